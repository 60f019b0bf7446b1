"""``coclr curate EMBED_DIR --out DIR``: near-duplicates, outliers and a map of a ``coclr embed`` folder.

What it writes into ``DIR``:

- ``duplicates.csv``: ``group,path,similarity,kind,start,end``: each near-duplicate group's videos (``kind``
  ``whole``: the videos' fingerprints reach the threshold, ``similarity`` a video's highest to another member), then the
  pairs of videos that share only a stretch (``kind`` ``partial``: windows of the two reach it; ``start`` and
  ``end``, in seconds, the stretch of each video), searched only when the windows' threshold was calibrated on
  altered copies or given.
- ``outliers.csv``: ``rank,path,score``: every video, most unlike the rest first; the score is one minus the mean
  similarity of its :data:`~coclr.curate.groups.OUTLIER_K` nearest others (a kNN distance).
- ``index.html`` with ``data.js`` and ``thumbs/``: the map (:mod:`coclr.curate.page`).
- ``curate.json``: the threshold and the rule that chose it, the counts, the seconds of each part.
- ``calibration/``: the altered copies and their embeddings and fingerprints the thresholds were calibrated on.
- ``fingerprints/``: each video's fingerprint, by its identity and the encoder's (a second run reads them).

Similarities are cosines of the vectors centred by the folder's mean (as the paper's retrieval protocol centres its
gallery): the direction every video shares says nothing of which videos are alike, and an encoder whose vectors all
point one way still tells its videos apart. Whole videos are compared by their fingerprints
(:mod:`coclr.curate.fingerprint`, centred the same way; ``fingerprints`` off: by their vectors), windows by their
vectors. Each threshold: ``threshold`` when given (the windows' too without fingerprints); else calibrated on altered
copies of ``calibrate`` of the folder's videos (:mod:`coclr.curate.calibrate`); else (``calibrate`` 0, or no copy
could be made) the distribution rule (:func:`~coclr.curate.groups.distribution_threshold`). They are printed and
recorded.

The rule of every long command: the same command on the same ``DIR`` runs again (cheap: the calibration's copies
and embeddings and the thumbnails are kept; the rest is recomputed from the folder as it is now), other options are
refused before any work naming each, and nothing in ``DIR`` is overwritten that curate did not write.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from coclr import progress
from coclr.atomic import atomic_open, atomic_write_json, atomic_write_text, remove_stale_partials
from coclr.config import option
from coclr.curate import groups as rules
from coclr.curate.calibrate import video_key
from coclr.curate.graph import neighbour_graph
from coclr.curate.layout import colour_groups, layout
from coclr.curate.page import PAGE, PAGE_DIGITS, THUMBS, write_page
from coclr.embed.output import Embeddings, finished_embeddings
from coclr.errors import ConfigError
from coclr.runfolder import FolderRule, claim_folder
from coclr.seeding import check_seed
from coclr.text import shown
from coclr.threads import check_workers

CURATE_FOLDER = FolderRule("curate", "a curate run", may_differ=("device", "workers"), restart=True)
RESULT_FILE = "curate.json"
MIN_VIDEOS = 3
"""The fewest videos curated: similarities are of vectors less the folder's mean (what every video shares)."""
SHOWN_OUTLIERS = 100
"""Outliers listed on the page (every video is in outliers.csv)."""
PAGE_NEIGHBOURS = 5
"""Nearest videos the page lists for a chosen point."""
ALIKE_RULE = "every video's fingerprint is the same: copies of one video, one group"
"""The rule of a folder whose videos no similarity tells apart: each fingerprint is the folder's mean, so zero once
centred. (Their vectors alike say less: a collapsed encoder gives every video one vector.)"""
FINGERPRINTS = "fingerprints"
"""The curate folder's subfolder of the videos' fingerprints."""


