"""The uint8 storage of flow: formula, round trip, clipping, numpy/torch agreement."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coclr.flow.encode import flow_to_uint8, uint8_to_flow


def reference_encode(flow: np.ndarray) -> np.ndarray:
    """The I3D formula written out element by element."""
    out = np.full((*flow.shape[:-1], 3), 128, dtype=np.uint8)
    for index in np.ndindex(flow.shape):
        value = min(max(float(flow[index]), -20.0), 20.0)
        out[index] = round((value + 20.0) * 255.0 / 40.0)
    return out


def test_matches_the_formula_element_by_element():
    rng = np.random.default_rng(0)
    flow = rng.uniform(-30, 30, size=(2, 5, 7, 2))
    np.testing.assert_array_equal(flow_to_uint8(flow), reference_encode(flow))


@pytest.mark.parametrize("bound", [20.0, 5.0])
def test_round_trip_error_is_at_most_half_a_step_inside_the_range(bound):
    rng = np.random.default_rng(1)
    flow = rng.uniform(-bound, bound, size=(3, 40, 50, 2)).astype(np.float32)
    image = flow_to_uint8(flow, bound)
    assert image.dtype == np.uint8 and image.shape == (3, 40, 50, 3)
    assert np.all(image[..., 2] == 128)
    decoded = uint8_to_flow(image, bound)
    assert decoded.dtype == np.float32 and decoded.shape == flow.shape
    half_step = bound / 255
    error = np.abs(decoded - flow).max()
    assert error <= half_step + 1e-5
    assert error > half_step * 0.9  # the quantisation is really there (the bound is tight)


def test_a_smaller_bound_is_the_formula_with_finer_steps():
    """Bound 5 is bound 20 applied to flow four times larger: the same codes, decoded four times smaller."""
    rng = np.random.default_rng(3)
    flow = rng.uniform(-7, 7, size=(2, 5, 7, 2))
    np.testing.assert_array_equal(flow_to_uint8(flow, 5.0), reference_encode(flow * 4))
    np.testing.assert_allclose(uint8_to_flow(flow_to_uint8(flow, 5.0), 5.0),
                               uint8_to_flow(reference_encode(flow * 4)) / 4, atol=1e-5)


def test_out_of_range_flow_is_clipped_to_the_bound():
    flow = np.array([[[25.0, -100.0], [20.0, -20.0], [1e6, -21.0]]])
    decoded = uint8_to_flow(flow_to_uint8(flow))
    np.testing.assert_allclose(decoded, [[[20.0, -20.0], [20.0, -20.0], [20.0, -20.0]]], atol=1e-5)
    np.testing.assert_array_equal(flow_to_uint8(np.zeros((1, 1, 2)))[0, 0], [128, 128, 128])
    small = uint8_to_flow(flow_to_uint8(np.array([[[6.0, -5.5]]]), 5.0), np.float32(5.0))  # numpy scalars too
    np.testing.assert_allclose(small, [[[5.0, -5.0]]], atol=1e-5)


@pytest.mark.parametrize("bound", [0.0, -5.0, float("inf"), float("nan"), "5"])
def test_bad_bounds_are_rejected(bound):
    with pytest.raises(ValueError, match="flow bound"):
        flow_to_uint8(np.zeros((1, 1, 2)), bound)
    with pytest.raises(ValueError, match="flow bound"):
        uint8_to_flow(np.zeros((1, 1, 3), dtype=np.uint8), bound)


def test_torch_and_numpy_agree():
    rng = np.random.default_rng(2)
    flow = rng.uniform(-25, 25, size=(4, 6, 2)).astype(np.float32)
    image = flow_to_uint8(torch.from_numpy(flow))
    assert isinstance(image, torch.Tensor) and image.dtype == torch.uint8
    np.testing.assert_array_equal(image.numpy(), flow_to_uint8(flow))
    decoded = uint8_to_flow(image)
    assert isinstance(decoded, torch.Tensor) and decoded.dtype == torch.float32
    np.testing.assert_allclose(decoded.numpy(), uint8_to_flow(flow_to_uint8(flow)))


def test_wrong_channel_count_is_rejected():
    with pytest.raises(ValueError, match="2 channels"):
        flow_to_uint8(np.zeros((4, 4, 3)))
    with pytest.raises(ValueError, match="at least 2 channels"):
        uint8_to_flow(np.zeros((4, 4, 1), dtype=np.uint8))
