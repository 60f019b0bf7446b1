"""``coclr eval`` end to end on a tiny store with width-0.125 encoders, checked against direct computation."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from coclr.cli import main
from coclr.eval.features import ClipConfig
from test_eval_helpers import make_tiny_store, save_tiny_encoder
from test_eval_retrieval import brute_force

CLIP_ARGS = ["--length", "8", "--size", "32", "--batch-size", "6", "--quiet"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    store = make_tiny_store(root / "store", train_per_class=2, test_per_class=1, frames=8, views=("rgb", "flow"))
    flow = save_tiny_encoder(root / "flow.pt", seed=1, meta={"method": "infonce", "view": "flow"})
    return store, save_tiny_encoder(root / "rgb.pt", seed=0), flow, root


def _cached(store_root, checkpoint, view, cache, monkeypatch):
    """The features the command used, read back from its cache (test_eval_features checks that a cache hit
    equals a fresh extraction); loading the model is forbidden, so these must be hits."""
    import coclr.eval.features as features
    from coclr.store.clipstore import ClipStore

    monkeypatch.setattr(features, "load_backbone", lambda path: pytest.fail("expected a cache hit"))
    store = ClipStore(store_root)
    config = ClipConfig(length=8, size=32, batch_size=6)
    return [features.cached_features(checkpoint, store, view, split, config, cache) for split in ("train", "test")]


def test_eval_retrieval_two_stream(tiny, capsys, monkeypatch):
    store, rgb, flow, root = tiny
    out = root / "retrieval.json"
    assert main(["eval", "retrieval", "--checkpoint", str(rgb), "--checkpoint2", str(flow), "--view2", "flow",
                 "--store", str(store), "--out", str(out), "--cache-dir", str(root / "cache"), *CLIP_ARGS]) == 0
    record = json.loads(out.read_text())
    assert record["task"] == "retrieval" and record["splits"]["train"]["videos"] == 6
    assert record["splits"]["test"]["videos"] == 3
    assert [s["view"] for s in record["streams"]] == ["rgb", "flow"]
    from coclr.atomic import file_sha256

    assert record["streams"][0]["checkpoint_sha256"] == file_sha256(rgb)
    cache = root / "cache"
    (rgb_train, rgb_test) = _cached(store, rgb, "rgb", cache, monkeypatch)
    (flow_train, flow_test) = _cached(store, flow, "flow", cache, monkeypatch)
    ks = (1, 5, 10, 20)
    expected, neighbours = brute_force([rgb_test.features, flow_test.features], rgb_test.labels,
                                       [rgb_train.features, flow_train.features], rgb_train.labels, ks)
    for k in ks:
        assert record["results"][f"R@{k}"] == pytest.approx(100 * expected[k])
    assert record["neighbours"]["topk_indices"] == neighbours[:, :6].tolist()
    assert record["neighbours"]["query_keys"] == rgb_test.keys
    single, _ = brute_force([rgb_test.features], rgb_test.labels, [rgb_train.features], rgb_train.labels, ks)
    assert record["per_stream"][0]["R@1"] == pytest.approx(100 * single[1])
    assert '"R@1"' in capsys.readouterr().out


def test_eval_linear(tiny, capsys):
    store, rgb, _, root = tiny
    out = root / "linear.json"
    assert main(["eval", "linear", "--checkpoint", str(rgb), "--store", str(store), "--out", str(out),
                 "--cache-dir", str(root / "cache"), "--lrs", "0.01", "--weight-decays", "0", "--epochs", "2", "6",
                 *CLIP_ARGS]) == 0
    # three classes: the top-5 of 100% is no result, and was printed beside top-1 without a word
    assert "note: top-5 is 100% by construction with 3 classes (at most 5): only top-1 measures the classifier" in \
        capsys.readouterr().err
    record = json.loads(out.read_text())
    results = record["results"]
    assert results["selected"]["epochs"] in (2, 6) and len(results["grid"]) == 2
    probabilities = np.load(results["probabilities"])
    labels = probabilities["labels"]
    top1 = (probabilities["probabilities"].argmax(axis=1) == labels).mean()
    assert results["top1"] == pytest.approx(100 * top1)
    assert len(labels) == 3 and record["streams"][0]["view"] == "rgb"
    assert record["config"]["probe"]["lrs"] == [0.01]


@pytest.mark.parametrize("args, message", [
    (["--checkpoint", "{root}/missing.pt"], "checkpoint not found"),
    (["--checkpoint", "{root}/flow.pt", "--view", "flow_dis"], "view 'flow_dis' is missing"),
    (["--test-split", "val"], "split 'val' has no videos"),
    (["--store", "{root}/nowhere"], "clip store not found"),
])
def test_errors_are_clear_and_early(tiny, capsys, args, message):
    store, rgb, _, root = tiny
    base = {"--checkpoint": str(rgb), "--store": str(store)}
    extra = [a.format(root=root) for a in args]
    for flag in ("--checkpoint", "--store"):
        if flag not in extra:
            extra += [flag, base[flag]]
    assert main(["eval", "retrieval", *extra, *CLIP_ARGS]) == 2
    assert message in capsys.readouterr().err


def test_frames_unlike_the_encoders_training_are_said(tiny, capsys):
    """The short side, frame rate and flow bound a checkpoint recorded were not compared with the store's: an encoder
    trained on 32-pixel frames was evaluated on 128-pixel ones without a word."""
    store, _, _, root = tiny  # frames as decoded, every frame, flow at the default bound of 20 px
    same = {"view": "flow", "length": 8, "stride": 1, "size": 32, "short_side": None, "fps": None, "flow_bound": 20.0}
    other = {**same, "short_side": 32, "fps": 10.0, "flow_bound": 1.5}
    for name, settings in (("same", same), ("other", other)):
        encoder = save_tiny_encoder(root / f"{name}_flow.pt", seed=2, meta={"clip_settings": settings})
        assert main(["eval", "retrieval", "--checkpoint", str(encoder), "--store", str(store), "--batch-size", "6",
                     "--quiet"]) == 0
        warnings = [line for line in capsys.readouterr().err.splitlines() if "was trained on" in line]
        if name == "same":
            assert warnings == []
            continue
        assert warnings == [
            "coclr eval: warning: other_flow.pt was trained on frames of short side 32 px; this store's 'flow' has "
            "frames as decoded (a store made with `coclr data store --short-side` as its training store's gives it "
            "its own clips)",
            "coclr eval: warning: other_flow.pt was trained on frames at 10.0 fps; this store's 'flow' has every "
            "decoded frame (a store made with `coclr data store --fps` as its training store's gives it its own "
            "clips)",
            "coclr eval: warning: other_flow.pt was trained on flow clipped at +-1.5 px; this store's 'flow' has flow "
            "clipped at +-20.0 px (a store made with `coclr flow --bound` as its training store's gives it its own "
            "clips)"]


def test_clip_settings_and_view_default_to_what_the_checkpoint_was_trained_on(tiny, capsys):
    store, _, _, root = tiny
    settings = {"view": "flow", "length": 8, "stride": 1, "size": 32}
    flow = save_tiny_encoder(root / "trained_flow.pt", seed=2, meta={"method": "infonce", "clip_settings": settings})
    out = root / "defaults.json"
    assert main(["eval", "retrieval", "--checkpoint", str(flow), "--store", str(store), "--out", str(out),
                 "--batch-size", "6", "--quiet"]) == 0
    record = json.loads(out.read_text())
    assert (record["config"]["length"], record["config"]["stride"], record["config"]["size"]) == (8, 1, 32)
    assert record["streams"][0]["view"] == "flow" and record["streams"][0]["trained_clips"] == {
        "length": 8, "stride": 1, "size": 32}
    captured = capsys.readouterr()
    assert "clips of length 8 (checkpoint), stride 1 (checkpoint), size 32 (checkpoint); views flow" in captured.err
    assert json.loads(captured.out[captured.out.index("{"):])["clips"] == {"length": 8, "stride": 1, "size": 32}
    assert main(["eval", "retrieval", "--checkpoint", str(flow), "--store", str(store), "--view", "rgb",
                 "--quiet"]) == 2
    assert "--view rgb: " in capsys.readouterr().err
    # Evaluated on other clips than it was trained on: the report marks the row and says how.
    other = root / "other.json"
    assert main(["eval", "retrieval", "--checkpoint", str(flow), "--store", str(store), "--out", str(other),
                 "--length", "9", "--batch-size", "6", "--quiet"]) == 0
    assert main(["report", "--results", str(out), str(other), "--out", str(root / "report")]) == 0
    table = (root / "report" / "table.md").read_text()
    assert "| InfoNCE | Flow | ✗ | - | - |" in table and "| InfoNCE † | Flow | ✗ | - | - |" in table
    assert "- InfoNCE † (Flow): † evaluated on 9x32 clips, trained on 8x32" in table


def test_bad_evaluation_options_are_refused_before_any_feature_is_extracted(tiny, capsys):
    store, rgb, _, root = tiny
    base = ["eval", "retrieval", "--checkpoint", str(rgb), "--store", str(store), "--cache-dir", str(root / "c0")]
    assert main([*base, "--ks", "0", "5"]) == 2
    assert "--ks 0 5: each k must be at least 1" in capsys.readouterr().err
    assert main([*base, "--length", "1"]) == 2
    assert "length: must be >= 8" in capsys.readouterr().err
    assert not (root / "c0").exists()
    assert main([*base, "--ks", "1", "50", *CLIP_ARGS]) == 0
    assert "k = 50 exceeds the 6 'train' videos" in capsys.readouterr().err


def test_a_collapsed_encoder_is_reported_and_scores_chance(tiny, capsys):
    """Every conv weight zero: every video gets the same feature. The record, the CLI and the report say so, and
    R@1 is the share of each query's class in the gallery (1/3 here), whatever the gallery's order."""
    import torch

    from coclr.models.encoder import Encoder
    from coclr.models.loading import load_encoder, save_encoder

    store, rgb, _, root = tiny
    backbone, head = load_encoder(rgb)
    with torch.no_grad():
        for name, parameter in backbone.named_parameters():
            if name.endswith("conv.weight") or ".conv" in name and name.endswith("weight"):
                parameter.zero_()
    collapsed = save_encoder(root / "collapsed.pt", Encoder(backbone, head), {"method": "coclr", "view": "rgb"})
    out = root / "collapsed.json"
    assert main(["eval", "retrieval", "--checkpoint", str(collapsed), "--store", str(store), "--out", str(out),
                 *CLIP_ARGS]) == 0
    record = json.loads(out.read_text())
    assert record["feature_health"][0]["train"]["degenerate"] and record["warnings"]
    assert "degenerate features" in capsys.readouterr().err
    assert record["results"]["R@1"] == pytest.approx(100 / 3, abs=1e-3)
    assert main(["report", "--results", str(out), "--out", str(root / "collapsed_report")]) == 0
    table = (root / "collapsed_report" / "table.md").read_text()
    assert "| CoCLR ‡ | RGB |" in table and "‡ degenerate features in the retrieval evaluation" in table


def test_a_video_found_damaged_as_it_is_read_is_left_out_and_the_evaluation_goes_on(tmp_path, capsys):
    """A frame whose checksum fails stopped the evaluation with the checksums and nothing to do (then, the job with
    exit 2, what to do): one input's failure is that input's, so the evaluation leaves it out, starts again and
    ends with exit status 3; the same command again leaves it out too."""
    from coclr.store.clipstore import entry_path

    store = make_tiny_store(tmp_path / "store", train_per_class=2, test_per_class=1, frames=8)
    damaged = entry_path(store, "green_class/test_00.avi", "rgb")
    data = damaged.read_bytes()
    damaged.write_bytes(data[:len(data) // 2] + bytes(len(data) - len(data) // 2))
    rgb = save_tiny_encoder(tmp_path / "rgb.pt")
    command = ["eval", "retrieval", "--checkpoint", str(rgb), "--store", str(store), *CLIP_ARGS]
    assert main([*command, "--out", str(tmp_path / "first.json")]) == 3
    err = capsys.readouterr().err
    assert "checksum" in err and "listed as failed and left out: the evaluation starts again without it" in err, err
    assert main([*command, "--out", str(tmp_path / "again.json")]) == 3
    assert "left out 1 'test' video(s)" in capsys.readouterr().err
    first, again = (json.loads((tmp_path / name).read_text()) for name in ("first.json", "again.json"))
    assert first["results"] == again["results"]  # the same evaluation, of the videos left


def test_videos_whose_job_failed_are_left_out_of_evaluation_and_listed(tmp_path, capsys):
    import os

    from coclr.store.clipstore import entry_path, record_failures

    store = make_tiny_store(tmp_path / "store", train_per_class=2, test_per_class=1, frames=8, views=("rgb", "flow"))
    broken = "green_class/test_00.avi"
    os.unlink(entry_path(store, broken, "flow"))
    record_failures(store, "flow", [broken], [(broken, "DataError: cannot decode")])
    rgb = save_tiny_encoder(tmp_path / "rgb.pt")
    out = tmp_path / "r.json"
    assert main(["eval", "retrieval", "--checkpoint", str(rgb), "--store", str(store), "--also-views", "flow",
                 "--out", str(out), *CLIP_ARGS]) == 3  # (the figures are of the others: not all done)
    assert "left out 1 'test' video(s) whose jobs failed" in capsys.readouterr().err
    record = json.loads(out.read_text())
    assert record["splits"]["test"] == {"name": "test", "videos": 2, "left_out": [broken]}
    assert broken not in record["neighbours"]["query_keys"]
    assert main(["eval", "retrieval", "--checkpoint", str(rgb), "--store", str(store), "--out", str(out),
                 *CLIP_ARGS]) == 0  # RGB alone: nothing is missing
    assert json.loads(out.read_text())["splits"]["test"]["videos"] == 3


def _relabelled(tmp_path, relabel, train_per_class: int = 1):
    import dataclasses

    from coclr.store.clipstore import ClipStore, create_store

    root = make_tiny_store(tmp_path / "store", train_per_class=train_per_class, test_per_class=1, frames=8)
    index = ClipStore(root).index
    create_store(root, dataclasses.replace(index, entries=[dataclasses.replace(e, label=relabel(e))
                                                           for e in index.entries]), replace_index=True)
    return root


def test_scores_that_mean_less_than_they_seem_are_said(tmp_path, capsys):
    """A test class no training video has: misses without a word."""
    root = _relabelled(tmp_path, lambda e: 0 if e.split == "train" and e.label == 2 else e.label)
    checkpoint = save_tiny_encoder(tmp_path / "enc.pt")
    assert main(["eval", "retrieval", "--checkpoint", str(checkpoint), "--store", str(root), "--ks", "1",
                 *CLIP_ARGS]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    said = "1 of the 3 'test' videos are of classes no 'train' video has: each counts as a miss"
    assert sum(said in line for line in warnings) == 1, warnings  # (and the random encoder's health warning)


@pytest.mark.parametrize("task", ["retrieval", "linear"])
def test_what_the_index_tells_is_refused_before_any_feature(tmp_path, capsys, monkeypatch, task):
    """One class in all scored 100 "by construction" with exit status 0 (a warning on the terminal, none in the
    record); an unlabelled store was warned to be of one class before the labels' refusal; the probe's selection
    that holds out nothing was refused after every feature was extracted."""
    import coclr.eval.features as features

    monkeypatch.setattr(features, "load_backbone", lambda path: pytest.fail("features computed before refusing"))
    checkpoint = save_tiny_encoder(tmp_path / "enc.pt")
    args = ["--checkpoint", str(checkpoint), "--ks", "1", *CLIP_ARGS] if task == "retrieval" else [
        "--checkpoint", str(checkpoint), *CLIP_ARGS]
    one = _relabelled(tmp_path / "one", lambda e: 0)
    assert main(["eval", task, "--store", str(one), *args]) == 2
    err = capsys.readouterr().err
    assert f"evaluation ({task}): every 'train' and 'test' video is of one class, so every score would be 100" in err
    # one class in the train split: every score is the share of test videos of it (R@k 33.3 for any encoder)
    one_train = _relabelled(tmp_path / "one_train", lambda e: 0 if e.split == "train" else e.label)
    assert main(["eval", task, "--store", str(one_train), *args]) == 2
    assert f"evaluation ({task}): every 'train' video is of one class" in capsys.readouterr().err
    unlabelled = _relabelled(tmp_path / "none", lambda e: None)
    assert main(["eval", task, "--store", str(unlabelled), *args]) == 2
    err = capsys.readouterr().err
    assert "needs labels" in err and "one class" not in err and "warning" not in err, err
    if task == "linear":  # one train video a class: nothing to hold out for the selection
        assert main(["eval", task, "--store", str(make_tiny_store(tmp_path / "single", train_per_class=1,
                                                                   test_per_class=1, frames=8)), *args]) == 2
        assert "held-out split is empty: every class has a single train video" in capsys.readouterr().err


def test_a_feature_cache_that_cannot_be_written_is_refused_before_the_features(tiny, capsys, monkeypatch):
    """A --cache-dir on a read-only mount was refused only after the train split's features were computed."""
    import os

    import coclr.eval.features as features

    store, rgb, _, root = tiny
    monkeypatch.setattr(features, "load_backbone", lambda path: pytest.fail("features computed before refusing"))
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    assert main(["eval", "retrieval", "--checkpoint", str(rgb), "--store", str(store), "--cache-dir",
                 str(root / "read_only" / "cache"), *CLIP_ARGS]) == 2
    assert "cannot be written by this user" in capsys.readouterr().err