@dataclasses.dataclass
class CurateOptions:
    """What ``coclr curate`` is asked for; each option is a ``--flag`` of the command."""

    threshold: float | None = option(None, "similarity from which two whole videos are near-duplicates (of their "
                                           "fingerprints; of their vectors with --no-fingerprints, which the windows "
                                           "then share); unset: calibrated on altered copies of --calibrate videos. "
                                           "The windows' own threshold is calibrated too unless --no-fingerprints "
                                           "gives it this one, or --calibrate 0 or --no-windows")
    fingerprints: bool = option(True, "find whole-video duplicates by each video's appearance fingerprint (the "
                                      "encoder's first block over frames decoded again from its file: what is where, "
                                      "which tells one take from another); off: by the embedding vectors")
    calibrate: int = option(8, "videos whose altered copies (re-encoded, trimmed, cropped, resized, brightened, "
                               "sped up, flipped, captioned) calibrate the threshold; 0: the distribution rule "
                               "(an outer fence of each video's similarity to its nearest other)")
    windows: bool = option(True, "also find stretches that only parts of two videos share, from their windows")
    neighbours: int = option(10, "nearest others kept for each video: the outlier score's k (the page lists the "
                                 f"first {PAGE_NEIGHBOURS})")
    thumbnails: int = option(2000, "at most this many animated thumbnails (the duplicates and the outliers first, "
                                   "then videos evenly spaced in the folder's order)")
    seed: int = option(0, "seed of the map's layout and colour groups")
    device: str | None = option(None, "torch device embedding the altered copies (default: cuda when available)")
    workers: int | None = option(None, "processes decoding the altered copies, threads making the thumbnails "
                                       "(default: one per core)")

    def validate(self) -> None:
        if self.threshold is not None and not -1.0 <= self.threshold <= 1.0:
            raise ConfigError(f"--threshold: a cosine similarity lies in [-1, 1], got {self.threshold}")
        for name in ("calibrate", "thumbnails"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name}: must be 0 or more, got {getattr(self, name)}")
        if self.neighbours < 1:
            raise ConfigError(f"--neighbours: must be at least 1, got {self.neighbours}")
        check_workers(self.workers, "--workers")
        check_seed(self.seed, "--seed")


@dataclasses.dataclass
class CurateSummary:
    out: Path
    videos: int
    threshold: float
    rule: str
    groups: int
    duplicates: int
    partial: int
    stale: int
    seconds: float
    unfingerprinted: int = 0
    """Videos without a fingerprint (gone, unreadable, or one of zeros): nobody's duplicate."""
    stretches: str = "searched"
    """Whether the stretches two videos share were searched (``curate.json``'s ``stretches``), else why not."""

    def __str__(self) -> str:
        lines = [f"{self.out}: {self.videos} videos curated in {progress.duration(self.seconds)}",
                 f"  threshold {shown_threshold(self.threshold, self.rule)} ({self.rule})",
                 f"  {self.groups} near-duplicate group(s) of {self.duplicates} videos, "
                 f"{rules.stretches_text(self.partial, self.stretches)}: {self.out / 'duplicates.csv'}",
                 f"  every video ranked by how unlike the rest it is: {self.out / 'outliers.csv'}",
                 f"  the map: {self.out / PAGE}"]
        if self.unfingerprinted:
            lines.append(f"  {self.unfingerprinted} video(s) could not be read for a fingerprint, or gave one of zeros "
                         f"(listed in {self.out / RESULT_FILE}): they are nobody's duplicate")
        if self.stale:
            lines.append(f"  {self.stale} video(s) changed or removed since they were embedded: their rows are of the "
                         "embedded version; run coclr embed on the folder again to bring it up to date")
        return "\n".join(map(shown, lines))


def say(text: str, show: bool) -> None:
    if show:
        progress.write(text, file=sys.stderr)


def recorded_options(source: Path, options: CurateOptions) -> dict[str, Any]:
    return {"embeddings": str(source.resolve()), **dataclasses.asdict(options)}


