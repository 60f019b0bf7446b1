"""Nothing overwritten, nothing written into another command's folder: every output option of the CLI (``--out``,
``--html``, ``--cache-dir``, a flow ``--view``, ``run.out``) refuses, in one line naming what is in the way, with exit
status 2 and before any work, a path that holds files the command did not write or lies inside a folder another
command owns (:mod:`coclr.runfolder`); and it still rewrites what it wrote itself. (A finetuning ``--work-dir`` gains
only its own claimed folders: tests/test_folders.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coclr.cli import build_parser, main
from coclr.runfolder import FolderRefused, FolderRule, check_folder, check_place, claim_folder, folder_owner
from conftest import make_random_store
from test_embed import moving_square, write_video
from test_eval_helpers import save_tiny_encoder
from test_folders import snapshot
from test_store import make_dataset


def refused(capsys, argv: list[str], *named: str, untouched: Path | None = None) -> str:
    """``coclr ARGV`` exits 2 with one line on stderr that holds every text of ``named``; ``untouched`` (a folder or a
    file) is byte for byte what it was. Returns the line."""
    before = snapshot(untouched) if untouched is not None and untouched.is_dir() else (
        untouched.read_bytes() if untouched is not None else None)
    assert main(argv) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("coclr "), lines
    for text in named:
        assert text in lines[0], (text, lines[0])
    if untouched is not None:
        assert (snapshot(untouched) if untouched.is_dir() else untouched.read_bytes()) == before
    return lines[0]


@pytest.fixture(scope="module")
def embedded(tmp_path_factory) -> tuple[Path, Path]:
    """A ``coclr embed`` folder of two tiny videos, and the encoder."""
    root = tmp_path_factory.mktemp("embedded")
    encoder = save_tiny_encoder(root / "encoder.pth")
    for seed in range(2):
        write_video(root / "videos" / f"v{seed}.mp4", moving_square(12, seed=seed))
    assert main(["embed", str(root / "videos"), "--checkpoint", str(encoder), "--out", str(root / "emb"), "--length",
                 "8", "--size", "32", "--short-side", "32", "--quiet", "--workers", "0"]) == 0
    return root / "emb", encoder


def test_data_store_refuses_a_folder_holding_the_users_own_index(tmp_path, capsys):
    """The probe: `coclr data store --out DIR` replaced DIR/index.json, the user's own file, without a word."""
    make_dataset(tmp_path / "videos", 2, frames=4)
    assert main(["data", "index", "--format", "folder", "--root", str(tmp_path / "videos"), "--out",
                 str(tmp_path / "index.json")]) == 0
    out = tmp_path / "out"
    out.mkdir()
    (out / "index.json").write_text('{"mine": 1}\n')
    (out / "notes").mkdir()
    store = ["data", "store", "--index", str(tmp_path / "index.json"), "--root", str(tmp_path / "videos"), "--out",
             str(out), "--short-side", "16", "--workers", "0"]
    refused(capsys, store, f"{out}: holds index.json, notes/, which coclr data store did not write", untouched=out)
    # A build killed between its index.json and its store.json left the same index: that is continued.
    (out / "notes").rmdir()
    (out / "index.json").write_bytes((tmp_path / "index.json").read_bytes())
    assert main(store) == 0 and folder_owner(out) == "data store"
    assert main(store) == 0  # and a store continues as before


def test_search_html_refuses_the_embedding_folder_and_files_it_did_not_write(tmp_path, capsys, embedded):
    """The probe: `coclr search DIR --html DIR/videos.jsonl` overwrote the folder's index with HTML."""
    emb, _ = embedded
    for target in (emb / "videos.jsonl", emb / "page.html"):
        refused(capsys, ["search", str(emb), "--query", "0", "--html", str(target)],
                f"inside {emb}, the output folder of `coclr embed`", untouched=emb)
    mine = tmp_path / "mine.html"
    mine.write_text("<html>my own page</html>")
    refused(capsys, ["search", str(emb), "--query", "0", "--html", str(mine)],
            f"{mine}: exists and is not a coclr search page", untouched=mine)
    page = tmp_path / "page.html"
    for _ in range(2):  # its own page is rewritten
        assert main(["search", str(emb), "--query", "0", "--html", str(page)]) == 0
    assert "coclr" in page.read_text()[:200]
    # a report's retrieval gallery the user kept was replaced by a search page: every page had one mark
    from coclr.eval.gallery import LEGACY_GENERATOR, gallery_page, page_generator

    kept = tmp_path / "kept_gallery.html"
    kept.write_text(gallery_page("Nearest-neighbour retrieval", "Test-set queries", []))
    refused(capsys, ["search", str(emb), "--query", "0", "--html", str(kept)],
            f"{kept}: exists and is not a coclr search page", untouched=kept)
    legacy = tmp_path / "legacy_gallery.html"  # (a gallery written before the mark named its kind, as reported)
    legacy.write_text(kept.read_text().replace(page_generator("gallery"), LEGACY_GENERATOR))
    refused(capsys, ["search", str(emb), "--query", "0", "--html", str(legacy)],
            f"{legacy}: exists and is not a coclr search page", untouched=legacy)
    old = tmp_path / "old_search.html"  # (a search page written before the mark named its kind: rewritten)
    old.write_text(page.read_text().replace(page_generator("search"), LEGACY_GENERATOR))
    assert LEGACY_GENERATOR in old.read_text()
    assert main(["search", str(emb), "--query", "0", "--html", str(old)]) == 0
    assert main(["search", str(emb), "--query", "0"]) == 0  # the folder works as before


