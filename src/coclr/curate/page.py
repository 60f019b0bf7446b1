"""``DIR/index.html`` of ``coclr curate``: a map of every video, its duplicate groups and its outliers, offline.

The page is three files beside each other, no network: ``index.html`` (the page and its script), ``data.js`` (the
collection as one JSON object: names, points, colour groups, each video's nearest, the duplicate groups and the
outliers) and ``thumbs/<row>.gif`` (animated thumbnails, loaded only when a point is hovered or a list entry shown).
The map is a canvas: every point written into one image each frame (no canvas call per point), dragged to pan,
wheeled to zoom. Hovering a point shows its name and thumbnail; clicking it lists its nearest videos and marks them;
clicking a duplicate group or an outlier marks its points. Every name reaches the page as JSON data and is shown
as text (``textContent``), never as markup; the JSON has ``<`` escaped, so no name ends a script.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from coclr.atomic import atomic_write_text
from coclr.text import html_name, on_page

PAGE = "index.html"
DATA = "data.js"
PAGE_DIGITS = 3
"""Decimals the page shows a similarity or score with (its script's ``toFixed(3)``; ``data.js`` holds them rounded
to as many, so that they are rounded once)."""

THUMBS = "thumbs"
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
           "#aec7e8")
"""The colour groups' colours (group 0 first)."""
MARK = "#d62728"
"""The colour of marked points (a chosen group, outlier or neighbours)."""

STYLE = """
body { font-family: sans-serif; margin: 0; color: #222; height: 100vh; display: flex; flex-direction: column; }
header { padding: 8px 12px; border-bottom: 1px solid #ddd; } header h1 { font-size: 17px; margin: 0 0 4px; }
header p { font-size: 12px; color: #555; margin: 0; }
main { display: flex; flex: 1; min-height: 0; }
#map { flex: 1; position: relative; } canvas { width: 100%; height: 100%; display: block; cursor: grab; }
aside { width: 360px; overflow-y: auto; border-left: 1px solid #ddd; padding: 0 10px; font-size: 12px; }
aside h2 { font-size: 14px; } aside li { cursor: pointer; margin: 2px 0; } aside li:hover { background: #f0f0f0; }
aside li.chosen { background: #fde0dc; } ul { padding-left: 18px; } .path { word-break: break-all; }
#tip { position: absolute; pointer-events: none; background: #fff; border: 1px solid #999; padding: 4px;
  font-size: 11px; display: none; width: max-content; max-width: 260px; } #tip img { display: block; max-width: 250px; }
#tip-more { display: block; color: #555; }
"""

