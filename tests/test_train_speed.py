"""The fast training path changes no result: no host read-back per step, the same batches whichever process decodes
them, the same losses with the key encoders under inference mode, precision and decoding resolved per device."""

from __future__ import annotations

import json
import traceback
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from coclr.data.batch_decode import EncodedBatch, collate_clips, decode_batch, resolve_decode
from coclr.data.datasets import TrainClips
from coclr.errors import ConfigError, DataError
from coclr.models.encoder import build_encoder
from coclr.models.loading import save_encoder
from coclr.train.config import PretrainConfig
from coclr.train.trainer import Trainer, resolve_precision
from conftest import make_random_store
from test_train import tiny_config

SRC = Path(__file__).resolve().parents[1] / "src" / "coclr"

READ_BACK_OPS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
                 torch.ops.aten.masked_select.default}
"""Ops whose result the host must wait for on a GPU: reading a value (``item``, ``bool``, ``float``, ``int``) and
ops whose output size depends on the data."""

SYNC_POINTS = {"_record", "_check_finite", "_end_epoch", "save", "_knn", "_load"}
"""The trainer's places that may read back (every ``run.log_every`` steps, per epoch, at start-up)."""

CPU_BY_DESIGN = {("augment.py", "_colour"), ("augment.py", "sample_crop_boxes"), ("methods.py", "_draw"),
                 ("sampler.py", "__iter__"), ("augment.py", "_cpu_clips"), ("augment.py", "colour_clip_u8")}
"""Reads of tensors that stay on the CPU in a GPU run too: augmentation parameters and the own-key drop are drawn
from CPU generators, and the data order is a CPU permutation; the 8-bit augmentation path runs on CPU tensors
only (a GPU run never enters it)."""


class HostReads(TorchDispatchMode):
    """Records where (file, function in src/coclr) each read-back op ran and whether a sync point was on the
    stack; ``tolist`` (which runs no op on a CPU tensor) is watched by a patch."""

    def __init__(self):
        super().__init__()
        self.sites: list[tuple[str, str, bool]] = []

    def record(self) -> None:
        stack = traceback.extract_stack()
        frames = [f for f in stack if f.filename.startswith(str(SRC))]
        if not frames:
            return
        inner = frames[-1]
        below = stack[stack.index(inner) + 1:]
        if any("torch/utils/data/" in f.filename for f in below):  # the DataLoader's own (CPU) seed draws
            return
        in_sync_point = any(f.name in SYNC_POINTS and f.filename.endswith("trainer.py") for f in frames[:-1]) or (
            inner.name in SYNC_POINTS and inner.filename.endswith("trainer.py"))
        self.sites.append((Path(inner.filename).name, inner.name, in_sync_point))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in READ_BACK_OPS:
            self.record()
        return func(*args, **(kwargs or {}))


def unexpected_reads(trainer: Trainer, monkeypatch) -> list[tuple[str, str]]:
    """The read-back sites of a training run outside the sync points and the CPU-by-design reads."""
    reads = HostReads()
    tolist = torch.Tensor.tolist

    def watched_tolist(self):
        reads.record()
        return tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", watched_tolist)
    with reads:
        trainer.run()
    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    assert reads.sites, "the detector saw nothing: it is not watching"
    return sorted({(file, name) for file, name, in_sync_point in reads.sites
                   if not in_sync_point and (file, name) not in CPU_BY_DESIGN})


@pytest.mark.parametrize("method", ["infonce", "coclr"])
def test_training_steps_read_nothing_back_from_the_device(method: str, tmp_path: Path, monkeypatch) -> None:
    store = make_random_store(tmp_path / "store")
    extra = []
    if method == "coclr":  # mining, the own-key drop and waiting for the full queue
        save_encoder(tmp_path / "sampler.pth", build_encoder(width=0.125))
        extra = ["method.name=coclr", f"method.sampler_checkpoint={tmp_path / 'sampler.pth'}",
                 "method.wait_for_full_queue=true"]
    trainer = Trainer(tiny_config(store, tmp_path / "run", "optim.epochs=2", "run.log_every=1000", *extra))
    assert unexpected_reads(trainer, monkeypatch) == []


def test_the_read_back_detector_finds_an_item_in_the_step(tmp_path: Path, monkeypatch) -> None:
    from coclr.train.learner import ViewLearner

    store = make_random_store(tmp_path / "store")
    trainer = Trainer(tiny_config(store, tmp_path / "run", "optim.epochs=1", "run.log_every=1000"))
    step = ViewLearner.step

    def step_reading_the_loss(self, *args, **kwargs):
        out = step(self, *args, **kwargs)
        out.loss.item()
        return out

    monkeypatch.setattr(ViewLearner, "step", step_reading_the_loss)
    assert unexpected_reads(trainer, monkeypatch) == [("learner.py", "forward")]  # the caller of the patched step


