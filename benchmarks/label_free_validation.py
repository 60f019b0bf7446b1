"""Which label-free measure ranks a run's stages as their quality on hidden labels does (issue 55).

For every stage of every run given: the label-free measures of ``coclr.eval.label_free`` (on the videos the run
trained on, as ``coclr learn`` measures its stages), and with the labels the R@1 of the test videos retrieving the
train videos and the linear probe's top-1, all from the same features. Then Spearman's rho of each measure with
R@1 and LP within each run's stages, within each view's stages, and pooled, with 95% bootstrap intervals over the
runs; and what each export rule (the last healthy stage, the healthy stage best by a measure) exports, against the
last and the best stage. The plan: docs/experiments/2026-11-28-issue55-plan.md.

    python benchmarks/label_free_validation.py --study W/study --learn W/learn --out W/validation

``--study``: a ``coclr study --seeds`` folder (``seed<S>/``: the pipeline's six stages, and the oracle's, scored
beside); ``--learn``: a ``benchmarks/learn_synth.py --work`` folder (``learn<S>/`` with ``data<S>/labels.csv``).
Each stage's figures are kept in ``--out`` (``<run>.json``): a second call only analyses. ``--choose MEASURE``
names the development set's choice when analysing the confirmation set alone.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
from pathlib import Path

import numpy as np

PIPELINE = ("infonce_rgb", "infonce_flow", "cycle1_rgb", "cycle1_flow", "cycle2_rgb", "cycle2_flow")
VIEWS = ("rgb", "flow")
MEASURES = {"effective_rank": 1, "rankme": 1, "alignment": -1, "uniformity": -1, "agreement": 1,
            "temporal_retrieval": 1, "neighbour_stability": 1}
"""Each measure and its direction (1: higher is better), as the plan fixed them."""
BOOTSTRAP = 10_000


# ------------------------------------------------------------------------------------------------ measuring


def stage_features(checkpoint: Path, store, split: str, device: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Window features of every video of ``split`` (``window_features``, the clips the encoder recorded)."""
    import torch

    from coclr.eval.features import ClipConfig, window_features
    from coclr.models.loading import load_encoder, read_clip_settings

    settings = read_clip_settings(checkpoint)
    clips = ClipConfig(length=settings["length"], stride=settings["stride"], size=settings["size"], batch_size=32)
    backbone, _ = load_encoder(checkpoint)
    backbone.eval()
    with torch.inference_mode():
        return window_features(backbone, store, settings["view"], split, clips, device)[:3]


def per_video(windows: np.ndarray, videos: np.ndarray, count: int) -> np.ndarray:
    return np.stack([windows[videos == v].mean(axis=0) for v in range(count)])


def labelled_scores(features: dict[str, np.ndarray], labels: dict[str, tuple[int, str]], classes: int
                    ) -> dict[str, float]:
    """R@1 (test -> train) and the linear probe's top-1 (percent) of the labelled videos' features."""
    from coclr.eval.features import VideoFeatures
    from coclr.eval.linear import linear_probe
    from coclr.eval.retrieval import retrieve

    def split(name: str) -> VideoFeatures:
        keys = [key for key in features if key in labels and labels[key][1] == name]
        return VideoFeatures(np.stack([features[k] for k in keys]).astype(np.float32),
                             np.array([labels[k][0] for k in keys], dtype=np.int64), keys)

    train, test = split("train"), split("test")
    recall = retrieve(test.features, test.labels, train.features, train.labels, ks=(1,)).recall[1]
    probe = linear_probe(train, test, classes)
    return {"R@1": 100.0 * recall, "LP": 100.0 * float(probe.top1)}


