"""Frames of a few videos at a given size for the benchmarks (benchmarks/gpu_suite.py, benchmarks/bench_tvl1.py):
the real clips of ../shared/data/clips when present, else clips of the synthetic dataset. A module of its own so
that the benchmarks that share it do not import each other."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

SHARED_CLIPS = Path(os.environ.get("COCLR_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "data" / "clips"


def have_pyav() -> bool:
    """Whether PyAV imports (GPU machines have no wheel of their own: then the frames are synthesised)."""
    try:
        import av  # noqa: F401
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=8)
def frame_pool(size: tuple[int, int], frames: int, clips: int = 4) -> tuple[list[list[np.ndarray]], str]:
    """RGB frames ``[H, W, 3]`` of a few videos at ``size``: the real clips of ../shared/data/clips when present
    (resized and centre-cropped), else clips of the synthetic dataset rendered at that size."""
    from coclr.data.frames import fit_frames

    if SHARED_CLIPS.is_dir() and have_pyav():
        from coclr.video.decode import decode_video

        videos = []
        for path in sorted(SHARED_CLIPS.iterdir())[:clips]:
            decoded = decode_video(path, short_side=min(size))[:frames]
            videos.append(list(fit_frames(np.asarray(decoded), size)))
        return videos, f"real clips of {SHARED_CLIPS}"
    from coclr.synth import SynthConfig, dataset_clips, render_clip

    # Noise 0.03 makes the JPEGs as large as the real clips' (7.4 KiB at 171x128, quality 90); decoding time
    # grows with it.
    config = SynthConfig(height=size[0], width=size[1], frames=frames, train_scenes=max(2, clips), test_scenes=2,
                         actions_per_scene=1, num_classes=2, clips_per_action=1, noise=0.03)
    keys = [clip.key for clip in dataset_clips(config) if clip.split == "train"][:clips]
    return [list(render_clip(config, key)) for key in keys], "synthetic clips (coclr.synth)"
