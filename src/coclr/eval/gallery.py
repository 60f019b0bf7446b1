"""An HTML retrieval gallery (the paper's Figure 5): test queries and their top-3 train neighbours.

Every video is shown as a small animated GIF made from frames of the store, with its class name; a
neighbour's border is green when its class is the query's (a hit) and red otherwise. The page is
self-contained (images are ``data:`` URIs, no script, no network access), so it can be mailed or archived.
"""

from __future__ import annotations

import base64
import html
import io
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import cv2
import numpy as np

from coclr.atomic import atomic_write_text
from coclr.data.sampling import spread
from coclr.text import html_name, on_page

HIT_COLOUR = "#1fa336"
MISS_COLOUR = "#d62728"
QUERY_COLOUR = "#3b5bdb"
NEIGHBOUR_COLOUR = "#999999"
"""A neighbour's border where no label says whether it is of the query's class."""


def choose_queries(query_labels: Sequence[int], count: int) -> list[int]:
    """Up to ``count`` query positions: the first query of classes spread evenly over the classes present
    (deterministic, one per class, so the gallery shows variety rather than one class)."""
    labels = np.asarray(query_labels)
    classes = np.unique(labels)
    if len(classes) == 0 or count <= 0:
        return []
    picked = classes[spread(len(classes), count)]
    return [int(np.flatnonzero(labels == label)[0]) for label in picked]


def thumbnail_frames(store, key: str, view: str, num_frames: int = 8, height: int = 64) -> np.ndarray:
    """``num_frames`` frames spread evenly over a stored video, resized to ``height`` pixels (aspect kept)."""
    return thumbnail(store.num_frames(key, view), lambda indices: store.read(key, view, indices), num_frames, height)


def thumbnail(total: int, read: Callable[[np.ndarray], np.ndarray], num_frames: int = 8,
              height: int = 64) -> np.ndarray:
    """``num_frames`` of ``total`` frames spread evenly, resized to ``height`` pixels (aspect kept); ``read``
    gives the frames ``uint8 [T, H, W, 3]`` at the indices it is passed (from a store, or a video file)."""

    indices = spread(total, num_frames)
    frames = read(indices)
    width = max(1, round(frames.shape[2] * height / frames.shape[1]))
    return np.stack([cv2.resize(frame, (width, height), interpolation=cv2.INTER_AREA) for frame in frames])


def animated_gif(frames: np.ndarray, fps: float = 6.0) -> bytes:
    """``uint8 [T, H, W, 3]`` frames -> the bytes of a looping animated GIF."""
    from PIL import Image  # noqa: PLC0415 (optional)

    images = [Image.fromarray(frame).convert("P", palette=Image.Palette.ADAPTIVE, colors=255) for frame in frames]
    buffer = io.BytesIO()
    images[0].save(buffer, format="GIF", save_all=True, append_images=images[1:], duration=round(1000 / fps),
                   loop=0, disposal=1)
    return buffer.getvalue()


def data_uri(data: bytes, mime: str = "image/gif") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def video_cell(uri: str, name: str, colour: str, title: str, badge: str, detail: str = "") -> str:
    """One video of the page: its animated thumbnail (a ``data:`` URI) with a badge and a caption, ``name`` (a
    video's or a class's, isolated: :func:`coclr.text.html_name`) then ``detail`` (a span, a score)."""
    return (f'<figure class="video" style="border-color:{colour}" title="{html.escape(on_page(title))}">'
            f'<img src="{uri}" alt="{html.escape(on_page(name))}"><figcaption><b>{html.escape(badge)}</b> '
            f"{html_name(name)}{html.escape(detail)}</figcaption></figure>")


def short_names(paths: Sequence[str]) -> list[str]:
    """How a page captions videos: each path relative to the folder every one of them is in (``a.mp4``,
    ``x/clip.mp4`` and ``y/clip.mp4``: two files of one name stay apart); the paths as they are where they share
    none (relative and absolute paths mixed)."""
    try:
        common = os.path.commonpath([os.path.dirname(path) for path in paths]) if paths else ""
    except ValueError:
        return list(paths)
    return [os.path.relpath(path, common) if common else path for path in paths]


PAGE_STYLE = """
body { font-family: sans-serif; background: #ffffff; color: #222; margin: 16px; }
h1 { font-size: 18px; } p.note { font-size: 12px; color: #555; }
table { border-collapse: collapse; } td { padding: 4px 6px; vertical-align: top; }
td.sep { border-left: 2px solid #999; }
figure.video { margin: 0; border: 5px solid; display: inline-block; background: #f4f4f4; }
figure.video img { display: block; height: 96px; image-rendering: auto; }
figure.video figcaption { font-size: 11px; padding: 2px 4px; max-width: 160px; overflow-wrap: anywhere; }
"""


