"""``coclr report``: Table 1 layout, the R@1-per-stage plot, the self-contained retrieval gallery."""

from __future__ import annotations

import base64
import io
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from coclr.cli import main
from coclr.errors import DataError
from coclr.eval.gallery import HIT_COLOUR, MISS_COLOUR, choose_queries
from coclr.eval.report import (
    build_table,
    load_record,
    markdown_table,
    mined_precision,
    plot_stage_recall,
    stage_encoders,
)
from test_eval_helpers import make_tiny_store, save_tiny_encoder


def _record(task, results, streams, name=None, store="", neighbours=None):
    record = {"task": task, "results": results, "store": store, "dataset": "tiny",
              "streams": [{"checkpoint": f"/ckpt/{sha}.pt", "checkpoint_sha256": sha, "view": view,
                           "meta": {"method": method}} for sha, view, method in streams]}
    if name:
        record["name"] = name
    if neighbours:
        record["neighbours"] = neighbours
    return record


def test_table_in_the_layout_of_table_1(tmp_path):
    records = [
        _record("retrieval", {"R@1": 33.1}, [("a", "rgb", "infonce")]),
        _record("linear", {"top1": 46.8}, [("a", "rgb", "infonce")]),
        _record("linear", {"top1": 78.0}, [("b", "rgb", "ubernce")]),
        _record("finetune", {"top1": 87.34}, [("c", "rgb", "coclr"), ("d", "flow", "coclr")]),
    ]
    rows = build_table(records)
    assert [(r["Method"], r["Input"], r["Labels"]) for r in rows] == [
        ("InfoNCE", "RGB", "✗"), ("UberNCE", "RGB", "✓"), ("CoCLR", "R+F", "✗")]
    text = markdown_table(rows)
    lines = text.strip().splitlines()
    assert lines[0] == "| Method | Input | Labels | Linear probe | Finetune | R@1 |"
    assert lines[2] == "| InfoNCE | RGB | ✗ | 46.8 | - | 33.1 |"
    assert lines[3] == "| UberNCE | RGB | ✓ | 78.0 | - | - |"
    assert lines[4] == "| CoCLR | R+F | ✗ | - | 87.3 | - |"
    path = tmp_path / "r.json"
    path.write_text(json.dumps(records[0]))
    assert load_record(path)["source"] == str(path)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(DataError, match="bad.json"):
        load_record(tmp_path / "bad.json")


def _colour_pixels(png_path, rgb, tolerance=40):
    from PIL import Image

    image = np.asarray(Image.open(png_path).convert("RGB")).astype(int)
    return int((np.abs(image - np.array(rgb)).max(axis=2) <= tolerance).sum())


def test_stage_plot(tmp_path):
    path = plot_stage_recall(["init", "cycle1_rgb", "cycle1_flow"], {"rgb": [30.0, 45.0, 45.0],
                             "flow": [40.0, 40.0, 50.0]}, [["rgb", "flow"], ["rgb"], ["flow"]], tmp_path / "p.png")
    assert path.stat().st_size > 10_000
    assert _colour_pixels(path, (0x1F, 0x77, 0xB4), 10) > 200  # RGB line
    assert _colour_pixels(path, (0xFF, 0x7F, 0x0E), 10) > 200  # flow line


