"""A study's numbers: Table 1 beside the paper's, the paper's claims checked on them, and their spread over seeds.

Claims are checked on every column the study evaluated, and a claim whose rows are not all in the study is left
out. Over several seeds, every number gets its mean and standard deviation, every claim the count of seeds it held on
and whether it holds on the means, and every comparison behind a claim its paired difference: the difference of the
two rows on each seed (both rows of a seed share its data and its InfoNCE encoders), its mean and a 95% Student-t
interval. The spread of a row over seeds is mostly the seed's (its data and starting encoders), which a paired
difference cancels, so the interval can exclude 0 where the unpaired spreads overlap.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from coclr.atomic import atomic_open
from coclr.eval.health import describe_health
from coclr.eval.report import DEGENERATE_MARK as COLLAPSED_MARK
from coclr.eval.report import markdown_text
from coclr.study.config import COLUMNS, ROWS

METRICS = {"retrieval": "R@1", "linear": "linear probe", "finetune": "finetune"}
"""Each column's name in the claims."""

Getter = Callable[[dict[str, Any], str], "float | None"]


def row_value(row: dict[str, Any], column: str) -> float | None:
    """A row's number in ``column``: R@1 for retrieval, top-1 for the probe and finetuning (None: not evaluated)."""
    if column == "retrieval":
        return (row.get("retrieval") or {}).get("R@1")
    return row.get(f"{column}_top1")


CLAIMS: tuple[tuple[str, tuple[str, ...], Callable[..., Any]], ...] = (
    ("UberNCE-RGB > CoCLR-RGB > InfoNCE-RGB", ("ubernce_rgb", "coclr_rgb", "infonce_rgb"), lambda u, c, i: u > c > i),
    ("InfoNCE-Flow > InfoNCE-RGB", ("infonce_flow", "infonce_rgb"), lambda f, r: f > r),
    ("CoCLR-Flow > InfoNCE-Flow", ("coclr_flow", "infonce_flow"), lambda c, i: c > i),
    ("CoCLR two-stream above every other self-supervised row", ("coclr_two_stream", "*"),
     lambda two, *others: all(two > other for other in others)),
    ("CoCLR-RGB > CMC-RGB", ("coclr_rgb", "cmc_rgb"), lambda c, m: c > m),
    ("CoCLR-RGB K=5 >= K=1 and K=50", ("coclr_rgb", "coclr_k1_rgb", "coclr_k50_rgb"),
     lambda k5, k1, k50: k5 >= max(k1, k50)),
    ("CoCLR-RGB alternating >= sim", ("coclr_rgb", "coclr_sim_rgb"), lambda a, s: a >= s),
    ("CoCLR-RGB alternating with equal updates >= sim", ("coclr_equal_rgb", "coclr_sim_rgb"), lambda a, s: a >= s),
    ("gap closed by CoCLR-RGB", ("ubernce_rgb", "coclr_rgb", "infonce_rgb"),
     lambda u, c, i: (c - i) / (u - i) if u - i > 0 else None),
)
"""The paper's claims: name, the rows each compares (``"*"``: every other self-supervised row the study has, at
least one) and its verdict on their numbers (True/False, or the share of the InfoNCE-RGB to UberNCE-RGB gap that
CoCLR-RGB closes, None when there is no gap)."""

CLAIM_NOTES = {
    "CoCLR-Flow > InfoNCE-Flow": "on the built-in data it rests on the class precision of the positives RGB mines "
    "for flow (the mined positives below; docs/synth.md, issue 48)",
}
"""What a claim's line in ``results.md`` and ``seeds.md`` adds: what a verdict was found to rest on, by a test
pre-registered in docs/experiments/."""


def claim_note(claim: str) -> str:
    """The note a claim line (``"name (column)"``) ends with ('' when none: :data:`CLAIM_NOTES`)."""
    name = claim.rsplit(" (", 1)[0]
    return f" — {CLAIM_NOTES[name]}" if name in CLAIM_NOTES else ""


