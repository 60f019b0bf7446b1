"""The I3D / CoCLR storage format of optical flow: a 3-channel uint8 image.

Flow is clipped to +-``bound`` pixels (``FLOW_BOUND``, 20, by default) and mapped linearly onto 0..255, so one
quantisation step is ``2 * bound / 255`` px (about 0.16 px at 20) and rounding adds at most half of that. The
I3D convention's 20 px suits frames of 128 px and more; smaller frames have proportionally smaller motion, and a
proportionally smaller bound keeps the same relative precision (5 at 32 px). Channel 0 holds u (horizontal),
channel 1 v (vertical) and channel 2 the constant 128, which makes a flow field an ordinary RGB-shaped frame that
the store, the JPEG codec and the 3-channel network all handle like RGB.

Both functions take numpy arrays or torch tensors (any device) and return the same kind.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

from coclr.clips import BOUND_RANGE, FLOW_BOUND, check_bound  # noqa: F401 (the bound's rule, default: the clips')

BOUND_SIDE = 128
"""The frame side (px) the I3D convention's bound suits; smaller frames get a proportionally smaller one."""


def bound_for(side: int) -> float:
    """The bound for frames of ``side`` px: :data:`FLOW_BOUND`, scaled down below :data:`BOUND_SIDE` (5 px at 32),
    so that a quantisation step is the same share of the frame's motion."""
    return FLOW_BOUND * min(1.0, side / BOUND_SIDE)
THIRD_CHANNEL = 128
"""Value of the unused third channel of a stored flow frame."""

Array = TypeVar("Array")


def _is_numpy(x: object) -> bool:
    return isinstance(x, np.ndarray)




def quantise_flow(flow: Array, bound: float = FLOW_BOUND) -> Array:
    """The stored values of u and v of flow ``[..., H, W, 2]``: uint8 ``[..., H, W, 2]``,
    ``round((clip(f, -bound, bound) + bound) * 255 / (2 * bound))`` (:func:`flow_to_uint8` without its third
    channel; on a GPU this is what leaves the device)."""
    bound = check_bound(bound)
    if flow.shape[-1] != 2:
        raise ValueError(f"flow must have 2 channels (u, v) in the last dimension, got shape {tuple(flow.shape)}")
    scaled = ((flow.clip(-bound, bound) + bound) * (255.0 / (2 * bound))).round()
    if _is_numpy(flow):
        return scaled.astype(np.uint8)
    import torch  # noqa: PLC0415 (heavy)

    return scaled.to(torch.uint8)


def flow_image(uv: Array) -> Array:
    """The stored 3-channel image of quantised flow ``uint8 [..., H, W, 2]``: u, v and the constant 128."""
    shape = (*uv.shape[:-1], 3)
    if _is_numpy(uv):
        out = np.full(shape, THIRD_CHANNEL, dtype=np.uint8)
    else:
        import torch  # noqa: PLC0415 (heavy)

        out = torch.full(shape, THIRD_CHANNEL, dtype=torch.uint8, device=uv.device)
    out[..., :2] = uv
    return out


def flow_to_uint8(flow: Array, bound: float = FLOW_BOUND) -> Array:
    """Encode flow ``[..., H, W, 2]`` (float, pixels) as uint8 ``[..., H, W, 3]``.

    ``value = round((clip(f, -bound, bound) + bound) * 255 / (2 * bound))`` for u and v; the third channel is 128.
    """
    return flow_image(quantise_flow(flow, bound))


def uint8_to_flow(image: Array, bound: float = FLOW_BOUND) -> Array:
    """Decode a stored flow image ``uint8 [..., H, W, C>=2]`` back to float32 flow ``[..., H, W, 2]`` in pixels.

    The inverse of :func:`flow_to_uint8` with the same ``bound``, up to its rounding (and any JPEG loss); the
    third channel is ignored.
    """
    bound = check_bound(bound)
    if image.shape[-1] < 2:
        raise ValueError(f"a flow image needs at least 2 channels, got shape {tuple(image.shape)}")
    if _is_numpy(image):
        uv = image[..., :2].astype(np.float32)
    else:
        import torch  # noqa: PLC0415 (heavy)

        uv = image[..., :2].to(torch.float32)
    return uv * (2 * bound / 255) - bound
