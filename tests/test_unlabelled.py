"""Videos without labels, first class: indexes, the store, flow and self-supervised training take them; what needs
labels refuses them in one line before any work."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from coclr.cli import main
from coclr.errors import DataError
from coclr.video.indexes import UNLABELLED, VideoEntry, VideoIndex, csv_index, tree_index, unlabelled_index


def touch(path, data: bytes = b"x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_a_tree_of_videos_is_indexed_without_labels_its_folders_are_source_groups(tmp_path):
    for name in ("top.mp4", "cam1/a.mp4", "cam1/b.avi", "cam1/day2/c.mkv", "cam2/d.mp4", "cam2/notes.txt",
                 ".hidden/e.mp4"):
        touch(tmp_path / "v" / name)
    index = tree_index(tmp_path / "v")
    by_path = {e.path: e for e in index.entries}
    assert sorted(by_path) == ["cam1/a.mp4", "cam1/b.avi", "cam1/day2/c.mkv", "cam2/d.mp4", "top.mp4"]
    assert {path: e.group for path, e in by_path.items()} == {
        "cam1/a.mp4": "cam1", "cam1/b.avi": "cam1", "cam1/day2/c.mkv": "cam1/day2", "cam2/d.mp4": "cam2",
        "top.mp4": None}
    assert all(e.label is None and e.label_id == UNLABELLED and e.split == "train" for e in index.entries)
    assert index.classes == [] and index.unlabelled() == [e.path for e in index.entries]
    loaded = VideoIndex.from_dict(json.loads(json.dumps(index.to_dict())))  # null labels survive the file
    assert loaded.entries == index.entries
    split = tree_index(tmp_path / "v", test_fraction=0.5, seed=3)
    assert {e.split for e in split.entries} == {"train", "test"}
    for group in ("cam1", "cam2"):  # a source never straddles the split
        assert len({e.split for e in split.entries if e.group == group}) == 1
    with pytest.raises(DataError, match="no videos"):
        tree_index(touch(tmp_path / "empty" / "notes.txt").parent)


def test_a_link_loop_in_a_tree_is_refused_naming_it(tmp_path):
    touch(tmp_path / "v" / "cam" / "a.mp4")
    (tmp_path / "v" / "cam" / "again").symlink_to(tmp_path / "v")
    with pytest.raises(DataError, match="loop.*cam/again"):
        tree_index(tmp_path / "v")


def test_a_manifest_without_a_label_column_or_with_empty_labels(tmp_path):
    plain = tmp_path / "plain.csv"
    plain.write_text("a.mp4\nb.mp4\n")
    assert [(e.path, e.label) for e in csv_index(plain).entries] == [("a.mp4", None), ("b.mp4", None)]
    header = tmp_path / "header.csv"
    header.write_text("path,split,group\na.mp4,train,g1\nb.mp4,test,g2\n")
    entries = csv_index(header).entries
    assert [(e.path, e.label, e.split, e.group) for e in entries] == [("a.mp4", None, "train", "g1"),
                                                                      ("b.mp4", None, "test", "g2")]
    some = tmp_path / "some.csv"
    some.write_text("path,label\na.mp4,run\nb.mp4,\nc.mp4,walk\n")
    index = csv_index(some)
    assert index.classes == ["run", "walk"] and [e.label for e in index.entries] == [0, None, 1]
    bad = tmp_path / "bad.csv"
    bad.write_text("path,colour\na.mp4,red\n")
    with pytest.raises(DataError, match="header names the columns"):
        csv_index(bad)


def test_what_needs_labels_names_the_unlabelled_videos(tmp_path):
    index = VideoIndex("mine", ["a"], [VideoEntry("x.mp4", 0, "train"), VideoEntry("y.mp4", None, "train"),
                                       VideoEntry("z.mp4", None, "test")])
    index.require_labels("anything", ["val"])  # no video of that split: nothing missing
    with pytest.raises(DataError, match=r"linear probe needs labels, but 1 of the 2 videos of split train .*y\.mp4"):
        index.require_labels("linear probe", ["train"])
    assert index.class_counts() == [1]


def test_data_index_unlabelled_cli(tmp_path, capsys):
    touch(tmp_path / "v" / "cam1" / "a.mp4")
    touch(tmp_path / "v" / "b.mp4")
    out = tmp_path / "index.json"
    assert main(["data", "index", "--format", "folder", "--unlabelled", "--root", str(tmp_path / "v"),
                 "--out", str(out)]) == 0
    assert "no labels, 2 videos" in capsys.readouterr().out
    assert [e.label for e in VideoIndex.load(out).entries] == [None, None]
    # the labelled folder format still refuses loose videos; --unlabelled with another format is refused
    assert main(["data", "index", "--format", "folder", "--root", str(tmp_path / "v"), "--out", str(out)]) == 2
    assert main(["data", "index", "--format", "csv", "--unlabelled", "--annotations", "m.csv", "--out",
                 str(out)]) == 2
    assert "--unlabelled applies to --format folder" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ through every stage


@pytest.fixture(scope="module")
def unlabelled_store(tmp_path_factory):
    """A store of 12 random unlabelled videos with rgb and flow views."""
    from coclr.store.clipstore import create_store, write_entry
    from coclr.store.jpeg import encode_jpeg

    root = tmp_path_factory.mktemp("unlabelled") / "store"
    index = unlabelled_index([f"cam{i % 3}/v{i:02d}.mp4" for i in range(12)], "mine", test_fraction=0.3)
    create_store(root, index)
    rng = np.random.default_rng(0)
    for entry in index.entries:
        for view, count in (("rgb", 12), ("flow", 11)):
            frames = rng.integers(0, 256, (count, 36, 40, 3), dtype=np.uint8)
            write_entry(root, entry.path, view, [encode_jpeg(f) for f in frames], fps=25.0)
    return root


def pretrain_args(store, out, *overrides):
    return ["pretrain", f"data.store={store}", f"run.out={out}", "data.length=8", "data.size=32", "data.workers=0",
            "model.width=0.125", "method.queue_size=8", "method.topk=2", "optim.epochs=1", "run.batch_size=4",
            "run.progress=false", *overrides]


@pytest.mark.parametrize("method", ["infonce", "coclr", "cmc"])
def test_self_supervised_methods_train_on_unlabelled_videos(tmp_path, unlabelled_store, method):
    from coclr.train.checkpoint import load_checkpoint

    extra = []
    if method == "coclr":
        assert main(pretrain_args(unlabelled_store, tmp_path / "flow", "data.view=flow",
                                  "data.second_view=rgb")) == 0
        extra = [f"method.sampler_checkpoint={tmp_path / 'flow' / 'checkpoint_last.pth'}",
                 "method.wait_for_full_queue=false"]
    assert main(pretrain_args(unlabelled_store, tmp_path / method, f"method.name={method}", *extra)) == 0
    checkpoint = load_checkpoint(tmp_path / method / "checkpoint_last.pth")
    assert checkpoint["position"]["epoch"] == 1
    log = [json.loads(line) for line in (tmp_path / method / "log.jsonl").read_text().splitlines()]
    assert all(np.isfinite(record["epoch_loss"]) for record in log if "epoch_loss" in record)
    views = sorted(path.name for path in (tmp_path / method).glob("encoder_*.pth"))
    if method != "cmc":
        assert views == []  # one view trained: the checkpoint is its encoder
        return
    # Both views trained: each one's encoder is a file of its own (the checkpoint loads as the first view's).
    from coclr.embed.settings import checkpoint_view
    from coclr.models.loading import load_encoder

    assert views == ["encoder_flow.pth", "encoder_rgb.pth"]
    flow, _ = load_encoder(tmp_path / method / "encoder_flow.pth")
    assert checkpoint_view(tmp_path / method / "encoder_flow.pth") == "flow"
    for name, tensor in flow.state_dict().items():
        assert torch.equal(tensor, checkpoint["encoders"]["flow"]["backbone"][name])


def test_label_needing_commands_refuse_unlabelled_videos_before_any_work(tmp_path, unlabelled_store, capsys):
    from test_eval_helpers import save_tiny_encoder

    assert main(pretrain_args(unlabelled_store, tmp_path / "uber", "method.name=ubernce")) == 2
    assert "method ubernce needs labels, but 8 of the 8 videos of split train" in capsys.readouterr().err
    assert not (tmp_path / "uber").exists()
    encoder = save_tiny_encoder(tmp_path / "enc.pth")
    for task in ("retrieval", "linear", "finetune"):
        extra = ["--work-dir", str(tmp_path / "ft")] if task == "finetune" else []
        assert main(["eval", task, "--checkpoint", str(encoder), "--store", str(unlabelled_store), "--out",
                     str(tmp_path / f"{task}.json"), "--length", "8", "--size", "32", *extra]) == 2
        assert f"evaluation ({task}) needs labels" in capsys.readouterr().err
        assert not (tmp_path / f"{task}.json").exists() and not (tmp_path / "ft").exists()
    assert main(["study", "--out", str(tmp_path / "study"), "data.source=store", f"data.store={unlabelled_store}",
                 "--check"]) == 2
    assert "a study (Table 1 is evaluated with labels) needs labels" in capsys.readouterr().err


def test_the_training_monitor_judges_unlabelled_videos_by_their_spread(unlabelled_store):
    from coclr.eval.monitor import knn_recall
    from coclr.models.loading import load_encoder
    from test_eval_helpers import save_tiny_encoder

    backbone, _ = load_encoder(save_tiny_encoder(unlabelled_store.parent / "enc.pth"))
    found = knn_recall(backbone, str(unlabelled_store), "rgb", 8, 1, 32, query_split="test", gallery_split="train")
    assert set(found) == {"knn_rank", "knn_collapsed"} and found["knn_rank"] > 1