def _claims(rows: Sequence[dict[str, Any]], columns: Sequence[str]):
    """``(claim, row keys, verdict)`` of every claim whose rows the study has, per evaluated column."""
    by_key = {row["row"]: row for row in rows}
    for column in columns:
        values = {key: row_value(row, column) for key, row in by_key.items()}
        values = {key: value for key, value in values.items() if value is not None}
        for name, needs, test in CLAIMS:
            keys = [key for key in needs if key != "*"]
            if "*" in needs:
                keys += [key for key in values if not ROWS[key].labels and key not in keys]
            if all(key in values for key in keys) and len(keys) >= len(needs):
                yield f"{name} ({METRICS[column]})", keys, test(*(values[key] for key in keys))


def claims(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> dict[str, Any]:
    """The paper's claims (:data:`CLAIMS`) on these rows (``{"row": key, ...}`` records), per evaluated column."""
    return {claim: verdict for claim, _, verdict in _claims(rows, columns)}


def claim_rows(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> dict[str, list[str]]:
    """The rows each claim of :func:`claims` rests on."""
    return {claim: keys for claim, keys, _ in _claims(rows, columns)}


def collapsed_rows(rows: Sequence[dict[str, Any]], claim_keys: Sequence[str]) -> list[str]:
    """The rows among ``claim_keys`` whose encoder collapsed (``collapsed`` in their record; over seeds: on any)."""
    by_key = {row["row"]: row for row in rows}
    return [key for key in claim_keys if by_key[key].get("collapsed")]


def every_row_collapsed(rows: Sequence[dict[str, Any]]) -> bool:
    """Whether every row of one seed's study had a collapsed encoder: a study with nothing learnt to compare, which
    is not reported as done (exit status 3, as ``coclr learn`` when every stage of a view collapsed)."""
    return bool(rows) and all(row.get("collapsed") for row in rows)


def row_name(row: dict[str, Any]) -> str:
    """How a row is named in notes: ``Method (Input)``."""
    return f"{row['method']} ({row['view']})"


def collapse_caveat(rows: Sequence[dict[str, Any]], claim_keys: Sequence[str], seeds: int = 1) -> str:
    """What a claim line adds when it rests on a collapsed row ('' when none): which rows (over seeds, on how many
    of them), so that a verdict that holds for the wrong reason says so."""
    by_key = {row["row"]: row for row in rows}
    bad = collapsed_rows(rows, claim_keys)
    if not bad:
        return ""
    names = ", ".join(row_name(by_key[key]) + (f" on {int(by_key[key]['collapsed'])} of {seeds} seeds"
                                               if seeds > 1 else "") for key in bad)
    return f" [{COLLAPSED_MARK} rests on a collapsed encoder: {names}; no evidence either way]"


def collapse_warning(record: dict[str, Any]) -> str:
    """The note of a row whose ``record`` (linear probe or retrieval) had degenerate features: the mark, the task
    and the measures of the first stream and split that failed (:mod:`coclr.eval.health`)."""

    measures = next(stream[split] for stream in record["feature_health"] for split in ("train", "test")
                    if stream[split]["degenerate"])
    return (f"{COLLAPSED_MARK} collapsed encoder: degenerate features in the {record['task']} evaluation "
            f"({describe_health(measures)}): its numbers are no evidence of a representation")


def claim_text(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "undefined (UberNCE-RGB is not above InfoNCE-RGB)" if value is None else f"{100 * value:.0f}%"


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def table_markdown(rows: Sequence[dict[str, Any]], columns: Sequence[str], with_paper: bool = True,
                   cell: Callable[[dict[str, Any], str], str] | None = None) -> list[str]:
    """Table 1's layout: Method | Input | Labels, then each evaluated column (with the paper's number beside it),
    then R@5/10/20 when retrieval was evaluated. ``cell(row, key)`` formats a number (default: one decimal)."""
    cell = cell or (lambda row, key: _cell(_lookup(row, key)))
    names = {"linear": "Linear probe", "finetune": "Finetune", "retrieval": "R@1"}
    keys: list[tuple[str, str]] = []
    for column in COLUMNS:
        if column in columns:
            keys.append((names[column], column))
            if with_paper:
                keys.append(("paper", f"paper_{column}"))
    if "retrieval" in columns:
        keys += [(f"R@{k}", f"R@{k}") for k in (5, 10, 20)]
    lines = ["| Method | Input | Labels | " + " | ".join(name for name, _ in keys) + " |",
             "|---|---|---|" + "---:|" * len(keys)]
    for row in rows:
        labels = "✓" if row["labels"] else "✗"
        lines.append(f"| {row['method']}{row.get('marks', '')} | {row['view']} | {labels} | "
                     + " | ".join(cell(row, key) for _, key in keys) + " |")
    return lines


def _lookup(row: dict[str, Any], key: str) -> float | None:
    if key.startswith("paper_"):
        return (row.get("paper") or {}).get(key[len("paper_"):])
    if key.startswith("R@"):
        return (row.get("retrieval") or {}).get(key)
    return row_value(row, key)


def results_markdown(rows: Sequence[dict[str, Any]], columns: Sequence[str], checks: dict[str, Any],
                     seconds: float, seed: int, stages: Sequence[dict[str, Any]] = (), notes: Sequence[str] = (),
                     title: str = "coclr study") -> str:
    """``results.md``: the table beside the paper's numbers, the claims, the stages of co-training, notes.
    ``seconds``: the wall time of the command that wrote it (a continued study counts only its last command)."""
    lines = [f"# {title} (seed {seed}; this command took {seconds / 60:.1f} min)", "",
             "Numbers in percent; 'paper': Table 1 of the paper (UCF101 split 1). Test videos query train videos.",
             "", *table_markdown(rows, columns), ""]
    if notes:  # (a note names videos: a name's Markdown shown as written)
        lines += [*(f"- {markdown_text(note)}" for note in notes), ""]
    resting = claim_rows(rows, columns)
    if checks:  # (a heading with nothing under it where the rows chosen test no claim)
        lines += ["Claims of the paper on these results:", ""]
        lines += [f"- {claim}: {claim_text(value)}{collapse_caveat(rows, resting.get(claim, []))}{claim_note(claim)}"
                  for claim, value in checks.items()]
    else:
        lines.append("No claim of the paper rests on these rows alone (each compares rows this study did not run).")
    if stages:
        lines += ["", "Pretraining stages: R@1 of the network each trained, and for CoCLR the share of its mined "
                  "positives (top-K in the other view) that had the query's class:", "",
                  "| Stage | Trains | R@1 | Mined positives of the class (%) |", "|---|---|---|---|"]
        for stage in stages:
            precision = stage["mined_precision"]
            shown = "-" if precision is None else f"{precision:.1f}"
            lines.append(f"| {stage['stage']} | {stage['view']} | {stage['R@1']:.1f} | {shown} |")
    mined = [row for row in rows if row.get("mined_precision") is not None]
    if mined:
        lines += ["", "Mined positives of the query's class per CoCLR row (%, the mean over the stages that trained "
                  "its encoder):", "", *(f"- {row_name(row)}: {row['mined_precision']:.1f}" for row in mined)]
    lines += ["", "Files: `results.json`, `table.md`, `stage_recall.png` (R@1 across the co-training stages), "
              "`gallery.html` (test queries and their nearest train videos), `eval/` (full records), `configs/` "
              "(every training configuration used), `logs/`."]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------- seeds


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


PAIRS: tuple[tuple[str, str, str], ...] = (
    ("UberNCE-RGB - CoCLR-RGB", "ubernce_rgb", "coclr_rgb"),
    ("CoCLR-RGB - InfoNCE-RGB", "coclr_rgb", "infonce_rgb"),
    ("InfoNCE-Flow - InfoNCE-RGB", "infonce_flow", "infonce_rgb"),
    ("CoCLR-Flow - InfoNCE-Flow", "coclr_flow", "infonce_flow"),
    ("CoCLR two-stream - CoCLR-RGB", "coclr_two_stream", "coclr_rgb"),
    ("CoCLR-RGB - CMC-RGB", "coclr_rgb", "cmc_rgb"),
    ("CoCLR-RGB K=5 - K=1", "coclr_rgb", "coclr_k1_rgb"),
    ("CoCLR-RGB K=5 - K=50", "coclr_rgb", "coclr_k50_rgb"),
    ("CoCLR-RGB alternating - sim", "coclr_rgb", "coclr_sim_rgb"),
    ("CoCLR-RGB alternating with equal updates - sim", "coclr_equal_rgb", "coclr_sim_rgb"),
    ("CoCLR-RGB alternating with equal updates - alternating", "coclr_equal_rgb", "coclr_rgb"),
    ("CoCLR-Flow mined by UberNCE-RGB - InfoNCE-Flow", "coclr_ubernce_miner_flow", "infonce_flow"),
    ("CoCLR-Flow mined by InfoNCE-RGB (frozen) - InfoNCE-Flow", "coclr_infonce_miner_flow", "infonce_flow"),
    ("CoCLR-Flow mined by UberNCE-RGB - CoCLR-Flow", "coclr_ubernce_miner_flow", "coclr_flow"),
    ("CoCLR-Flow - CoCLR-Flow mined by InfoNCE-RGB (frozen)", "coclr_flow", "coclr_infonce_miner_flow"),
    ("CoCLR-Flow mined in both views - InfoNCE-Flow", "coclr_both_flow", "infonce_flow"),
    ("CoCLR-Flow mined in both views - CoCLR-Flow", "coclr_both_flow", "coclr_flow"),
    ("CoCLR-RGB mined in both views - CoCLR-RGB", "coclr_both_rgb", "coclr_rgb"),
)
"""The comparisons behind the paper's claims, as ``(name, row a, row b)``: the claim expects a - b > 0 (>= 0 for
K and the schedule). The last four compare the miners of CoCLR-Flow (issue 48): if the quality of RGB's mining
limits what co-training does for flow, each is positive (a better miner, a larger gain). The last three compare
mining in both views' summed similarity with mining in the other view's (issue 59)."""

T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
"""The 0.975 quantile of Student's t with 1..30 degrees of freedom."""


def t_quantile_975(dof: int) -> float:
    """The 0.975 quantile of Student's t: the table up to 30 degrees of freedom, then the Cornish-Fisher
    expansion around the normal quantile (within 1e-3 beyond 30)."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {dof}")
    if dof <= len(T_975):
        return T_975[dof - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * dof) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * dof ** 2)


def paired_interval(differences: Sequence[float]) -> dict[str, Any]:
    """Mean of paired differences and its 95% Student-t interval (None with fewer than two)."""
    mean, std = mean_std(differences)
    if len(differences) < 2:
        return {"mean": mean, "interval": None, "seeds": len(differences)}
    half = t_quantile_975(len(differences) - 1) * std / math.sqrt(len(differences))
    return {"mean": mean, "interval": (mean - half, mean + half), "seeds": len(differences)}


def paired_differences(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per comparison of :data:`PAIRS` whose rows every seed evaluated, per column: each seed's difference (a - b,
    in points), their mean and 95% interval; and of the rows' mined precision where both record it."""
    found: dict[str, Any] = {}
    columns = results[0]["columns"]
    measures = [(METRICS[column], lambda row, column=column: row_value(row, column)) for column in columns]
    measures.append(("mined precision", lambda row: row.get("mined_precision")))
    for name, a, b in PAIRS:
        for label, value in measures:
            per_seed = []
            for result in results:
                by_key = {row["row"]: row for row in result["rows"]}
                values = [value(by_key[key]) if key in by_key else None for key in (a, b)]
                per_seed.append(None if None in values else values[0] - values[1])
            if per_seed and None not in per_seed:
                found[f"{name} ({label})"] = {"per_seed": per_seed, **paired_interval(per_seed)}
    return found


def summarise_seeds(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Over the ``results.json`` of several seeds: every row's numbers as mean and standard deviation, every
    claim's count of seeds it held on (for the gap: each seed's share) and its verdict on the means."""
    columns = results[0]["columns"]
    rows = []
    for index, first in enumerate(results[0]["rows"]):
        row = {key: first.get(key) for key in ("row", "method", "view", "labels", "paper")}
        row["collapsed"] = sum(bool(r["rows"][index].get("collapsed")) for r in results)
        if row["collapsed"]:
            row["marks"] = f" {COLLAPSED_MARK}"
        for key in ("linear_top1", "finetune_top1"):
            values = [r["rows"][index].get(key) for r in results]
            if all(v is not None for v in values):
                row[key] = mean_std(values)
        retrieval = [r["rows"][index].get("retrieval") for r in results]
        if all(retrieval):
            row["retrieval"] = {k: mean_std([r[k] for r in retrieval]) for k in retrieval[0]}
        precision = [r["rows"][index].get("mined_precision") for r in results]
        if all(v is not None for v in precision):
            row["mined_precision"] = mean_std(precision)
        rows.append(row)
    means = [{**row, **{k: v[0] for k, v in row.items() if k.endswith("_top1")},
              "retrieval": {k: v[0] for k, v in row.get("retrieval", {}).items()} or None} for row in rows]
    on_means = claims(means, columns)
    resting = claim_rows(means, columns)
    summary = {}
    for claim, verdict in on_means.items():
        per_seed = [r["claims"].get(claim) for r in results]
        if claim.startswith("gap closed"):
            shares = [v for v in per_seed if v is not None]
            summary[claim] = {"per_seed": per_seed, "mean_std": mean_std(shares) if shares else None,
                              "on_means": verdict}
        else:
            summary[claim] = {"held_on": sum(bool(v) for v in per_seed), "seeds": len(per_seed), "on_means": verdict}
        summary[claim]["rows"] = resting[claim]
    found = {"seeds": [r["seed"] for r in results], "columns": columns, "rows": rows, "claims": summary,
             "paired": paired_differences(results)}
    points = mining_points(results)
    if points:
        found["mining"] = points
    return found


MINING_BASELINE = ("infonce_flow", "Flow")
"""What the gain of a CoCLR-Flow row is measured against: InfoNCE-Flow (its start), on the flow rows."""


def mining_points(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per seed and CoCLR row of flow that records ``mined_precision`` (the mean over its stages of the
    share of its mined positives that had the query's class, in percent): that precision and the row's R@1 minus
    InfoNCE-Flow's on the same seed (``gain``), for the plot of the gain against the miner's quality."""
    baseline, view = MINING_BASELINE
    points = []
    for result in results:
        by_key = {row["row"]: row for row in result["rows"]}
        if baseline not in by_key or row_value(by_key[baseline], "retrieval") is None:
            continue
        for row in result["rows"]:
            value = row_value(row, "retrieval")
            if row.get("view") == view and row.get("mined_precision") is not None and value is not None:
                points.append({"seed": result["seed"], "row": row["row"], "method": row["method"],
                               "mined_precision": row["mined_precision"],
                               "gain": value - row_value(by_key[baseline], "retrieval")})
    return points


def seeds_markdown(summary: dict[str, Any]) -> str:
    """The summary of :func:`summarise_seeds` as Markdown: mean ± std per number (the value alone over one seed,
    which has no spread), then the claims."""
    seeds, rows = summary["seeds"], summary["rows"]

    def mean_and_spread(pair: Sequence[float]) -> str:
        return f"{pair[0]:.1f}" if len(seeds) < 2 else f"{pair[0]:.1f} ± {pair[1]:.1f}"

    def cell(row: dict[str, Any], key: str) -> str:
        value = _lookup_pair(row, key)
        if value is None:
            return "-"
        return f"{value:.1f}" if isinstance(value, float) else mean_and_spread(value)

    told = ("Mean ± standard deviation over the seeds" if len(seeds) > 1 else "The one seed's figures (no spread)")
    lines = [f"# coclr study over seeds {', '.join(map(str, seeds))}", "",
             f"{told}, in percent; 'paper': Table 1 of the paper.", "",
             *table_markdown(rows, summary["columns"], cell=cell), ""]
    collapsed = [f"- {row_name(row)}: {COLLAPSED_MARK} its encoder collapsed on {row['collapsed']} of {len(seeds)} "
                 "seeds (degenerate features: `seed<S>/results.md` says which): its mean is no evidence of a "
                 "representation" for row in rows if row.get("collapsed")]
    lines += [*collapsed, ""] if collapsed else []
    lines += ["Claims of the paper: on how many seeds each held, and on the means:", ""]
    for claim, entry in summary["claims"].items():
        caveat = collapse_caveat(rows, entry.get("rows", []), len(seeds))
        if "held_on" in entry:
            lines.append(f"- {claim}: {entry['held_on']} of {entry['seeds']} seeds; on the means: "
                         f"{claim_text(entry['on_means'])}{caveat}{claim_note(claim)}")
        else:
            spread, defined = entry["mean_std"], sum(v is not None for v in entry["per_seed"])
            over = ("over the seeds" if defined == len(entry["per_seed"]) else
                    f"over the {defined} of {len(entry['per_seed'])} seeds where it is defined")
            shown = ("undefined on every seed" if spread is None else f"{100 * spread[0]:.0f}% (one seed: no spread)"
                     if defined == 1 else f"{100 * spread[0]:.0f}% ± {100 * spread[1]:.0f}% {over}")
            per_seed = ", ".join(claim_text(v) for v in entry["per_seed"])
            lines.append(f"- {claim}: {shown} ({per_seed}); on the means: {claim_text(entry['on_means'])}{caveat}")
    paired = summary.get("paired") or {}
    if paired:
        lines += ["", "Paired differences (the two rows on the same seed), in points: mean [95% interval], then each "
                  "seed's:", ""]
        for name, entry in paired.items():
            interval = entry["interval"]
            shown = "no interval (one seed)" if interval is None else f"[{interval[0]:+.1f}, {interval[1]:+.1f}]"
            per_seed = ", ".join(f"{d:+.1f}" for d in entry["per_seed"])
            lines.append(f"- {name}: {entry['mean']:+.1f} {shown} ({per_seed})")
    mined = [row for row in rows if row.get("mined_precision")]
    if mined:
        told = "mean ± standard deviation over the seeds" if len(seeds) > 1 else "the one seed's"
        lines += ["", f"Mined positives of the query's class (%, mean over the row's CoCLR stages; {told}):", ""]
        lines += [f"- {row_name(row)}: {mean_and_spread(row['mined_precision'])}" for row in mined]
    if summary.get("mining"):
        lines += ["", f"`{MINING_PLOT}`: each CoCLR row of flow's R@1 minus InfoNCE-Flow's against its mined "
                  "positives' class precision, one point per seed."]
    return "\n".join(lines) + "\n"


MINING_PLOT = "mined_precision_flow.png"
"""The plot of :func:`plot_mining` in a study's folder over seeds."""


def plot_mining(points: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """CoCLR-Flow's gain over InfoNCE-Flow (R@1, points) against the class precision of its mined positives (%),
    one point per (seed, row) of :func:`mining_points`, one colour per row (its miner), each row's mean as a
    larger mark; the seed is written beside each point."""
    import matplotlib  # noqa: PLC0415 (heavy)

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt  # noqa: PLC0415 (heavy)

    figure, axes = plt.subplots(figsize=(6.4, 4.2), dpi=120)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for number, key in enumerate(dict.fromkeys(point["row"] for point in points)):
        mine = [point for point in points if point["row"] == key]
        xs, ys = [p["mined_precision"] for p in mine], [p["gain"] for p in mine]
        colour = colours[number % len(colours)]
        label = mine[0]["method"] + (" (mined by the latest CoCLR-RGB)" if key == "coclr_flow" else "")
        axes.scatter(xs, ys, color=colour, s=22, label=label)
        for point in mine:
            axes.annotate(str(point["seed"]), (point["mined_precision"], point["gain"]), fontsize=6,
                          xytext=(3, 2), textcoords="offset points", color=colour)
        axes.scatter([sum(xs) / len(xs)], [sum(ys) / len(ys)], color=colour, s=110, marker="D", edgecolor="black")
    axes.axhline(0.0, color="gray", linewidth=1)
    axes.set_xlabel("mined positives of the query's class (%, mean over the flow stages)")
    axes.set_ylabel("R@1 minus InfoNCE-Flow's (points)")
    axes.set_title("CoCLR-Flow's gain against the quality of its miner (◆: mean over the seeds)", fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="best")
    figure.tight_layout()
    with atomic_open(path, "wb") as file:
        figure.savefig(file, format="png")
    plt.close(figure)
    return Path(path)


def _lookup_pair(row: dict[str, Any], key: str):
    if key.startswith("paper_"):
        return (row.get("paper") or {}).get(key[len("paper_"):])
    if key.startswith("R@"):
        return (row.get("retrieval") or {}).get(key)
    return row.get("retrieval", {}).get("R@1") if key == "retrieval" else row.get(f"{key}_top1")