def test_embed_refuses_a_folder_inside_another_commands_folder(tmp_path, capsys, embedded):
    emb, encoder = embedded
    store = make_random_store(tmp_path / "store")
    embed = ["embed", str(emb.parent / "videos"), "--checkpoint", str(encoder), "--quiet", "--workers", "0", "--out"]
    refused(capsys, [*embed, str(store / "embeddings")], f"inside {store}, the output folder of `coclr data store`",
            untouched=store)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "a.txt").write_text("mine")
    refused(capsys, [*embed, str(mine)], "holds a.txt, which coclr embed did not write", untouched=mine)


def test_data_index_rewrites_an_index_and_refuses_anything_else(tmp_path, capsys):
    make_dataset(tmp_path / "videos", 2, frames=4)
    index = ["data", "index", "--format", "folder", "--root", str(tmp_path / "videos"), "--out"]
    assert main([*index, str(tmp_path / "index.json")]) == 0
    assert main([*index, str(tmp_path / "index.json")]) == 0  # its own file, rewritten
    mine = tmp_path / "labels.json"
    mine.write_text('{"labels": []}')
    refused(capsys, [*index, str(mine)], f"{mine}: exists and is not a coclr video index", untouched=mine)
    store = make_random_store(tmp_path / "store")
    refused(capsys, [*index, str(store / "index.json")], "the output folder of `coclr data store`", untouched=store)


def test_eval_refuses_its_outputs_before_any_work(tmp_path, capsys, embedded):
    """The result file, the probe's probabilities beside it and the cache folder are checked first: a checkpoint that
    does not exist is not even looked at."""
    emb, _ = embedded
    base = ["--checkpoint", str(tmp_path / "absent.pt"), "--store", str(tmp_path / "absent"), "--quiet"]
    mine = tmp_path / "result.json"
    mine.write_text('{"my": "notes"}')
    refused(capsys, ["eval", "retrieval", *base, "--out", str(mine)], "is not a coclr eval result", untouched=mine)
    refused(capsys, ["eval", "linear", *base, "--out", str(emb / "r.json")], "the output folder of `coclr embed`",
            untouched=emb)
    probabilities = tmp_path / "linear.probabilities.npz"
    probabilities.write_text("not numpy")
    refused(capsys, ["eval", "linear", *base, "--out", str(tmp_path / "linear.json")], str(probabilities),
            untouched=probabilities)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "keep.txt").write_text("mine")
    refused(capsys, ["eval", "retrieval", *base, "--cache-dir", str(cache)],
            "holds keep.txt, which coclr feature cache did not write", untouched=cache)
    assert "checkpoint not found" in refused(capsys, ["eval", "retrieval", *base, "--out", str(tmp_path / "new.json")])


def test_report_writes_a_report_folder_and_refuses_any_other(tmp_path, capsys):
    from coclr.eval.report import TABLE_COLUMNS, report_options

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("mine")
    refused(capsys, ["report", "--results", str(tmp_path / "absent.json"), "--out", str(mine)],
            "holds thesis.tex, which coclr report did not write", untouched=mine)
    run = tmp_path / "run"
    with claim_folder(run, FolderRule("pretrain", "a pretrain run"), {}):
        pass
    refused(capsys, ["report", "--results", str(tmp_path / "absent.json"), "--out", str(run / "report")],
            f"inside {run}, the output folder of `coclr pretrain`", untouched=run)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "table.md").write_text("| old |")
    assert report_options(legacy) is None  # a user's file of a report's name: not a report
    (legacy / "results").mkdir()
    (legacy / "results" / "infonce_rgb_rgb.json").write_text('{"my": "notes"}')
    refused(capsys, ["report", "--results", str(tmp_path / "absent.json"), "--out", str(legacy)],
            "holds results/, table.md, which coclr report did not write", untouched=legacy)
    (legacy / "table.json").write_text(json.dumps({"columns": list(TABLE_COLUMNS), "rows": []}))
    assert report_options(legacy) == {}  # a report written before folders were recorded is a report's
    assert report_options(mine) is None