def measure_run(stages: dict[str, tuple[str, Path]], store_path: Path, splits: tuple[str, ...],
                quality_keys: list[str] | None, labels: dict[str, tuple[int, str]], classes: int, device: str
                ) -> dict[str, dict]:
    """Every stage's label-free measures (on ``quality_keys`` of the first split, all of it when None) and its
    labelled scores; ``agreement`` against the pipeline's stages of the other view."""
    from coclr.eval.label_free import neighbour_overlap, quality
    from coclr.store.clipstore import ClipStore

    store = ClipStore(store_path)
    records, means = {}, {}
    for name, (view, checkpoint) in stages.items():
        all_features: dict[str, np.ndarray] = {}
        for number, split in enumerate(splits):
            windows, videos, keys = stage_features(checkpoint, store, split, device)
            vectors = per_video(windows, videos, len(keys))
            all_features.update(zip(keys, vectors))
            if number == 0:
                wanted = set(keys if quality_keys is None else quality_keys)
                rows = [i for i, key in enumerate(keys) if key in wanted]
                keep = np.isin(videos, rows)
                remap = {old: new for new, old in enumerate(rows)}
                sub_videos = np.array([remap[v] for v in videos[keep]])
                measures = quality(vectors[rows], windows[keep], sub_videos)
                means[name] = vectors[rows]
        records[name] = {"view": view, **measures, **labelled_scores(all_features, labels, classes)}
        print(f"  {name}: " + ", ".join(f"{k} {v:.3g}" for k, v in records[name].items()
                                        if isinstance(v, float)), flush=True)
    for name, record in records.items():
        others = [other for other in PIPELINE if other in means and records[other]["view"] != record["view"]]
        record["agreement"] = float(np.mean([neighbour_overlap(means[name], means[o]) for o in others]))
    return records


def pipeline_stages(folder: Path) -> dict[str, tuple[str, Path]]:
    """The view and encoder file of each of a pipeline folder's six stages."""
    views = {stage: stage.rsplit("_", 1)[1] for stage in PIPELINE}
    return {stage: (view, folder / stage / f"encoder_{view}.pth") for stage, view in views.items()}


def study_runs(folder: Path, out: Path, device: str) -> list[str]:
    """Measure every seed of a ``coclr study --seeds`` folder (kept in ``out``); returns the run names."""
    from coclr.store.clipstore import ClipStore

    names = []
    for seed_folder in sorted((p for p in folder.glob("seed*") if p.is_dir()), key=lambda p: int(p.name[4:])):
        if not (seed_folder / "results.json").is_file():
            print(f"{seed_folder}: not finished, left out", flush=True)
            continue
        name = f"study_{seed_folder.name}"
        names.append(name)
        target = out / f"{name}.json"
        if target.is_file():
            continue
        print(f"{name}:", flush=True)
        stages = pipeline_stages(seed_folder / "pipeline")
        stages["ubernce_rgb"] = ("rgb", seed_folder / "ubernce_rgb" / "checkpoint_last.pth")
        store = ClipStore(seed_folder / "store")
        labels = {e.path: (e.label_id, e.split) for e in store.index.entries}
        records = measure_run(stages, seed_folder / "store", ("train", "test"), None, labels,
                              len(store.index.classes), device)
        target.write_text(json.dumps(records, indent=1))
    return names


def learn_runs(folder: Path, out: Path, device: str) -> list[str]:
    """Measure every ``learn<S>`` run of a ``benchmarks/learn_synth.py`` folder (kept in ``out``)."""
    from coclr.learn.budget import QUALITY_VIDEOS
    from coclr.learn.run import common_root
    from coclr.learn.stages import sample_keys

    names = []
    for run in sorted((p for p in folder.glob("learn*") if p.is_dir()), key=lambda p: int(p.name[5:])):
        if (json.loads((run / "learn.json").read_text()) if (run / "learn.json").is_file() else {}).get(
                "status") != "done":
            print(f"{run}: not finished, left out", flush=True)
            continue
        name = f"learn_seed{run.name[5:]}"
        names.append(name)
        target = out / f"{name}.json"
        if target.is_file():
            continue
        print(f"{name}:", flush=True)
        data = folder / f"data{run.name[5:]}"
        with (data / "labels.csv").open() as file:
            rows = list(csv.DictReader(file))
        classes = sorted({row["label"] for row in rows})
        by_path = {os.path.abspath(data / row["path"]): (classes.index(row["label"]), row["split"]) for row in rows}
        root = common_root(json.loads((run / "inputs.json").read_text())["videos"])
        from coclr.store.clipstore import ClipStore

        store = ClipStore(run / "store")
        labels = {e.path: by_path[os.path.join(root, e.path)] for e in store.index.entries}
        stages = pipeline_stages(run / "pipeline")
        records = measure_run(stages, run / "store", ("train",), sample_keys(run / "store", QUALITY_VIDEOS), labels,
                              len(classes), device)
        exported = json.loads((run / "learn.json").read_text()).get("exported")
        target.write_text(json.dumps({"stages": records, "exported": exported}, indent=1))
    return names


