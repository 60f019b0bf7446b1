"""load_encoder / load_classifier / save_encoder: every supported format, strict errors, refused pickles."""

from __future__ import annotations

import pickle
import re
import sys
import types
from pathlib import Path

import pytest
import torch

from coclr.errors import CheckpointError
from coclr.models import (
    S3D,
    LinearClassifier,
    ProjectionHead,
    build_encoder,
    load_classifier,
    load_encoder,
    save_encoder,
)

# The authors' S3D registers each layer a second time under these names (docs/ARCHITECTURE.md).
AUTHOR_ALIAS = {
    "Conv_1a": "block1.0",
    "Conv_2b": "block2.1",
    "Conv_2c": "block2.2",
    "Mixed_3b": "block3.1",
    "Mixed_3c": "block3.2",
    "Mixed_4b": "block4.1",
    "Mixed_4c": "block4.2",
    "Mixed_4d": "block4.3",
    "Mixed_4e": "block4.4",
    "Mixed_4f": "block4.5",
    "Mixed_5b": "block5.1",
    "Mixed_5c": "block5.2",
}


def randomise(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random weights and random BatchNorm running statistics, so a wrong mapping cannot go unnoticed."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)
                m.num_batches_tracked.fill_(int(torch.randint(1, 1000, (1,), generator=gen)))
            elif isinstance(m, (torch.nn.Conv3d, torch.nn.Linear)):
                fan_in = m.weight[0].numel()
                m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * (2.0 / fan_in) ** 0.5)
                if m.bias is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)
    return module.eval()


def authors_backbone_keys(backbone: S3D, prefix: str) -> dict[str, torch.Tensor]:
    """The backbone as the authors' code stores it: every tensor under its name and its block alias."""
    out = {}
    for key, value in backbone.state_dict().items():
        layer, rest = key.split(".", 1)
        out[f"{prefix}{key}"] = value.clone()
        out[f"{prefix}{AUTHOR_ALIAS[layer]}.{rest}"] = value.clone()
    return out


def authors_pretrain_checkpoint(backbone: S3D, head: ProjectionHead, module_prefix: str = "") -> dict:
    """The layout of the authors' InfoNCE / CoCLR pretraining checkpoints (1x1x1 conv head at .2 and .4)."""
    state = {}
    for encoder in ("encoder_q", "encoder_k"):
        state.update(authors_backbone_keys(backbone, f"{module_prefix}{encoder}.0."))
        for index, fc in (("2", head.fc1), ("4", head.fc2)):
            state[f"{module_prefix}{encoder}.{index}.weight"] = fc.weight.detach().clone()[:, :, None, None, None]
            state[f"{module_prefix}{encoder}.{index}.bias"] = fc.bias.detach().clone()
    state[f"{module_prefix}queue"] = torch.randn(head.out_dim, 64)
    state[f"{module_prefix}queue_ptr"] = torch.zeros(1, dtype=torch.long)
    return {"epoch": 7, "state_dict": state, "best_acc": 0.0, "optimizer": {}, "iteration": 99}


@pytest.fixture(scope="module")
def small_parts() -> tuple[S3D, ProjectionHead]:
    torch.manual_seed(0)
    encoder = build_encoder(width=0.25, embed_dim=32)
    return randomise(encoder.backbone, 1), randomise(encoder.head, 2)


@pytest.fixture(scope="module")
def clip() -> torch.Tensor:
    return torch.randn(2, 3, 8, 32, 32, generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="module")
def reference(small_parts, clip) -> tuple[torch.Tensor, torch.Tensor]:
    """Pooled features and head outputs of the original small encoder on ``clip``."""
    return outputs(*small_parts, clip)


