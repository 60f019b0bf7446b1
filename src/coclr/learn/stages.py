"""The stages of a learn run judged without labels, and the one of each view that ``coclr learn`` exports.

Every stage's encoder is measured on the stored videos (a sample of large footage) by
:mod:`coclr.eval.label_free`; each stage also gets its ``agreement``: how far its neighbours are those of the
other view's stages (the mean :func:`~coclr.eval.label_free.neighbour_overlap` with each of them). The exported
stage of a view is the healthy one (not collapsed: :func:`coclr.eval.health.feature_health` without labels) that
:data:`SCORE` rates best; when every stage of a view collapsed, the last one is exported and marked so. The rule
and why that score: docs/learn.md ("Which stage is exported"), measured in
docs/experiments/2026-11-28-issue55-plan.md.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from coclr.data.sampling import spread

VIEWS = ("rgb", "flow")
MAX_INSTANCES = 2048
"""At most this many instances (spread evenly over the sampled videos' stretches) are measured: the neighbour
measures compare every pair."""
SCORE = "last"
"""What picks the exported stage among a view's healthy stages: ``"last"`` (the last healthy one) or a measure of
:func:`coclr.eval.label_free.quality` (or ``agreement``) with its direction in :data:`DIRECTIONS` (the best)."""
DIRECTIONS = {"effective_rank": 1, "rankme": 1, "alignment": -1, "uniformity": -1, "agreement": 1,
              "temporal_retrieval": 1, "neighbour_stability": 1}
"""Each label-free measure's direction: 1 when higher is better, -1 when lower is."""


def sample_keys(store: Path, count: int) -> list[str]:
    """Up to ``count`` of the store's usable videos, spread evenly over its index (all of smaller footage)."""
    from coclr.data.datasets import usable_entries  # noqa: PLC0415 (heavy: torch)
    from coclr.store.clipstore import ClipStore  # noqa: PLC0415

    entries = usable_entries(ClipStore(store), "train", list(VIEWS))[0]
    return [entries[i].path for i in spread(len(entries), count)]


def instance_features(windows: np.ndarray, pairs: np.ndarray, most: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The instances of the windows (``pairs``: the (video, stretch) of each,
    :func:`coclr.data.sampling.instances_of`), at most ``most``
    of them spread evenly: their (video, stretch) ``[I, 2]``, their features (the mean of their windows) ``[I, D]``,
    and their windows ``[W', D]`` with the instance of each ``[W']`` (in time order, as the windows came)."""
    found, rows = np.unique(pairs, axis=0, return_inverse=True)
    rows = rows.reshape(-1)
    kept = spread(len(found), most)
    renumber = np.full(len(found), -1)
    renumber[kept] = np.arange(len(kept))
    inside = renumber[rows] >= 0
    windows, rows = windows[inside], renumber[rows[inside]]
    features = np.zeros((len(kept), windows.shape[1]))
    np.add.at(features, rows, windows)
    features /= np.bincount(rows, minlength=len(kept))[:, None]
    return found[kept], features, windows, rows


def stage_quality(encoder: Callable[[str, str], Path], store: Path, stages, clips, device: str, keys: list[str],
                  segment_frames: int | None = None, scorer: Callable[[list[str], np.ndarray], Any] | None = None
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The label-free measures of every stage's encoder (``stages``: :class:`~coclr.train.pipeline.Stage` in order,
    the starting encoders first as method ``"init"``; ``encoder(stage, view)``: its file) on the stored videos
    ``keys``, over the training instances (each video, or its stretches of ``segment_frames``: a few long videos give
    the measures many rows; a row's neighbours are never its own video's), each stage's agreement with the other
    view's stages (a starting encoder's with the other starting one), and the agreement of the RGB and flow
    encoders' nearest neighbours at the start, after InfoNCE and after each cycle. ``scorer(keys, features)`` (the
    sampled videos' keys and features, each the mean of its instances) adds each stage's ``labels`` entry."""
    import torch  # noqa: PLC0415 (heavy)

    from coclr.data.sampling import aligned_num_frames, instances_of, segment_counts  # noqa: PLC0415
    from coclr.eval.features import window_features  # noqa: PLC0415
    from coclr.eval.label_free import (  # noqa: PLC0415
        chance_agreement,
        neighbour_agreement,
        neighbour_overlap,
        quality,
    )
    from coclr.models.loading import load_encoder  # noqa: PLC0415
    from coclr.store.clipstore import ClipStore  # noqa: PLC0415

    clip_store = ClipStore(store)
    measured: dict[str, Any] = {}
    rows: dict[str, np.ndarray] = {}
    latest: dict[str, str] = {}
    agreement: dict[str, Any] = {}
    instances = groups = counts = None  # the same for every stage: each row's (video, stretch), its video, and
    # each video's stretches
    for stage in stages:
        for view in stage.trains:
            backbone, _ = load_encoder(encoder(stage.name, view))
            backbone.eval()
            with torch.inference_mode():
                windows, videos, names, starts = window_features(backbone, clip_store, view, "train", clips, device,
                                                                 keys)
            if counts is None:
                counts = segment_counts([aligned_num_frames(clip_store.num_frames(name, "rgb"),
                                                            clip_store.num_frames(name, "flow")) for name in names],
                                        segment_frames)
            found, features, windows, window_rows = instance_features(
                windows, instances_of(videos, starts, counts, segment_frames), MAX_INSTANCES)
            if instances is None:
                instances, groups = found, found[:, 0]
            elif not np.array_equal(found, instances):
                raise RuntimeError(f"{stage.name}: its windows fall into other instances than the first stage's")
            measured[stage.name] = {"view": view, "method": stage.method,
                                    **quality(features, windows, window_rows, groups),
                                    "videos": len(names), "instances": len(found)}
            if scorer is not None:
                measured[stage.name]["labels"] = scorer(*video_features(names, found[:, 0], features))
            rows[stage.name] = features
            latest[view] = stage.name
        if set(latest) == set(VIEWS) and (stage.name.startswith("infonce_") or stage.trains == [VIEWS[1]]):
            # the schedule's first stages are cycle 0
            name = "init" if stage.method == "init" else "infonce" if stage.cycle == 0 else f"cycle{stage.cycle}"
            agreement[name] = {"stages": [latest["rgb"], latest["flow"]],
                               "nearest_neighbour": neighbour_agreement(rows[latest["rgb"]], rows[latest["flow"]],
                                                                        groups),
                               "chance": chance_agreement(len(groups), groups)}
    for name, entry in measured.items():
        others = [other for other in measured if measured[other]["view"] != entry["view"]
                  and (measured[other]["method"] == "init") == (entry["method"] == "init")]
        overlaps = [neighbour_overlap(rows[name], rows[other], groups=groups) for other in others]
        entry["agreement"] = (float(np.mean(overlaps)) if overlaps and None not in overlaps else None)
    return measured, agreement


def video_features(names: list[str], videos: np.ndarray, features: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The keys of the videos among ``names`` that ``videos`` (each instance's index into ``names``) holds, and each
    one's feature: the mean of its instances' ``features``."""
    found, rows = np.unique(videos, return_inverse=True)
    summed = np.zeros((len(found), features.shape[1]))
    np.add.at(summed, rows.reshape(-1), features)
    return [names[i] for i in found], summed / np.bincount(rows.reshape(-1))[:, None]


def score_of(entry: dict[str, Any], score: str = SCORE) -> float | None:
    """A stage's score by ``score`` (higher is better; None without one)."""
    value = entry.get(score)
    return None if value is None else DIRECTIONS[score] * float(value)


def choose_exports(stages: dict[str, Any], score: str = SCORE) -> dict[str, dict[str, Any]]:
    """For each view, the stage to export and why: ``{"stage", "collapsed", "reason"}``. Among the view's stages
    (in training order) that did not collapse, the last (``score`` ``"last"``) or the best by ``score`` (ties to the
    later stage; a stage without a score ranks last); when all collapsed, the last stage, ``collapsed`` True."""
    chosen = {}
    for view in VIEWS:
        names = [name for name, entry in stages.items() if entry["view"] == view]
        if not names:
            continue
        healthy = [name for name in names if not stages[name]["collapsed"]]
        dropped = [name for name in names if stages[name]["collapsed"]]
        if not healthy:
            chosen[view] = {"stage": names[-1], "collapsed": True,
                            "reason": f"every {view} stage collapsed ({', '.join(names)}): the last one is exported, "
                                      "and carries nothing"}
            continue
        if score == "last":
            stage, why = healthy[-1], "the last stage that did not collapse"
        else:
            rated = [(score_of(stages[name], score), number, name) for number, name in enumerate(healthy)]
            best = max(rated, key=lambda item: (item[0] is not None, item[0] or 0.0, item[1]))
            stage, why = best[2], f"the best {score} of the stages that did not collapse"
        reason = why if not dropped else f"{', '.join(dropped)} collapsed; {why}"
        chosen[view] = {"stage": stage, "collapsed": False, "reason": reason}
    return chosen


def export_line(chosen: dict[str, dict[str, Any]]) -> str:
    """One line saying which stage of each view was exported and why."""
    return "; ".join(f"exported {entry['stage']} as encoder_{view} ({entry['reason']})"
                     for view, entry in chosen.items())


def trained_steps(plan: dict[str, Any]) -> int:
    """A learn run's training steps as trained: the InfoNCE epochs planned, each of the four CoCLR stages' as sized
    when it started to the time left (``stage_epochs``), else as planned."""
    infonce, planned = plan["epochs"]["infonce"], plan["epochs"]["coclr"]
    sized = plan.get("stage_epochs") or {}
    per_epoch = plan["steps"] / max(1, 2 * infonce + 4 * planned)
    return round(per_epoch * (2 * infonce + sum(sized.values()) + (4 - len(sized)) * planned))


def _mapping(value: Any) -> dict[str, Any]:
    """``value`` when it is a dict, else an empty one."""
    return value if isinstance(value, dict) else {}


def videos_learnt(result: dict[str, Any]) -> int | None:
    """The videos a ``learn.json`` record's encoders were trained on: those stored with their flow
    (``trained_videos``; a record from before it was kept: the videos less every failure, embedding's too); None
    when it does not say."""
    trained = result.get("trained_videos")
    if isinstance(trained, int):
        return trained
    videos, failed = result.get("videos"), result.get("failed")
    return videos - len(failed) if isinstance(videos, int) and isinstance(failed, list) else None


def start_text(start: dict[str, Any], name: Callable[[str], str] = str, escape: Callable[[str], str] = str) -> str:
    """A warm start's checkpoint as learn's report and an export's model card name it (``start``: its record in the
    plan, :meth:`coclr.learn.init.Start.record`): the file (as ``name`` shows it), its format and the beginning of
    its sha256 (each as ``escape`` writes it)."""
    return (f"{name(str(start.get('source', '?')))} ({escape(str(start.get('format', '?')))} checkpoint, sha256 "
            f"{escape(str(start.get('sha256', '?'))[:12])}...)")


def card_notes(result: dict[str, Any], stage: str | None) -> list[str]:
    """Lines for an exported encoder's model card from its learn run's ``learn.json`` (``result``): the run's
    plan, why this stage was exported, and its label-free measures (:mod:`coclr.eval.label_free`)."""
    notes = []
    plan = _mapping(result.get("plan"))  # (a learn.json is read as found: what is not its shape is left out)
    if plan:
        model = _mapping(plan.get("model"))
        try:
            steps: Any = trained_steps(plan)
        except (KeyError, TypeError):  # (a record without the plan's epochs)
            steps = plan.get("steps", "?")
        # the run's figures, said as the run's: the exported stage may be an early one (its later stages collapsed)
        videos, learnt = result.get("videos", "?"), videos_learnt(result)
        if isinstance(videos, int) and learnt is not None and learnt != videos:
            videos = f"{learnt} of its {videos}"
        notes.append(f"from a `coclr learn` run without labels on {videos} videos (InfoNCE then "
                     f"two CoCLR cycles, {steps} steps of batch {plan.get('batch', '?')} over all its stages, S3D "
                     f"width {model.get('width', '?')})" + (f"; this encoder is its stage {stage}" if stage else ""))
        for view, start in _mapping(plan.get("init")).items():  # (a warm start: what the run started from)
            notes.append(f"its {view} encoder started from {start_text(_mapping(start))}")
    for view, entry in _mapping(result.get("exported")).items():
        if _mapping(entry).get("stage") == stage:
            notes.append(f"exported as encoder_{view}: {entry.get('reason')}")
    measures = _mapping(_mapping(result.get("stages")).get(stage))
    shown = [f"{name} {measures[name]:.3g}" for name in DIRECTIONS if isinstance(measures.get(name), (int, float))]
    if shown:
        notes.append(f"label-free measures of {stage} (docs/learn.md): " + ", ".join(shown)
                     + ("; collapsed" if measures.get("collapsed") else ""))
    return notes