def test_stage_encoders_follow_the_manifest(tmp_path):
    stages = [("infonce_rgb", "infonce", "rgb", None, 0), ("infonce_flow", "infonce", "flow", None, 0),
              ("cycle1_rgb", "coclr", "rgb", "flow", 1), ("cycle1_flow", "coclr", "flow", "rgb", 1),
              ("cycle2_rgb", "coclr", "rgb", "flow", 2)]
    manifest = {"stages": [{"name": n, "method": m, "view": v, "trains": v, "frozen": f, "cycle": c,
                            "checkpoint": f"{n}/last.pt", "encoders": {v: f"{n}/{v}.pt"},
                            "status": "done" if n != "cycle2_rgb" else "running"} for n, m, v, f, c in stages]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    points = stage_encoders(tmp_path)
    assert [p["name"] for p in points] == ["init", "cycle1_rgb", "cycle1_flow"]
    assert [p["trains"] for p in points] == [["rgb", "flow"], ["rgb"], ["flow"]]
    assert points[1]["encoders"] == {"rgb": tmp_path / "cycle1_rgb/rgb.pt", "flow": tmp_path / "infonce_flow/flow.pt"}
    assert points[2]["producers"]["rgb"] == ("cycle1_rgb", "coclr")
    assert points[2]["logs"] == {"rgb": tmp_path / "cycle1_rgb/log.jsonl", "flow": tmp_path / "cycle1_flow/log.jsonl"}
    with pytest.raises(DataError, match="manifest.json"):
        stage_encoders(tmp_path / "elsewhere")


def test_mined_precision_is_the_mean_over_the_logged_steps(tmp_path):
    values = [0.25, 0.5, 0.625]
    lines = [json.dumps({"step": 12, "epoch": 1, "epoch_loss": 2.0})]
    lines += [json.dumps({"step": 50 * i, "rgb/loss": 3.0, "rgb/mined_precision": v}) for i, v in enumerate(values)]
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(lines) + '\n\n{"step": 200, "rgb/mined_prec')  # a blank line; cut short by a kill
    assert mined_precision(log, "rgb") == pytest.approx(100 * sum(values) / len(values))
    assert mined_precision(log, "flow") is None  # no value for that view
    assert mined_precision(tmp_path / "missing.jsonl", "rgb") is None
    log.write_text(lines[1] + "\nnot json\n" + lines[2] + "\n")
    with pytest.raises(DataError, match=r"log\.jsonl: line 2 is not JSON"):
        mined_precision(log, "rgb")


@pytest.fixture(scope="module")
def gallery_inputs(tmp_path_factory):
    from coclr.store.clipstore import ClipStore

    root = tmp_path_factory.mktemp("gallery")
    store = ClipStore(make_tiny_store(root / "store", train_per_class=2, test_per_class=1, frames=8))
    train = [e for e in store.index.entries if e.split == "train"]
    test = [e for e in store.index.entries if e.split == "test"]
    # Train labels are 0 0 1 1 2 2: query 0 (red) finds red, red, green; query 1 (green) green, green, red;
    # query 2 (blue) blue, blue, red: six hits and three misses.
    topk = [[0, 1, 2], [2, 3, 0], [4, 5, 1]]
    neighbours = {"query_keys": [e.path for e in test], "query_labels": [e.label for e in test],
                  "gallery_keys": [e.path for e in train], "gallery_labels": [e.label for e in train],
                  "classes": store.index.classes, "topk_indices": topk}
    record = _record("retrieval", {"R@1": 100.0}, [("a", "rgb", "coclr")], store=str(store.root),
                     neighbours=neighbours)
    path = root / "retrieval.json"
    path.write_text(json.dumps(record))
    return store, path, root


