"""`coclr flow --backend tvl1-torch` writes a store that training reads exactly as the OpenCV one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from coclr.cli import main
from coclr.config import from_dict
from coclr.data.datasets import TrainClips
from coclr.store.clipstore import ClipStore
from coclr.synth import SynthConfig, generate_synthetic


def test_torch_and_opencv_flow_stores_read_the_same(tmp_path: Path) -> None:
    store = tmp_path / "store"
    generate_synthetic(store, from_dict(SynthConfig, {"train_scenes": 1, "test_scenes": 1, "num_classes": 2,
                                                      "actions_per_scene": 2, "clips_per_action": 1,
                                                      "frames": 9}), workers=1)
    params = ["nscales=3", "warps=2"]  # a short pyramid keeps the test fast; both backends get the same
    assert main(["flow", str(store), "--backend", "opencv", "--workers", "1", *params]) == 0
    assert main(["flow", str(store), "--backend", "torch", "--view", "flow_torch", "--device", "cpu", *params]) == 0
    clip_store = ClipStore(store)
    for key in clip_store.keys():
        assert clip_store.num_frames(key, "flow_torch") == clip_store.num_frames(key, "flow") == 8
        assert clip_store.frame_size(key, "flow_torch") == clip_store.frame_size(key, "flow")
    opencv = TrainClips(store, "train", ["rgb", "flow"], length=8, seed=1)
    ours = TrainClips(store, "train", ["rgb", "flow_torch"], length=8, seed=1)
    differences = []
    for item in range(len(opencv)):
        a, b = opencv[item], ours[item]
        assert torch.equal(a["rgb"], b["rgb"]), "both stores must give the same clips of the same frames"
        assert a["flow"].shape == b["flow_torch"].shape and a["flow"].dtype == b["flow_torch"].dtype
        differences.append((a["flow"].int() - b["flow_torch"].int()).abs()[..., :2].numpy())
    difference = np.concatenate([d.ravel() for d in differences])
    assert difference.mean() < 1.0, difference.mean()
    assert (difference > 2).mean() < 0.02, (difference > 2).mean()
