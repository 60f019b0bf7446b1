"""Decoding the stored JPEG frames of a whole training batch in the training process (nvJPEG on GPUs).

Reading a clip from the store costs far less than decoding its 32 JPEGs (``docs/store.md``), and on a GPU
machine the CPU cores that DataLoader workers decode with are what limits training
(``docs/training_speed.md``). With ``data.decode=device`` the workers only read the encoded bytes
(:class:`EncodedFrames`, one per sample and view), :func:`collate_clips` packs a batch of them into one
:class:`EncodedBatch`, and :func:`decode_batch` decodes it where the training runs:

- on CUDA, with nvJPEG through ``torchvision.io.decode_jpeg`` (a list of images per call); frames stored at
  another size than the batch's are fitted there (:func:`coclr.data.frames.fit_frames_torch`). nvJPEG's pixels
  may differ from libjpeg-turbo's by a grey level here and there;
- elsewhere (or without torchvision), frame by frame with OpenCV, as the workers would: the same pixels, bit for
  bit, so the CPU path can be tested against the workers' path.

torchvision is optional: :func:`gpu_decoder_available` says whether its GPU decoder can be imported,
:func:`gpu_decoder_problem` whether it decodes on a given device (a one-frame probe, once per device), which is what
``data.decode`` is resolved with. Should nvJPEG still fail on a batch whose frames all decode on the CPU (a driver
or library problem, not the data), the batch is decoded on the CPU and the run goes on, with one warning.
"""

from __future__ import annotations

import functools
import importlib.util
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from coclr.data.frames import fit_frames, fit_frames_torch
from coclr.errors import ConfigError, DataError
from coclr.store.jpeg import decode_jpeg, encode_jpeg

DECODE_MODES = ("workers", "device")


def gpu_decoder_available() -> bool:
    """Whether ``torchvision.io.decode_jpeg`` (nvJPEG on CUDA devices) can be imported."""
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        from torchvision.io import decode_jpeg  # noqa: F401, PLC0415 (optional)
    except (ImportError, RuntimeError, OSError):  # a torchvision built for another torch fails at import
        return False
    return True


@functools.cache
def gpu_decoder_problem(device: torch.device) -> str | None:
    """None when ``torchvision.io.decode_jpeg`` decodes a small JPEG on ``device`` to OpenCV's size, else why not
    (one line). Probed once per device and process."""
    if not gpu_decoder_available():
        return (f"torchvision.io.decode_jpeg is not importable (pip install the torchvision built for torch "
                f"{torch.__version__})")
    from torchvision.io import ImageReadMode  # noqa: PLC0415 (optional)
    from torchvision.io import decode_jpeg as tv_decode_jpeg  # noqa: PLC0415 (optional)

    probe = np.zeros((16, 16, 3), np.uint8)
    encoded = torch.from_numpy(np.frombuffer(encode_jpeg(probe), np.uint8).copy())
    try:
        images = tv_decode_jpeg([encoded], mode=ImageReadMode.RGB, device=device)
        if tuple(images[0].shape) != (3, 16, 16):
            return f"torchvision's decode_jpeg gave a {tuple(images[0].shape)} image for a 16x16 JPEG on {device}"
    except Exception as error:  # noqa: BLE001 - whatever fails, the decoder does not work here
        return f"torchvision's decode_jpeg fails on {device}: {type(error).__name__}: {str(error).splitlines()[0]}"
    return None


def resolve_decode(requested: str | None, device: torch.device, frame_cache: bool = False) -> str:
    """Where a training run decodes its frames: ``requested`` if given, else ``device`` on CUDA when the GPU
    decoder works there and no decoded-frame cache is used, else ``workers``. ``device`` requested on CUDA
    without a working GPU decoder is refused (:class:`ConfigError`), before any work."""
    if requested is not None:
        if requested not in DECODE_MODES:
            raise ValueError(f"decode must be one of {DECODE_MODES} or None, got {requested!r}")
        if requested == "device" and device.type == "cuda":
            problem = gpu_decoder_problem(device)
            if problem is not None:
                raise ConfigError(f"data.decode=device on {device}: {problem}; use data.decode=workers")
        return requested
    if device.type == "cuda" and not frame_cache and gpu_decoder_problem(device) is None:
        return "device"
    return "workers"


@dataclass
class EncodedFrames:
    """The JPEG frames of one sample's clips of one view: ``data`` (uint8, the frames back to back) and
    ``offsets`` (int64 ``[N + 1]``, frame ``i`` is ``data[offsets[i]:offsets[i + 1]]``), ``N = clips x length``
    in clip order; ``stored_size`` is the frames' ``(height, width)``, ``size`` the one the batch needs, ``where``
    names the entry in error messages."""

    data: torch.Tensor
    offsets: torch.Tensor
    clips: int
    length: int
    stored_size: tuple[int, int]
    size: tuple[int, int]
    where: str

    @classmethod
    def from_blobs(cls, blobs: Sequence[bytes], shape: tuple[int, int], stored_size: tuple[int, int],
                   size: tuple[int, int], where: str) -> EncodedFrames:
        offsets = np.zeros(len(blobs) + 1, np.int64)
        np.cumsum([len(blob) for blob in blobs], out=offsets[1:])
        data = np.frombuffer(b"".join(blobs), np.uint8).copy()
        return cls(torch.from_numpy(data), torch.from_numpy(offsets), shape[0], shape[1], tuple(stored_size),
                   tuple(size), where)