# ------------------------------------------------------------------------------- decoding in the training process

def mixed_size_store(root: Path) -> Path:
    """A random store whose first train video is stored at another size (fitted to the common one on reading)."""
    import numpy as np

    from coclr.store.clipstore import ClipStore, write_entry
    from coclr.store.jpeg import encode_jpeg

    store = make_random_store(root, frames=14)
    key = ClipStore(store).keys()[0]
    rng = np.random.default_rng(1)
    for view, count in (("rgb", 14), ("flow", 13)):
        frames = rng.integers(0, 256, (count, 30, 52, 3), dtype=np.uint8)
        write_entry(store, key, view, [encode_jpeg(f) for f in frames], fps=25.0)
    return store


@pytest.mark.parametrize("views", [["rgb", "flow"], ["rgbdiff"]])
def test_batches_decoded_in_the_training_process_equal_the_workers_batches(views, tmp_path: Path) -> None:
    store = mixed_size_store(tmp_path / "store")
    kwargs = dict(length=8, stride=2 if views == ["rgbdiff"] else 1, seed=5)
    decoded = TrainClips(store, "train", views, **kwargs)
    encoded = TrainClips(store, "train", views, encoded=True, **kwargs)
    assert decoded.frame_size == (36, 40) and decoded.store.frame_size(decoded.entries[0].path, "rgb") == (30, 52)
    items = [(3, 0), (3, 1), (0, 4), (3, 7)]  # (epoch, index); video 0 is fitted from 30x52
    expected = torch.utils.data.default_collate([decoded[item] for item in items])
    batch = collate_clips([encoded[item] for item in items])
    assert all(isinstance(batch[view], EncodedBatch) for view in views)
    got = decode_batch(batch, torch.device("cpu"))
    assert got.keys() == expected.keys()
    for key in expected:
        assert torch.equal(got[key], expected[key]), key


def test_an_item_names_its_epoch(tmp_path: Path) -> None:
    dataset = TrainClips(make_random_store(tmp_path / "store"), "train", ["rgb"], length=8, seed=2)
    dataset.set_epoch(4)
    assert torch.equal(dataset[3]["rgb"], dataset[(4, 3)]["rgb"])
    assert not torch.equal(dataset[(4, 3)]["rgb"], dataset[(5, 3)]["rgb"])


def test_a_damaged_frame_is_named_when_decoded_in_the_training_process(tmp_path: Path) -> None:
    from coclr.store.clipstore import ClipStore

    store = make_random_store(tmp_path / "store")
    dataset = TrainClips(store, "train", ["rgb"], length=8, encoded=True)
    sample = dataset[0]
    frames = sample["rgb"]
    frames.data[int(frames.offsets[2]): int(frames.offsets[3])] = 7  # frame 2 of clip 0 is no JPEG any more
    with pytest.raises(DataError, match=rf"{ClipStore(store).keys()[0]} \(rgb\): frame 2 of clip 0"):
        decode_batch(collate_clips([sample]), torch.device("cpu"))


class FakeTorchvisionDecoder:
    """Stands in for ``torchvision.io`` on machines without it: decodes with OpenCV, returns ``[3, H, W]``."""

    class ImageReadMode:
        RGB = "RGB"

    @staticmethod
    def decode_jpeg(tensors, mode, device):
        from coclr.store.jpeg import decode_jpeg

        assert mode == "RGB"
        return [torch.from_numpy(decode_jpeg(t.numpy().tobytes())).permute(2, 0, 1).to(device) for t in tensors]


@pytest.fixture
def fake_torchvision(monkeypatch):
    import importlib.machinery
    import sys
    import types

    package = types.ModuleType("torchvision")
    package.__spec__ = importlib.machinery.ModuleSpec("torchvision", None)
    io = types.ModuleType("torchvision.io")
    io.decode_jpeg, io.ImageReadMode = FakeTorchvisionDecoder.decode_jpeg, FakeTorchvisionDecoder.ImageReadMode
    package.io = io
    monkeypatch.setitem(sys.modules, "torchvision", package)
    monkeypatch.setitem(sys.modules, "torchvision.io", io)