def curate(source: str | os.PathLike[str], out: str | os.PathLike[str], options: CurateOptions | None = None,
           restart: bool = False, show: bool = True) -> CurateSummary:
    """Curate the embedding folder ``source`` into ``out`` (see the module docstring). Raises a
    :class:`~coclr.errors.CoclrError` in one line, before any write, for a folder that is not a finished ``coclr
    embed`` folder, bad options, or an ``out`` of other options or holding files curate did not write."""
    options = options or CurateOptions()
    options.validate()
    started = time.perf_counter()
    source, out = Path(source), Path(out)
    if not source.is_dir():
        raise ConfigError(f"{source}: not a folder; give a coclr embed output folder (or coclr learn's "
                          "embeddings/two_stream)")
    embeddings = finished_embeddings(source)  # a folder that is not one, or unfinished, is one line here
    if len(embeddings.videos) < MIN_VIDEOS:
        raise ConfigError(f"{source}: {len(embeddings.videos)} video(s) embedded; curation compares each video with "
                          f"the others, less what they share (their mean), which needs at least {MIN_VIDEOS} (of two, "
                          "each is the other's opposite)")
    from coclr.embed.search import folder_rows  # noqa: PLC0415

    folder_rows(embeddings, center=True)  # rows that hold NaN: the folder is damaged, said before any write (the
    if options.windows and len(embeddings.windows) > 1:  # rows are prepared beside them, once, as search keeps them)
        folder_rows(embeddings, windows=True, center=True)
    encoder = stem = None
    if options.fingerprints:  # the encoder the fingerprints need, checked before any write
        from coclr.curate.fingerprint import folder_checkpoint  # noqa: PLC0415 (heavy: torch)

        stem = folder_checkpoint(embeddings)
    if vector_threshold_wanted(options, len(embeddings.windows)) and options.calibrate > 0:
        from coclr.curate.calibrate import folder_encoder  # noqa: PLC0415 (heavy: torch)

        encoder = folder_encoder(embeddings, options.device, options.workers)
    with claim_folder(out, CURATE_FOLDER, recorded_options(source, options), restart=restart):
        return _curate(embeddings, out, options, started, show, encoder, stem)


def vector_threshold_wanted(options: CurateOptions, windows: int) -> bool:
    """Whether a threshold on the vectors is to be found (not given): for whole videos without fingerprints, for
    the windows' stretches."""
    vectors = not options.fingerprints or (options.windows and windows > 1)
    given = options.threshold is not None and not options.fingerprints
    return vectors and not given


