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