# ------------------------------------------------------------------------------------------------ analysis


def ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties given their mean rank."""
    order = np.argsort(values, kind="stable")
    result = np.empty(len(values))
    sorted_values = values[order]
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and sorted_values[end + 1] == sorted_values[start]:
            end += 1
        result[order[start: end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return result


def spearman(x, y) -> float | None:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(x) < 3:
        return None
    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return 0.0
    return float(np.corrcoef(rx, ry)[0, 1])


def mean_interval(values: list[float], seed: int = 0) -> tuple[float, float, float]:
    """The mean and its 95% percentile bootstrap interval (resampling the values)."""
    values = np.asarray([v for v in values if v is not None], dtype=float)
    if len(values) == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), (BOOTSTRAP, len(values)))].mean(axis=1)
    return float(values.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def value(record: dict, measure: str) -> float:
    raw = record.get(measure)
    return float("nan") if raw is None else MEASURES[measure] * float(raw)


def run_stages(run: dict) -> dict[str, dict]:
    return run.get("stages", run)


def correlations(runs: dict[str, dict], target: str, pipeline_only: bool = True) -> dict[str, dict]:
    """Per measure: rho within each run (its pipeline's stages), within each (run, view), and pooled."""
    table = {}
    for measure in MEASURES:
        within, per_view, pooled_x, pooled_y = [], [], [], []
        for run in runs.values():
            stages = {k: v for k, v in run_stages(run).items() if not pipeline_only or k in PIPELINE}
            within.append(spearman([value(s, measure) for s in stages.values()],
                                   [s[target] for s in stages.values()]))
            for view in VIEWS:
                chosen = [s for s in stages.values() if s["view"] == view]
                per_view.append(spearman([value(s, measure) for s in chosen], [s[target] for s in chosen]))
            pooled_x += [value(s, measure) for s in stages.values()]
            pooled_y += [s[target] for s in stages.values()]
        table[measure] = {"within": within, "within_mean": mean_interval(within),
                          "view_mean": mean_interval(per_view), "pooled": spearman(pooled_x, pooled_y)}
    return table


def export(stages: dict[str, dict], view: str, rule: str) -> str | None:
    """The stage a rule exports for ``view`` among the healthy pipeline stages: ``last`` or a measure's best (ties
    to the later stage)."""
    healthy = [name for name in PIPELINE if name in stages and stages[name]["view"] == view
               and not stages[name]["collapsed"]]
    if not healthy:
        return None
    if rule == "last":
        return healthy[-1]
    scores = [value(stages[name], rule) for name in healthy]
    best = max(range(len(healthy)), key=lambda i: (scores[i] if np.isfinite(scores[i]) else -np.inf, i))
    return healthy[best]


def export_table(runs: dict[str, dict], rules: list[str]) -> dict[str, dict]:
    """For each rule: per (run, view) the exported stage's R@1 minus the last stage's and minus the best's."""
    result = {}
    for rule in rules:
        below_last, short_of_best, picks = [], [], []
        for name, run in runs.items():
            stages = run_stages(run)
            for view in VIEWS:
                chosen = export(stages, view, rule)
                names = [s for s in PIPELINE if stages[s]["view"] == view]
                if chosen is None:
                    continue
                last, best = stages[names[-1]]["R@1"], max(stages[s]["R@1"] for s in names)
                below_last.append(stages[chosen]["R@1"] - last)
                short_of_best.append(best - stages[chosen]["R@1"])
                picks.append(f"{name}/{view}: {chosen}")
        result[rule] = {"minus_last": below_last, "short_of_best": short_of_best, "picks": picks}
    return result


def print_set(title: str, runs: dict[str, dict]) -> dict[str, dict]:
    print(f"\n## {title} ({len(runs)} runs)\n")
    print("| stage | " + " | ".join(runs) + " |")
    print("|---|" + "---|" * len(runs))
    for stage in [*PIPELINE, "ubernce_rgb"]:
        cells = []
        for run in runs.values():
            record = run_stages(run).get(stage)
            cells.append("-" if record is None else f"{record['R@1']:.1f} / {record['LP']:.1f}"
                         + (" ‡" if record["collapsed"] else ""))
        if any(cell != "-" for cell in cells):
            print(f"| {stage} (R@1 / LP) | " + " | ".join(cells) + " |")
    for measure in MEASURES:
        print(f"| {measure} | " + " | ".join(
            ", ".join(f"{run_stages(run)[s].get(measure) or float('nan'):.3g}" for s in PIPELINE)
            for run in runs.values()) + " |")
    tables = {}
    for target in ("R@1", "LP"):
        table = correlations(runs, target)
        tables[target] = table
        print(f"\nSpearman with {target} (six pipeline stages; mean [95% bootstrap interval]):\n")
        print("| measure | within a run | each run | within a view | pooled |")
        print("|---|---|---|---|---|")
        for measure, row in table.items():
            mean, low, high = row["within_mean"]
            vmean, vlow, vhigh = row["view_mean"]
            each = ", ".join("-" if v is None else f"{v:+.2f}" for v in row["within"])
            pooled = "-" if row["pooled"] is None else f"{row['pooled']:+.2f}"
            print(f"| {measure} | {mean:+.2f} [{low:+.2f}, {high:+.2f}] | {each} | {vmean:+.2f} [{vlow:+.2f}, "
                  f"{vhigh:+.2f}] | {pooled} |")
    with_oracle = correlations(runs, "R@1", pipeline_only=False)
    if any(len(run_stages(run)) > len(PIPELINE) for run in runs.values()):
        print("\nWith the oracle's stage too (seven stages), Spearman with R@1 within a run: "
              + ", ".join(f"{m} {row['within_mean'][0]:+.2f}" for m, row in with_oracle.items()))
    return tables


def print_exports(runs: dict[str, dict], rules: list[str]) -> None:
    print("\n| rule | exported R@1 - last stage's (min, mean) | best stage's - exported (mean, max) | picks |")
    print("|---|---|---|---|")
    for rule, row in export_table(runs, rules).items():
        print(f"| {rule} | {min(row['minus_last']):+.1f}, {np.mean(row['minus_last']):+.1f} | "
              f"{np.mean(row['short_of_best']):.1f}, {max(row['short_of_best']):.1f} | {'; '.join(row['picks'])} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", type=Path, help="a coclr study --seeds folder (the development runs)")
    parser.add_argument("--learn", type=Path, help="a benchmarks/learn_synth.py --work folder (the confirmation)")
    parser.add_argument("--out", type=Path, required=True, help="folder of the measured figures (<run>.json)")
    parser.add_argument("--choose", help="the measure chosen on the development runs (when analysing only learn)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sets = {}
    if args.study:
        sets["development: the quick study"] = study_runs(args.study, args.out, args.device)
    if args.learn:
        sets["confirmation: coclr learn on the synthetic videos"] = learn_runs(args.learn, args.out, args.device)
    chosen = args.choose
    everything = {}
    for title, names in sets.items():
        runs = {name: json.loads((args.out / f"{name}.json").read_text()) for name in names}
        everything.update(runs)
        tables = print_set(title, runs)
        if title.startswith("development"):
            by_rho = {m: (row["within_mean"][0], tables["LP"][m]["within_mean"][0])
                      for m, row in tables["R@1"].items()}
            chosen = max(by_rho, key=lambda m: by_rho[m])
            print(f"\nThe score chosen by the plan's rule (highest mean within-run rho with R@1): {chosen}")
        print_exports(runs, ["last", *([chosen] if chosen else []), *[m for m in MEASURES if m != chosen]])
    if len(sets) > 1:
        print_set("all runs", everything)
        print_exports(everything, ["last", chosen])


if __name__ == "__main__":
    main()