def _curate(embeddings: Embeddings, out: Path, options: CurateOptions, started: float, show: bool,
            encoder, stem: tuple[Path, str] | None) -> CurateSummary:
    from coclr.embed.search import folder_rows  # noqa: PLC0415

    seconds: dict[str, float] = {}
    clock = time.perf_counter()
    count = len(embeddings.videos)
    paths = [record["path"] for record in embeddings.video_records]
    stale = {int(row) for row in embeddings.stale_rows()}
    rows = folder_rows(embeddings, center=True)
    k = min(options.neighbours, count - 1)
    scores, neighbours = neighbour_graph(rows, k, show=show, desc="nearest videos")
    seconds["neighbours"] = time.perf_counter() - clock
    units = rows.block(0, rows.count)
    at_mean = np.flatnonzero(~units.any(axis=1))
    if len(at_mean) >= 2:  # copies of one video (every video, or the folder's mean): alike, not unlike
        scores, neighbours = rules.alike_first(scores, neighbours, at_mean)
    nearest = scores[:, 0].astype(np.float64)

    clock = time.perf_counter()
    fingerprinted: dict[str, Any] = {}
    if stem is not None:
        links, group_threshold, group_rule, fingerprinted = _fingerprint_groups(embeddings, out, options, stem, k,
                                                                                stale, show)
    alike = stem is not None and group_rule == ALIKE_RULE  # one group: no stretch to find, no threshold to calibrate
    windows = options.windows and len(embeddings.windows) > 1
    given = not options.fingerprints and options.threshold is not None
    space = _window_space(embeddings, show) if windows and not alike and (given or options.calibrate > 0) else None
    threshold, rule, calibration = float("nan"), "not needed", {}
    if given:
        threshold, rule = float(options.threshold), "given"
    elif not alike and vector_threshold_wanted(options, len(embeddings.windows)):
        threshold, rule, calibration = _vector_threshold(embeddings, out, options, units, rows.mean, nearest, encoder,
                                                         stale, show, space[0] if space is not None else None)
    window_threshold, window_rule = threshold, rule
    if rule.startswith("calibrated") or rule.startswith("the distribution rule"):  # the windows': their own
        own = calibration.get("windows") or {"threshold": None, "rule": calibration.get("rule", "not calibrated")}
        window_threshold = own["threshold"] if own["threshold"] is not None else float("nan")
        window_rule = own["rule"] if own["threshold"] is not None else f"not calibrated: {own['rule']}"
    if stem is None:
        group_threshold, group_rule = threshold, rule
        links = vector_links(rows, threshold, at_mean, show)
    seconds["threshold"] = time.perf_counter() - clock
    say(f"coclr curate: near-duplicate threshold {shown_threshold(group_threshold, group_rule)} ({group_rule})", show)
    if windows and not alike:
        say(f"coclr curate: the windows' threshold {shown_threshold(window_threshold, window_rule)} "
            f"({window_rule})", show)
    # Stretches only from a threshold that was calibrated on copies or given: the distribution rule says which whole
    # videos are unusually alike, and says nothing of windows (measured: most of its stretches were not copies).

    clock = time.perf_counter()
    whole = rules.link_groups(links)
    stretches = []
    trusted = window_rule == "given" or window_rule.startswith("calibrated")
    if windows and not trusted and not alike:
        say("coclr curate: no stretches searched: the windows' threshold is not calibrated (the vectors did not tell "
            "altered copies from other videos, or --calibrate 0)", show)
    if windows and trusted and space is not None:
        stretches = _stretches(embeddings, *space, window_threshold, rules.group_of(whole, count), show)
    outliers = rules.outlier_scores(scores, options.neighbours)
    ranking = rules.outlier_ranking(outliers)
    seconds["duplicates_outliers"] = time.perf_counter() - clock
    write_tables(out, paths, links.best, whole, stretches, outliers, ranking)

    clock = time.perf_counter()
    points, method = layout(units, options.seed)
    colours = colour_groups(units, options.seed)
    seconds["map"] = time.perf_counter() - clock
    clock = time.perf_counter()
    wanted = thumbnail_rows(count, whole, stretches, ranking, options.thumbnails)
    thumbs = write_thumbnails(out, embeddings, wanted, stale, show, options.workers)
    seconds["thumbnails"] = time.perf_counter() - clock
    searched = ("not asked for" if not windows else "not searched: one group holds every video" if alike
                else "searched" if trusted else "not searched: the windows' threshold is not calibrated")
    summary = CurateSummary(out, count, group_threshold, group_rule, len(whole), sum(len(group) for group in whole),
                            rules.sharing_pairs(stretches), len(stale), 0.0, len(fingerprinted.get("without", [])),
                            searched)
    data = page_data(paths, points, colours, scores, neighbours, whole, stretches, outliers, ranking, thumbs, count,
                     links.best)
    shown_map = "UMAP" if method == "umap" else "the first two principal components (pip install umap-learn for UMAP)"
    lines = [f"map: {shown_map}; colours: {int(colours.max()) + 1} groups of alike videos",
             f"near-duplicates from {'fingerprint ' if stem is not None else ''}similarity "
             f"{shown_threshold(group_threshold, group_rule)} "
             f"({group_rule}); a point's nearest and outlier scores from the vectors less the folder's mean (as "
             "coclr search --center); drag to pan, wheel to zoom, hover for a thumbnail, click a point for its "
             "nearest, a list entry to mark its videos"]
    if searched != "searched":  # (its list of stretches is empty: not for want of any)
        lines.append(f"shared stretches (part of one video in another): {searched}")
    if stale:  # (said on the terminal and in curate.json, not on the page)
        lines.append(f"{len(stale)} video(s) changed or removed since they were embedded are shown as embedded: run "
                     "coclr embed again, then this command")
    write_page(out, embeddings.root, lines, data)
    summary.seconds = time.perf_counter() - started
    atomic_write_json(out / RESULT_FILE, {
        "embeddings": str(embeddings.root.resolve()), "videos": count, "threshold": _finite(group_threshold),
        "rule": group_rule, "compared_by": "fingerprints" if stem is not None else "vectors",
        **({"fingerprints": fingerprinted} if stem is not None else {}),
        "window_threshold": _finite(window_threshold) if windows else None,
        "window_rule": window_rule if windows else None,
        "stretches": searched,
        "calibration": {key: value for key, value in calibration.items() if key != "threshold"},
        "groups": len(whole), "duplicate_videos": summary.duplicates, "partial_pairs": summary.partial,
        "partial_stretches": len(stretches),
        "stale": sorted(stale), "map": method, "colour_groups": int(colours.max()) + 1,
        "outlier_score": f"1 - mean similarity of the {k} nearest others",
        "seconds": {**seconds, "all": summary.seconds}})
    return summary


