"""``OUT/report.html`` of a learn run: what was learnt, how training went, how good each stage is without
labels, and what the encoders find alike.

One self-contained page (images are ``data:`` URIs; no script, no network): the plan and the time of each phase,
the training loss of every stage, the label-free measures of every stage (a collapsed one marked, and so is
everything computed from it), the scores on labels when given, a sample of videos with their nearest neighbours
in the two-stream embedding (animated thumbnails from the store, every video named), and every input video with
what became of it.
"""

from __future__ import annotations

import html
import io
import os
from pathlib import Path
from typing import Any

import numpy as np

from coclr.atomic import atomic_write_text, read_json_lines
from coclr.curate.groups import stretches_text
from coclr.data.sampling import spread
from coclr.embed.output import Embeddings
from coclr.embed.search import search
from coclr.eval.gallery import (
    NEIGHBOUR_COLOUR,
    PAGE_STYLE,
    QUERY_COLOUR,
    animated_gif,
    data_uri,
    gallery_row,
    thumbnail_frames,
    video_cell,
)
from coclr.learn.stages import start_text, trained_steps
from coclr.progress import duration
from coclr.store.clipstore import ClipStore
from coclr.text import html_name, on_page

SAMPLE_QUERIES = 8
NEIGHBOURS = 4
COLLAPSED_MARK = "‡"
REPORT_STYLE = PAGE_STYLE + """
h2 { font-size: 15px; margin-top: 22px; } table.data td, table.data th { border: 1px solid #ccc; font-size: 12px; }
table.data th { background: #f0f0f0; text-align: left; padding: 4px 6px; } td.bad, li.bad { color: #d62728; }
ul.videos { font-size: 12px; columns: 3; overflow-wrap: anywhere; } .mark { color: #d62728; font-weight: bold; }
p.alarm { border: 2px solid #d62728; padding: 8px; color: #d62728; font-weight: bold; }
"""


def write_report(path: Path, out: Path, result: dict[str, Any], paths: list[str]) -> Path:
    """Write the report of the run in ``out`` (its ``result``: what ``learn.json`` records) for the input
    videos ``paths``."""
    store = ClipStore(out / "store")
    root = os.path.commonpath([os.path.dirname(p) for p in paths])
    collapsed = {stage for stage, entry in result.get("stages", {}).items() if entry.get("collapsed")}
    exported = {view: entry["stage"] for view, entry in result.get("exported", {}).items()}
    sections = [_alarm(result), _summary(result), _curves(out, result), _stages(result, collapsed, exported),
                _embeddings(result), _neighbours(out, store, root, result), _videos(paths, result)]
    name = Path(out).resolve().name  # (a run made as "." is named by its folder)
    title = f"coclr learn: {name}"
    page = ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(on_page(title))}</title><style>{REPORT_STYLE}</style></head><body>"
            f"<h1>coclr learn: {html_name(name)}</h1>{''.join(sections)}</body></html>\n")
    return atomic_write_text(path, page)


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table class="data"><tr>{head}</tr>{body}</table>'


