"""The fast training path changes no result: no host read-back per step, the same batches whichever process decodes
them, the same losses with the key encoders under inference mode, precision and decoding resolved per device."""

from __future__ import annotations

import json
import traceback
import weakref
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from coclr.data.batch_decode import (
    EncodedBatch,
    collate_clips,
    decode_batch,
    gpu_decoder_problem,
    resolve_decode,
)
from coclr.data.datasets import TrainClips
from coclr.errors import ConfigError, DataError
from coclr.models.encoder import build_encoder
from coclr.models.loading import save_encoder
from coclr.train.config import PretrainConfig
from coclr.train.run import pretrain, start_run
from coclr.train.setup import resolve_precision
from coclr.train.trainer import Trainer
from conftest import make_random_store
from test_train import tiny_config

SRC = Path(__file__).resolve().parents[1] / "src" / "coclr"

READ_BACK_OPS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
                 torch.ops.aten.masked_select.default}
"""Ops whose result the host must wait for on a GPU: reading a value (``item``, ``bool``, ``float``, ``int``) and
ops whose output size depends on the data."""

SYNC_POINTS = {"_record", "_check_finite", "_end_epoch", "save", "_knn", "_load", "_check_mining_space"}
"""The trainer's places that may read back (every ``run.log_every`` steps, per epoch, at start-up, once as the
queues fill)."""

CPU_BY_DESIGN = {("augment.py", "upload"), ("augment.py", "sample_crop_boxes"), ("methods.py", "_draw"),
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


class DeviceTraffic(TorchFunctionMode):
    """Follows which tensors a GPU run would hold on the device, on a CPU run, and records each blocking copy from
    the host to the device and each read of a device value, with its site (as :class:`HostReads`).

    A tensor is on the device when it is a parameter or buffer of the model (the queue included), the result of a
    copy that names the device (``Tensor.to``), of a call that names a ``device`` (not a draw from a generator,
    which are CPU generators here), or of an operation with a device tensor among its inputs; anything else stays
    on the host (the DataLoader's batches, draws from CPU generators).
    A copy is blocking when it moves a host tensor to the device without ``non_blocking=True``; a read is
    ``item``, ``tolist``, ``__bool__``, ``__int__``, ``__float__``, ``nonzero``, ``cpu``, ``numpy`` or a boolean
    mask index on a device tensor.
    """

    READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
             torch.Tensor.__float__, torch.Tensor.nonzero, torch.nonzero, torch.Tensor.cpu, torch.Tensor.numpy}

    def __init__(self, device_tensors) -> None:
        super().__init__()
        self.on_device: set[int] = set()  # ids of live device tensors (a WeakSet would compare tensors with ==)
        for tensor in device_tensors:
            self._mark(tensor)
        self.blocking: list[tuple[str, str, bool]] = []  # (file, function, in a sync point) of each
        self.reads: list[tuple[str, str, bool]] = []
        self.non_blocking = 0

    @staticmethod
    def _site() -> tuple[str, str, bool]:
        """The innermost frame in src/coclr (else the caller's) and whether a trainer sync point is on the stack."""
        stack = traceback.extract_stack()[:-2]
        ours = [f for f in stack if f.filename.startswith(str(SRC))]
        inner = ours[-1] if ours else stack[-1]
        in_sync_point = any(f.name in SYNC_POINTS and f.filename.endswith("trainer.py") for f in ours)
        return Path(inner.filename).name, inner.name, in_sync_point

    def _mark(self, tensor: torch.Tensor) -> None:
        if id(tensor) not in self.on_device:
            self.on_device.add(id(tensor))
            weakref.finalize(tensor, self.on_device.discard, id(tensor))

    def _is_device(self, value) -> bool:
        return isinstance(value, torch.Tensor) and id(value) in self.on_device

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
        inputs += [t for v in (*args, *kwargs.values()) if isinstance(v, (list, tuple))
                   for t in v if isinstance(t, torch.Tensor)]
        device_input = any(self._is_device(t) for t in inputs)
        if func in self.READS and self._is_device(args[0]):
            self.reads.append(self._site())
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and isinstance(args[1], torch.Tensor) \
                and args[1].dtype == torch.bool and self._is_device(args[1]):
            self.reads.append(self._site())  # a boolean mask: the output's size is data on the device
        moved = False
        if func is torch.Tensor.to:
            target, _, non_blocking, *_ = torch._C._nn._parse_to(*args[1:], **kwargs)
            if target is not None or any(self._is_device(v) for v in args[1:]):
                moved = True
                if not self._is_device(args[0]):
                    if non_blocking:
                        self.non_blocking += 1
                    else:
                        self.blocking.append(self._site())
        if func is torch.Tensor.copy_ and self._is_device(args[0]) and not self._is_device(args[1]):
            if kwargs.get("non_blocking", len(args) > 2 and args[2]):
                self.non_blocking += 1
            else:
                self.blocking.append(self._site())
        out = func(*args, **kwargs)
        if moved and out is args[0]:
            out = out.view_as(out)  # on a GPU the copy is a new tensor; the host tensor stays on the host
        named = "device" in kwargs and kwargs.get("generator") is None  # a CPU generator's draws stay on the host
        if func not in self.READS and (moved or device_input or named):
            for result in (out if isinstance(out, (list, tuple)) else (out,)):
                if isinstance(result, torch.Tensor):
                    self._mark(result)
        return out