def _finite(value: float) -> float | None:
    """A threshold as ``curate.json`` records it: null where there is none (NaN is no JSON)."""
    return value if math.isfinite(value) else None


def shown_threshold(value: float, rule: str) -> str:
    """A threshold as printed: a given one as given (0.99999 is not "1.0000"), another to four decimals; "none"
    where there is none."""
    if not math.isfinite(value):
        return "none"
    return repr(float(value)) if rule == "given" else f"{value:.4f}"


def vector_links(rows, threshold: float, at_mean: np.ndarray, show: bool) -> rules.Links:
    """The :class:`~coclr.curate.groups.Links` of the videos' vectors (``rows``, centred unit rows) at ``threshold``:
    every pair that reaches it (:func:`~coclr.curate.graph.video_links`), and the videos that are each the folder's
    mean (``at_mean``: copies of one video, zero once centred) joined at similarity 1."""
    from coclr.curate.graph import video_links  # noqa: PLC0415

    links = video_links(rows, rules.reach_floor(threshold, rows.dim), show=show)
    return rules.merged(links, rules.alike_links(at_mean, rows.count))


def _stretches(embeddings: Embeddings, space, rows, threshold: float, whole: np.ndarray, show: bool) -> list:
    """The stretches videos share (:func:`~coclr.curate.groups.matching_stretches`) from every pair of windows
    (``space``, :class:`~coclr.curate.calibrate.WindowSpace`, and their search's ``rows``) of different videos that
    reaches ``threshold`` (:func:`~coclr.curate.graph.window_pairs`; ``whole``: each video's duplicate group)."""
    from coclr.curate.graph import window_pairs  # noqa: PLC0415

    starts = np.array([record["start"] for record in embeddings.window_records], np.float64)
    ends = np.array([record["end"] for record in embeddings.window_records], np.float64)
    floor = rules.reach_floor(threshold, space.units.shape[1])
    pairs = window_pairs(rows, floor, space.video, show=show)
    return rules.matching_stretches(*pairs, space.video, starts, ends, whole)