def render_gallery(store, view: str, query_keys: Sequence[str], query_labels: Sequence[int],
                   gallery_keys: Sequence[str], gallery_labels: Sequence[int], topk_indices: np.ndarray,
                   classes: Sequence[str], queries: Sequence[int], title: str = "Nearest-neighbour retrieval",
                   neighbours: int = 3, num_frames: int = 8, degenerate: bool = False) -> str:
    """The gallery page as an HTML string: one row per chosen query position in ``queries``, each with up to
    ``neighbours`` of its nearest (as many as the record holds); ``degenerate``: the features were (a collapsed
    encoder), said first, since its "nearest" are arbitrary."""
    cache: dict[str, str] = {}

    def uri(key: str) -> str:
        if key not in cache:
            cache[key] = data_uri(animated_gif(thumbnail_frames(store, key, view, num_frames)))
        return cache[key]

    shown = min(neighbours, int(np.asarray(topk_indices).shape[1])) if len(topk_indices) else neighbours
    rows = []
    for position in queries:
        query_label = int(query_labels[position])
        cells = [video_cell(uri(query_keys[position]), classes[query_label], QUERY_COLOUR, query_keys[position],
                            "query")]
        for rank, gallery_index in enumerate(np.asarray(topk_indices[position])[:neighbours], start=1):
            label = int(gallery_labels[gallery_index])
            colour = HIT_COLOUR if label == query_label else MISS_COLOUR
            cells.append(video_cell(uri(gallery_keys[gallery_index]), classes[label], colour,
                                    gallery_keys[gallery_index], f"#{rank}"))
        rows.append(gallery_row(cells[0], cells[1:]))
    nearest = "nearest training video" if shown == 1 else f"{shown} nearest training videos"
    note = (f"Test-set queries (blue) and their {nearest}; green border: same class as the query, red: another "
            "class. Thumbnails are animated.")
    if degenerate:
        note = ("Warning: these features are degenerate (a collapsed encoder: no spread), so every training video "
                "is about as near as any other and the neighbours shown are arbitrary. " + note)
    return gallery_page(title, note, rows)


def gallery_row(query_cell: str, neighbour_cells: Sequence[str]) -> str:
    """One table row: the query's cell, a separator, then its neighbours' cells."""
    return f'<tr><td>{query_cell}</td><td class="sep">' + "</td><td>".join(neighbour_cells) + "</td></tr>"


LEGACY_GENERATOR = '<meta name="generator" content="coclr">'
"""The mark of pages written before it named their kind (:func:`page_generator`)."""
LEGACY_TITLES = {"search": "<title>Nearest "}
"""How a page of a kind was known before its mark named it: its title (a search's "Nearest videos")."""


def page_generator(kind: str) -> str:
    """The mark of the pages of ``kind`` (``"gallery"``: a report's or study's retrieval gallery; ``"search"``), so
    that a command rewrites its own page, not another file (:func:`is_page_file`): a search's ``--html`` replaced a
    report's gallery page that the user kept, since every page had one mark."""
    return f'<meta name="generator" content="coclr {kind}">'


def gallery_page(title: str, note: str, rows: Sequence[str], kind: str = "gallery") -> str:
    """A self-contained HTML page of ``rows`` (from :func:`gallery_row`) under a title and a note, marked as a page
    of ``kind``."""
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">{page_generator(kind)}"
            f"<title>{html.escape(title)}</title><style>{PAGE_STYLE}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><p class=\"note\">{html.escape(note)}</p>"
            f"<table>{''.join(rows)}</table></body></html>\n")


def is_page_file(path: str | Path, kind: str) -> bool:
    """Whether ``path`` is a page of ``kind`` that :func:`gallery_page` wrote (marked so; a page written before the
    mark named its kind, known by its title, :data:`LEGACY_TITLES`)."""
    try:
        with open(path, "rb") as file:
            head = file.read(4096).decode("utf-8", "replace")
    except OSError:
        return False
    if not head.startswith("<!DOCTYPE html>"):
        return False
    if page_generator(kind) in head:
        return True
    legacy = LEGACY_GENERATOR in head or f"<style>{PAGE_STYLE}</style>" in head
    return legacy and kind in LEGACY_TITLES and LEGACY_TITLES[kind] in head


def write_gallery(path: str | Path, store, record: dict, count: int = 8, view: str | None = None,
                  title: str | None = None, degenerate: bool = False) -> Path:
    """Write the gallery of a retrieval record (from :func:`coclr.eval.retrieval.evaluate_retrieval`).

    Thumbnails come from ``view`` (default: ``rgb`` when the store has it, else the record's first view).
    """

    neighbours = record["neighbours"]
    if view is None:
        view = "rgb" if "rgb" in store.views() else record["streams"][0]["view"]
    queries = choose_queries(neighbours["query_labels"], count)
    page = render_gallery(store, view, neighbours["query_keys"], neighbours["query_labels"],
                          neighbours["gallery_keys"], neighbours["gallery_labels"],
                          np.asarray(neighbours["topk_indices"]), neighbours["classes"], queries,
                          title or "Nearest-neighbour retrieval", degenerate=degenerate)
    return atomic_write_text(path, page)
