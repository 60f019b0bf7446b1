"""MomentumQueue against a plain-Python ring buffer."""

from __future__ import annotations

import pytest
import torch

from coclr.core.queue import MomentumQueue


class ListRing:
    """Reference: write entries one at a time at ptr, wrapping around."""

    def __init__(self, size: int) -> None:
        self.slots: list[tuple | None] = [None] * size
        self.ptr = 0
        self.writes = 0

    def push_all(self, entries: list[tuple]) -> None:
        for entry in entries:
            self.slots[self.ptr] = entry
            self.ptr = (self.ptr + 1) % len(self.slots)
            self.writes += 1


def batch(start: int, rows: int, dim: int = 3):
    ids = torch.arange(start, start + rows)
    keys = ids[:, None].float().repeat(1, dim) + torch.arange(dim).float() / 10
    return keys, ids % 7, ids, ids // 2, -keys[:, :2]


def check_against(queue: MomentumQueue, ring: ListRing, initial_keys: torch.Tensor) -> None:
    assert int(queue.ptr) == ring.ptr
    assert bool(queue.full) == (ring.writes >= queue.size)
    assert queue.valid.tolist() == [slot is not None for slot in ring.slots]
    for j, slot in enumerate(ring.slots):
        if slot is None:
            assert torch.equal(queue.keys[j], initial_keys[j])
            assert queue.labels[j] == queue.video_ids[j] == queue.groups[j] == -1
        else:
            keys, label, video, group, other = slot
            assert torch.equal(queue.keys[j], keys) and torch.equal(queue.other[j], other)
            assert (queue.labels[j], queue.video_ids[j], queue.groups[j]) == (label, video, group)


@pytest.mark.parametrize("size,batch_sizes", [(10, [3, 3, 3, 3, 3]), (7, [4, 10, 2, 9]), (5, [5, 5]), (8, [0, 2, 17])])
def test_wraparound_matches_list_reference(size, batch_sizes):
    queue = MomentumQueue(size, 3, other_dim=2, generator=torch.Generator().manual_seed(0))
    initial_keys = queue.keys.clone()
    assert torch.allclose(initial_keys.norm(dim=1), torch.ones(size))
    assert not queue.valid.any() and not bool(queue.full)
    ring = ListRing(size)
    start = 0
    for rows in batch_sizes:
        keys, labels, ids, groups, other = batch(start, rows)
        queue.enqueue(keys, labels=labels, video_ids=ids, groups=groups, other=other)
        ring.push_all([(keys[i], labels[i], ids[i], groups[i], other[i]) for i in range(rows)])
        start += rows
        check_against(queue, ring, initial_keys)


def test_missing_fields_are_minus_one():
    queue = MomentumQueue(4, 2)
    queue.enqueue(torch.ones(2, 2), labels=torch.tensor([5, 6]))
    assert queue.labels.tolist() == [5, 6, -1, -1]
    assert queue.video_ids.tolist() == [-1] * 4 and queue.groups.tolist() == [-1] * 4


def test_input_errors():
    queue = MomentumQueue(4, 2, other_dim=3)
    with pytest.raises(ValueError, match="pass other"):
        queue.enqueue(torch.ones(2, 2))
    with pytest.raises(ValueError, match="keys"):
        queue.enqueue(torch.ones(2, 5), other=torch.ones(2, 3))
    with pytest.raises(ValueError, match="labels"):
        queue.enqueue(torch.ones(2, 2), labels=torch.ones(3, dtype=torch.long), other=torch.ones(2, 3))
    assert int(queue.ptr) == 0  # nothing was written


def test_state_dict_round_trip_keeps_full(tmp_path):
    queue = MomentumQueue(5, 3, other_dim=2)
    for start in (0, 3, 6):
        keys, labels, ids, groups, other = batch(start, 3)
        queue.enqueue(keys, labels, ids, groups, other)
    assert bool(queue.full) and int(queue.ptr) == 4
    path = tmp_path / "queue.pt"
    torch.save(queue.state_dict(), path)
    assert set(queue.state_dict()) == {"keys", "labels", "video_ids", "groups", "other", "ptr", "full"}

    restored = MomentumQueue(5, 3, other_dim=2)
    assert not bool(restored.full)
    restored.load_state_dict(torch.load(path, weights_only=True))
    assert bool(restored.full) and restored.valid.all()
    for name, value in queue.state_dict().items():
        assert torch.equal(restored.state_dict()[name], value), name
    # The restored queue continues exactly where the original stands.
    keys, labels, ids, groups, other = batch(9, 2)
    queue.enqueue(keys, labels, ids, groups, other)
    restored.enqueue(keys, labels, ids, groups, other)
    for name, value in queue.state_dict().items():
        assert torch.equal(restored.state_dict()[name], value), name


def test_keys_cast_to_queue_dtype():
    queue = MomentumQueue(4, 2)
    queue.enqueue(torch.ones(1, 2, dtype=torch.float16))
    assert queue.keys.dtype == torch.float32 and queue.keys[0].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("size,batch_sizes", [(10, [3, 3, 3, 3]), (7, [4, 10, 2]), (5, [5]), (8, [0, 2, 17])])
def test_fullness_is_known_on_the_host_through_enqueues_and_loading(size, batch_sizes):
    queue = MomentumQueue(size, 3, other_dim=2)
    written = 0
    for rows in batch_sizes:
        queue.enqueue(*batch(written, rows))
        written += rows
        assert queue.is_full() == bool(queue.full) == (written >= size)
    restored = MomentumQueue(size, 3, other_dim=2)
    restored.enqueue(*batch(0, 1))
    restored.load_state_dict(queue.state_dict())
    assert restored.is_full() == bool(queue.full)
    restored.enqueue(*batch(written, size - int(queue.ptr)))  # from the loaded pointer on
    assert restored.is_full() and int(restored.ptr) == 0


def test_labels_that_are_not_whole_numbers_are_refused():
    """Labels 1.7 and 2.2 were stored as 1 and 2."""
    queue = MomentumQueue(8, 4)
    keys = torch.nn.functional.normalize(torch.randn(2, 4), dim=1)
    with pytest.raises(ValueError, match="labels must be whole numbers"):
        queue.enqueue(keys, labels=torch.tensor([1.7, 2.2]))
    queue.enqueue(keys, labels=torch.tensor([1, 2]))


def test_a_contrasted_other_view_starts_with_random_unit_negatives():
    """CMC contrasts against the other view's queue from the first step: it starts like the keys (random, unit
    length), not as zero vectors (a constant logit); CoCLR mines only written slots, so its stays zeros."""
    contrasted = MomentumQueue(6, 3, other_dim=4, generator=torch.Generator().manual_seed(0), contrasted_other=True)
    torch.testing.assert_close(contrasted.other.norm(dim=1), torch.ones(6))
    assert torch.unique(contrasted.other, dim=0).shape[0] == 6
    mined = MomentumQueue(6, 3, other_dim=4, generator=torch.Generator().manual_seed(0))
    assert not mined.other.any()
    torch.testing.assert_close(mined.keys, contrasted.keys, rtol=0, atol=0)
