"""PyTorch Datasets over a clip store: random training clips and test-time sliding windows.

Both return raw ``uint8 [T, H, W, 3]`` frames (training clips also still JPEG-encoded, for decoding a whole batch
on the training device: :mod:`coclr.data.batch_decode`); augmentation runs later on whole batches, on the training
device (:mod:`coclr.data.augment`). Randomness is a pure function of ``(seed, epoch, item)``, so a sample is
the same whichever DataLoader worker reads it, and a resumed run reads exactly what an uninterrupted one would.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from coclr.data.batch_decode import EncodedFrames
from coclr.data.frames import fit_frames
from coclr.data.sampling import aligned_num_frames, segments_of, sliding_windows, train_clip_indices
from coclr.data.views import DERIVED_VIEWS, is_flow_view, stored_view
from coclr.errors import DataError
from coclr.store.clipstore import ClipStore, DamagedEntryError, failures_path, open_store


def usable_entries(store: ClipStore, split: str, views: Sequence[str]) -> tuple[list, dict[str, str]]:
    """The entries of ``split`` that have every view of ``views``, and those left out, with the reason.

    An entry is left out when the job of one of its views failed or its entry was found damaged (the store lists
    it: a video that cannot be decoded, one too short for flow, bytes that do not match their checksum). An entry
    whose view was simply not built yet is an error, not a left-out, so that training never starts on part of a
    view by mistake. Raises :class:`DataError` naming the split, the
    view and the first videos, or when no entry is left.
    """
    entries = [e for e in store.index.entries if e.split == split]
    if not entries:
        present = sorted({e.split for e in store.index.entries})
        raise DataError(f"{store.root}: split {split!r} has no videos (splits present: {', '.join(present) or 'none'})")
    left_out: dict[str, str] = {}
    for view in sorted({stored_view(v) for v in views}):
        failed = store.failed(view)
        missing = [e.path for e in entries if e.path not in left_out and (e.path in failed
                                                                          or not store.has(e.path, view))]
        unbuilt = [key for key in missing if key not in failed]
        if unbuilt:
            shown = ", ".join(unbuilt[:5]) + (" ..." if len(unbuilt) > 5 else "")
            built = ", ".join(store.views()) or "none"
            raise DataError(f"{store.root}: view {view!r} is missing for {len(unbuilt)} of the {len(entries)} "
                            f"{split!r} videos ({shown}): their {view!r} view is not built yet (views in the store: "
                            f"{built}). Build it first: `{store.rgb_command()}` makes rgb, `coclr flow` flow")
        left_out.update({key: f"no {view!r} entry: {failed[key]}" for key in missing})
    kept = [e for e in entries if e.path not in left_out]
    if not kept:
        raise DataError(f"{store.root}: every video of split {split!r} was left out (their jobs failed; see "
                        f"{', '.join(str(failures_path(store.root, stored_view(v))) for v in views)})")
    return kept, left_out


def say_damaged(store: ClipStore, error: DamagedEntryError) -> None:
    """Print the one line of an entry found damaged during a run, which the run leaves out."""
    print(f"{error}; left out of this run, listed in {failures_path(store.root, error.view)} (the next run of the "
          "job that writes the view rebuilds it)", file=sys.stderr)


_UNVERIFIED_SAID: set[tuple[str, str]] = set()


def unverified_note(store: ClipStore, keys: Sequence[str], views: Sequence[str]) -> str | None:
    """One line when entries of ``keys`` in ``views`` were written before checksums (their reads are not
    verified), saying how to add them; None when every entry has its checksums."""
    counts = {view: sum(store.checksum(key, view) is None for key in keys) for view in sorted(set(views))}
    counts = {view: n for view, n in counts.items() if n}
    if not counts:
        return None
    views_text = ", ".join(f"{n} of {len(keys)} {view!r}" for view, n in counts.items())
    return (f"{store.root}: {views_text} entries have no checksums (built before checksums): their reads are "
            f"unverified; `coclr data verify {store.root} --add` checks them and adds checksums")


def left_out_message(store: ClipStore, split: str, views: Sequence[str], left_out: dict[str, str]) -> str:
    """One line saying how many videos of ``split`` were left out and where they are listed."""
    lists = ", ".join(str(failures_path(store.root, v)) for v in sorted({stored_view(v) for v in views})
                      if store.failed(v))
    first = next(iter(left_out))
    return (f"left out {len(left_out)} {split!r} video(s) whose jobs failed (listed in {lists}), e.g. {first}: "
            f"{left_out[first]}")


class _SplitClips(Dataset):
    """Shared state of the two datasets: the split's entries, their frame counts and a common frame size (none with
    :attr:`own_sizes`: each video's frames as stored).

    The entries are those that have every view read and every view of ``with_views`` (:func:`usable_entries`; two
    streams evaluated together read the same videos); ``left_out`` lists the others with the reason.

    With ``cache_mb`` > 0, each entry's frames are decoded and fitted once, on first read, and kept (per process,
    never pickled) until the cache holds ``cache_mb`` MiB; later entries are then read from the store as usual.
    Reads return the same frames either way. It pays when the split fits in memory and the dataset lives in one
    process for many epochs (``num_workers=0``), as in the quick CPU study, whose 32-px clips decode in a sizeable
    share of an epoch.
    """

    own_sizes = False
    """Whether each video keeps its own frame size (no ``frame_size`` given): a clip then never depends on which
    other videos share its split (evaluation); else every clip is fitted to one size (training batches)."""

    def __init__(self, store: ClipStore | str | Path, split: str, views: Sequence[str], length: int, stride: int,
                 frame_size: tuple[int, int] | None, cache_mb: float = 0.0, with_views: Sequence[str] = (),
                 keys: Sequence[str] | None = None):
        if length < 1 or stride < 1:
            raise ValueError(f"clip length and stride must be >= 1, got length={length}, stride={stride}")
        if cache_mb < 0:
            raise ValueError(f"cache_mb must be non-negative, got {cache_mb}")
        self.cache_bytes = int(cache_mb * 2**20)
        self._cache: dict[tuple[str, str], np.ndarray] = {}
        self._cached_bytes = 0
        self.store = open_store(store)
        self.views = list(views)
        self.length, self.stride = length, stride
        entries, self.left_out = usable_entries(self.store, split, [*self.views, *with_views])
        if keys is not None:  # a sample of the split
            wanted = set(keys)
            entries = [entry for entry in entries if entry.path in wanted]
        counts = {}
        for entry in entries:
            try:
                counts[entry.path] = self._usable_frames(entry.path)
            except DamagedEntryError as error:  # its header: listed by the store, left out here
                self.left_out[entry.path] = str(error)
                say_damaged(self.store, error)
        self.entries = [entry for entry in entries if entry.path in counts]
        if not self.entries:
            raise DataError(f"{self.store.root}: every usable video of split {split!r} is damaged (see `coclr data "
                            "verify`)")
        self.num_frames = np.array([counts[e.path] for e in self.entries], dtype=np.int64)
        groups = sorted({e.group for e in self.entries if e.group is not None})
        group_ids = {g: i for i, g in enumerate(groups)}
        self.labels = torch.tensor([e.label_id for e in self.entries], dtype=torch.long)
        self.groups = torch.tensor([group_ids.get(e.group, -1) for e in self.entries], dtype=torch.long)
        self.frame_size = (tuple(frame_size) if frame_size else None if self.own_sizes else self._common_size())
        self._say_unverified()

    def _say_unverified(self) -> None:
        """Print :func:`unverified_note` once per process and store (the datasets of one run share a store)."""
        views = sorted({stored_view(v) for v in self.views})
        said = (str(self.store.root), ",".join(views))
        if said in _UNVERIFIED_SAID:
            return
        _UNVERIFIED_SAID.add(said)
        note = unverified_note(self.store, [e.path for e in self.entries], views)
        if note:
            print(note, file=sys.stderr)

    def _usable_frames(self, key: str) -> int:
        """Clip start frames every view can provide, so all views of a sample cover the same frames.

        Flow frame i is the motion from RGB frame i to i+1 (``aligned_num_frames``); ``rgbdiff`` needs the
        frame one stride past each sampled one.
        """
        counts = []
        for view in self.views:
            n = self.store.num_frames(key, stored_view(view))
            if is_flow_view(view) and self.store.has(key, "rgb"):
                n = aligned_num_frames(self.store.num_frames(key, "rgb"), n)
            elif view in DERIVED_VIEWS:
                n -= self.stride
            counts.append(n)
        return max(1, min(counts))

    def _common_size(self) -> tuple[int, int]:
        sizes = Counter(self.store.frame_size(e.path, stored_view(self.views[0])) for e in self.entries)
        return sizes.most_common(1)[0][0]

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_cache"], state["_cached_bytes"] = {}, 0
        return state

    def _frames_of(self, key: str, view: str, indices: np.ndarray) -> tuple[str, np.ndarray]:
        """The stored view and the frame indices a clip of ``view`` at ``indices`` reads (``rgbdiff`` one more;
        indices past the end repeat the last frame)."""
        if view in DERIVED_VIEWS:
            indices = np.append(indices, indices[-1] + self.stride)
        source = stored_view(view)
        return source, np.minimum(indices, self.store.num_frames(key, source) - 1)

    def _read(self, key: str, view: str, indices: np.ndarray) -> np.ndarray:
        return self._read_clips(key, view, [indices])[0]

    def _read_clips(self, key: str, view: str, clips: Sequence[np.ndarray]) -> np.ndarray:
        """The frames of several clips of one video, ``uint8 [len(clips), T, H, W, 3]``, in one read: a frame
        that two clips share is decoded once."""
        wanted = [self._frames_of(key, view, indices) for indices in clips]
        frames = self._read_frames(key, wanted[0][0], np.concatenate([indices for _, indices in wanted]))
        return frames.reshape(len(clips), -1, *frames.shape[1:])

    def _read_frames(self, key: str, source: str, indices: np.ndarray) -> np.ndarray:
        frames = self.store.num_frames(key, source)
        cached = self._cache.get((key, source))
        if cached is None and self._cached_bytes < self.cache_bytes:
            cached = self._fitted(self.store.read(key, source, range(frames)))
            self._cache[(key, source)] = cached
            self._cached_bytes += cached.nbytes
        if cached is not None:
            return cached[indices]
        return self._fitted(self.store.read(key, source, indices))

    def _fitted(self, frames: np.ndarray) -> np.ndarray:
        """``frames`` fitted to the common frame size (as they are where each video keeps its own)."""
        return frames if self.frame_size is None else fit_frames(frames, self.frame_size)


class TrainClips(_SplitClips):
    """``num_clips`` random clips per instance (independent random starts), the same frames in every view.

    An instance is a video, or with ``segment_frames`` a stretch of one (:func:`~coclr.data.sampling.segments_of`):
    few long videos then give many instances, each its own positives and the others' negatives, as CoCLR's batches
    and queue need. ``segment_with``: other views whose frames the stretches are cut in too, where the store holds
    them (a video's 32 RGB frames are two stretches of 16, its 31 flow frames one: a pipeline's RGB stage trained on
    twice the instances its flow and CoCLR stages did).
    Items are dicts: one ``uint8 [num_clips, T, H, W, 3]`` tensor per view (``rgbdiff`` gets T+1 frames),
    ``label``, ``video`` (the instance's index) and ``group`` (source-group id, -1 when unknown). With ``encoded``,
    each view is an :class:`~coclr.data.batch_decode.EncodedFrames` of the same frames still JPEG-encoded, for
    the training process to decode a whole batch at once (``collate_clips`` then ``decode_batch``).

    An item is an instance index, read for the epoch of :meth:`set_epoch`, or an ``(epoch, index)`` pair, so that
    DataLoader workers that live across epochs read the epoch the sampler is at (the trainer's sampler
    gives such pairs).
    """

    def __init__(self, store: ClipStore | str | Path, split: str, views: Sequence[str], length: int,
                 stride: int = 1, num_clips: int = 2, seed: int = 0, frame_size: tuple[int, int] | None = None,
                 cache_mb: float = 0.0, with_views: Sequence[str] = (), encoded: bool = False,
                 segment_frames: int | None = None, segment_with: Sequence[str] = ()):
        if encoded and cache_mb:
            raise ValueError("the frame cache holds decoded frames: use cache_mb=0 with encoded=True")
        if segment_frames is not None and segment_frames < 1:
            raise ValueError(f"segment_frames must be at least 1 (or None), got {segment_frames}")
        super().__init__(store, split, views, length, stride, frame_size, cache_mb, with_views)
        self.num_clips = num_clips
        cut = self.num_frames if segment_frames is None or not segment_with else np.array(
            [self._frames_with(key, count, segment_with) for key, count in
             zip((e.path for e in self.entries), self.num_frames.tolist())], dtype=np.int64)
        self.segments = segments_of(cut, segment_frames)
        self._damaged: set[str] = set()  # entries found damaged while reading, in this process
        self.seed = seed
        self.epoch = 0
        self.encoded = encoded

    def _frames_with(self, key: str, count: int, views: Sequence[str]) -> int:
        """The frames of ``key`` that the views read and each of ``views`` the store holds for it have too (a
        pipeline's stretches: its one-view stages cut the same ones as its two-view stages)."""
        for view in views:
            if view in self.views or not self.store.has(key, stored_view(view)):
                continue
            try:
                other = self.store.num_frames(key, stored_view(view))
                if is_flow_view(view) and self.store.has(key, "rgb"):
                    other = aligned_num_frames(self.store.num_frames(key, "rgb"), other)
            except (DamagedEntryError, ValueError):  # a view this run does not read: its own frames cut the stretches
                continue
            count = min(count, other)
        return max(1, count)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose random clips are drawn (call before each epoch, in every process)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.segments)

    def __getitem__(self, item: int | tuple[int, int]) -> dict[str, Any]:
        """The sample of instance ``item``; when its entry turns out damaged (a checksum that does not match), the
        entry is listed in the store (:meth:`ClipStore._recorded`), named in one line, and left out of the rest of
        the run in this process: the next instance of a video that is not damaged gives the sample instead."""
        epoch, item = item if isinstance(item, tuple) else (self.epoch, item)
        for offset in range(len(self.segments)):
            candidate = (item + offset) % len(self.segments)
            key = self.entries[int(self.segments[candidate, 0])].path
            if key in self._damaged:
                continue
            try:
                return self._sample(epoch, candidate)
            except DamagedEntryError as error:
                self._damaged.add(key)
                say_damaged(self.store, error)
        raise DataError(f"{self.store.root}: every video of the split is damaged (see `coclr data verify`)")

    def _sample(self, epoch: int, item: int) -> dict[str, Any]:
        rng = np.random.default_rng([self.seed, epoch, item])
        video, first, frames = (int(value) for value in self.segments[item])
        key = self.entries[video].path
        starts = [first + train_clip_indices(frames, self.length, self.stride, rng) for _ in range(self.num_clips)]
        if self.encoded:
            sample: dict[str, Any] = {view: self._encoded(key, view, starts) for view in self.views}
        else:
            sample = {view: torch.from_numpy(self._read_clips(key, view, starts)) for view in self.views}
        sample.update(label=self.labels[video], video=torch.tensor(item), group=self.groups[video])
        return sample

    def _encoded(self, key: str, view: str, clips: Sequence[np.ndarray]) -> EncodedFrames:
        """The encoded frames of ``clips`` (index arrays) of ``view``, as :meth:`_read` would decode them."""
        blobs: list[bytes] = []
        for indices in clips:
            source, indices = self._frames_of(key, view, indices)
            blobs += self.store.read_encoded(key, source, indices)
        return EncodedFrames.from_blobs(blobs, (len(clips), len(blobs) // len(clips)),
                                        self.store.frame_size(key, source), self.frame_size,
                                        f"{self.store.root}: {key} ({source})")


class WindowClips(_SplitClips):
    """Every test-time window of every video: half-overlapping windows covering the whole video, each video's frames
    at their own size (an evaluation's crop of a video never depends on the other videos of its split: fitted to
    the split's most common size, a portrait video among landscape ones was cut to 71% of its centre square, and
    differently as a query and as a gallery item). Batch them with :meth:`batches`, whose batches each hold one
    frame size.

    Items are dicts with ``clip`` (``uint8 [T, H, W, 3]``, T+1 frames for ``rgbdiff``), ``video`` (index in
    the split, to average the windows of a video) and ``label``. ``keys``: only these videos of the split (a
    sample).
    """

    own_sizes = True

    def __init__(self, store: ClipStore | str | Path, split: str, view: str, length: int, stride: int = 1,
                 with_views: Sequence[str] = (), keys: Sequence[str] | None = None):
        super().__init__(store, split, [view], length, stride, None, with_views=with_views, keys=keys)
        self.view = view
        self.windows = [(video, window) for video, n in enumerate(self.num_frames)
                        for window in sliding_windows(int(n), length, stride)]
        self.sizes = [self.store.frame_size(entry.path, stored_view(view)) for entry in self.entries]

    def batches(self, batch_size: int) -> list[list[int]]:
        """The windows in order, in batches of at most ``batch_size`` whose videos share one frame size (a batch
        ends early where the size changes)."""
        found: list[list[int]] = []
        for item, (video, _) in enumerate(self.windows):
            if found and len(found[-1]) < batch_size and \
                    self.sizes[self.windows[found[-1][0]][0]] == self.sizes[video]:
                found[-1].append(item)
            else:
                found.append([item])
        return found

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        video, indices = self.windows[item]
        clip = self._read(self.entries[video].path, self.view, np.asarray(indices))
        return {"clip": torch.from_numpy(clip), "video": torch.tensor(video), "label": self.labels[video]}
