"""One library function evaluates a checkpoint; ``coclr eval`` and the study call it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from coclr.cli import main
from coclr.errors import ConfigError
from coclr.eval.evaluate import TaskOptions, evaluate_checkpoint
from coclr.eval.features import ClipConfig, Stream
from coclr.eval.linear import LinearProbeConfig
from coclr.eval.retrieval import evaluate_retrieval
from coclr.store.clipstore import ClipStore
from test_eval_cli import CLIP_ARGS, tiny  # noqa: F401 (the fixture)

CLIPS = ClipConfig(length=8, size=32, batch_size=6)


def test_the_cli_record_is_the_library_record(tiny, tmp_path):  # noqa: F811
    store_root, rgb, _, _ = tiny
    out = tmp_path / "retrieval.json"
    assert main(["eval", "retrieval", "--checkpoint", str(rgb), "--store", str(store_root), "--out", str(out),
                 "--name", "Mine", *CLIP_ARGS]) == 0
    store = ClipStore(store_root)
    record = evaluate_checkpoint("retrieval", store, [Stream(rgb, "rgb")], CLIPS, name="Mine", progress=False)
    assert json.loads(out.read_text()) == json.loads(json.dumps(record))
    direct = evaluate_retrieval(store, [Stream(rgb, "rgb")], CLIPS, progress=False)
    assert record["results"] == direct["results"] and record["name"] == "Mine"


def test_the_linear_probe_writes_its_probabilities_when_asked(tiny, tmp_path):  # noqa: F811
    store_root, rgb, _, _ = tiny
    store = ClipStore(store_root)
    options = TaskOptions(probe=LinearProbeConfig(lrs=[1e-2], weight_decays=[0.0], epochs=[2]),
                          probabilities=tmp_path / "p.npz")
    record = evaluate_checkpoint("linear", store, [Stream(rgb, "rgb")], CLIPS, options, progress=False)
    saved = np.load(record["results"]["probabilities"])
    assert saved["probabilities"].shape == (3, len(store.index.classes))
    assert np.allclose(saved["probabilities"].sum(axis=1), 1, atol=1e-5)


def test_bad_tasks_are_refused(tiny):  # noqa: F811
    store = ClipStore(tiny[0])
    with pytest.raises(ConfigError, match="'knn'"):
        evaluate_checkpoint("knn", store, [Stream(tiny[1], "rgb")], CLIPS)
    with pytest.raises(ConfigError, match="work_dir"):
        evaluate_checkpoint("finetune", store, [Stream(tiny[1], "rgb")], CLIPS)


def test_an_earlier_record_of_the_same_inputs_stands_and_other_inputs_are_evaluated_again(tiny, tmp_path):  # noqa: F811
    """What a study's rerun relies on: a record is reused only when every input is the same (the batch size is
    not an input), and a record of other inputs is never returned."""
    store_root, rgb, flow, _ = tiny
    store = ClipStore(store_root)
    options = TaskOptions(probe=LinearProbeConfig(lrs=[1e-2], weight_decays=[0.0], epochs=[2]))
    record = evaluate_checkpoint("linear", store, [Stream(rgb, "rgb")], CLIPS, options, progress=False)
    marked = {**record, "results": {**record["results"], "top1": -1.0}}  # only a reuse can return -1

    def again(streams=None, clips=CLIPS, task_options=options):
        return evaluate_checkpoint("linear", store, streams or [Stream(rgb, "rgb")], clips, task_options,
                                   progress=False, earlier=marked)

    assert again() is marked
    assert again(clips=ClipConfig(length=8, size=32, batch_size=2)) is marked
    other_probe = TaskOptions(probe=LinearProbeConfig(lrs=[1e-2], weight_decays=[0.0], epochs=[3]))
    copy = tmp_path / "copy.pt"  # the same content elsewhere is the same input ...
    copy.write_bytes(rgb.read_bytes())
    assert again(streams=[Stream(copy, "rgb")]) is marked
    for changed in (again(task_options=other_probe), again(streams=[Stream(flow, "rgb")]),  # ... other content not
                    again(clips=ClipConfig(length=8, stride=2, size=32, batch_size=6))):
        assert changed["results"]["top1"] >= 0 and changed["inputs_sha256"] != record["inputs_sha256"]


def test_one_split_for_both_sides_of_an_evaluation_is_refused():
    from coclr.errors import ConfigError
    from coclr.eval.evaluate import evaluate_checkpoint

    for task in ("retrieval", "linear", "finetune"):  # retrieval answered R@1 100: each video found itself
        with pytest.raises(ConfigError, match="--train-split and --test-split are both 'test'"):
            evaluate_checkpoint(task, "no store needed", [], None, train_split="test", test_split="test")


def test_autocast_is_refused_where_the_cpu_has_no_bfloat16_instructions(tiny, tmp_path, monkeypatch,  # noqa: F811
                                                                        capsys):
    """``eval --amp`` ran on a CPU without bfloat16 instructions (the AVX2 kind): slower than float32, and R@k other
    than a CPU with them gives (its features cached under the same key); ``embed --precision bf16`` was refused
    there. One rule now (:func:`coclr.cpu.require_native_bfloat16`), before any work."""
    from coclr.cpu import AVX2_LIMIT

    store_root, rgb, _, _ = tiny
    for name, value in AVX2_LIMIT.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "r.json"
    assert main(["eval", "retrieval", "--checkpoint", str(rgb), "--store", str(store_root), "--out", str(out),
                 "--amp", "--cache-dir", str(tmp_path / "cache"), *CLIP_ARGS]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "coclr eval: error: amp: this CPU has no bfloat16 instructions (AVX512_BF16 or AMX); leave --amp off")
    assert not out.exists() and not (tmp_path / "cache").exists()