def outputs(backbone: S3D, head: torch.nn.Module | None, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    with torch.no_grad():
        pooled = backbone(x).mean(dim=(2, 3, 4))
        return pooled, None if head is None else head(pooled)


# ------------------------------------------------------------------------------------ the authors' formats


def test_official_fixture_reproduces_the_authors_outputs(fixtures_dir):
    expected = torch.load(fixtures_dir / "official_infonce_s3d_expected.pt", weights_only=True)
    backbone, head = load_encoder(fixtures_dir / "official_infonce_s3d_format.pth.tar")
    assert isinstance(backbone, S3D) and isinstance(head, ProjectionHead)
    assert not backbone.training and not head.training
    assert backbone.width == 1.0 and not backbone.gating
    with torch.no_grad():
        fmap = backbone(expected["input"])
        pooled = fmap.mean(dim=(2, 3, 4))
        projected = head(pooled)
    assert list(fmap.shape) == list(expected["backbone_feature_map_shape"])
    assert (pooled - expected["pooled_feature"]).abs().max() < 1e-4
    assert (projected - expected["head_output"]).abs().max() < 1e-4


@pytest.mark.parametrize("module_prefix", ["", "module."])
def test_authors_pretrain_layout_round_trip(tmp_path, small_parts, clip, reference, module_prefix):
    backbone, head = small_parts
    path = tmp_path / "authors.pth.tar"
    torch.save(authors_pretrain_checkpoint(backbone, head, module_prefix), path)
    loaded_backbone, loaded_head = load_encoder(path)
    assert loaded_backbone.width == 0.25 and loaded_head.out_dim == 32
    for got, want in zip(outputs(loaded_backbone, loaded_head, clip), reference):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_authors_alias_disagreement_is_an_error(tmp_path, small_parts):
    checkpoint = authors_pretrain_checkpoint(*small_parts)
    checkpoint["state_dict"]["encoder_q.0.block3.2.branch1.1.bn2.running_var"] += 1.0
    torch.save(checkpoint, tmp_path / "bad.pth.tar")
    with pytest.raises(CheckpointError) as info:
        load_encoder(tmp_path / "bad.pth.tar")
    assert "encoder_q.0.Mixed_3c.branch1.1.bn2.running_var" in str(info.value)
    assert "encoder_q.0.block3.2.branch1.1.bn2.running_var" in str(info.value)


@pytest.mark.parametrize("final_bn,dropout,module_prefix", [(True, 0.0, ""), (False, 0.5, "module."), (True, 0.9, "")])
def test_authors_classifier_layouts(tmp_path, small_parts, clip, reference, final_bn, dropout, module_prefix):
    backbone, _ = small_parts
    # the authors' linear probe (final BN) L2-normalises the features first: their final_norm goes with final_bn
    classifier = randomise(LinearClassifier(backbone.out_channels, 7, final_bn=final_bn, dropout=dropout,
                                            l2_norm=final_bn), 4)
    state = authors_backbone_keys(backbone, module_prefix + "backbone.")
    state.update({f"{module_prefix}{k}": v for k, v in classifier.state_dict().items()})
    assert any(k.endswith("final_fc.1.weight" if dropout else "final_fc.0.weight") for k in state)
    path = tmp_path / "classifier.pth.tar"
    torch.save({"epoch": 1, "state_dict": state, "best_acc": 0.5, "optimizer": {}}, path)

    loaded_backbone, loaded_classifier = load_classifier(path)
    assert (loaded_classifier.final_bn is not None) == final_bn and loaded_classifier.l2_norm == final_bn
    assert (len(loaded_classifier.final_fc) == 2) == (dropout > 0)
    assert not loaded_classifier.training
    pooled = outputs(loaded_backbone, None, clip)[0]
    torch.testing.assert_close(pooled, reference[0], rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(loaded_classifier(pooled), classifier(reference[0]), rtol=0, atol=0)

    encoder_backbone, encoder_head = load_encoder(path)
    assert encoder_head is None
    torch.testing.assert_close(encoder_backbone.state_dict(), loaded_backbone.state_dict(), rtol=0, atol=0)


def test_load_classifier_refuses_a_pretraining_checkpoint(tmp_path, small_parts):
    torch.save(authors_pretrain_checkpoint(*small_parts), tmp_path / "pretrain.pth.tar")
    with pytest.raises(CheckpointError, match="not a classifier checkpoint"):
        load_classifier(tmp_path / "pretrain.pth.tar")


# ------------------------------------------------------------------------------------ torchvision


def torchvision_s3d():
    """torchvision's s3d constructor, or skip (its plain import fails here without two stub modules)."""
    for name in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
        sys.modules.setdefault(name, types.ModuleType(name))
    try:
        from torchvision.models.video import s3d
    except Exception as error:  # not installed, or broken against this torch
        pytest.skip(f"torchvision unavailable: {error}")
    return s3d


def test_torchvision_s3d_conversion(tmp_path):
    s3d = torchvision_s3d()
    torch.manual_seed(5)
    theirs = randomise(s3d(num_classes=400), 6)
    path = tmp_path / "tv_s3d.pth"
    torch.save(theirs.state_dict(), path)
    backbone, head = load_encoder(path)
    assert head is None and backbone.bn_eps == 1e-3 and backbone.width == 1.0
    x = torch.randn(1, 3, 16, 64, 64, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = theirs.features(x)
        got = backbone(x)
    assert got.shape == want.shape == (1, 1024, 2, 2, 2)
    assert want.abs().max() > 1e-2  # a real signal, not all zeros
    assert (got - want).abs().max() < 1e-4


def test_a_warm_start_from_torchvision_weights_keeps_their_batchnorm_epsilon(tmp_path, clip):
    """torchvision's S3D keeps its statistics under eps 1e-3: a run's encoder started from such a file computes
    what the file's network does (it was built with 1e-5, up to 1.0 off on features of 6.5), and records it."""
    from coclr.models.loading import _torchvision_name
    from coclr.train.model import load_into

    torch.manual_seed(0)
    theirs = S3D(width=0.125, bn_eps=1e-3)
    randomise(theirs, 8)
    for module in theirs.modules():
        if isinstance(module, torch.nn.BatchNorm3d):
            module.running_var.uniform_(1e-4, 4e-3)  # small variances: where the epsilon tells
    torch.save({_torchvision_name(key): value for key, value in theirs.state_dict().items()}, tmp_path / "tv.pth")
    run = build_encoder(width=0.125)
    load_into(run, str(tmp_path / "tv.pth"), "method.init_checkpoint")
    assert run.backbone.bn_eps == 1e-3 and run.arch["bn_eps"] == 1e-3
    run.eval()
    with torch.no_grad():
        torch.testing.assert_close(run.backbone(clip), theirs.eval()(clip), rtol=0, atol=0)


# ------------------------------------------------------------------------------------ our own format


@pytest.mark.parametrize("width,gating,with_head", [(0.25, False, True), (0.125, True, True), (0.125, False, False)])
def test_our_format_round_trip(tmp_path, clip, width, gating, with_head):
    torch.manual_seed(0)
    encoder = build_encoder(width=width, gating=gating, embed_dim=24 if with_head else None, bn_eps=1e-4)
    randomise(encoder, 8)
    path = save_encoder(tmp_path / "sub" / "enc.pt", encoder, meta={"method": "coclr", "epoch": 3, "view": "flow"})
    assert sorted(p.name for p in path.parent.iterdir()) == ["enc.pt"]  # no temporary file left behind
    raw = torch.load(path, weights_only=True)
    assert raw["format"] == "coclr.encoder" and raw["arch"] == encoder.arch and raw["meta"]["view"] == "flow"

    backbone, head = load_encoder(path)
    assert backbone.gating == gating and backbone.bn_eps == 1e-4 and (head is not None) == with_head
    for got, want in zip(outputs(backbone, head, clip), outputs(encoder.backbone, encoder.head, clip)):
        if want is not None:
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def _edited(tmp_path: Path, name: str, edit) -> Path:
    """An encoder file (width 0.125, a head of 16) with ``edit(payload)`` applied, saved as ``name``."""
    path = save_encoder(tmp_path / name, build_encoder(width=0.125, embed_dim=16))
    payload = torch.load(path, weights_only=True)
    edit(payload)
    torch.save(payload, path)
    return path


def _set(payload: dict, part: str, key: str, make) -> None:
    payload[part][key] = make(payload[part][key])


@pytest.mark.parametrize("edit, why", [
    (lambda p: _set(p, "backbone", "Conv_1a.conv1.weight", lambda t: torch.full_like(t, float("nan"))),
     r"backbone\.Conv_1a\.conv1\.weight \(NaN or infinite values\)"),
    (lambda p: _set(p, "head", "fc2.bias", lambda t: t.to(torch.int64)),
     r"head\.fc2\.bias \(int64, not real numbers\)"),
    (lambda p: _set(p, "backbone", "Conv_1a.conv1.weight", lambda t: t.to(torch.complex64)),
     r"\(complex64, not real numbers\)"),
    (lambda p: _set(p, "backbone", "Conv_1a.conv1.weight", lambda t: t.to_sparse()), r"\(a sparse_coo tensor\)"),
    (lambda p: _set(p, "backbone", "Conv_2b.bn.num_batches_tracked", lambda t: t.float()),
     r"num_batches_tracked \(float32, not whole numbers\)"),
])
def test_tensors_that_are_not_weights_are_refused_naming_each(tmp_path, edit, why):
    """NaN weights embedded as vectors of zeros with exit status 0, whole numbers were cast silently (zeros too), a
    sparse tensor was a traceback in every command: refused at load, for every reader."""
    path = _edited(tmp_path, "odd.pth", edit)
    with pytest.raises(CheckpointError, match=rf"odd\.pth: not usable as weights: \[.*{why}.*\]; the file is damaged"):
        load_encoder(path)


@pytest.mark.parametrize("key, value, problem", [
    ("width", 1000.0, r"width 1000, but backbone\.Conv_1a\.conv1\.weight holds 8 filters \(width 0\.125\)"),
    ("width", -1, r"width must be a positive finite number, got -1"),
    ("embed_dim", 10 ** 9, r"embed_dim 1000000000, but head\.fc2\.weight holds 16 outputs"),
    ("bn_eps", -1.0, r"bn_eps must be a positive finite number, got -1\.0"),
    ("bn_eps", float("nan"), r"bn_eps must be a positive finite number, got nan"),
    ("gating", "no", r"gating must be true or false, got 'no'"),
])
def test_an_arch_its_tensors_do_not_have_is_refused_before_the_network_is_built(tmp_path, key, value, problem,
                                                                                monkeypatch):
    """A file's ``arch`` built the network before its tensors were compared: width 1000 asked for a terabyte
    ("not enough memory", naming no file), a negative epsilon embedded as zeros in one command and was a traceback in
    another, the text "no" was read as true."""
    import coclr.models.loading as loading

    def built(*args, **kwargs):
        raise AssertionError("the network was built")

    path = _edited(tmp_path, "arch.pth", lambda p: p["arch"].__setitem__(key, value))
    monkeypatch.setattr(loading, "S3D", built)
    monkeypatch.setattr(loading, "ProjectionHead", built)
    with pytest.raises(CheckpointError, match=rf"arch\.pth: invalid 'arch': {problem}"):
        load_encoder(path)


def test_training_format_with_ddp_prefix(tmp_path, small_parts, clip, reference):
    backbone, head = small_parts
    payload = {
        "format": "coclr.train",
        "arch": {"width": 0.25, "gating": False, "embed_dim": 32, "bn_eps": 1e-5},
        "backbone": {f"module.{k}": v for k, v in backbone.state_dict().items()},
        "head": {f"module.{k}": v for k, v in head.state_dict().items()},
        "optimizer": {"state": {}, "param_groups": []},
        "epoch": 4,
    }
    torch.save(payload, tmp_path / "train.pt")
    loaded = load_encoder(tmp_path / "train.pt")
    for got, want in zip(outputs(*loaded, clip), reference):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_save_encoder_refuses_non_plain_meta(tmp_path):
    encoder = build_encoder(width=0.125)
    with pytest.raises(ValueError, match="meta"):
        save_encoder(tmp_path / "enc.pt", encoder, meta={"root": Path("/data")})
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------ strict errors


def our_payload(backbone: S3D, head: ProjectionHead) -> dict:
    return {
        "format": "coclr.encoder",
        "arch": {"width": 0.25, "gating": False, "embed_dim": 32, "bn_eps": 1e-5},
        "backbone": dict(backbone.state_dict()),
        "head": dict(head.state_dict()),
    }


def edit_missing(state: dict, key: str) -> None:
    del state[key]


def edit_unexpected(state: dict, key: str) -> None:
    state[key + "_extra"] = torch.zeros(3)


def edit_misshaped(state: dict, key: str) -> None:
    state[key] = torch.zeros(5, 5)


@pytest.mark.parametrize(
    "edit,word,suffix",
    [(edit_missing, "missing", ""), (edit_unexpected, "unexpected", "_extra"), (edit_misshaped, "mis-shaped", "")],
)
@pytest.mark.parametrize("layout", ["ours_backbone", "ours_head", "authors_backbone", "authors_head"])
def test_strict_errors_name_the_key(tmp_path, small_parts, edit, word, suffix, layout):
    if layout.startswith("ours"):
        payload = our_payload(*small_parts)
        part = "backbone" if layout == "ours_backbone" else "head"
        state, key = payload[part], "Mixed_4d.branch2.1.conv2.weight" if part == "backbone" else "fc2.bias"
        shown = f"{part}.{key}"
    else:
        payload = authors_pretrain_checkpoint(*small_parts)
        state = payload["state_dict"]
        if layout == "authors_backbone":
            key = "encoder_q.0.Mixed_4d.branch2.1.conv2.weight"
            edit(state, key.replace("Mixed_4d", "block4.3"))  # both copies, or the alias check fires first
        else:
            key = "encoder_q.4.bias"
        shown = key
    edit(state, key)
    torch.save(payload, tmp_path / "bad.pt")
    with pytest.raises(CheckpointError) as info:
        load_encoder(tmp_path / "bad.pt")
    message = str(info.value)
    assert word in message and shown + suffix in message and "bad.pt" in message


@pytest.mark.parametrize("width", [0.2, 0.3, 0.7, 0.125])
def test_a_bare_state_dict_of_any_width_loads_at_its_width(tmp_path, width):
    """The width was the stem's filters over 64: 19 / 64 = 0.296875 for a width-0.3 network, whose other layers then
    had a filter fewer than the file (57 where it held 58), and the file was refused as "S3D does not match"."""
    from coclr.models.loading import load_encoder
    from coclr.models.s3d import S3D

    torch.manual_seed(0)
    network = S3D(width=width)
    torch.save(network.state_dict(), tmp_path / "bare.pth")
    backbone, head = load_encoder(tmp_path / "bare.pth")
    assert backbone.width == width and head is None
    assert all(torch.equal(a, b) for a, b in zip(backbone.state_dict().values(), network.state_dict().values()))


def test_torchvision_classifier_is_ignored_but_other_keys_are_not(tmp_path):
    backbone = S3D(width=0.125, bn_eps=1e-3)
    from coclr.models.loading import _torchvision_name

    state = {_torchvision_name(k): v for k, v in backbone.state_dict().items()}
    state["classifier.1.weight"] = torch.zeros(400, backbone.out_channels, 1, 1, 1)
    state["features.16.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / "tv.pth")
    with pytest.raises(CheckpointError, match=r"unexpected keys \[features\.16\.weight\]"):
        load_encoder(tmp_path / "tv.pth")


def test_unknown_format_lists_what_was_found(tmp_path):
    torch.save({"model": {"layer1.weight": torch.zeros(2)}, "step": 3}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match=r"unknown checkpoint format.*model.*step"):
        load_encoder(tmp_path / "other.pt")
    torch.save({"format": "coclr.future", "arch": {}}, tmp_path / "future.pt")
    with pytest.raises(CheckpointError, match="coclr.future"):
        load_encoder(tmp_path / "future.pt")
    torch.save([torch.zeros(1)], tmp_path / "list.pt")
    with pytest.raises(CheckpointError, match="list"):
        load_encoder(tmp_path / "list.pt")
    # a key that is not a name was an AttributeError ('int' object has no attribute 'startswith')
    torch.save({**S3D(width=0.125).state_dict(), 7: torch.zeros(1)}, tmp_path / "int_key.pt")
    with pytest.raises(CheckpointError, match=r"int_key\.pt: a state-dict key is not a name but int 7"):
        load_encoder(tmp_path / "int_key.pt")


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(CheckpointError, match="not found.*nothing.pt"):
        load_encoder(tmp_path / "nothing.pt")
    (tmp_path / "junk.pt").write_bytes(b"this is not a checkpoint")
    with pytest.raises(CheckpointError, match="junk.pt"):
        load_encoder(tmp_path / "junk.pt")


class _CreatesMarkerWhenUnpickled:
    """Unpickling this object calls ``open(marker, "w")``: code execution, which a weights-only load forbids."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_pickled_objects_are_refused_not_executed(tmp_path, small_parts):
    marker = tmp_path / "executed.txt"
    checkpoint = authors_pretrain_checkpoint(*small_parts)
    checkpoint["optimizer"] = _CreatesMarkerWhenUnpickled(marker)
    path = tmp_path / "evil.pth.tar"
    torch.save(checkpoint, path)
    with pytest.raises(CheckpointError, match="refused.*evil.pth.tar|evil.pth.tar.*refused"):
        load_encoder(path)
    assert not marker.exists()
    # the payload is live: an unsafe load would have run it
    torch.load(path, weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_pickle_of_objects_is_refused_as_such_not_executed(tmp_path, protocol, capsys):
    """A raw pickle (not torch.save's) of an object that runs code: refused, but called "damaged", after a torch
    warning asking to file an issue."""
    marker = tmp_path / "executed.txt"
    path = tmp_path / "evil.pth"
    path.write_bytes(pickle.dumps(_CreatesMarkerWhenUnpickled(marker), protocol=protocol))
    with pytest.raises(CheckpointError, match=r"evil\.pth: refused: a pickle of Python objects \(io\.open\), not a "
                                              r"PyTorch checkpoint; nothing in it was executed"):
        load_encoder(path)
    assert not marker.exists() and "warning" not in capsys.readouterr().err.lower()
    torch.save({"state_dict": {}}, tmp_path / "legacy.pth", _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match="unknown checkpoint format"):  # a legacy torch file is read
        load_encoder(tmp_path / "legacy.pth")


@pytest.mark.parametrize("content, message", [
    (b"", "is empty (0 bytes), not a checkpoint"),
    (b"a checkpoint in a text file\n", "not a PyTorch checkpoint"),
    (bytes(range(256)) * 12, "not a PyTorch checkpoint"),
    (b"PK\x03\x04" + bytes(200), "damaged, or not a PyTorch checkpoint"),  # a zip header, then nothing usable
])
def test_files_that_are_not_checkpoints_are_named_as_such(tmp_path, content, message):
    """Empty, text, random and damaged files get one line saying what they are; never the advice to load an
    untrusted file without weights_only (torch's message for random bytes)."""
    path = tmp_path / "model.pth"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=re.escape(message)) as error:
        load_encoder(path)
    assert "weights_only" not in str(error.value) and "\n" not in str(error.value)
    assert str(path) in str(error.value)


def test_a_refused_pickle_names_the_object(tmp_path):
    import argparse

    torch.save({"args": argparse.Namespace(lr=0.1)}, tmp_path / "with_args.pth")
    with pytest.raises(CheckpointError, match=r"pickled Python object \(argparse\.Namespace\)") as error:
        load_encoder(tmp_path / "with_args.pth")
    assert "weights_only" not in str(error.value)


def test_a_legacy_file_cut_short_is_damaged_not_a_refused_object(tmp_path, fixtures_dir):
    """The authors' file (torch.save's legacy format) cut inside its header read a cut name as an unknown global:
    "refused: the file holds a pickled Python object (torch.LongSto)". It is a file cut short; a whole file with an
    object is still refused as one (in the legacy format too)."""
    import argparse

    data = (fixtures_dir / "official_infonce_s3d_format.pth.tar").read_bytes()
    cut = tmp_path / "cut.pth"
    for size in (219, 1000, 1003):
        cut.write_bytes(data[:size])
        with pytest.raises(CheckpointError) as error:
            load_encoder(cut)
        assert "pickled Python object" not in str(error.value) and "damaged" in str(error.value)
    torch.save({"args": argparse.Namespace(lr=0.1)}, tmp_path / "legacy.pth", _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match=r"pickled Python object \(argparse\.Namespace\)"):
        load_encoder(tmp_path / "legacy.pth")
    (tmp_path / "more.pth").write_bytes(pickle.dumps({"args": argparse.Namespace(lr=0.1)}, 2) + b"\x00\x01raw")
    with pytest.raises(CheckpointError, match=r"a pickle of Python objects \(argparse\.Namespace\), not a PyTorch"):
        load_encoder(tmp_path / "more.pth")  # a whole pickle, other bytes after it: not cut short


def test_a_torchscript_network_is_named_as_one_and_not_run(tmp_path, capsys):
    """An exported network (coclr export --format torchscript) given where a checkpoint is wanted: one line saying
    what it is and what to give instead (it was "damaged", after a raw warning from torch.load)."""
    scripted = torch.jit.script(torch.nn.Linear(2, 2))
    torch.jit.save(scripted, str(tmp_path / "model.pt"))
    with pytest.raises(CheckpointError, match=r"model\.pt: a TorchScript network .* not a checkpoint: .* give the "
                                              "checkpoint it was exported from"):
        load_encoder(tmp_path / "model.pt")
    assert "torch.load" not in capsys.readouterr().err
    (tmp_path / "model.onnx").write_bytes(b"\x08\x07\x12\x07pytorch")  # an ONNX protobuf's first bytes
    with pytest.raises(CheckpointError, match=r"model\.onnx: an ONNX network .* not a checkpoint; give the "
                                              "checkpoint it was exported from"):
        load_encoder(tmp_path / "model.onnx")


def test_a_checkpoint_is_read_once_per_process_while_the_file_is_unchanged(tmp_path):
    """One object per unchanged file: its sha256 is that of the bytes on disk, every reader gets the same payload,
    and a file replaced by another one is read again (never the stale weights)."""
    import os

    from coclr.atomic import file_sha256
    from coclr.models.loading import checkpoint_format, checkpoint_sha256, open_checkpoint, read_clip_settings

    torch.manual_seed(0)
    path = tmp_path / "enc.pth"
    save_encoder(path, build_encoder(width=0.125), meta={"clip_settings": {"view": "flow", "size": 32}})
    first = open_checkpoint(path)
    assert open_checkpoint(str(path)) is first and checkpoint_sha256(path) == file_sha256(path) == first.sha256
    assert read_clip_settings(path) == {"view": "flow", "size": 32} and checkpoint_format(path) == "ours"
    backbone, _ = load_encoder(path)
    again, _ = load_encoder(path)
    assert backbone is not again  # new modules each time, from the one payload
    with torch.no_grad():
        next(again.parameters()).add_(1.0)  # a caller's own modules: the shared payload is untouched
    assert torch.equal(load_encoder(path)[0].state_dict()["Conv_1a.conv1.weight"],
                       backbone.state_dict()["Conv_1a.conv1.weight"])
    other = tmp_path / "other.pth"
    save_encoder(other, build_encoder(width=0.125), meta={"clip_settings": {"view": "rgb"}})
    os.replace(other, path)  # another encoder in its place
    replaced = open_checkpoint(path)
    assert replaced is not first and replaced.sha256 == file_sha256(path) != first.sha256
    assert read_clip_settings(path) == {"view": "rgb"}


def test_coclr_embed_opens_its_checkpoint_once(tmp_path):
    """Issue 57: format, clip settings, hash and weights all come from one read of the file (it was opened 13
    times, loaded 6)."""
    import subprocess

    import numpy as np

    from conftest import REPO_ROOT
    from test_embed import write_video

    torch.manual_seed(0)
    checkpoint = tmp_path / "enc.pth"
    save_encoder(checkpoint, build_encoder(width=0.125))
    frames = np.random.default_rng(0).integers(0, 255, (20, 48, 64, 3), dtype=np.uint8)
    video = write_video(tmp_path / "a.mp4", frames)
    code = (
        "import os, sys\n"
        "target, opens = os.path.realpath(sys.argv[1]), []\n"
        "sys.addaudithook(lambda event, args: opens.append(1) if event == 'open' and args and "
        "isinstance(args[0], (str, os.PathLike)) and os.path.realpath(os.fspath(args[0])) == target else None)\n"
        "from coclr.cli import main\n"
        "code = main(sys.argv[2:])\n"
        "print('OPENS', len(opens))\n"
        "sys.exit(code)\n")
    result = subprocess.run([sys.executable, "-c", code, str(checkpoint), "embed", "--checkpoint", str(checkpoint),
                             "--out", str(tmp_path / "out"), str(video), "--size", "32", "--quiet"],
                            capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "OPENS 1" in result.stdout


def test_a_checkpoint_path_that_is_a_folder_is_named_so(tmp_path):
    from coclr.models.loading import load_encoder, read_checkpoint_file

    for read in (read_checkpoint_file, load_encoder):
        with pytest.raises(CheckpointError, match="is a folder, not a checkpoint file; give the checkpoint file in"):
            read(tmp_path)


def test_loading_leaves_the_global_random_stream_alone(tmp_path, small_parts):
    """A seeded script draws the same numbers whether or not it loads an encoder or a classifier first."""
    backbone, head = small_parts
    save_encoder(tmp_path / "ours.pth", build_encoder(width=0.25, embed_dim=32))
    classifier = LinearClassifier(backbone.out_channels, 3)
    state = authors_backbone_keys(backbone, "backbone.")
    state.update(classifier.state_dict())
    torch.save({"state_dict": state}, tmp_path / "classifier.pth.tar")
    for load in (lambda: load_encoder(tmp_path / "ours.pth"), lambda: load_classifier(tmp_path / "classifier.pth.tar")):
        torch.manual_seed(11)
        expected = torch.rand(4)
        torch.manual_seed(11)
        load()
        torch.testing.assert_close(torch.rand(4), expected, rtol=0, atol=0)


def test_a_weight_damaged_in_a_copy_is_refused_by_its_checksum(tmp_path):
    """torch.load checks no CRC: a bit flipped inside a tensor loaded as a wrong weight (and was exported)."""
    import io
    import struct
    import zipfile

    path = save_encoder(tmp_path / "encoder.pth", build_encoder(width=0.25, embed_dim=16))
    data = bytearray(path.read_bytes())
    entry = next(i for i in zipfile.ZipFile(io.BytesIO(bytes(data))).infolist() if i.filename.endswith("data/0"))
    name_length, extra_length = struct.unpack("<HH", data[entry.header_offset + 26 : entry.header_offset + 30])
    data[entry.header_offset + 30 + name_length + extra_length + 3] ^= 0x40  # an exponent bit of the first weight
    damaged = tmp_path / "damaged.pth"
    damaged.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"damaged.pth: damaged: .*data/0 fails its checksum"):
        load_encoder(damaged)
    load_encoder(path)


def test_checkpoints_without_checksums_load_and_unreadable_zips_are_one_line(tmp_path):
    """torch.serialization.set_crc32_options(False) writes every CRC as 0 (torch.load takes them): loaded; a zip
    entry compressed in a way zipfile does not read (deflate64) is one line, not a NotImplementedError."""
    import io
    import zipfile

    import torch.serialization

    encoder = build_encoder(width=0.25, embed_dim=16)
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(encoder.backbone.state_dict(), tmp_path / "no_crc.pth")
    finally:
        torch.serialization.set_crc32_options(True)
    assert all(entry.CRC == 0 for entry in zipfile.ZipFile(tmp_path / "no_crc.pth").infolist())
    assert isinstance(load_encoder(tmp_path / "no_crc.pth")[0], S3D)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", b"x" * 100)
    data = bytearray(buffer.getvalue())
    for signature, at in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):  # the compression method: 9, deflate64
        start = data.find(signature)
        data[start + at : start + at + 2] = (9).to_bytes(2, "little")
    (tmp_path / "deflate64.pth").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"deflate64.pth: damaged, or not a PyTorch checkpoint"):
        load_encoder(tmp_path / "deflate64.pth")