@pytest.mark.parametrize("method", ["infonce", "coclr"])
def test_a_training_step_makes_no_blocking_copy_and_reads_nothing_on_the_device(method: str, tmp_path: Path,
                                                                                 start_trainer) -> None:
    """Per step, outside the logging and epoch-end points, at most one host synchronisation: a blocking copy to the
    device or a read of a device value (there are none), on a CPU run followed as a GPU run would place its
    tensors (:class:`DeviceTraffic`); the batch's tensors and the augmentation parameters go over non-blocking."""
    store = make_random_store(tmp_path / "store")
    extra = []
    if method == "coclr":
        save_encoder(tmp_path / "sampler.pth", build_encoder(width=0.125))
        extra = ["method.name=coclr", f"method.sampler_checkpoint={tmp_path / 'sampler.pth'}",
                 "method.wait_for_full_queue=true"]
    # The device path of the augmentation, as a GPU run takes it (the 8-bit path is for CPU tensors only).
    trainer = start_trainer(tiny_config(store, tmp_path / "run", "optim.epochs=2", "run.log_every=1000",
                                        "augment.cpu_8bit=false", *extra))
    steps = []
    step = trainer.train_step

    def counted_step(*args, **kwargs):
        steps.append(1)
        return step(*args, **kwargs)

    trainer.train_step = counted_step
    traffic = DeviceTraffic([*trainer.model.parameters(), *trainer.model.buffers()])
    with traffic:
        trainer.run()
    syncs = [site for site in traffic.blocking + traffic.reads if not site[2]]
    assert steps and traffic.non_blocking >= 2 * len(steps)  # it is watching: the batch goes over every step
    assert len(syncs) <= len(steps), syncs
    assert syncs == [], syncs


def test_the_device_traffic_detector_finds_a_blocking_copy_and_a_read() -> None:
    device_weight = torch.zeros(3)
    traffic = DeviceTraffic([device_weight])
    with traffic:
        batch = torch.ones(3)  # the host's
        on_device = batch.to("cpu")  # blocking
        total = (on_device + device_weight).sum()
        total.item()  # a read of a device value
        batch.sum().item()  # a host value: no read
        batch.to("cpu", non_blocking=True)
        device_weight.copy_(batch)  # blocking
    assert (len(traffic.blocking), len(traffic.reads), traffic.non_blocking) == (2, 1, 1)


@pytest.mark.parametrize("method", ["infonce", "coclr"])
def test_training_steps_read_nothing_back_from_the_device(method: str, tmp_path: Path, monkeypatch,
                                                          start_trainer) -> None:
    store = make_random_store(tmp_path / "store")
    extra = []
    if method == "coclr":  # mining, the own-key drop and waiting for the full queue
        save_encoder(tmp_path / "sampler.pth", build_encoder(width=0.125))
        extra = ["method.name=coclr", f"method.sampler_checkpoint={tmp_path / 'sampler.pth'}",
                 "method.wait_for_full_queue=true"]
    trainer = start_trainer(tiny_config(store, tmp_path / "run", "optim.epochs=2", "run.log_every=1000", *extra))
    assert unexpected_reads(trainer, monkeypatch) == []


