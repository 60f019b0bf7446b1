"""multi_positive_nce and logits_from against plain-Python references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from coclr.core.loss import logits_from, multi_positive_nce
from coclr.errors import ConfigError


def reference_loss(logits: torch.Tensor, mask: torch.Tensor, form: str) -> list[float]:
    """Per-row loss written straight from the definitions, with Python floats."""
    losses = []
    for row, positives in zip(logits.tolist(), mask.tolist()):
        exps = [math.exp(value) for value in row]
        total = sum(exps)
        if form == "mil":
            losses.append(-math.log(sum(e for e, p in zip(exps, positives) if p) / total))
        else:
            terms = [-math.log(e / total) for e, p in zip(exps, positives) if p]
            losses.append(sum(terms) / len(terms))
    return losses


def random_case(seed: int, rows: int = 6, cols: int = 9) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, cols, generator=generator, dtype=torch.float64) * 3
    mask = torch.rand(rows, cols, generator=generator) < 0.3
    mask[torch.arange(rows), torch.randint(0, cols, (rows,), generator=generator)] = True
    return logits, mask


@pytest.mark.parametrize("form", ["mil", "supcon"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_reference_per_row_and_mean(form, seed):
    logits, mask = random_case(seed)
    expected = torch.tensor(reference_loss(logits, mask, form), dtype=torch.float64)
    per_row = multi_positive_nce(logits, mask, form=form, reduction="none")
    torch.testing.assert_close(per_row, expected)
    torch.testing.assert_close(multi_positive_nce(logits, mask, form=form), expected.mean())


def test_forms_differ_with_several_positives():
    logits = torch.tensor([[2.0, 0.0, -1.0, 0.5]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False, False]])
    mil = multi_positive_nce(logits, mask, form="mil")
    supcon = multi_positive_nce(logits, mask, form="supcon")
    # Jensen: -log of a sum of probabilities is smaller than the mean of -log of each.
    assert mil < supcon


@pytest.mark.parametrize("form", ["mil", "supcon"])
def test_single_own_positive_is_cross_entropy(form):
    logits, _ = random_case(3, rows=5, cols=12)
    mask = torch.zeros_like(logits, dtype=torch.bool)
    mask[:, 0] = True
    expected = F.cross_entropy(logits, torch.zeros(5, dtype=torch.long))
    torch.testing.assert_close(multi_positive_nce(logits, mask, form=form), expected)


def test_stable_with_large_logits():
    logits = torch.tensor([[1000.0, 999.0, -1000.0], [-500.0, -400.0, -300.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    losses = multi_positive_nce(logits, mask, reduction="none")
    assert torch.isfinite(losses).all()
    torch.testing.assert_close(losses[0], torch.tensor(-math.log((1 + math.exp(-1)) / (1 + math.exp(-1) + 0))))
    torch.testing.assert_close(losses[1], torch.tensor(200.0 + math.log(1 + math.exp(-100) + math.exp(-200))))


@pytest.mark.parametrize("form", ["mil", "supcon"])
def test_gradcheck(form):
    logits, mask = random_case(4, rows=4, cols=7)
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: multi_positive_nce(x, mask, form=form, reduction="none"), (logits,))


def test_mil_gradient_is_softmax_minus_positive_share():
    logits, mask = random_case(5)
    logits.requires_grad_(True)
    multi_positive_nce(logits, mask, form="mil", reduction="none").sum().backward()
    probs = torch.softmax(logits.detach(), dim=1)
    positive_probs = torch.where(mask, probs, torch.zeros_like(probs))
    expected = probs - positive_probs / positive_probs.sum(dim=1, keepdim=True)
    torch.testing.assert_close(logits.grad, expected)


def test_row_without_positive_is_named():
    logits = torch.zeros(4, 3)
    mask = torch.ones(4, 3, dtype=torch.bool)
    mask[2] = False
    with pytest.raises(ValueError, match=r"\[2\]"):
        multi_positive_nce(logits, mask)


def test_bad_inputs():
    with pytest.raises(ValueError, match="shape"):
        multi_positive_nce(torch.zeros(2, 3), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool"):
        multi_positive_nce(torch.zeros(2, 3), torch.ones(2, 3))
    with pytest.raises(ConfigError, match="'sum'"):
        multi_positive_nce(torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool), form="sum")


def test_logits_from_matches_loops():
    generator = torch.Generator().manual_seed(6)
    q, k = F.normalize(torch.randn(2, 3, 4, generator=generator), dim=2)
    queue = F.normalize(torch.randn(5, 4, generator=generator), dim=1)
    logits = logits_from(q, k, queue, tau=0.07)
    assert logits.shape == (3, 6)
    for i in range(3):
        own = sum(a * b for a, b in zip(q[i].tolist(), k[i].tolist()))
        assert math.isclose(logits[i, 0].item(), own / 0.07, rel_tol=1e-5)
        for j in range(5):
            dot = sum(a * b for a, b in zip(q[i].tolist(), queue[j].tolist()))
            assert math.isclose(logits[i, 1 + j].item(), dot / 0.07, rel_tol=1e-5, abs_tol=1e-5)


@pytest.mark.parametrize("form", ["mil", "supcon"])
def test_excluded_candidates_leave_the_row_altogether(form):
    """An excluded candidate is the same as deleting its column from that row (loop reference), and its
    logit gets no gradient; other rows keep it."""
    logits, mask = random_case(4)
    excluded = torch.zeros_like(mask)
    for row in range(logits.shape[0]):
        negatives = torch.nonzero(~mask[row]).flatten()
        excluded[row, negatives[: row % 3]] = True
    logits.requires_grad_(True)
    per_row = multi_positive_nce(logits, mask, form=form, reduction="none", excluded=excluded)
    for row in range(logits.shape[0]):
        kept = ~excluded[row]
        expected = reference_loss(logits[row, kept][None].detach(), mask[row, kept][None], form)[0]
        assert per_row[row].item() == pytest.approx(expected, rel=1e-12)
    per_row.sum().backward()
    assert bool((logits.grad[excluded] == 0).all()) and bool((logits.grad[~excluded] != 0).any())


def test_excluded_must_not_mark_a_positive():
    logits, mask = random_case(5)
    with pytest.raises(ValueError, match="excluded marks a positive"):
        multi_positive_nce(logits, mask, excluded=mask.clone())
    with pytest.raises(ValueError, match="excluded must be a bool"):
        multi_positive_nce(logits, mask, excluded=mask.float())


@pytest.mark.parametrize("form", ["mil", "supcon"])
def test_unchecked_masks_give_the_same_loss_and_still_check_shapes(form):
    logits, mask = random_case(6)
    excluded = torch.zeros_like(mask)
    excluded[:, -1] = ~mask[:, -1]
    checked = multi_positive_nce(logits, mask, form=form, excluded=excluded)
    assert torch.equal(multi_positive_nce(logits, mask, form=form, excluded=excluded, check_masks=False), checked)
    empty = mask.clone()
    empty[1] = False
    multi_positive_nce(logits, empty, form=form, check_masks=False)  # values unchecked: the caller's promise
    with pytest.raises(ValueError, match="shape"):
        multi_positive_nce(logits, mask[:, 1:], form=form, check_masks=False)


def test_logits_are_float32_under_bf16_autocast():
    """Under bf16 autocast the dot products would be rounded to bf16 (errors of ~0.04 after the temperature);
    logits_from computes them in float32 whatever the autocast state."""
    generator = torch.Generator().manual_seed(7)
    q, k = F.normalize(torch.randn(2, 32, 128, generator=generator), dim=2)
    queue = F.normalize(torch.randn(1024, 128, generator=generator), dim=1)
    reference = logits_from(q, k, queue, tau=0.07)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = logits_from(q, k, queue, tau=0.07)
        rounded = (q @ queue.T) / 0.07  # what autocast does to a plain matmul: the test can tell the difference
    assert mixed.dtype == torch.float32
    assert (mixed - reference).abs().max() <= 1e-5
    assert (rounded.float() - reference[:, 1:]).abs().max() > 1e-3


def test_a_temperature_or_batch_no_loss_can_use_is_refused():
    """tau=0 gave infinities, tau=-1 negated logits silently, an empty batch a NaN loss."""
    q = F.normalize(torch.randn(3, 4), dim=1)
    for tau in (0.0, -1.0, float("nan"), float("inf"), True, "0.07", torch.tensor(-0.07), torch.ones(2),
                torch.tensor(1)):
        with pytest.raises(ValueError, match="tau .the temperature. must be a positive number"):
            logits_from(q, q, q, tau)
    # a learnt temperature (a one-value tensor) was refused as "not a positive number, got tensor(0.0700)"
    tau = torch.tensor(0.5, requires_grad=True)
    logits = logits_from(q, q, q, tau)
    assert torch.allclose(logits, logits_from(q, q, q, 0.5))
    logits.sum().backward()
    assert tau.grad is not None and float(tau.grad) != 0.0
    with pytest.raises(ValueError, match="logits must be a float tensor"):  # (an int64 overflow deep in torch)
        multi_positive_nce(torch.randint(0, 5, (3, 5)), torch.ones(3, 5, dtype=torch.bool))
    # a NumPy number is a number (it was refused as "not a positive number, got np.float32(0.07)")
    assert torch.equal(logits_from(q, q, q, np.float32(0.5)), logits_from(q, q, q, float(np.float32(0.5))))
    with pytest.raises(ValueError, match="a batch of 0 rows"):
        multi_positive_nce(torch.zeros(0, 5), torch.zeros(0, 5, dtype=torch.bool))


@pytest.mark.parametrize("form", ["mil", "supcon"])
def test_half_precision_logits_give_the_float32_loss(form):
    """bf16 logits of 1 + 2048 columns gave a loss 0.1-0.2 nats off: the sums ran in the logits' 8-bit mantissa."""
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(16, 2049, generator=generator) / 0.07).bfloat16()
    mask = torch.zeros(16, 2049, dtype=torch.bool)
    mask[:, 0] = True
    mask[:, 1:6] = torch.rand(16, 5, generator=generator) > 0.5
    reference = multi_positive_nce(logits.float(), mask, form=form)
    assert torch.equal(multi_positive_nce(logits, mask, form=form), reference)
