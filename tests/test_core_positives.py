"""The four positive-set rules against plain-Python loops."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from coclr.core.methods import positive_mask
from coclr.core.positives import (
    cross_view_instance_positives,
    cross_view_topk_positives,
    drop_own_positive,
    instance_positives,
    label_positives,
    summed_similarity_embedding,
    top_k_lowest_index_ties,
)
from coclr.core.queue import MomentumQueue
from coclr.errors import ConfigError


def loop_topk(other_keys, queue_other, topk, valid, groups=None, queue_groups=None):
    """Reference: own key, same-group valid entries, then greedily the best unmined valid entries."""
    rows, size = other_keys.shape[0], queue_other.shape[0]
    expected = [[False] * (1 + size) for _ in range(rows)]
    for i in range(rows):
        expected[i][0] = True
        siblings = set()
        if groups is not None:
            siblings = {j for j in range(size) if valid[j] and groups[i] >= 0 and queue_groups[j] == groups[i]}
        scored = []
        for j in range(size):
            if valid[j] and j not in siblings:
                score = sum(a * b for a, b in zip(other_keys[i].tolist(), queue_other[j].tolist()))
                scored.append((-score, j))  # best score first, then lower index first
        for _, j in sorted(scored)[:topk]:
            expected[i][1 + j] = True
        for j in siblings:
            expected[i][1 + j] = True
    return torch.tensor(expected)


def test_instance_positives():
    mask = instance_positives(3, 4)
    assert mask.shape == (3, 5) and mask.dtype == torch.bool
    assert mask.tolist() == [[True, False, False, False, False]] * 3


def test_label_positives_vs_loop():
    labels = torch.tensor([2, 0, -1, 7])
    queue_labels = torch.tensor([0, 2, -1, 2, 5, 0, -1])
    mask = label_positives(labels, queue_labels)
    for i, label in enumerate(labels.tolist()):
        assert mask[i, 0]
        for j, queued in enumerate(queue_labels.tolist()):
            assert mask[i, 1 + j].item() == (label >= 0 and label == queued)


def test_topk_vs_loop_random():
    generator = torch.Generator().manual_seed(0)
    other_keys = F.normalize(torch.randn(6, 8, generator=generator), dim=1)
    queue_other = F.normalize(torch.randn(20, 8, generator=generator), dim=1)
    valid = torch.ones(20, dtype=torch.bool)
    valid[[3, 11, 17]] = False
    mask = cross_view_topk_positives(other_keys, queue_other, 5, valid)
    assert torch.equal(mask, loop_topk(other_keys, queue_other, 5, valid.tolist()))
    assert (mask.sum(dim=1) == 6).all()


def test_topk_ties_prefer_lower_index():
    # Integer-valued embeddings give exact ties: slots 1, 2, 4, 6 all score 1.0 against the query.
    other_keys = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    queue_other = torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [1.0, 0.0]])
    valid = torch.ones(7, dtype=torch.bool)
    mask = cross_view_topk_positives(other_keys, queue_other, 3, valid)
    assert torch.equal(mask, loop_topk(other_keys, queue_other, 3, valid.tolist()))
    assert torch.nonzero(mask[0, 1:]).flatten().tolist() == [1, 2, 5]


@pytest.mark.parametrize("k", [0, 1, 3, 7, 12, 40])
def test_top_k_lowest_index_ties_vs_loop(k):
    scores = torch.randint(0, 4, (9, 30), generator=torch.Generator().manual_seed(k)).float()
    scores[0, :5] = float("-inf")
    mask = top_k_lowest_index_ties(scores, k)
    for row, chosen in zip(scores.tolist(), mask.tolist()):
        ranked = sorted(range(len(row)), key=lambda j: (-row[j], j))[:k]
        assert [j for j, c in enumerate(chosen) if c] == sorted(ranked)


def test_invalid_slots_never_mined():
    other_keys = torch.tensor([[1.0, 0.0]])
    queue_other = torch.tensor([[1.0, 0.0], [5.0, 0.0], [0.5, 0.0], [9.0, 0.0]])
    valid = torch.tensor([True, False, True, False])
    mask = cross_view_topk_positives(other_keys, queue_other, 5, valid)
    # Fewer valid slots than topk: all valid ones are mined, never the (better scoring) invalid ones.
    assert mask.tolist() == [[True, True, False, True, False]]


def test_group_positives_vs_loop():
    generator = torch.Generator().manual_seed(1)
    other_keys = F.normalize(torch.randn(5, 4, generator=generator), dim=1)
    queue_other = F.normalize(torch.randn(16, 4, generator=generator), dim=1)
    valid = torch.arange(16) < 13
    groups = torch.tensor([0, 1, -1, 2, 1])
    queue_groups = torch.tensor([1, 0, 2, -1, 1, 3, 0, 1, -1, 2, 4, 5, 1, 1, 0, 2])
    mask = cross_view_topk_positives(other_keys, queue_other, 3, valid, groups, queue_groups)
    expected = loop_topk(other_keys, queue_other, 3, valid.tolist(), groups.tolist(), queue_groups.tolist())
    assert torch.equal(mask, expected)
    # Row 1 (group 1): siblings at valid slots 0, 4, 7, 12 plus 3 mined; slot 13 (group 1) is invalid.
    assert mask[1, 1 + 0] and mask[1, 1 + 4] and mask[1, 1 + 7] and mask[1, 1 + 12] and not mask[1, 1 + 13]
    assert mask[1].sum() == 1 + 4 + 3


def test_topk_zero_is_own_key_only():
    mask = cross_view_topk_positives(torch.ones(2, 3), torch.ones(4, 3), 0, torch.ones(4, dtype=torch.bool))
    assert torch.equal(mask, instance_positives(2, 4))


def test_cross_view_instance_positives():
    mask = cross_view_instance_positives(2, 3)
    assert mask.shape == (2, 8)
    for row in mask.tolist():
        assert [j for j, v in enumerate(row) if v] == [0, 4]


def test_drop_own_positive():
    mask = torch.tensor([[True, False, True], [True, False, False], [False, True, True]])
    dropped = drop_own_positive(mask)
    assert dropped.tolist() == [[False, False, True], [True, False, False], [False, True, True]]
    assert mask[0, 0]  # input untouched


def full_queue(size=10, dim=4, seed=0) -> MomentumQueue:
    generator = torch.Generator().manual_seed(seed)
    queue = MomentumQueue(size, dim, other_dim=dim, generator=generator)
    queue.enqueue(
        F.normalize(torch.randn(size, dim, generator=generator), dim=1),
        labels=torch.randint(0, 3, (size,), generator=generator),
        groups=torch.arange(size) % 4,
        other=F.normalize(torch.randn(size, dim, generator=generator), dim=1),
    )
    assert bool(queue.full)
    return queue


def test_dispatch_infonce_cmc_ubernce():
    queue = full_queue()
    assert torch.equal(positive_mask("infonce", batch_size=3, queue=queue), instance_positives(3, 10))
    assert torch.equal(positive_mask("cmc", batch_size=3, queue=queue), cross_view_instance_positives(3, 10))
    labels = torch.tensor([0, 2, 1])
    mask = positive_mask("ubernce", batch_size=3, queue=queue, labels=labels)
    assert torch.equal(mask, label_positives(labels, queue.labels))


def test_dispatch_coclr_before_full_is_instance():
    queue = MomentumQueue(10, 4, other_dim=4)
    queue.enqueue(torch.randn(6, 4), other=torch.randn(6, 4), groups=torch.zeros(6, dtype=torch.long))
    groups = torch.zeros(2, dtype=torch.long)
    mask = positive_mask(
        "coclr", batch_size=2, queue=queue, other_keys=torch.randn(2, 4), groups=groups, group_positives=True
    )
    assert torch.equal(mask, instance_positives(2, 10))


def test_dispatch_coclr_own_key_dropout_both_draws():
    queue = full_queue()
    other_keys = F.normalize(torch.randn(3, 4, generator=torch.Generator().manual_seed(2)), dim=1)
    mined = cross_view_topk_positives(other_keys, queue.other, 2, queue.valid)
    kept = positive_mask("coclr", batch_size=3, queue=queue, other_keys=other_keys, topk=2, own_drop_prob=0.0)
    dropped = positive_mask("coclr", batch_size=3, queue=queue, other_keys=other_keys, topk=2, own_drop_prob=1.0)
    assert torch.equal(kept, mined)
    assert torch.equal(dropped, drop_own_positive(mined)) and not dropped[:, 0].any()
    # With p=0.5 the decision follows the generator's own draw, once per call (never per row).
    for seed in range(8):
        expect_drop = torch.rand((), generator=torch.Generator().manual_seed(seed)) < 0.5
        mask = positive_mask(
            "coclr", batch_size=3, queue=queue, other_keys=other_keys, topk=2, own_drop_prob=0.5,
            generator=torch.Generator().manual_seed(seed),
        )
        assert torch.equal(mask, dropped if expect_drop else kept)


def test_dispatch_coclr_group_positives():
    queue = full_queue()
    other_keys = F.normalize(torch.randn(2, 4, generator=torch.Generator().manual_seed(3)), dim=1)
    groups = torch.tensor([1, -1])
    mask = positive_mask(
        "coclr", batch_size=2, queue=queue, other_keys=other_keys, groups=groups, group_positives=True,
        topk=2, own_drop_prob=0.0,
    )
    expected = loop_topk(other_keys, queue.other, 2, [True] * 10, groups.tolist(), queue.groups.tolist())
    assert torch.equal(mask, expected)
    assert mask[0].sum() == 1 + 3 + 2  # slots 1, 5, 9 have group 1


def test_dispatch_errors():
    queue = full_queue()
    with pytest.raises(ValueError, match="labels"):
        positive_mask("ubernce", batch_size=2, queue=queue)
    with pytest.raises(ValueError, match="other_keys"):
        positive_mask("coclr", batch_size=2, queue=queue)
    with pytest.raises(ValueError, match="groups"):
        positive_mask("coclr", batch_size=2, queue=queue, other_keys=torch.randn(2, 4), group_positives=True)
    with pytest.raises(ValueError, match="batch_size=2"):
        positive_mask("ubernce", batch_size=2, queue=queue, labels=torch.zeros(3, dtype=torch.long))
    with pytest.raises(ConfigError, match="'moco'"):
        positive_mask("moco", batch_size=2, queue=queue)  # type: ignore[arg-type]


def test_mined_positives_are_identical_under_bf16_autocast():
    """The top-k scores are float32 under autocast: bf16 scores would reorder near-equal candidates (a queue of
    clusters around the keys, as trained embeddings are)."""
    generator = torch.Generator().manual_seed(8)
    keys = F.normalize(torch.randn(32, 128, generator=generator), dim=1)
    centres = keys[torch.randint(0, 32, (2048,), generator=generator)]
    queue = F.normalize(centres + 0.05 * torch.randn(2048, 128, generator=generator), dim=1)
    valid = torch.ones(2048, dtype=torch.bool)
    reference = cross_view_topk_positives(keys, queue, 5, valid)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = cross_view_topk_positives(keys, queue, 5, valid)
        rounded = top_k_lowest_index_ties(keys @ queue.T, 5)  # bf16 scores under autocast
    assert torch.equal(mixed, reference)
    assert not torch.equal(rounded, reference[:, 1:])  # the test can tell bf16 mining apart


def test_mining_in_both_views_takes_the_top_k_of_the_summed_similarity():
    """``mine_in=both``: the rule on the side-by-side embeddings picks what a loop over the sum of the two views'
    cosine similarities picks (ties to lower indices), and one view is mined as before."""
    generator = torch.Generator().manual_seed(5)
    unit = lambda n, d: F.normalize(torch.randn(n, d, generator=generator), dim=1)  # noqa: E731
    keys_other, keys_own, queue_other, queue_own = unit(6, 8), unit(6, 4), unit(20, 8), unit(20, 4)
    valid = [True] * 17 + [False] * 3
    mask = cross_view_topk_positives(summed_similarity_embedding([keys_other, keys_own]),
                                     summed_similarity_embedding([queue_other, queue_own]), 3, torch.tensor(valid))
    for i in range(6):
        summed = [(-(float(keys_other[i] @ queue_other[j]) + float(keys_own[i] @ queue_own[j])), j)
                  for j in range(20) if valid[j]]
        expected = {0} | {1 + j for _, j in sorted(summed)[:3]}
        assert set(mask[i].nonzero().flatten().tolist()) == expected
    # both spaces matter: a candidate close in one view only loses to one close in both
    assert not torch.equal(mask, cross_view_topk_positives(keys_other, queue_other, 3, torch.tensor(valid)))
    assert summed_similarity_embedding([keys_other]) is keys_other
    with pytest.raises(ValueError, match="same clips"):
        summed_similarity_embedding([keys_other, queue_own])


@pytest.mark.parametrize("options, said", [({"own_drop_prob": 3.0}, "own_drop_prob must be a probability"),
                                           ({"topk": 0}, "topk must be a whole number of at least 1")])
def test_mining_options_out_of_range_are_refused(options, said):
    queue = MomentumQueue(8, 4)
    with pytest.raises(ValueError, match=said):
        positive_mask("coclr", batch_size=2, queue=queue, other_keys=torch.randn(2, 4), **options)


def test_mining_inputs_of_the_wrong_shape_or_type_are_named():
    """A queue_valid or groups of the wrong length gave torch's broadcast error, topk=2.5 a TypeError inside topk."""
    keys, queue = F.normalize(torch.randn(3, 4), dim=1), F.normalize(torch.randn(6, 4), dim=1)
    valid = torch.ones(6, dtype=torch.bool)
    with pytest.raises(ValueError, match="queue_valid must be \\[K\\] = \\[6\\]"):
        cross_view_topk_positives(keys, queue, 2, torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="topk must be a whole number"):
        cross_view_topk_positives(keys, queue, 2.5, valid)
    with pytest.raises(ValueError, match="groups \\[B\\] and queue_groups \\[K\\] must match"):
        cross_view_topk_positives(keys, queue, 2, valid, torch.zeros(2, dtype=torch.long),
                                  torch.zeros(6, dtype=torch.long))
    with pytest.raises(ValueError, match="MomentumQueue needs size >= 1"):
        MomentumQueue(2.5, 4)