def _window_space(embeddings: Embeddings, show: bool):
    """The windows as stretches are compared (:class:`~coclr.curate.calibrate.WindowSpace`, with each window's
    nearest window of another video, what the calibration compares copies with) and their search's rows."""
    from coclr.curate.calibrate import WindowSpace  # noqa: PLC0415 (heavy: torch)
    from coclr.embed.search import folder_rows  # noqa: PLC0415

    video = np.array([record["video"] for record in embeddings.window_records], np.int64)
    rows = folder_rows(embeddings, windows=True, center=True)
    graph = neighbour_graph(rows, 1, groups=video, show=show, desc="nearest windows")
    return WindowSpace(rows.block(0, rows.count), rows.mean, video, graph[0][:, 0].astype(np.float64)), rows


def _vector_threshold(embeddings: Embeddings, out: Path, options: CurateOptions, units: np.ndarray, mean,
                      nearest: np.ndarray, encoder, stale: set[int], show: bool,
                      windows=None) -> tuple[float, str, dict[str, Any]]:
    """The threshold on the vectors, its rule and its calibration's record: calibrated on altered copies, else the
    distribution rule; with ``windows`` (:class:`~coclr.curate.calibrate.WindowSpace`), the calibration's record
    holds the windows' own threshold too."""
    calibration: dict[str, Any] = {"threshold": None, "rule": "--calibrate 0"}
    if encoder is not None:
        from coclr.curate.calibrate import FOLDER, calibrate, sample_rows  # noqa: PLC0415 (heavy: torch)

        what = "the windows' threshold (--no-windows skips it)" if options.fingerprints else "the vectors' threshold"
        videos = len(sample_rows(embeddings, options.calibrate, stale))
        say(f"coclr curate: calibrating {what} on altered copies of {videos} videos ...", show)
        calibration = calibrate(embeddings, units, mean, nearest, options.calibrate, out / FOLDER, encoder, stale, show,
                                windows)
    if calibration["threshold"] is not None:
        return float(calibration["threshold"]), calibration["rule"], calibration
    return rules.distribution_threshold(nearest), _distribution_rule(calibration["rule"]), calibration


def _distribution_rule(why: str) -> str:
    return (f"the distribution rule ({why}): the third quartile of each video's similarity to its nearest other plus "
            f"three interquartile ranges, within {rules.FALLBACK_RANGE[0]}-{rules.FALLBACK_RANGE[1]}")


def _fingerprint_groups(embeddings: Embeddings, out: Path, options: CurateOptions, stem: tuple[Path, str], k: int,
                        stale: set[int], show: bool) -> tuple[rules.Links, float, str, dict[str, Any]]:
    """Every video's fingerprint (kept in ``out/fingerprints``), the threshold on them and its rule, the
    :class:`~coclr.curate.groups.Links` of every pair that reaches it, and what ``curate.json`` records of them (the
    videos without one, the calibration).

    The threshold comes first (given, or calibrated on altered copies, which needs no graph), then a range search
    finds every pair that reaches it (:func:`~coclr.curate.fingerprint.duplicate_links`), among the videos that have
    a fingerprint (a video without one is nobody's duplicate, whatever the threshold); only the distribution rule
    needs each video's nearest other, and so the ranked graph (:func:`~coclr.curate.fingerprint.neighbour_graph`),
    before the same range search. ``k`` (``--neighbours``) bounds only that graph, never which pairs join."""
    from coclr.curate import fingerprint as prints  # noqa: PLC0415 (heavy: torch)
    from coclr.curate.calibrate import FOLDER, calibrate_fingerprints, sample_rows  # noqa: PLC0415

    checkpoint, sha = stem
    found, lacking, colours = prints.fingerprints([record["path"] for record in embeddings.video_records], checkpoint,
                                                  sha, out / FINGERPRINTS, show=show, workers=options.workers)
    flat = np.flatnonzero(~np.isnan(colours[:, 0]))
    have = np.setdiff1d(np.arange(len(found)), np.union1d(lacking, flat))
    units, mean = prints.centred(found)  # (a video without one, or of one colour: a zero row, joined by no pair)
    record: dict[str, Any] = {"without": [embeddings.video_records[row]["path"] for row in lacking],
                              "solid_colour": [embeddings.video_records[row]["path"] for row in flat]}
    same_colour = rules.colour_links(colours, prints.SAME_COLOUR)

    def pairs(threshold: float) -> rules.Links:
        floor = rules.reach_floor(threshold, units.shape[-1])
        links = rules.subset_links(prints.duplicate_links(units[have], floor, show=show), have, len(found))
        return rules.merged(links, same_colour)

    if len(have) >= 2 and not units[have, 0].any():  # each the folder's mean: no threshold can join them
        return rules.merged(rules.alike_links(have, len(found)), same_colour), 1.0, ALIKE_RULE, record
    if options.threshold is not None:
        return pairs(float(options.threshold)), float(options.threshold), "given", record
    if len(have) < 2:
        return pairs(1.0), 1.0, f"{len(have)} video(s) could be fingerprinted: no duplicates", record
    calibration: dict[str, Any] = {"threshold": None, "rule": "--calibrate 0"}
    if options.calibrate > 0:
        videos = len(sample_rows(embeddings, options.calibrate, stale))
        say(f"coclr curate: calibrating the fingerprints' threshold on altered copies of {videos} videos ...", show)
        calibration = calibrate_fingerprints(embeddings, units, mean, options.calibrate, out / FOLDER, checkpoint, sha,
                                             stale, show, options.workers)
    record["calibration"] = {key: value for key, value in calibration.items() if key != "threshold"}
    if calibration["threshold"] is not None:
        return pairs(float(calibration["threshold"])), float(calibration["threshold"]), calibration["rule"], record
    scores, _ = prints.neighbour_graph(units[have], min(k, len(have) - 1), show=show)
    threshold = rules.distribution_threshold(scores[:, 0] if scores.shape[1] else np.empty(0))
    return pairs(threshold), threshold, _distribution_rule(calibration["rule"]), record