def test_report_from_results_writes_table_and_gallery(gallery_inputs, tmp_path):
    from PIL import Image

    store, result, _ = gallery_inputs
    assert main(["report", "--results", str(result), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "table.md").read_text().splitlines()[2] == "| CoCLR | RGB | ✗ | - | - | 100.0 |"
    assert json.loads((tmp_path / "rep" / "table.json").read_text())["rows"][0]["R@1"] == 100.0
    page = (tmp_path / "rep" / "gallery.html").read_text()
    assert not re.search(r"https?://", page) and "<script" not in page
    images = re.findall(r'src="data:image/gif;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 12  # 3 queries x (query + top 3)
    gif = Image.open(io.BytesIO(base64.b64decode(images[0])))
    assert gif.format == "GIF" and gif.n_frames == 8 and gif.size[1] == 64
    assert page.count(f"border-color:{MISS_COLOUR}") == 3 and page.count(f"border-color:{HIT_COLOUR}") == 6
    for name in store.index.classes:
        assert name in page


def test_the_gallery_says_when_its_features_are_degenerate_and_how_many_neighbours_it_shows(gallery_inputs,
                                                                                                tmp_path):
    """A collapsed encoder's record (every score 0, neighbours in row order) was shown as any other's, its
    arbitrary neighbours as the "3 nearest"; and a record of one neighbour each was called the "3 nearest"."""
    store, result, root = gallery_inputs
    healthy = json.loads(result.read_text())
    collapsed = {**json.loads(json.dumps(healthy)), "feature_health": [
        {"train": {"degenerate": True}, "test": {"degenerate": True}}]}
    collapsed["neighbours"]["topk_indices"] = [[0], [0], [0]]
    (root / "collapsed.json").write_text(json.dumps(collapsed))
    assert main(["report", "--results", str(root / "collapsed.json"), "--out", str(tmp_path / "c")]) == 0
    page = (tmp_path / "c" / "gallery.html").read_text()
    assert "Warning: these features are degenerate" in page and "their nearest training video;" in page
    assert "3 nearest" not in page
    flow = {**json.loads(json.dumps(healthy)), "streams": [{**healthy["streams"][0], "view": "flow",
                                                            "checkpoint_sha256": "f"}]}
    (root / "flow.json").write_text(json.dumps(flow))  # a healthy flow record beside the collapsed RGB one
    assert main(["report", "--results", str(root / "collapsed.json"), str(root / "flow.json"), "--out",
                 str(tmp_path / "both")]) == 0
    page = (tmp_path / "both" / "gallery.html").read_text()
    assert "degenerate" not in page and "their 3 nearest training videos" in page


def test_a_gallery_of_no_queries_is_refused(gallery_inputs, tmp_path, capsys):
    _, result, _ = gallery_inputs
    assert main(["report", "--results", str(result), "--out", str(tmp_path / "r"), "--gallery-queries", "0"]) == 2
    assert "--gallery-queries: must be at least 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_choose_queries_spreads_over_classes():
    assert choose_queries([0, 0, 1, 1, 2, 3, 3], 3) == [0, 4, 5]
    assert choose_queries([2, 2, 0], 10) == [2, 0]


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def test_a_report_of_results_does_not_claim_an_earlier_runs_plot(gallery_inputs, tmp_path, capsys):
    """A folder whose earlier report evaluated a --run keeps that run's plot: a report of result files said it
    wrote it."""
    _, result, _ = gallery_inputs
    out = tmp_path / "rep"
    assert main(["report", "--results", str(result), "--out", str(out)]) == 0
    (out / "stage_recall.png").write_bytes(b"an earlier run's plot")
    capsys.readouterr()
    assert main(["report", "--results", str(result), "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "wrote" in printed.out and "stage_recall.png" not in printed.out
    assert f"note: {out / 'stage_recall.png'} and {out / 'results'} are of an earlier report's --run" in printed.err


def test_gallery_renders_in_headless_chromium(gallery_inputs, tmp_path):
    """The screenshot shows the thumbnails: each class colour, and the hit and miss borders."""
    import shutil
    import subprocess

    from test_eval_helpers import CLASS_COLOURS

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed")
    store, result, _ = gallery_inputs
    assert main(["report", "--results", str(result), "--out", str(tmp_path / "rep")]) == 0
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
                    "--window-size=800,600", (tmp_path / "rep" / "gallery.html").as_uri()],
                   check=True, capture_output=True, timeout=60)
    for colour in CLASS_COLOURS:  # each thumbnail is ~100x96 px of its class colour
        assert _colour_pixels(shot, colour, 45) > 3000, colour
    for border in (HIT_COLOUR, MISS_COLOUR):
        rgb = tuple(int(border[i : i + 2], 16) for i in (1, 3, 5))
        assert _colour_pixels(shot, rgb, 12) > 300, border


def fake_run(tmp_path) -> None:
    """A store (``tmp_path/store``) and a pipeline run of four finished stages (``tmp_path/run``)."""
    make_tiny_store(tmp_path / "store", train_per_class=2, test_per_class=1, frames=8, views=("rgb", "flow"))
    stages = [("infonce_rgb", "infonce", "rgb", None, 0), ("infonce_flow", "infonce", "flow", None, 0),
              ("cycle1_rgb", "coclr", "rgb", "flow", 1), ("cycle1_flow", "coclr", "flow", "rgb", 1)]
    for seed, (name, method, view, _, _) in enumerate(stages):
        save_tiny_encoder(tmp_path / "run" / name / f"{view}.pt", seed=seed, meta={"method": method, "view": view})
    manifest = {"stages": [{"name": n, "method": m, "view": v, "trains": v, "frozen": f, "cycle": c,
                            "checkpoint": f"{n}/last.pt", "encoders": {v: f"{n}/{v}.pt"}, "status": "done"}
                           for n, m, v, f, c in stages]}
    (tmp_path / "run" / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.slow
def test_report_run_end_to_end(tmp_path, capsys):
    """``coclr report --run``: retrieval after every stage of a (fake) pipeline run, plot, table, gallery."""
    fake_run(tmp_path)
    logged = [0.4, 0.6]
    (tmp_path / "run" / "cycle1_rgb" / "log.jsonl").write_text(
        "".join(json.dumps({"step": i, "rgb/mined_precision": v}) + "\n" for i, v in enumerate(logged)))
    out = tmp_path / "report"
    assert main(["report", "--run", str(tmp_path / "run"), "--store", str(tmp_path / "store"), "--out", str(out),
                 "--length", "8", "--size", "32", "--quiet"]) == 0
    table = (out / "table.md").read_text().split("\n\n")[0].splitlines()  # ‡ marks a collapsed encoder
    assert [line.split(" | ")[0].removesuffix(" ‡") for line in table[2:]] == [
        "| InfoNCE (infonce_rgb)", "| InfoNCE (infonce_flow)", "| CoCLR (cycle1_rgb)", "| CoCLR (cycle1_flow)"]
    assert sorted(p.name for p in (out / "results").iterdir()) == [
        "cycle1_flow_flow.json", "cycle1_rgb_rgb.json", "infonce_flow_flow.json", "infonce_rgb_rgb.json"]
    assert (out / "stage_recall.png").stat().st_size > 10_000
    assert "CoCLR (cycle1_rgb)" in (out / "gallery.html").read_text()
    stage = json.loads((out / "results" / "cycle1_rgb_rgb.json").read_text())
    assert stage["mined_precision"] == pytest.approx(50.0)
    assert "mined_precision" not in json.loads((out / "results" / "cycle1_flow_flow.json").read_text())  # no log
    rows = json.loads((out / "table.json").read_text())  # each row names its record (it said "")
    rows = rows["rows"] if isinstance(rows, dict) else rows
    assert [os.path.basename(source) for row in rows for source in row["sources"]] == [
        "infonce_rgb_rgb.json", "infonce_flow_flow.json", "cycle1_rgb_rgb.json", "cycle1_flow_flow.json"]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    manifest["stages"][-1]["status"] = "running"  # stopped mid-way: said, not reported as if it were all
    (tmp_path / "run" / "manifest.json").write_text(json.dumps(manifest))
    assert main(["report", "--run", str(tmp_path / "run"), "--store", str(tmp_path / "store"), "--out", str(out),
                 "--length", "8", "--size", "32", "--quiet"]) == 0
    assert "stage(s) cycle1_flow not finished: reported are the 3 finished ones" in capsys.readouterr().err


def test_a_run_whose_store_left_videos_out_says_so_and_is_not_all_done(tmp_path, capsys):
    """A flow job that failed for a video left it out of every flow stage's evaluation: the report wrote its
    figures, said nothing and exited 0 (as if every video were in them)."""
    import os

    from coclr.store.clipstore import entry_path, open_store, record_failures

    fake_run(tmp_path)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    manifest["stages"] = manifest["stages"][:2]  # the two InfoNCE stages are enough
    (tmp_path / "run" / "manifest.json").write_text(json.dumps(manifest))
    store = open_store(tmp_path / "store")
    broken = next(e.path for e in store.index.entries if e.split == "test")
    os.unlink(entry_path(store.root, broken, "flow"))
    record_failures(store.root, "flow", [broken], [(broken, "DataError: cannot decode")])
    out = tmp_path / "report"
    assert main(["report", "--run", str(tmp_path / "run"), "--store", str(tmp_path / "store"), "--out", str(out),
                 "--length", "8", "--size", "32", "--quiet"]) == 3
    err = capsys.readouterr().err
    assert "left out 1 'test' video(s) whose jobs failed" in err and broken in err, err
    for view in ("rgb", "flow"):  # the two curves of one set of videos (the RGB stage scored one video more)
        record = json.loads((out / "results" / f"infonce_{view}_{view}.json").read_text())
        assert record["splits"]["test"]["left_out"] == [broken], view
    # its result files shown again: a line names each, and the report is not all done either
    assert main(["report", "--results", str(out / "results" / "infonce_flow_flow.json"),
                 str(out / "results" / "infonce_rgb_rgb.json"), "--out", str(tmp_path / "again")]) == 3
    err = capsys.readouterr().err
    assert f"infonce_flow_flow.json: its figures leave out 1 'test' video(s) whose jobs failed, e.g. {broken}" in err
    assert "infonce_rgb_rgb.json: its figures leave out" in err


def test_a_run_whose_stage_file_is_of_another_view_is_refused_and_unlike_clips_are_said(tmp_path, capsys):
    """An RGB encoder copied over a flow stage's file was evaluated on flow and its figure reported (eval refuses
    it); a run's encoders trained on other clips than the store's were evaluated without the warning eval gives."""
    from test_eval_helpers import save_tiny_encoder

    fake_run(tmp_path)
    out = tmp_path / "report"
    save_tiny_encoder(tmp_path / "run" / "cycle1_flow" / "flow.pt", meta={"method": "coclr", "view": "rgb",
                                                                          "clip_settings": {"view": "rgb"}})
    assert main(["report", "--run", str(tmp_path / "run"), "--store", str(tmp_path / "store"), "--out", str(out),
                 "--length", "8", "--size", "32"]) == 2
    err = capsys.readouterr().err
    assert "cycle1_flow/flow.pt: the run names it its 'flow' encoder, but it was trained on 'rgb' clips" in err, err
    assert not out.exists()
    from coclr.eval.report import run_warnings, stage_encoders
    from coclr.store.clipstore import open_store

    fake_run(tmp_path)
    save_tiny_encoder(tmp_path / "run" / "infonce_rgb" / "rgb.pt", meta={
        "method": "infonce", "view": "rgb", "clip_settings": {"view": "rgb", "short_side": 128}})
    lines = run_warnings(stage_encoders(tmp_path / "run"), open_store(tmp_path / "store"))
    assert len(lines) == 1 and "short side 128 px" in lines[0], lines


def test_a_report_without_a_gallery_says_an_earlier_one_is_not_of_its_inputs(gallery_inputs, tmp_path, capsys):
    _, result, _ = gallery_inputs
    out = tmp_path / "out"
    assert main(["report", "--results", str(result), "--out", str(out)]) == 0
    assert (out / "gallery.html").is_file()
    linear = json.loads(result.read_text()) | {"task": "linear", "results": {"top1": 50.0}}
    linear.pop("neighbours", None)
    (tmp_path / "linear.json").write_text(json.dumps(linear))
    capsys.readouterr()
    assert main(["report", "--results", str(tmp_path / "linear.json"), "--out", str(out)]) == 0
    assert f"note: {out / 'gallery.html'} is of an earlier report's inputs" in capsys.readouterr().err
    for key in ("dataset", "store"):  # (a mapping there was a TypeError's traceback)
        (tmp_path / "odd.json").write_text(json.dumps(linear | {key: {"a": 1}}))
        assert main(["report", "--results", str(tmp_path / "odd.json"), "--out", str(tmp_path / "odd")]) == 2
        assert f"odd.json: not a valid 'coclr eval' result: {key}: not a string" in capsys.readouterr().err


def test_report_refuses_evaluation_options_without_a_run(tmp_path, capsys) -> None:
    assert main(["report", "--results", str(tmp_path / "r.json"), "--out", str(tmp_path / "o"), "--length", "8",
                 "--amp"]) == 2
    assert "--length, --amp: apply to --run only" in capsys.readouterr().err
    # every clip option: --batch-size -7 and --workers -3 were taken without a word (and without a check)
    assert main(["report", "--results", str(tmp_path / "r.json"), "--out", str(tmp_path / "o"), "--batch-size", "-7",
                 "--workers", "-3"]) == 2
    assert "--batch-size, --workers: apply to --run only" in capsys.readouterr().err


@pytest.mark.parametrize("given, said", [(["--size", "17"], "size: must be >= 32"),
                                         (["--device", "nodevice"], "--device")])
def test_a_run_s_bad_clips_or_device_are_refused_before_out_is_made(tmp_path, capsys, given, said) -> None:
    fake_run(tmp_path)
    out = tmp_path / "report"
    assert main(["report", "--run", str(tmp_path / "run"), "--store", str(tmp_path / "store"), "--out", str(out),
                 "--quiet", *given]) == 2
    assert said in capsys.readouterr().err
    assert not out.exists()


def test_a_store_without_a_stage_s_view_is_refused_before_out_is_made(tmp_path, capsys) -> None:
    """The check of the store's views came inside the claim of --out: refused, it left run.json and .lock there."""
    fake_run(tmp_path)
    make_tiny_store(tmp_path / "rgb_only", train_per_class=2, test_per_class=1, frames=8, views=("rgb",))
    out = tmp_path / "report"
    assert main(["report", "--run", str(tmp_path / "run"), "--store", str(tmp_path / "rgb_only"), "--out", str(out),
                 "--quiet"]) == 2
    assert "'flow'" in capsys.readouterr().err
    assert not out.exists()


def test_the_markdown_table_shows_names_as_written():
    from coclr.eval.report import TABLE_COLUMNS, markdown_table

    row = {column: None for column in TABLE_COLUMNS}
    row.update({"Method": "<img src=x onerror=alert(2)>|pipe|", "Input": "RGB", "R@1": 50.0,
                "notes": ["two\nlines"]})
    table, _, note = markdown_table([row]).split("\n")[2:5]
    assert table == "| &lt;img src=x onerror=alert(2)&gt;\\|pipe\\| | RGB | - | - | - | 50.0 |"  # six cells, no markup
    assert note == "- &lt;img src=x onerror=alert(2)&gt;\\|pipe\\| (RGB): two lines"
    row["Method"] = "**CoCLR** [v2](http://x.example/) `k=5` a_b_ c\\d"  # bold, a link and code when rendered
    table = markdown_table([row]).split("\n")[2]
    assert table.startswith("| \\*\\*CoCLR\\*\\* \\[v2\\](http://x.example/) \\`k=5\\` a_b\\_ c\\\\d | RGB |")
    # a name that begins a block: a heading, a numbered or a nested list inside the notes' list
    for name, shown in (("# best run", "\\# best run"), ("1. first", "1\\. first"), ("+ plus", "\\+ plus")):
        row["Method"] = name
        assert markdown_table([row]).split("\n")[4] == f"- {shown} (RGB): two lines"


def test_records_of_two_stores_are_two_rows_each_naming_its_store():
    """A probe on one store and an R@1 on another made one row, the second R@1 replacing the first's."""
    on_one = _record("linear", {"top1": 83.3}, [("a", "rgb", "infonce")], name="M", store="/s1")
    same = _record("retrieval", {"R@1": 90.0}, [("a", "rgb", "infonce")], name="M", store="/s1")
    other = dict(_record("retrieval", {"R@1": 42.0}, [("a", "rgb", "infonce")], name="M", store="/s2"),
                 dataset="other")
    rows = build_table([on_one, same, other])
    assert [(row["Linear probe"], row["R@1"]) for row in rows] == [(83.3, 90.0), (None, 42.0)]
    assert "on tiny (/s1)" in rows[0]["notes"] and "on other (/s2)" in rows[1]["notes"]
    assert all(not row["notes"] for row in build_table([on_one, same]))  # one store: nothing to say


def test_records_of_other_splits_are_other_rows_and_a_missing_result_keeps_the_earlier_one():
    """The test split as the gallery (43.8) replaced the protocol's R@1 (12.5) in silence; an R@5-only record
    blanked an earlier R@1; a finetuned encoder (trained on the labels) showed Labels ✗."""
    def on(train: str, test: str, record: dict) -> dict:
        return {**record, "splits": {"train": {"name": train, "videos": 4}, "test": {"name": test, "videos": 2}}}

    standard = on("train", "test", _record("retrieval", {"R@1": 12.5, "R@5": 50.0}, [("a", "rgb", "infonce")]))
    swapped = on("test", "train", _record("retrieval", {"R@1": 43.8}, [("a", "rgb", "infonce")]))
    wider = on("train", "test", _record("retrieval", {"R@5": 60.0, "R@10": 70.0}, [("a", "rgb", "infonce")]))
    rows = build_table([standard, swapped, wider])
    assert [row["R@1"] for row in rows] == [12.5, 43.8]
    assert "test split test, train split train" in rows[0]["notes"]
    assert "test split train, train split test" in rows[1]["notes"]
    assert all(not row["notes"] for row in build_table([standard, wider]))  # one protocol: nothing to say
    # two encoders of one default name: rows alike but for their numbers, nothing said (only table.json's sources)
    first = _record("retrieval", {"R@1": 25.0}, [("a", "rgb", "infonce")])
    second = _record("retrieval", {"R@1": 0.0}, [("b", "rgb", "infonce")])
    rows = build_table([first, second])
    assert [row["Method"] for row in rows] == ["InfoNCE", "InfoNCE"]
    assert [row["notes"][-1].split(" (")[0] for row in rows] == [
        f"encoder {Path(record['streams'][0]['checkpoint']).name}" for record in (first, second)]
    assert rows[0]["notes"] != rows[1]["notes"]
    # one encoder on two clip shapes: two rows alike but for their numbers, nothing said
    short = _record("retrieval", {"R@1": 12.5}, [("a", "rgb", "infonce")])
    long = _record("retrieval", {"R@1": 50.0}, [("a", "rgb", "infonce")])
    short["config"], long["config"] = {"clips": {"length": 8, "size": 32}}, {"clips": {"length": 16, "size": 32}}
    rows = build_table([short, long])
    assert [(row["R@1"], row["notes"]) for row in rows] == [(12.5, ["on 8x32 clips"]), (50.0, ["on 16x32 clips"])]
    finetuned = _record("retrieval", {"R@1": 80.0}, [("f", "rgb", "finetuned")])
    finetuned["streams"][0]["meta"]["finetuned_from"] = "a" * 64
    assert build_table([finetuned])[0]["Labels"] == "✓"


def test_report_inputs_refused_before_out_is_made(gallery_inputs, tmp_path, capsys):
    """A store without the gallery's videos wrote table.md and run.json before it was refused; a folder given as a
    result file was "not found"; NaN was a result."""
    store, path, _ = gallery_inputs
    other = make_tiny_store(tmp_path / "other", train_per_class=1, test_per_class=1, frames=8, seed=3)
    (other / "index.json").write_text((other / "index.json").read_text().replace("red_class/", "crimson/"))
    assert main(["report", "--results", str(path), "--store", str(other), "--out", str(tmp_path / "a")]) == 2
    assert "holds no video" in capsys.readouterr().err and not (tmp_path / "a").exists()
    gone = json.loads(path.read_text())
    gone["store"] = str(tmp_path / "gone")
    (tmp_path / "gone.json").write_text(json.dumps(gone))
    # the store a record names is gone: the table needs none (it was refused whole), the gallery is left out, said
    assert main(["report", "--results", str(tmp_path / "gone.json"), "--out", str(tmp_path / "b")]) == 0
    err = capsys.readouterr().err
    assert "note: no gallery.html: " in err and "give --store" in err, err
    assert (tmp_path / "b" / "table.md").is_file() and not (tmp_path / "b" / "gallery.html").exists()
    assert main(["report", "--results", str(tmp_path), "--out", str(tmp_path / "c")]) == 2
    assert "a folder, not a result file" in capsys.readouterr().err
    nan = _record("linear", {"top1": float("nan")}, [("a", "rgb", "infonce")])
    (tmp_path / "nan.json").write_text(json.dumps(nan))
    with pytest.raises(DataError, match="results.top1: not a percentage from 0 to 100"):
        load_record(tmp_path / "nan.json")
    for problem, said in ((lambda r: r["results"].update({"top1": 250.0}), "results.top1: not a percentage"),
                          (lambda r: r.update(feature_health=[{"train": {"degenerate": "no"},
                                                               "test": {"degenerate": False}}]),
                           "feature_health: needs"),  # (250 was shown; "no" read as degenerate)
                          # (tracebacks: a list of splits, clip values that are not numbers)
                          (lambda r: r.update(splits=["train", "test"]), "splits: not a mapping of each role"),
                          (lambda r: r.update(config={"clips": {"length": "8", "size": [32]}}),
                           r"config\.clips\.length: not a whole number \('8'\)")):
        edited = _record("linear", {"top1": 50.0}, [("a", "rgb", "infonce")])
        problem(edited)
        (tmp_path / "edited.json").write_text(json.dumps(edited))
        with pytest.raises(DataError, match=said):
            load_record(tmp_path / "edited.json")


@pytest.mark.slow
def test_a_report_of_another_run_keeps_none_of_the_first_run_s_results(tmp_path):
    """`report --run A` then `--run B` into one folder: results/ held A's stages beside B's, and a table made from
    it mixed the two runs."""
    fake_run(tmp_path)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    manifest["stages"] = manifest["stages"][:2]
    (tmp_path / "short").mkdir()
    for stage in manifest["stages"]:
        (tmp_path / "short" / stage["name"]).symlink_to(tmp_path / "run" / stage["name"])
    (tmp_path / "short" / "manifest.json").write_text(json.dumps(manifest))
    for run in ("run", "short"):
        assert main(["report", "--run", str(tmp_path / run), "--store", str(tmp_path / "store"), "--out",
                     str(tmp_path / "report"), "--length", "8", "--size", "32", "--quiet"]) == 0
    assert sorted(p.name for p in (tmp_path / "report" / "results").iterdir()) == [
        "infonce_flow_flow.json", "infonce_rgb_rgb.json"]


def test_a_gallery_of_ragged_neighbour_rows_is_refused_before_anything_is_written():
    """Rows of nearest gallery videos of other lengths (each valid) failed in the gallery, after table.md and
    table.json were written."""
    from coclr.eval.report import neighbours_problem

    neighbours = {"query_keys": ["q0", "q1"], "query_labels": [0, 1], "gallery_keys": ["g0", "g1", "g2"],
                  "gallery_labels": [0, 1, 1], "classes": ["a", "b"], "topk_indices": [[0, 1], [2, 1]]}
    assert neighbours_problem({"neighbours": neighbours}) is None
    ragged = {**neighbours, "topk_indices": [[0, 1], [2]]}
    assert neighbours_problem({"neighbours": ragged}) == ("neighbours.topk_indices: needs one list of gallery rows "
                                                          "(below 3) per query, all of one length")