def test_flow_refuses_a_view_folder_of_other_files(tmp_path, capsys):
    store = make_random_store(tmp_path / "store")
    (store / "flow_notes").mkdir()
    (store / "flow_notes" / "todo.txt").write_text("mine")
    refused(capsys, ["flow", str(store), "--backend", "dis", "--view", "flow_notes", "--workers", "0"],
            "holds todo.txt, which coclr flow did not write (it writes only entry files", untouched=store)


def test_run_folders_refuse_other_files_and_nest_only_as_the_commands_do(tmp_path):
    """The folder rule itself: a new run folder holding files is refused (naming them), one inside another command's
    folder too, but a pipeline holds its stages and a study its runs; a folder with a record continues."""
    rule = FolderRule("pretrain", "a pretrain run")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "a.txt").write_text("mine")
    with pytest.raises(FolderRefused, match=r"mine: holds a\.txt, which coclr pretrain did not write"):
        check_folder(mine, rule, {})
    with claim_folder(tmp_path / "embed_like", FolderRule("embed", "embeddings"), {}):
        pass
    with pytest.raises(FolderRefused, match="the output folder of `coclr embed`"):
        check_folder(tmp_path / "embed_like" / "deeper" / "run", rule, {})
    with claim_folder(tmp_path / "pipe", FolderRule("pipeline", "a pipeline run"), {}):
        pass
    with claim_folder(tmp_path / "pipe" / "infonce_rgb", rule, {}) as continued:
        assert not continued
    assert folder_owner(tmp_path / "pipe" / "infonce_rgb") == "pretrain"
    with pytest.raises(FolderRefused, match="must not write into"):
        check_place(tmp_path / "pipe" / "infonce_rgb" / "page.html", "search")
    (tmp_path / "pipe" / "infonce_rgb" / "notes.txt").write_text("the user's, beside the run")
    assert check_folder(tmp_path / "pipe" / "infonce_rgb", rule, {})  # a recorded folder is continued


def test_a_studys_evaluation_records_and_report_are_its_own(tmp_path):
    """`coclr eval linear --out STUDY/eval/coclr_rgb_linear.json` replaced the study's record (its table then
    disagreed with it, and the study's next run replaced the user's file in turn); `coclr report --out STUDY/eval/r`
    was accepted too."""
    with claim_folder(tmp_path / "study", FolderRule("study", "a study run"), {}):
        pass
    for command, inside in (("eval", "eval/coclr_rgb_linear.json"), ("eval", "mine.json"), ("report", "eval/r"),
                            ("report", "logs/r")):
        with pytest.raises(FolderRefused, match="the output folder of `coclr study`, which coclr "
                                                f"{command} must not write into"):
            check_place(tmp_path / "study" / inside, command)
    check_place(tmp_path / "study" / "finetune" / "x", "finetune")  # (its own finetuning: the study's evaluations)


def test_a_record_written_while_the_folder_is_checked_is_checked_not_refused(tmp_path):
    """Two processes of one job (torchrun) claim one folder: the record the first writes between the second's read
    of it and its look at the folder's files is the folder's record, checked as such, not a file in the way."""
    import dataclasses

    from coclr.runfolder import run_record

    rule = FolderRule("pretrain", "a pretrain run")
    record = run_record(rule, {"lr": 0.1})
    reads = []

    def read_as_another_process_writes(folder: Path):
        reads.append(folder)
        if len(reads) == 1:  # not recorded yet when read; recorded at once after
            record.write(folder, False)
            return None
        return record.read(folder)

    racing = dataclasses.replace(record, read=read_as_another_process_writes)
    folder = tmp_path / "run"
    folder.mkdir()
    assert check_folder(folder, rule, {"lr": 0.1}, record=racing)  # recorded: continued
    reads.clear()
    (folder / "run.json").unlink()
    with pytest.raises(FolderRefused, match=r"holds a pretrain run with lr=0\.1 \(given 0\.2\)"):
        check_folder(folder, rule, {"lr": 0.2}, record=dataclasses.replace(record, read=read_as_another_process_writes))
    (folder / "run.json").unlink()
    (folder / "a.txt").write_text("the user's")
    with pytest.raises(FolderRefused, match=r"holds a\.txt"):  # no record appeared: refused as before
        check_folder(folder, rule, {"lr": 0.1}, record=dataclasses.replace(record, read=lambda f: None))