@dataclass
class EncodedBatch:
    """The :class:`EncodedFrames` of a batch, concatenated: one buffer, global offsets, per-sample sizes."""

    data: torch.Tensor
    offsets: torch.Tensor
    clips: int
    length: int
    stored_sizes: list[tuple[int, int]]
    size: tuple[int, int]
    wheres: list[str]

    @classmethod
    def collate(cls, samples: Sequence[EncodedFrames]) -> EncodedBatch:
        first = samples[0]
        if any((s.clips, s.length, s.size) != (first.clips, first.length, first.size) for s in samples):
            raise DataError("cannot batch encoded clips of different shapes: "
                            + ", ".join(f"{s.where}: {s.clips}x{s.length} frames for {s.size}" for s in samples))
        starts = np.cumsum([0] + [len(s.data) for s in samples[:-1]])
        offsets = torch.cat([samples[0].offsets[:1]]
                            + [s.offsets[1:] + int(start) for s, start in zip(samples, starts)])
        return cls(torch.cat([s.data for s in samples]), offsets, first.clips, first.length,
                   [s.stored_size for s in samples], first.size, [s.where for s in samples])

    @property
    def batch_size(self) -> int:
        return len(self.wheres)

    def frame(self, index: int) -> np.ndarray:
        """The encoded bytes of frame ``index`` (in batch order)."""
        start, stop = int(self.offsets[index]), int(self.offsets[index + 1])
        return self.data[start:stop].numpy()

    def _frame_error(self, index: int, error: Exception) -> DataError:
        per_sample = self.clips * self.length
        sample, frame = divmod(index, per_sample)
        return DataError(f"{self.wheres[sample]}: frame {frame % self.length} of clip {frame // self.length}: {error}")

    def decode_cpu(self) -> torch.Tensor:
        """``uint8 [B, clips, length, H, W, 3]`` decoded with OpenCV and fitted as a DataLoader worker would."""
        per_sample = self.clips * self.length
        height, width = self.size
        out = np.empty((self.batch_size, self.clips, self.length, height, width, 3), np.uint8)
        for sample in range(self.batch_size):
            stored_h, stored_w = self.stored_sizes[sample]
            frames = np.empty((per_sample, stored_h, stored_w, 3), np.uint8)
            for i in range(per_sample):
                index = sample * per_sample + i
                try:
                    image = decode_jpeg(self.frame(index).tobytes())
                except ValueError as error:
                    raise self._frame_error(index, error) from None
                if image.shape != frames.shape[1:]:
                    raise self._frame_error(index, ValueError(f"decoded to {image.shape[1]}x{image.shape[0]}, the "
                                                              f"entry's frames are {stored_w}x{stored_h}"))
                frames[i] = image
            for clip in range(self.clips):
                out[sample, clip] = fit_frames(frames[clip * self.length: (clip + 1) * self.length], self.size)
        return torch.from_numpy(out)

    def decode_gpu(self, device: torch.device) -> torch.Tensor:
        """``uint8 [B, clips, length, H, W, 3]`` on ``device``, decoded by nvJPEG in one call (a view of
        ``[..., 3, H, W]`` memory, the layout the augmentation reads fastest)."""
        from torchvision.io import ImageReadMode  # noqa: PLC0415 (optional)
        from torchvision.io import decode_jpeg as tv_decode_jpeg  # noqa: PLC0415 (optional)

        bounds = self.offsets.tolist()
        encoded = [self.data[bounds[i]: bounds[i + 1]] for i in range(len(bounds) - 1)]
        try:
            images = tv_decode_jpeg(encoded, mode=ImageReadMode.RGB, device=device)
        except RuntimeError as error:  # a damaged frame is named (found on the CPU); else the CPU decodes the batch
            cpu = self.decode_cpu()
            warnings.warn(f"nvJPEG failed on a batch whose frames all decode on the CPU ({type(error).__name__}: "
                          f"{str(error).splitlines()[0] if str(error) else ''}); this batch was decoded on the CPU",
                          RuntimeWarning, stacklevel=2)
            return cpu.to(device)
        per_sample = self.clips * self.length
        fitted = []
        for sample in range(self.batch_size):
            frames = torch.stack(images[sample * per_sample: (sample + 1) * per_sample])
            if frames.shape[2:] != tuple(self.size):
                frames = fit_frames_torch(frames, self.size)
            fitted.append(frames)
        planar = torch.stack(fitted).view(self.batch_size, self.clips, self.length, 3, *self.size)
        return planar.permute(0, 1, 2, 4, 5, 3)

    def decode(self, device: torch.device) -> torch.Tensor:
        """The decoded frames, on ``device`` when it is a GPU and the GPU decoder is available, else on the CPU."""
        if device.type == "cuda" and gpu_decoder_available():
            return self.decode_gpu(device)
        return self.decode_cpu()


def collate_clips(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``default_collate`` for samples whose views may be :class:`EncodedFrames` (packed into an
    :class:`EncodedBatch` each); picklable, for DataLoader workers."""
    encoded = [key for key, value in samples[0].items() if isinstance(value, EncodedFrames)]
    batch = default_collate([{k: v for k, v in sample.items() if k not in encoded} for sample in samples])
    batch.update({key: EncodedBatch.collate([sample[key] for sample in samples]) for key in encoded})
    return batch


def decode_batch(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """``batch`` with every :class:`EncodedBatch` decoded (:meth:`EncodedBatch.decode`); other values as they are."""
    return {key: value.decode(device) if isinstance(value, EncodedBatch) else value for key, value in batch.items()}