SCRIPT = r"""
(function () {
  const D = window.CURATE;
  const N = D.names.length;
  const canvas = document.getElementById('canvas');
  const tip = document.getElementById('tip');
  const tipName = document.getElementById('tip-name');
  const tipImage = document.getElementById('tip-image');
  const tipMore = document.getElementById('tip-more');
  const ctx = canvas.getContext('2d');
  const view = {scale: 1, x: 0, y: 0, marked: [], hover: -1, chosen: -1};
  window.curateView = view;
  const pad = 20;
  function size() {
    canvas.width = canvas.clientWidth * devicePixelRatio;
    canvas.height = canvas.clientHeight * devicePixelRatio;
  }
  const X = Float32Array.from({length: N}, (_, i) => D.points[2 * i]);
  const Y = Float32Array.from({length: N}, (_, i) => D.points[2 * i + 1]);
  const packed = D.colours.map(hex => {  // each colour as the canvas's RGBA bytes read as one 32-bit word
    const v = parseInt(hex.slice(1), 16);
    return new Uint32Array(new Uint8Array([v >> 16, (v >> 8) & 255, v & 255, 255]).buffer)[0];
  });
  function origin() {  // CSS pixels: the side of the square the layout fills at scale 1 (one scale for both
    const w = canvas.clientWidth - 2 * pad, h = canvas.clientHeight - 2 * pad, s = Math.min(w, h);  // axes: the
    return [s, pad + (w - s) / 2, pad + (h - s) / 2];  // layout's proportions), and where it starts, centred
  }
  function frame() {  // CSS pixels: x = ax * X + bx, y = ay * Y + by
    const [s, left, top] = origin();
    return [s * view.scale, left + view.x, s * view.scale, top + view.y];
  }
  view.toScreen = function (row) {  // CSS pixels within the canvas
    const f = frame();
    return [f[0] * X[row] + f[1], f[2] * Y[row] + f[3]];
  };
  function draw() {  // every point written into one image (a hundred thousand in milliseconds), then the marks
    const r = devicePixelRatio, base = N > 20000 ? 2 : N > 2000 ? 3 : 6;
    const dot = Math.round(Math.max(2, Math.min(12, base * Math.sqrt(view.scale))) * r);
    const width = canvas.width, height = canvas.height, f = frame();
    const image = ctx.createImageData(width, height), pixels = new Uint32Array(image.data.buffer);
    const ax = f[0] * r, bx = f[1] * r - dot / 2, ay = f[2] * r, by = f[3] * r - dot / 2;
    for (let i = 0; i < N; i++) {
      const x0 = Math.round(ax * X[i] + bx), y0 = Math.round(ay * Y[i] + by);
      if (x0 < 0 || y0 < 0 || x0 + dot > width || y0 + dot > height) continue;
      const colour = packed[D.groups[i] % packed.length];
      for (let y = y0; y < y0 + dot; y++) pixels.fill(colour, y * width + x0, y * width + x0 + dot);
    }
    ctx.putImageData(image, 0, 0);
    ctx.fillStyle = D.mark; ctx.strokeStyle = '#000';
    for (const i of view.marked) {
      const p = view.toScreen(i);
      ctx.beginPath(); ctx.arc(p[0] * r, p[1] * r, dot * 0.9, 0, 2 * Math.PI); ctx.fill(); ctx.stroke();
    }
  }
  view.draw = draw;
  function nearestPoint(x, y) {
    const f = frame();
    let best = -1, bestDistance = 100;  // within 10 px
    for (let i = 0; i < N; i++) {
      const dx = f[0] * X[i] + f[1] - x, dy = f[2] * Y[i] + f[3] - y, d = dx * dx + dy * dy;
      if (d < bestDistance) { best = i; bestDistance = d; }
    }
    return best;
  }
  function stacked(row) {  // the videos drawn at one spot with ``row`` (exact copies): each reachable
    if (row < 0) return [];
    const f = frame(), x = f[0] * X[row] + f[1], y = f[2] * Y[row] + f[3], here = [];
    for (let i = 0; i < N; i++) {
      if (Math.abs(f[0] * X[i] + f[1] - x) < 1 && Math.abs(f[2] * Y[i] + f[3] - y) < 1) here.push(i);
    }
    return here;
  }
  function place(x, y) {  // the tip beside the cursor, kept inside the map (on the cursor's other side if need be)
    const map = tip.parentElement, w = tip.offsetWidth, h = tip.offsetHeight;
    const left = x + 14 + w <= map.clientWidth ? x + 14 : Math.max(0, x - 14 - w);
    const top = y + 14 + h <= map.clientHeight ? y + 14 : Math.max(0, y - 14 - h);
    tip.style.left = left + 'px'; tip.style.top = top + 'px';
  }
  function showTip(row, x, y) {
    view.hover = row;
    if (row < 0) { tip.style.display = 'none'; return; }
    const here = stacked(row);
    tipName.textContent = D.names[row];
    tipMore.textContent = here.length > 1 ? here.length + ' videos at this spot: click again for the next' : '';
    tipImage.onload = null;  // (a handler of an earlier hover would move the tip back to where that one was)
    if (D.thumbs[row]) {
      if (tipImage.getAttribute('src') !== D.thumbs[row]) {
        tipImage.onload = () => { if (view.hover === row) place(x, y); };  // its size known: placed again
        tipImage.src = D.thumbs[row];
      }
      tipImage.style.display = 'block';
    } else { tipImage.removeAttribute('src'); tipImage.style.display = 'none'; }
    tip.style.display = 'block';
    place(x, y);
  }
  view.showTip = showTip;
  function mark(rows, entry) {
    view.marked = rows;
    document.querySelectorAll('aside li.chosen').forEach(e => e.classList.remove('chosen'));
    if (entry) entry.classList.add('chosen');
    draw();
  }
  view.mark = mark;
  function name(row) {  // a name as the page shows it: isolated, so that its right-to-left marks stay inside it
    const element = document.createElement('bdi');
    element.textContent = D.names[row];
    return element;
  }
  function listItem(list, parts, rows, title) {  // parts: text and name() elements
    const item = document.createElement('li');
    item.append(...parts);
    if (title) item.title = title;
    item.addEventListener('click', () => mark(rows, item));
    list.appendChild(item);
    return item;
  }
  function chooseVideo(row) {
    view.chosen = row;
    const list = document.getElementById('chosen');
    list.textContent = '';
    const head = document.createElement('li');
    head.append(name(row), ' (chosen)');
    head.className = 'path';
    list.appendChild(head);
    const rows = [row];
    for (const [other, score] of D.nearest[row]) {
      listItem(list, [score.toFixed(3) + '  ', name(other)], [row, other], D.names[other]).className = 'path';
      rows.push(other);
    }
    mark(rows, head);
  }
  view.chooseVideo = chooseVideo;
  const groups = document.getElementById('duplicates');
  D.duplicates.forEach((group, number) => {
    const parts = ['group ' + (number + 1) + ': ' + group.members.length + ' videos' +
      (group.kind === 'partial' ? ' (a shared stretch)' : '') + ', similarity ' + group.similarity.toFixed(3) + ': '];
    const seconds = at => group.seconds ? [' (' + group.seconds[at] + ' s)'] : [];
    group.members.forEach((row, at) => parts.push(...(at ? [', '] : []), name(row), ...seconds(at)));
    listItem(groups, parts, group.members).className = 'path';
  });
  if (!D.duplicates.length) groups.textContent = 'none at this threshold';
  const outliers = document.getElementById('outliers');
  for (const [row, score] of D.outliers) {
    listItem(outliers, [score.toFixed(3) + '  ', name(row)], [row]).className = 'path';
  }
  let drag = null;
  canvas.addEventListener('mousedown', e => { drag = [e.offsetX, e.offsetY, view.x, view.y, false]; });
  window.addEventListener('mouseup', e => {
    if (drag && !drag[4]) {  // a click: the point's video, or at a spot of several the next after the chosen one
      const here = stacked(nearestPoint(drag[0], drag[1])), at = here.indexOf(view.chosen);
      if (here.length) chooseVideo(here[(at + 1) % here.length]);
    }
    drag = null; canvas.style.cursor = 'grab';
  });
  canvas.addEventListener('mousemove', e => {
    if (drag) {
      const dx = e.offsetX - drag[0], dy = e.offsetY - drag[1];
      if (Math.abs(dx) + Math.abs(dy) > 3) { drag[4] = true; canvas.style.cursor = 'grabbing'; }
      if (drag[4]) { view.x = drag[2] + dx; view.y = drag[3] + dy; draw(); }
      return;
    }
    showTip(nearestPoint(e.offsetX, e.offsetY), e.offsetX, e.offsetY);
  });
  canvas.addEventListener('mouseleave', () => showTip(-1, 0, 0));
  canvas.addEventListener('wheel', e => {
    e.preventDefault();
    const [, left, top] = origin();
    const factor = Math.exp(-e.deltaY / 500), x = e.offsetX - left, y = e.offsetY - top;  // the spot under the
    view.x = x - (x - view.x) * factor; view.y = y - (y - view.y) * factor; view.scale *= factor;  // cursor stays
    draw();
  }, {passive: false});
  window.addEventListener('resize', () => { size(); draw(); });
  size(); draw();
  document.body.dataset.ready = 'yes';
})();
"""