def test_a_finetuning_result_named_without_a_suffix_has_its_own_work_folder(tmp_path):
    """--out ftx trained, tested, then failed: its default work folder was ftx itself (".ftx.partial -> ftx: Is a
    directory"), and the rerun was refused ("ftx: is a folder")."""
    from pathlib import Path

    from coclr.cli.eval import work_dir_of

    assert work_dir_of(Path("runs/ft.json")) == Path("runs/ft")
    assert work_dir_of(Path("runs/ftx")) == Path("runs/ftx.work")


def test_a_killed_evaluation_s_temporary_files_are_removed_by_the_next(tiny, tmp_path):
    """A kill while the result, the probabilities or a feature cache file was being written left its hidden
    temporary file (as large as the features), which no later run removed."""
    store, rgb, _, _ = tiny
    out, cache = tmp_path / "linear.json", tmp_path / "cache"
    command = ["eval", "linear", "--checkpoint", str(rgb), "--store", str(store), "--out", str(out), "--cache-dir",
               str(cache), "--lrs", "0.01", "--weight-decays", "0", "--epochs", "2", *CLIP_ARGS]
    assert main(command) == 0
    dead = 2 ** 22 + 12345  # above the default pid_max of 4194304: no such process
    cached = sorted(cache.iterdir())
    cached[0].unlink()  # (the kill came as it was written: the next run writes it again)
    probabilities = tmp_path / "linear.probabilities.npz"
    stale = [path.parent / f".{path.name}.{dead}.a1b2c3.partial" for path in (out, probabilities, cached[0])]
    for path in stale:
        path.write_bytes(b"half a file")
    alive = out.parent / f".{out.name}.{os.getpid()}.d4e5f6.partial"  # (a writer still at work: kept)
    alive.write_bytes(b"being written")
    assert main(command) == 0
    assert not any(path.exists() for path in stale) and alive.exists()