def test_the_gpu_path_assembles_and_fits_the_batch_as_the_cpu_path(tmp_path: Path, fake_torchvision) -> None:
    from coclr.data.batch_decode import gpu_decoder_available

    assert gpu_decoder_available()
    store = mixed_size_store(tmp_path / "store")
    dataset = TrainClips(store, "train", ["rgb", "flow"], length=8, seed=1, encoded=True)
    batch = collate_clips([dataset[(0, i)] for i in range(4)])
    for view in ("rgb", "flow"):
        cpu, gpu = batch[view].decode_cpu(), batch[view].decode_gpu(torch.device("cpu"))
        assert gpu.shape == cpu.shape == (4, 2, 8, 36, 40, 3)
        assert torch.equal(gpu[1:], cpu[1:])  # stored at the batch's size: the decoder's pixels as they are
        difference = (gpu[0].float() - cpu[0].float()).abs()  # fitted from 30x52 by PyTorch, not OpenCV
        assert difference.mean() < 3 and difference.max() <= 255


def test_decoding_is_resolved_per_device(monkeypatch, fake_torchvision) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_decode(None, cpu) == "workers"
    assert resolve_decode(None, cuda) == "device"
    assert resolve_decode(None, cuda, frame_cache=True) == "workers"
    assert resolve_decode("device", cpu) == "device" and resolve_decode("workers", cuda) == "workers"
    monkeypatch.delitem(__import__("sys").modules, "torchvision")
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    assert resolve_decode(None, cuda) == "workers"


def test_precision_is_resolved_per_device(tmp_path: Path, monkeypatch) -> None:
    config = tiny_config(tmp_path / "store", tmp_path / "run")
    assert (config.run.amp, config.run.channels_last) == ("auto", None)
    on_cpu = resolve_precision(config, torch.device("cpu"))
    assert (on_cpu.run.amp, on_cpu.run.channels_last) == ("none", False)
    assert config.run.amp == "auto"  # a copy
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    on_gpu = resolve_precision(config, torch.device("cuda"))
    assert (on_gpu.run.amp, on_gpu.run.channels_last) == ("bf16", True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert resolve_precision(config, torch.device("cuda")).run.amp == "none"
    explicit = tiny_config(tmp_path / "store", tmp_path / "run", "run.amp=fp16", "run.channels_last=false")
    assert (resolve_precision(explicit, torch.device("cuda")).run.amp,
            resolve_precision(explicit, torch.device("cuda")).run.channels_last) == ("fp16", False)


def test_a_cpu_run_records_full_precision_and_refuses_explicit_autocast(tmp_path: Path) -> None:
    store = make_random_store(tmp_path / "store")
    Trainer(tiny_config(store, tmp_path / "run", "run.max_steps=1")).run()
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["options"]["run"]
    assert (recorded["amp"], recorded["channels_last"]) == ("none", False)  # as runs recorded before "auto"
    with pytest.raises(ConfigError, match="run.amp: bf16 autocast is for CUDA"):
        Trainer(tiny_config(store, tmp_path / "other", "run.amp=bf16", "run.device=cpu"))


# ------------------------------------------------------------------------------------ the same training results

def losses_and_weights(config: PretrainConfig) -> tuple[list[float], dict[str, torch.Tensor]]:
    trainer = Trainer(config)
    trainer.run()
    records = [json.loads(line) for line in (Path(config.run.out) / "log.jsonl").read_text().splitlines()]
    return [r.get("loss", r.get("epoch_loss")) for r in records], trainer.model.state_dict()


@pytest.mark.parametrize("overrides", [["data.decode=device"], ["data.workers=2"],
                                       ["data.workers=2", "data.decode=device"]],
                         ids=["device", "persistent-workers", "workers-read-bytes"])
def test_every_loading_path_trains_to_the_same_losses_and_weights(overrides, tmp_path: Path) -> None:
    store = make_random_store(tmp_path / "store")
    common = ["optim.epochs=2", "method.queue_size=8"]
    reference = losses_and_weights(tiny_config(store, tmp_path / "a", *common))
    other = losses_and_weights(tiny_config(store, tmp_path / "b", *common, *overrides))
    assert other[0] == reference[0]  # epoch 2 reads epoch 2's clips in workers started in epoch 1
    for name, value in reference[1].items():
        assert torch.equal(other[1][name], value), name


def test_keys_are_ordinary_tensors_equal_to_a_no_grad_forward(tmp_path: Path) -> None:
    trainer = Trainer(tiny_config(make_random_store(tmp_path / "store"), tmp_path / "run"))
    learner = trainer.model.learners["rgb"]
    clips = torch.randn(4, 3, 8, 32, 32)
    keys = learner.embed_keys(clips)
    assert not keys.is_inference() and not keys.requires_grad
    with torch.no_grad():
        learner.encoder_k.train()
        expected = learner.encoder_k(clips)
    assert torch.equal(keys, expected)