def write_page(out: Path, folder: Path, summary: list[str], data: dict[str, Any]) -> Path:
    """Write ``out/index.html`` and ``out/data.js`` (``data``: see the module docstring; ``folder``: the embedding
    folder curated, named in the title; ``summary``: lines shown under it) atomically; the thumbnails are written
    apart (``out/thumbs``)."""
    folder = Path(folder).resolve()  # ("." has no name; a relative path means nothing where the page is opened)
    shown = {**data, "names": [on_page(name) for name in data["names"]], "colours": list(COLOURS), "mark": MARK}
    payload = json.dumps(shown, separators=(",", ":"))
    payload = payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    atomic_write_text(out / DATA, f"window.CURATE = {payload};\n")
    lines = "".join(f"<p>{html.escape(line)}</p>" for line in summary)
    page = (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>coclr curate: '
            f"{html.escape(on_page(folder.name))}</title><style>{STYLE}</style></head><body><header><h1>coclr curate: "
            f"{html_name(folder.name)}</h1><p>{len(data['names'])} videos of {html_name(folder)}</p>{lines}</header>"
            '<main><div id="map"><canvas id="canvas" aria-label="map of every video"></canvas>'
            '<div id="tip"><bdi id="tip-name" class="path"></bdi><span id="tip-more"></span>'
            '<img id="tip-image" alt="thumbnail"></div></div>'
            "<aside><h2>Chosen video and its nearest</h2><ul id=\"chosen\"><li>click a point</li></ul>"
            '<h2>Near-duplicate groups</h2><ul id="duplicates"></ul>'
            '<h2>Outliers (most unlike the rest first)</h2><ul id="outliers"></ul></aside></main>'
            f'<script src="{DATA}"></script><script>{SCRIPT}</script></body></html>\n')
    return atomic_write_text(out / PAGE, page)
