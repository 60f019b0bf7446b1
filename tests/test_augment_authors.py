"""Our augmentation's output distribution against the authors' transforms (``get_transform`` of their
``main_nce.py``, its full-augmentation branch), on the same real frames; their code runs in a subprocess from
their checkout (``COCLR_AUTHORS``, default ``../authors/CoCLR``), and the test is skipped when it is absent.

Per-clip statistics are compared: mean intensity, contrast (pixel standard deviation), colourfulness (mean
max - min over the channels) and the share of clips with no colour left. Known, intended differences (their
grayscale keeps one random channel per frame instead of the luminance; their crops sometimes squash the frame;
bicubic against bilinear resizing) move these statistics by less than the tolerances.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from coclr.data.augment import IMAGENET_MEAN, IMAGENET_STD, ClipAugment
from coclr.threads import OPENMP_POLICY
from conftest import REPO_ROOT, shared_path

AUTHORS = Path(os.environ.get("COCLR_AUTHORS", REPO_ROOT.parent / "authors" / "CoCLR"))
AUTHORS_PYTHONPATH = os.environ.get("COCLR_AUTHORS_PYTHONPATH", str(REPO_ROOT.parent / "authors-deps"))
CLIPS, FRAMES = 160, 8

THEIRS = """
import sys, json, random
import numpy as np
sys.path[:0] = [p for p in sys.argv[3].split(":") if p] + [sys.argv[2]]
import torch
try:
    import torchvision
except RuntimeError:  # a torchvision whose compiled operators do not load with this torch: PIL transforms only
    for name in [m for m in sys.modules if m.startswith("torchvision")]:
        del sys.modules[name]
    torch.library.register_fake = lambda *a, **k: (lambda f: f)
import argparse, main_nce
from PIL import Image
frames = np.load(sys.argv[1])
random.seed(0); np.random.seed(0); torch.manual_seed(0)
base = main_nce.get_transform("train", argparse.Namespace(img_dim=128, seq_len=len(frames))).transform_list[0].base
images = [Image.fromarray(f) for f in frames]
out = np.stack([torch.stack(base(list(images)), 1).numpy() for _ in range(int(sys.argv[4]))])
np.save(sys.argv[1] + ".theirs.npy", out.astype(np.float32))
"""


def clip_statistics(clips: np.ndarray) -> dict[str, np.ndarray]:
    """Per-clip statistics of ``[N, 3, T, H, W]`` clips in [0, 1]."""
    chroma = clips.max(axis=1) - clips.min(axis=1)
    return {"mean": clips.mean(axis=(1, 2, 3, 4)), "contrast": clips.std(axis=(1, 2, 3, 4)),
            "colour": chroma.mean(axis=(1, 2, 3)), "no_colour": (chroma.max(axis=(1, 2, 3)) < 2 / 255) * 1.0}


@pytest.mark.slow
def test_augmentation_statistics_match_the_authors_transforms(tmp_path):
    if not (AUTHORS / "main_nce.py").is_file():
        pytest.skip(f"the authors' checkout is not at {AUTHORS} (set COCLR_AUTHORS)")
    from coclr.video.decode import decode_video

    video = decode_video(shared_path("data", "clips") / "v_Basketball_g01_c01.avi", short_side=128)
    frames = np.ascontiguousarray(video[40 : 40 + FRAMES])
    path = tmp_path / "frames.npy"
    np.save(path, frames)
    env = {**os.environ, **OPENMP_POLICY, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", THEIRS, str(path), str(AUTHORS), AUTHORS_PYTHONPATH, str(CLIPS)],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    if run.returncode != 0 and "No module named" in run.stderr:
        pytest.skip(f"the authors' code cannot import here: {run.stderr.strip().splitlines()[-1]}")
    assert run.returncode == 0, run.stderr[-3000:]
    theirs = np.load(str(path) + ".theirs.npy")

    batch = torch.from_numpy(frames).expand(CLIPS, *frames.shape).contiguous()
    augment = ClipAugment(size=128)
    ours = augment({"rgb": batch}, torch.Generator().manual_seed(0))["rgb"].double().numpy()
    ours = ours * np.reshape(IMAGENET_STD, (3, 1, 1, 1)) + np.reshape(IMAGENET_MEAN, (3, 1, 1, 1))
    assert ours.shape == theirs.shape

    stats_ours, stats_theirs = clip_statistics(ours), clip_statistics(theirs)
    report = {}
    for key in stats_ours:
        a, b = stats_ours[key], stats_theirs[key]
        noise = np.sqrt(a.var() / len(a) + b.var() / len(b))
        report[key] = {"ours": [a.mean(), a.std()], "theirs": [b.mean(), b.std()], "noise": noise}
        assert abs(a.mean() - b.mean()) < 4 * noise + 0.01, json.dumps(report, default=float)
        if key != "no_colour":
            assert 0.7 < a.std() / b.std() < 1.4, json.dumps(report, default=float)