def _number(value: Any, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _alarm(result: dict[str, Any]) -> str:
    """A warning at the top when every stage of a view collapsed: what it means and what to try."""
    views = [view for view, entry in result.get("exported", {}).items() if entry.get("collapsed")]
    return "".join(f'<p class="alarm">{COLLAPSED_MARK} Every {html.escape(view)} stage collapsed: encoder_'
                   f"{html.escape(view)}.pth and the embeddings from it carry nothing. Try a longer --budget, or more "
                   "(or longer) videos.</p>" for view in views)


def _coclr_epochs(plan: dict[str, Any]) -> str:
    """The CoCLR stages' epochs as trained: each sized as it started to the time left (``stage_epochs``), else as
    planned; and the run's training steps."""
    planned, sized = plan["epochs"]["coclr"], plan.get("stage_epochs") or {}
    if not sized:
        return f"of {planned} epochs per view ({plan['steps']} steps)"
    stages = ", ".join(f"{stage} {count}" for stage, count in sized.items())
    return (f"whose stages were sized as they started by the time left ({stages} epochs; {planned} planned), "
            f"{trained_steps(plan)} steps in all")


def _summary(result: dict[str, Any]) -> str:
    plan = result["plan"]
    model = plan["model"]
    phases = result.get("phases", {})
    measured = plan["estimates"].get("measure")  # (what it took, recorded with the plan it chose)
    rows = ([["measure", "", duration(measured)]] if measured is not None else []) + [
        [html.escape(name), duration(plan["estimates"].get(name, 0.0)), duration(phases[name])] for name in phases]
    failed = len(result.get("failed", []))
    text = (f"<p>{result['videos']} videos ({failed} left out of what failed for them, listed below), learnt "
            "without labels in "
            f"{duration(result.get('seconds', 0.0))} of a {duration(plan['budget'])} budget: S3D width "
            f"{model['width']:g}, clips of {model['length']} frames at {model['size']}x{model['size']} px, batch "
            f"{plan['batch']}; InfoNCE {plan['epochs']['infonce']} epochs per view, then two CoCLR cycles "
            f"{_coclr_epochs(plan)}.</p>")
    reasons = "".join(f"<li>{html.escape(reason)}</li>" for reason in plan.get("reasons", []))
    exported = "".join(f"<li>encoder_{html.escape(view)}.pth: {html.escape(entry['stage'])} "
                       f"({html.escape(entry['reason'])})</li>" for view, entry in result.get("exported", {}).items())
    started = "".join(f"<li>{html.escape(view)}: {start_text(entry, html_name, html.escape)}</li>"
                      for view, entry in plan.get("init", {}).items())
    if started:
        alone = " (the other view from scratch)" if len(plan["init"]) == 1 else ""
        text += f'<p class="note">Started from{alone}:</p><ul class="note">{started}</ul>'
    curated = result.get("curate")
    if curated:
        text += (f'<p>Near-duplicates, outliers and a map of every video: <a href="curate/index.html">curate/index.html'
                 f"</a> ({curated['groups']} near-duplicate group(s), "
                 f"{html.escape(stretches_text(curated['partial_pairs'], curated.get('stretches')))}; threshold "
                 f"{curated['threshold']:.4f}).</p>")
    return (f"<h2>The run</h2>{text}<p class=\"note\">Exported:</p><ul class=\"note\">{exported}</ul>"
            f"<p class=\"note\">Why this plan:</p><ul class=\"note\">{reasons}</ul>"
            + _table(["phase", "estimated", "took"], rows))


def _curves(out: Path, result: dict[str, Any]) -> str:
    """The loss per epoch of every stage, one line each, as a PNG."""
    import matplotlib  # noqa: PLC0415 (heavy)

    matplotlib.use("Agg")
    from matplotlib import pyplot  # noqa: PLC0415 (heavy)

    figure, axis = pyplot.subplots(figsize=(7, 3), dpi=100)
    offset = 0
    for stage in result.get("stages", {}):
        log = out / "pipeline" / stage / "log.jsonl"
        losses = [r["epoch_loss"] for r in read_json_lines(log) if isinstance(r, dict) and "epoch_loss" in r] \
            if log.is_file() else []
        if losses:
            axis.plot(np.arange(offset, offset + len(losses)) + 1, losses, marker=".", label=stage)
            offset += len(losses)
    axis.set_xlabel("epoch (stages one after the other)")
    axis.set_ylabel("training loss")
    axis.legend(fontsize=7, ncol=3)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    pyplot.close(figure)
    image = data_uri(buffer.getvalue(), "image/png")
    return f'<h2>Training</h2><img alt="training loss of every stage" src="{image}">'


def _stages(result: dict[str, Any], collapsed: set[str], exported: dict[str, str]) -> str:
    rows = []
    labelled = any(entry.get("labels") for entry in result.get("stages", {}).values())
    for stage, entry in result.get("stages", {}).items():
        mark = f' <span class="mark">{COLLAPSED_MARK} collapsed</span>' if stage in collapsed else ""
        mark += " (exported)" if exported.get(entry["view"]) == stage else ""
        rows.append([html.escape(stage) + mark, html.escape(entry["view"]), html.escape(entry["method"]),
                     _number(entry["effective_rank"]), _number(entry.get("rankme")), _number(entry["alignment"]),
                     _number(entry["uniformity"]), _percent(entry.get("temporal_retrieval")),
                     _percent(entry.get("neighbour_stability")), _percent(entry.get("agreement"))])
        if labelled:
            rows[-1].append(_number((entry.get("labels") or {}).get("R@1"), 1))
    agreement = [[html.escape(name), " + ".join(html.escape(stage) + (f' <span class="mark">{COLLAPSED_MARK}</span>'
                                                                      if stage in collapsed else "")
                                                for stage in entry["stages"]),
                  _percent(entry["nearest_neighbour"]), _percent(entry["chance"])]
                 for name, entry in result.get("agreement", {}).items()]
    note = ("<p class=\"note\">Measured without labels on the stored videos, over the training instances (a video, "
            "or a stretch of a long one; an instance's neighbours are never of its own video): effective rank and "
            "RankMe of the features (higher: more directions used), alignment (mean squared distance of two halves "
            "of an instance; lower is better) and uniformity (log of the mean Gaussian potential between instances; "
            "lower is better), Wang and Isola 2020; the share of instances whose first half finds their own second "
            "half (temporal retrieval), the share of an instance's 5 nearest that stay its nearest through the other "
            "half (stable neighbours), and the share of them that the other view's stages find too (agreement). "
            f"{COLLAPSED_MARK}: the features have no spread (a collapsed encoder carries nothing). Below: how often "
            "the RGB and flow encoders find the same nearest video.</p>")
    if any(entry.get("method") == "init" for entry in result.get("stages", {}).values()):
        note += ("<p class=\"note\">init_*: the encoder the run started from (--init, --flow-init), measured the "
                 "same way: whether adapting it to these videos helped.</p>")
    if labelled:
        note += ("<p class=\"note\">R@1 (labels): the given labels' videos among those measured, each video the mean "
                 "of its instances (never used to train or to choose the exported stage).</p>")
    return ("<h2>Each stage, without labels</h2>" + note
            + _table(["stage", "view", "method", "effective rank", "RankMe", "alignment", "uniformity",
                      "temporal retrieval (%)", "stable neighbours (%)", "agreement (%)"]
                     + (["R@1 (labels, %)"] if labelled else []), rows)
            + "<p></p>" + _table(["after", "encoders", "nearest neighbours agree (%)", "chance (%)"], agreement))


def _percent(value: Any) -> str:
    return _number(None if value is None else 100 * value, 1)


def _embeddings(result: dict[str, Any]) -> str:
    rows = []
    labels = (result.get("labels") or {}).get("embeddings", {})
    keys = list(dict.fromkeys(key for scores in labels.values() for key in scores if key.startswith(("R@", "kNN"))))
    for name, entry in result.get("embeddings", {}).items():
        mark = f' <span class="mark">{COLLAPSED_MARK} collapsed</span>' if entry.get("collapsed") else ""
        scores = labels.get(name, {})
        rows.append([html.escape(name) + mark, _number(entry["effective_rank"]), _number(entry["uniformity"]),
                     *[_number(scores.get(key), 1) for key in keys]])
    text = ""
    if result.get("labels"):
        info = result["labels"]
        protocol = next(iter(labels.values()), {}).get("protocol", "")
        text = (f"<p class=\"note\">Scored with the labels of {info['videos']} videos from "
                f"{html_name(info['file'])} (never used to train; {html.escape(protocol)}; chance about "
                f"{info['chance']:.1f}%).</p>")
        text += "".join(f"<p class=\"note\">{html.escape(note)}</p>" for note in info.get("notes", []))
    return ("<h2>The embeddings</h2><p class=\"note\">Every video embedded with the exported encoders "
            "(embeddings/rgb, flow, two_stream: the two-stream similarity is the mean of the two).</p>" + text
            + _table(["embedding", "effective rank", "uniformity", *keys], rows))


def _neighbours(out: Path, store: ClipStore, root: str, result: dict[str, Any]) -> str:
    embeddings = Embeddings(out / "embeddings" / "two_stream")
    count = len(embeddings.videos)
    if count < 2:
        return ""
    cache: dict[str, str] = {}

    def cell(path: str, colour: str, badge: str) -> str:
        key = os.path.relpath(path, root).replace(os.sep, "/")
        if key not in cache:
            cache[key] = data_uri(animated_gif(thumbnail_frames(store, key, "rgb", 8)))
        return video_cell(cache[key], key, colour, path, badge)

    rows = []
    for row in spread(count, SAMPLE_QUERIES):
        query = embeddings.video_records[int(row)]["path"]
        hits = search(embeddings, np.asarray(embeddings.videos[int(row)]), k=min(NEIGHBOURS, count - 1),
                      exclude=int(row))
        rows.append(gallery_row(cell(query, QUERY_COLOUR, "video"),
                                [cell(hit.path, NEIGHBOUR_COLOUR, f"#{hit.rank} {hit.score:.3f}") for hit in hits]))
    mark = (f' <span class="mark">{COLLAPSED_MARK} from a collapsed encoder</span>'
            if result.get("embeddings", {}).get("two_stream", {}).get("collapsed") else "")
    return (f"<h2>Nearest neighbours{mark}</h2><p class=\"note\">A sample of videos (blue) and their "
            f"{NEIGHBOURS} nearest videos in the two-stream embedding, with the cosine similarity; thumbnails are "
            f"animated.</p><table>{''.join(rows)}</table>")


def _videos(paths: list[str], result: dict[str, Any]) -> str:
    failed = {item["path"]: item["error"] for item in result.get("failed", [])}
    short = set(result.get("short_videos", []))
    items = []
    for path in paths:
        if path in failed:
            error = failed[path].removeprefix(f"{path}: ")  # (the error names the file first: it is named already)
            items.append(f'<li class="bad">{html_name(path)}: left out ({html_name(error)})</li>')
        elif path in short:
            items.append(f'<li class="bad">{html_name(path)}: shorter than one clip (padded by repeating its last '
                         "frame)</li>")
        else:
            items.append(f"<li>{html_name(path)}</li>")
    return (f"<h2>The videos</h2><p class=\"note\">{len(paths)} inputs, {len(failed)} left out, {len(short)} "
            f"shorter than one clip.</p><ul class=\"videos\">{''.join(items)}</ul>")