def write_tables(out: Path, paths: list[str], best: np.ndarray, whole: list[list[int]], stretches: list,
                 outliers: np.ndarray, ranking: np.ndarray) -> None:
    """``duplicates.csv`` and ``outliers.csv`` (see the module docstring; ``best``: each video's highest similarity
    among the pairs that reach the threshold, :class:`~coclr.curate.groups.Links`), each written atomically."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["group", "path", "similarity", "kind", "start", "end"])
    for number, group in enumerate(whole, 1):
        for row in group:
            writer.writerow([number, paths[row], f"{best[row]:.6f}", "whole", "", ""])
    for number, stretch in enumerate(stretches, len(whole) + 1):
        writer.writerow([number, paths[stretch.video], f"{stretch.similarity:.6f}", "partial", f"{stretch.start:.3f}",
                         f"{stretch.end:.3f}"])
        writer.writerow([number, paths[stretch.other], f"{stretch.similarity:.6f}", "partial",
                         f"{stretch.other_start:.3f}", f"{stretch.other_end:.3f}"])
    atomic_write_text(out / "duplicates.csv", text.getvalue())
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["rank", "path", "score"])
    for rank, row in enumerate(ranking, 1):
        writer.writerow([rank, paths[row], f"{outliers[row]:.6f}"])
    atomic_write_text(out / "outliers.csv", text.getvalue())


THUMBNAIL_FRAMES, THUMBNAIL_HEIGHT = 8, 72
"""A thumbnail's frames (spread over the video) and their height in px."""


def thumbnail_rows(count: int, whole: list[list[int]], stretches: list, ranking: np.ndarray, most: int) -> list[int]:
    """The videos that get a thumbnail: every one of small collections; else the duplicates, the listed outliers,
    then videos evenly spaced in the folder's row order, up to ``most``."""
    if count <= most:
        return list(range(count))
    wanted = dict.fromkeys([row for group in whole for row in group]
                           + [row for s in stretches for row in (s.video, s.other)]
                           + [int(row) for row in ranking[:SHOWN_OUTLIERS]])
    for row in np.linspace(0, count - 1, most).round().astype(int):
        wanted.setdefault(int(row))
    return list(wanted)[:most]