def test_study_seeds_refuse_a_folder_of_other_files(tmp_path):
    from coclr.config import load_config
    from coclr.study.config import StudyConfig
    from coclr.study.run import run_seeds

    out = tmp_path / "seeds"
    out.mkdir()
    (out / "seeds.md").write_text("# earlier summary")  # ours by name
    (out / "mined_precision_flow.png").write_bytes(b"\x89PNG")  # ours too: the miners' plot (issue 48)
    (out / "paper.pdf").write_bytes(b"%PDF")
    before = snapshot(out)
    with pytest.raises(FolderRefused, match=r"holds paper\.pdf, which coclr study did not write"):
        run_seeds(load_config(StudyConfig), out, [0, 1], check_only=True)
    assert snapshot(out) == before


def test_the_owner_records_are_those_the_store_and_embed_folders_write():
    from coclr.embed import output
    from coclr.runfolder import OWNER_RECORDS
    from coclr.store import clipstore

    assert OWNER_RECORDS == {clipstore.META_FILE: (clipstore.STORE_FORMAT, clipstore.STORE_FOLDER.command),
                             output.SETTINGS_FILE: (output.FORMAT, output.EMBED_FOLDER.command)}


OUTPUT_OPTIONS = {"data index --out", "data store --out", "data synth --out", "embed --out", "eval * --out",
                  "eval * --cache-dir", "eval finetune --work-dir", "report --out", "report --cache-dir",
                  "search --html", "study --out", "demo --out", "learn --out", "export --out", "curate --out"}
"""Every option of the CLI that names where a command writes, each checked by the rule (the tests above, and
tests/test_folders.py, tests/test_learn.py, tests/test_export.py, tests/test_curate.py); pretrain and pipeline write
run.out, flow a view of its store."""


def test_every_output_option_of_the_cli_is_one_the_rule_covers():
    """A new --out-like option fails this test until it is added here, with its check."""
    import argparse

    found = set()

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{prefix} {name}".strip())
            for option in action.option_strings:
                words = set(option.lstrip("-").split("-"))
                if words & {"out", "output", "html", "dir", "folder", "cache", "save", "write", "file"}:
                    task = prefix.split()
                    shown = f"eval * {option}" if task[0] == "eval" and option != "--work-dir" else f"{prefix} {option}"
                    found.add(shown)

    walk(build_parser(), "")
    assert found == OUTPUT_OPTIONS, found ^ OUTPUT_OPTIONS


def test_paths_are_compared_as_the_files_they_name(tmp_path, monkeypatch):
    from coclr.train.setup import PRETRAIN_FOLDER

    (tmp_path / "store").mkdir()
    (tmp_path / "elsewhere" / "store").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    options = {"data": {"store": "store", "view": "rgb"}, "method": {"init_checkpoint": ""}}
    with claim_folder(tmp_path / "run", PRETRAIN_FOLDER, options):
        pass
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["options"]
    assert recorded["data"]["store"] == str(tmp_path / "store") and recorded["method"]["init_checkpoint"] == ""
    for spelling in ("store/", "./store", str(tmp_path / "store")):  # one store, typed as a shell completes it
        assert check_folder(tmp_path / "run", PRETRAIN_FOLDER, {**options, "data": {"store": spelling, "view": "rgb"}})
    monkeypatch.chdir(tmp_path / "elsewhere")  # the same name there is another store: not continued on it
    with pytest.raises(FolderRefused, match=f"data.store='{tmp_path / 'store'}' \\(given '{tmp_path / 'elsewhere'}"):
        check_folder(tmp_path / "run", PRETRAIN_FOLDER, options)


def test_a_report_of_a_folder_that_is_no_pipeline_run_makes_no_out_folder(tmp_path, capsys):
    from coclr.synth.output import random_store

    store = random_store(tmp_path / "store", videos=2, frames=3, size=(16, 16), views=("rgb",))
    refused(capsys, ["report", "--run", str(store), "--store", str(store), "--out", str(tmp_path / "report")],
            "manifest.json")
    assert not (tmp_path / "report").exists()  # (it was made, with its run.json, before the run was read)