def test_the_read_back_detector_finds_an_item_in_the_step(tmp_path: Path, monkeypatch, start_trainer) -> None:
    from coclr.train.learner import ViewLearner

    store = make_random_store(tmp_path / "store")
    trainer = start_trainer(tiny_config(store, tmp_path / "run", "optim.epochs=1", "run.log_every=1000"))
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
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            device = torch.device("cpu")  # it stands in for a working GPU decoder
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
    gpu_decoder_problem.cache_clear()
    yield
    gpu_decoder_problem.cache_clear()


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
    gpu_decoder_problem.cache_clear()
    assert resolve_decode(None, cuda) == "workers"
    with pytest.raises(ConfigError, match=r"^data.decode=device on cuda: torchvision.io.decode_jpeg is not importable "
                                          r".*; use data.decode=workers$"):
        resolve_decode("device", cuda)  # refused before any work, in one line
    assert resolve_decode("device", cpu) == "device"  # the CPU decodes with OpenCV


def test_a_gpu_decoder_that_fails_is_refused_or_falls_back_to_the_cpu(tmp_path: Path, monkeypatch,
                                                                      fake_torchvision) -> None:
    """A decoder that imports but fails: ``decode=device`` is refused at start-up naming the failure, ``auto``
    decodes in the workers, and a batch it fails on at call time is decoded on the CPU, with a warning."""
    import sys

    def failing(tensors, mode, device):
        raise RuntimeError("nvjpeg: not supported on this device")

    monkeypatch.setattr(sys.modules["torchvision.io"], "decode_jpeg", failing)
    cuda = torch.device("cuda")
    with pytest.raises(ConfigError, match="decode_jpeg fails on cuda: RuntimeError: nvjpeg: not supported"):
        resolve_decode("device", cuda)
    assert resolve_decode(None, cuda) == "workers"
    store = make_random_store(tmp_path / "store")
    dataset = TrainClips(store, "train", ["rgb"], length=4, seed=1, encoded=True)
    batch = collate_clips([dataset[(0, i)] for i in range(2)])["rgb"]
    with pytest.warns(RuntimeWarning, match="decoded on the CPU"):
        frames = batch.decode_gpu(torch.device("cpu"))
    assert torch.equal(frames, batch.decode_cpu())


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
    pretrain(tiny_config(store, tmp_path / "run", "run.max_steps=1", "run.device=cpu"))
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["options"]["run"]
    assert (recorded["amp"], recorded["channels_last"]) == ("none", False)  # as runs recorded before "auto"
    with pytest.raises(ConfigError, match="run.amp: bf16 autocast is for CUDA"):
        pretrain(tiny_config(store, tmp_path / "other", "run.amp=bf16", "run.device=cpu"))


# ------------------------------------------------------------------------------------ the same training results

def losses_and_weights(config: PretrainConfig) -> tuple[list[float], dict[str, torch.Tensor]]:
    with start_run(config) as trainer:
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


def test_keys_are_ordinary_tensors_equal_to_a_no_grad_forward(tmp_path: Path, start_trainer) -> None:
    trainer = start_trainer(tiny_config(make_random_store(tmp_path / "store"), tmp_path / "run"))
    learner = trainer.model.learners["rgb"]
    clips = torch.randn(4, 3, 8, 32, 32)
    keys = learner.embed_keys(clips)
    assert not keys.is_inference() and not keys.requires_grad
    with torch.no_grad():
        learner.encoder_k.train()
        expected = learner.encoder_k(clips)
    assert torch.equal(keys, expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("method", ["infonce", "coclr"])
def test_training_steps_on_cuda_make_no_synchronising_call(method: str, tmp_path: Path, start_trainer) -> None:
    """Every step after the first (which allocates and may probe) runs under CUDA's sync debug mode set to error."""
    store = make_random_store(tmp_path / "store")
    extra = []
    if method == "coclr":
        save_encoder(tmp_path / "sampler.pth", build_encoder(width=0.125))
        extra = ["method.name=coclr", f"method.sampler_checkpoint={tmp_path / 'sampler.pth'}",
                 "method.wait_for_full_queue=false"]
    trainer = start_trainer(tiny_config(store, tmp_path / "run", "optim.epochs=2", "run.log_every=1000",
                                              "run.device=cuda", "data.decode=workers", *extra))
    step = trainer.train_step
    steps = []

    def checked_step(batch, queue_full):
        if not steps:
            out = step(batch, queue_full)
        else:
            torch.cuda.set_sync_debug_mode("error")
            try:
                out = step(batch, queue_full)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        steps.append(1)
        return out

    trainer.train_step = checked_step
    trainer.run()
    assert len(steps) > 1