def thumbnail_key(record: dict[str, Any]) -> str:
    """A thumbnail's file name: by the video's identity as embedded (:func:`~coclr.curate.calibrate.video_key`)."""
    return video_key(record) + ".gif"


def write_thumbnails(out: Path, embeddings: Embeddings, rows: list[int], stale: set[int], show: bool,
                     workers: int | None = None) -> dict[int, str]:
    """An animated GIF of each video of ``rows`` in ``out/thumbs`` (kept when there already), made on ``workers``
    threads (default: one per core; decoding releases the GIL); returns row -> its path relative to ``out``. A
    video that cannot be read, or changed since it was embedded, gets none."""
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    from coclr.embed.search import file_thumbnail  # noqa: PLC0415
    from coclr.eval.gallery import animated_gif  # noqa: PLC0415
    from coclr.threads import usable_cores  # noqa: PLC0415

    folder = out / THUMBS
    folder.mkdir(exist_ok=True)
    remove_stale_partials(folder)  # (a killed run's)

    def make(row: int) -> str | None:
        record = embeddings.video_records[row]
        name = thumbnail_key(record)
        if not (folder / name).is_file():
            if row in stale:
                return None
            try:
                frames = file_thumbnail(record["path"], embeddings, num_frames=THUMBNAIL_FRAMES,
                                        height=THUMBNAIL_HEIGHT)
            except Exception:  # an unreadable video: no thumbnail, the rest goes on
                return None
            with atomic_open(folder / name, "wb") as file:
                file.write(animated_gif(frames))
        return f"{THUMBS}/{name}"

    found = {}
    with progress.bar(total=len(rows), desc="thumbnails", unit="video", disable=not show, leave=False) as shown, \
            ThreadPoolExecutor(max(1, workers or usable_cores())) as pool:
        for row, made in zip(rows, pool.map(make, rows)):
            shown.update(1)
            if made is not None:
                found[row] = made
    return found


def as_shown(score: Any) -> float:
    """A score as the page shows it (``toFixed(PAGE_DIGITS)``), rounded once here: rounded to more digits first, the
    page's rounding of that rounding was one unit off in the last digit for about one value in twenty."""
    return round(float(score), PAGE_DIGITS)


def page_data(paths: list[str], points: np.ndarray, colours: np.ndarray, scores: np.ndarray, neighbours: np.ndarray,
              whole: list[list[int]], stretches: list, outliers: np.ndarray, ranking: np.ndarray,
              thumbs: dict[int, str], count: int, best: np.ndarray) -> dict[str, Any]:
    """What ``data.js`` holds (:mod:`coclr.curate.page`); a group's similarity the lowest of its members' ``best``
    (each video's highest among the pairs that reach the threshold, :class:`~coclr.curate.groups.Links`)."""
    near = [[[int(other), as_shown(score)] for other, score in zip(neighbours[row, :PAGE_NEIGHBOURS],
                                                                          scores[row, :PAGE_NEIGHBOURS]) if other >= 0]
            for row in range(count)]
    duplicates = [{"members": group, "kind": "whole", "similarity": as_shown(min(best[group]))} for group in whole]
    duplicates += [{"members": [s.video, s.other], "kind": "partial", "similarity": as_shown(s.similarity),
                    "seconds": [f"{s.start:.3f}-{s.end:.3f}", f"{s.other_start:.3f}-{s.other_end:.3f}"]}  # (the CSV's)
                   for s in stretches]
    return {"names": paths, "points": [round(float(v), 5) for v in points.reshape(-1)],
            "groups": [int(g) for g in colours], "nearest": near, "duplicates": duplicates,
            "outliers": [[int(row), as_shown(outliers[row])] for row in ranking[:SHOWN_OUTLIERS]],
            "thumbs": [thumbs.get(row) for row in range(count)]}
