"""Clip sampling against plain loops: random training clips, sliding test windows, RGB/flow alignment."""

from __future__ import annotations

import numpy as np
import pytest

from coclr.data.sampling import aligned_num_frames, sliding_windows, spread, train_clip_indices


def reference_clip(start: int, num_frames: int, length: int, stride: int) -> list[int]:
    clip = []
    for k in range(length):
        index = start + k * stride
        clip.append(index if index < num_frames else num_frames - 1)  # pad with the last frame
    return clip


@pytest.mark.parametrize("num_frames,length,stride", [(100, 32, 1), (100, 16, 2), (32, 32, 1), (40, 8, 4)])
def test_train_clips_are_strided_runs_at_every_possible_start(num_frames, length, stride):
    rng = np.random.default_rng(0)
    span = (length - 1) * stride + 1
    starts = set()
    for _ in range(3000):
        clip = train_clip_indices(num_frames, length, stride, rng)
        start = int(clip[0])
        assert clip.tolist() == reference_clip(start, num_frames, length, stride)
        assert clip[-1] <= num_frames - 1
        starts.add(start)
    assert starts == set(range(num_frames - span + 1))  # uniform start: every start occurs


def test_short_video_is_padded_with_its_last_frame():
    rng = np.random.default_rng(0)
    assert train_clip_indices(5, 8, 1, rng).tolist() == [0, 1, 2, 3, 4, 4, 4, 4]
    assert train_clip_indices(5, 4, 2, rng).tolist() == [0, 2, 4, 4]
    assert train_clip_indices(1, 3, 1, rng).tolist() == [0, 0, 0]


def test_two_clips_of_a_sample_start_independently():
    rng = np.random.default_rng(1)
    pairs = [(train_clip_indices(200, 32, 1, rng)[0], train_clip_indices(200, 32, 1, rng)[0]) for _ in range(500)]
    first, second = np.array(pairs, dtype=float).T
    assert (first != second).mean() > 0.95
    assert abs(np.corrcoef(first, second)[0, 1]) < 0.15


def reference_windows(num_frames: int, length: int, stride: int) -> list[list[int]]:
    span = (length - 1) * stride + 1
    if num_frames <= span:
        return [reference_clip(0, num_frames, length, stride)]
    hop = max(1, length // 2) * stride
    windows, start = [], 0
    while start + span <= num_frames:
        windows.append(reference_clip(start, num_frames, length, stride))
        start += hop
    if windows[-1][-1] != num_frames - 1:
        windows.append(reference_clip(num_frames - span, num_frames, length, stride))
    return windows


@pytest.mark.parametrize("num_frames", [1, 20, 32, 33, 47, 48, 64, 100, 301])
@pytest.mark.parametrize("length,stride", [(32, 1), (16, 2), (8, 1), (1, 1)])
def test_sliding_windows_match_the_loop_and_cover_the_video(num_frames, length, stride):
    windows = sliding_windows(num_frames, length, stride)
    assert [w.tolist() for w in windows] == reference_windows(num_frames, length, stride)
    assert all(len(w) == length for w in windows)
    assert windows[0][0] == 0
    assert windows[-1][-1] == num_frames - 1  # the end of the video is never left out
    covered = sorted(set(np.concatenate(windows).tolist()))
    assert covered[0] == 0 and covered[-1] == num_frames - 1
    assert max(np.diff(covered), default=1) <= stride  # no part of the video is skipped


def test_sliding_windows_overlap_by_half():
    windows = sliding_windows(100, 32, 1)
    for previous, current in zip(windows[:-2], windows[1:-1]):
        assert len(set(previous.tolist()) & set(current.tolist())) == 16
    assert [int(w[0]) for w in windows] == [0, 16, 32, 48, 64, 68]
    assert [int(w[0]) for w in sliding_windows(64, 32, 1)] == [0, 16, 32]


def test_short_video_gets_one_padded_window():
    windows = sliding_windows(10, 32, 1)
    assert len(windows) == 1
    assert windows[0].tolist() == list(range(10)) + [9] * 22


def test_aligned_frames_pair_rgb_and_flow():
    # flow frame i is the motion from RGB frame i to i + 1: index i needs RGB i, i+1 and flow i
    for n_rgb, n_flow in [(100, 99), (100, 100), (100, 80), (50, 99), (2, 1)]:
        usable = aligned_num_frames(n_rgb, n_flow)
        valid = [i for i in range(max(n_rgb, n_flow)) if i + 1 < n_rgb and i < n_flow]
        assert usable == len(valid) == valid[-1] + 1
    with pytest.raises(ValueError):
        aligned_num_frames(1, 5)


def test_bad_arguments_are_rejected():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="num_frames=0"):
        train_clip_indices(0, 8, 1, rng)
    with pytest.raises(ValueError, match="stride"):
        sliding_windows(10, 8, 0)
    with pytest.raises(ValueError, match="length"):
        sliding_windows(10, 0, 1)


def test_a_spread_sample_takes_the_first_and_the_last_and_is_even_between():
    for total in range(0, 40):
        for count in range(0, 45):
            picked = spread(total, count)
            assert picked.dtype == np.int64 and len(picked) == min(count, total)
            assert np.all(np.diff(picked) > 0) and np.all((picked >= 0) & (picked < max(total, 1)))
            if len(picked) >= 2:
                assert picked[0] == 0 and picked[-1] == total - 1
                gaps = np.diff(picked)
                assert gaps.max() - gaps.min() <= 1  # as even as whole steps allow
            if count >= total:
                assert picked.tolist() == list(range(total))
