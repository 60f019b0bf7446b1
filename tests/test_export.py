"""coclr export: safetensors read back by load_encoder, ONNX and TorchScript run beside the PyTorch encoder on real
clips, the folder rule, and the learn run's model card."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from coclr.cli import main
from coclr.errors import CheckpointError
from coclr.models import build_encoder, load_encoder, save_encoder
from coclr.models.export import FORMATS, METADATA_KEY, compare, is_safetensors
from coclr.models.exported import export_encoder
from coclr.models.loading import checkpoint_format, read_clip_settings
from coclr.runfolder import FolderRefused
from conftest import SHARED, shared_path

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
SETTINGS = {"view": "rgb", "length": 8, "stride": 1, "size": 32, "fps": None, "short_side": 32, "mean": MEAN,
            "std": STD, "flow_bound": None}


def real_clips(clips_folder, count: int = 4) -> torch.Tensor:
    """Normalised 8-frame 32 px centre clips of the first ``count`` real videos."""
    from coclr.video.decode import decode_video

    out = []
    for path in sorted(clips_folder.iterdir())[:count]:
        frames = decode_video(path, short_side=32)[:8]
        height, width = frames.shape[1:3]
        top, left = (height - 32) // 2, (width - 32) // 2
        clip = torch.from_numpy(frames[:, top:top + 32, left:left + 32].astype(np.float32) / 255.0)
        clip = (clip - torch.tensor(MEAN)) / torch.tensor(STD)
        out.append(clip.permute(3, 0, 1, 2))
    return torch.stack(out)


@pytest.fixture(scope="module")
def clips():
    return real_clips(shared_path("data", "clips"))


@pytest.fixture(scope="module")
def some_clips():
    """The real clips where ../shared holds them, else clips of noise: what the tests that need no real data
    feed the encoder."""
    if (SHARED / "data" / "clips").is_dir():
        return real_clips(SHARED / "data" / "clips")
    return torch.randn((4, 3, 8, 32, 32), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def encoder_file(tmp_path_factory, some_clips):
    """An encoder whose BatchNorm statistics were taken on those clips (a fresh one's features are ~1e-20,
    which no comparison could judge), saved as coclr learn saves its encoders."""
    clips = some_clips
    torch.manual_seed(0)
    encoder = build_encoder(width=0.125)
    encoder.train()
    for module in encoder.modules():
        if isinstance(module, torch.nn.BatchNorm3d):
            module.momentum = None  # the running statistics: the mean over the passes
    with torch.no_grad():
        for _ in range(3):
            encoder.features(clips + 0.1 * torch.randn_like(clips))
    encoder.eval()
    path = tmp_path_factory.mktemp("encoder") / "encoder_rgb.pth"
    save_encoder(path, encoder, {"stage": "cycle2_rgb", "view": "rgb", "method": "coclr",
                                 "clip_settings": SETTINGS})
    return path


def features_of(path, clips) -> np.ndarray:
    backbone, _ = load_encoder(path)
    with torch.no_grad():
        return backbone(clips).mean(dim=(2, 3, 4)).numpy()


def test_safetensors_reads_back_as_the_encoder(encoder_file, some_clips, tmp_path):
    clips = some_clips
    exported = export_encoder(encoder_file, "safetensors", tmp_path / "out")
    model = tmp_path / "out" / "model.safetensors"
    assert exported.model == model and exported.check == {"max_difference": 0.0}
    with open(model, "rb") as file:
        head = file.read(9)
        assert is_safetensors(head)
        file.seek(8)
        header = json.loads(file.read(struct.unpack("<Q", head[:8])[0]))
    config = json.loads(header["__metadata__"][METADATA_KEY])
    assert config["arch"]["width"] == 0.125 and config["feature_dim"] == 128 and config["view"] == "rgb"
    assert config["clip_settings"] == SETTINGS and config["meta"]["stage"] == "cycle2_rgb"
    assert json.loads((tmp_path / "out" / "config.json").read_text())["feature_dim"] == 128
    # every tensor of the encoder, nothing else; the same features, the same clip settings and format
    original, _ = load_encoder(encoder_file)
    read, head_module = load_encoder(model)
    assert head_module is not None
    for key, value in original.state_dict().items():
        assert torch.equal(value, read.state_dict()[key]), key
    np.testing.assert_array_equal(features_of(model, clips), features_of(encoder_file, clips))
    assert read_clip_settings(model) == SETTINGS and checkpoint_format(model) == "ours"
    from safetensors.torch import load_file  # another tool's reader: the tensors, named, nothing else

    tensors = load_file(model)
    assert set(tensors) == {f"backbone.{key}" for key in original.state_dict()} | {
        f"head.{key}" for key in head_module.state_dict()}


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_network_formats_give_the_encoders_features_on_real_clips(fmt, encoder_file, clips, tmp_path):
    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    from coclr.models.export import run_exported

    exported = export_encoder(encoder_file, fmt, tmp_path / "out", clips=clips[:2])
    assert exported.check["min_cosine"] >= 0.9999
    # checked again here on other real clips and a batch size the export did not see
    reference = features_of(encoder_file, clips)
    assert np.abs(reference).max() > 1e-3  # features a comparison can judge
    found = compare(reference, run_exported(exported.model, fmt, clips))
    assert found["min_cosine"] >= 0.9999 and found["relative_difference"] < 1e-4
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["input"]["shape"] == ["batch", 3, 8, 32, 32] and config["output"]["shape"] == ["batch", 128]
    card = (tmp_path / "out" / "README.md").read_text()
    assert "smallest cosine" in card and "8 frames" in card
    if fmt == "onnx":  # its graph's clip shape is fixed: the card said only "any batch size"
        assert "clips of exactly 8 frames of 32 x 32 px, any batch size." in card


def test_a_torchvision_file_exports_with_the_clips_its_format_takes(tmp_path):
    """torchvision's s3d records no clips but takes its own (224 px at 15 fps, Kinetics' normalisation): the export
    records them, so coclr reads the export as the file it came from (it read 128 px and ImageNet's), and the ONNX
    graph takes 224 px clips."""
    from coclr.clips import FORMAT_CLIPS
    from coclr.embed.settings import resolve_settings
    from coclr.models.loading import _torchvision_name
    from coclr.models.s3d import S3D

    source = tmp_path / "s3d_tv.pth"
    torch.save({_torchvision_name(k): v for k, v in S3D(width=0.125, bn_eps=1e-3).state_dict().items()}, source)
    export_encoder(source, "safetensors", tmp_path / "out")
    exported = tmp_path / "out" / "model.safetensors"
    assert resolve_settings(exported) == resolve_settings(source)
    assert (resolve_settings(exported).size, resolve_settings(exported).fps) == (224, 15.0)
    assert load_encoder(exported)[0].bn_eps == 1e-3
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["clip_settings"]["mean"] == list(FORMAT_CLIPS["torchvision"]["mean"])
    card = (tmp_path / "out" / "README.md").read_text()
    assert "- clips of 32 frames (stride 1), 224 x 224 px, frames decoded at a short side of 256 px, 15.0 fps" in card
    assert "- not recorded by the checkpoint (or recorded as none), so the values above are those coclr embed feeds " \
        "it: length, stride;" in card
    assert "None" not in card.split("## Training")[0] and "head.*" not in card  # (it has no projection head)
    assert card.startswith("# S3D video encoder (rgb view, implied by its format)")  # (title "unknown", input "rgb")


def test_the_card_of_a_frame_difference_encoder_says_it_takes_differences(tmp_path):
    """An rgbdiff encoder's card said only "view: rgbdiff" and the frames' normalisation: fed normalised frames as it
    said, the network gave other features than in training, without an error."""
    source = save_encoder(tmp_path / "diff.pth", build_encoder(width=0.125), {
        "view": "rgbdiff", "clip_settings": {"view": "rgbdiff", "length": 8, "stride": 1, "size": 32}})
    export_encoder(source, "safetensors", tmp_path / "out")
    card = (tmp_path / "out" / "README.md").read_text()
    assert "differences of consecutive normalised frames, x[t+1] - x[t]: 8 differences of 8 + 1" in card
    save_encoder(tmp_path / "rgb.pth", build_encoder(width=0.125), {"clip_settings": {"view": "rgb", "length": 8}})
    export_encoder(tmp_path / "rgb.pth", "safetensors", tmp_path / "rgb")
    assert "differences" not in (tmp_path / "rgb" / "README.md").read_text()


def test_compare_catches_other_features():
    reference = np.random.default_rng(0).normal(size=(3, 16))
    assert compare(reference, reference)["min_cosine"] == pytest.approx(1.0)
    assert compare(reference, -reference)["min_cosine"] == pytest.approx(-1.0)
    with pytest.raises(CheckpointError, match="shape"):
        compare(reference, reference[:, :8])


def test_the_folder_rule(encoder_file, tmp_path):
    out = tmp_path / "out"
    export_encoder(encoder_file, "torchscript", out)
    stamps = {path.name: path.stat().st_mtime_ns for path in out.iterdir()}
    again = export_encoder(encoder_file, "torchscript", out)  # the same command: nothing written
    assert again.already_done and "nothing written" in str(again)
    assert {path.name: path.stat().st_mtime_ns for path in out.iterdir()} == stamps
    copy = tmp_path / "copy.pth"  # the same bytes elsewhere: the same encoder (it was refused on its path)
    copy.write_bytes(Path(encoder_file).read_bytes())
    assert export_encoder(copy, "torchscript", out).already_done
    with pytest.raises(FolderRefused, match="format='torchscript' \\(given 'safetensors'\\)"):
        export_encoder(encoder_file, "safetensors", out)
    assert {path.name: path.stat().st_mtime_ns for path in out.iterdir()} == stamps
    (out / "model.pt").write_bytes(b"garbage")  # damaged since: it said "exported already"
    mended = export_encoder(encoder_file, "torchscript", out)
    assert not mended.already_done and "was not the file exported (its sha256 differs" in str(mended)
    assert mended.check["min_cosine"] >= 0.999 and torch.jit.load(out / "model.pt") is not None  # checked again
    assert export_encoder(encoder_file, "torchscript", out).already_done
    for config in ("gone", "garbage"):  # no hash to tell the file by: written again (it said "exported already")
        (out / "model.pt").write_bytes(b"garbage")
        (out / "config.json").unlink() if config == "gone" else (out / "config.json").write_text("{")
        assert not export_encoder(encoder_file, "torchscript", out).already_done
        assert torch.jit.load(out / "model.pt") is not None
        assert export_encoder(encoder_file, "torchscript", out).already_done
    foreign = tmp_path / "theirs"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(FolderRefused):
        export_encoder(encoder_file, "safetensors", foreign)
    assert sorted(os.listdir(foreign)) == ["notes.txt"]
    with pytest.raises(CheckpointError, match="not a format coclr exports"):
        export_encoder(encoder_file, "tflite", tmp_path / "other")
    assert not (tmp_path / "other").exists()


def test_another_tools_safetensors_is_a_state_dict(tmp_path):
    """A safetensors file without coclr's config is read as the state dict it holds (here an S3D in the authors'
    naming, recognised by its keys)."""
    from safetensors.torch import save_file

    from coclr.models.s3d import S3D

    backbone = S3D(width=0.125)
    save_file({key: value.contiguous() for key, value in backbone.state_dict().items()}, tmp_path / "bare.safetensors")
    assert checkpoint_format(tmp_path / "bare.safetensors") == "bare"
    read, head = load_encoder(tmp_path / "bare.safetensors")
    assert head is None and all(torch.equal(value, read.state_dict()[key])
                                for key, value in backbone.state_dict().items())
    (tmp_path / "damaged.safetensors").write_bytes((tmp_path / "bare.safetensors").read_bytes()[:4000])
    with pytest.raises(CheckpointError, match="damaged"):
        load_encoder(tmp_path / "damaged.safetensors")


def test_cli_card_of_a_learn_encoder(encoder_file, tmp_path, capsys):
    """`coclr export` on an encoder in a coclr learn folder: the card says how the run chose and measured it."""
    folder = tmp_path / "learn"
    folder.mkdir()
    (folder / "encoder_rgb.pth").write_bytes(encoder_file.read_bytes())
    (folder / "learn.json").write_text(json.dumps({
        "videos": 8, "plan": {"steps": 640, "batch": 12, "model": {"width": 0.125}},
        "exported": {"rgb": {"stage": "cycle2_rgb", "reason": "the last stage that did not collapse"}},
        "stages": {"cycle2_rgb": {"effective_rank": 3.5, "agreement": 0.05, "collapsed": False}}}))
    status = main(["export", str(folder / "encoder_rgb.pth"), "--format", "safetensors", "--out", str(tmp_path / "o")])
    assert status == 0 and "model.safetensors" in capsys.readouterr().out
    card = (tmp_path / "o" / "README.md").read_text()
    assert "the last stage that did not collapse" in card
    # the run's steps are said as the run's, not as this encoder's (an early stage exported had not had them)
    assert ("from a `coclr learn` run without labels on 8 videos (InfoNCE then two CoCLR cycles, 640 steps of batch "
            "12 over all its stages, S3D width 0.125); this encoder is its stage cycle2_rgb") in card
    assert "effective_rank 3.5" in card and "coclr.load_encoder" in card
    assert "collapsed encoder" not in capsys.readouterr().err
    # a collapsed encoder (every stage of its view collapsed) was exported in silence, as if it were fine
    record = json.loads((folder / "learn.json").read_text())
    record["exported"]["rgb"] = {"stage": "cycle2_rgb", "collapsed": True, "reason": "every rgb stage collapsed"}
    record["stages"]["cycle2_rgb"]["collapsed"] = True
    (folder / "learn.json").write_text(json.dumps(record))
    assert main(["export", str(folder / "encoder_rgb.pth"), "--format", "safetensors", "--out",
                 str(tmp_path / "c")]) == 0
    assert "is a collapsed encoder (its learn.json: every stage of its view collapsed)" in capsys.readouterr().err
    assert "; collapsed" in (tmp_path / "c" / "README.md").read_text()
    # any other checkpoint put beside a learn.json was called "learnt by coclr learn" with the run's figures
    save_encoder(folder / "my_pretrain.pth", build_encoder(width=0.125), {"view": "flow", "method": "infonce"})
    assert main(["export", str(folder / "my_pretrain.pth"), "--format", "safetensors", "--out",
                 str(tmp_path / "p")]) == 0
    card = (tmp_path / "p" / "README.md").read_text()
    assert "coclr learn" not in card
    # its meta names its view, though no clips are recorded: the title said "view unknown" above `view: "flow"`
    assert card.startswith("# S3D video encoder (flow view), exported by coclr")
    assert json.loads((tmp_path / "p" / "config.json").read_text())["view"] == "flow"
    assert main(["export", str(folder / "encoder_rgb.pth"), "--format", "keras", "--out", str(tmp_path / "k")]) == 2
    assert "not a format coclr exports" in capsys.readouterr().err
    # a learn.json of another shape (another tool's, or hand-edited) gives the card no notes: no traceback, no refusal
    odd = '{"exported": {"rgb": {"stage": "cycle2_rgb"}}, "plan": {"model": 3}, "stages": 1}'
    for number, text in enumerate(['{"exported": {"rgb": "x"}}', '[1, 2]', '{"broken', odd]):
        (folder / "learn.json").write_text(text)
        out = tmp_path / f"other{number}"
        assert main(["export", str(folder / "encoder_rgb.pth"), "--format", "safetensors", "--out", str(out)]) == 0
        assert "S3D width ?" in (out / "README.md").read_text() or "coclr learn" not in (out / "README.md").read_text()


def test_help_names_every_format():
    from coclr.cli import build_parser

    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    text = action.choices["export"].format_help()
    assert all(fmt in text for fmt in FORMATS)


def test_a_meta_json_cannot_hold_is_refused_before_any_write(tmp_path):
    encoder = build_encoder(width=0.125)
    save_encoder(tmp_path / "odd.pth", encoder, {"view": "rgb", "scale": torch.ones(2)})  # a tensor in meta
    with pytest.raises(CheckpointError, match=r"odd\.pth: the encoder's meta\['scale'\] is a tensor of shape \(2,\), "
                                              "which its config \\(JSON\\) cannot hold"):
        export_encoder(tmp_path / "odd.pth", "safetensors", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    # a number kept as a one-number tensor (a training script's best accuracy) is written as its number
    save_encoder(tmp_path / "scalar.pth", encoder, {"view": "rgb", "best_acc": torch.tensor(0.5)})
    export_encoder(tmp_path / "scalar.pth", "safetensors", tmp_path / "scalar")
    assert json.loads((tmp_path / "scalar" / "config.json").read_text())["meta"]["best_acc"] == 0.5


@pytest.mark.parametrize("change", ["meta list", "meta text", "embed_dim text", "embed_dim negative"])
@pytest.mark.parametrize("kind", ["pth", "safetensors"])
def test_a_malformed_config_in_a_checkpoint_is_one_line_naming_it(kind, change, tmp_path):
    """A file of ours whose meta is not a mapping, or whose head's dimension is not a positive whole number: a
    CheckpointError naming the file for every reader (they were an AttributeError, a ValueError and a RuntimeError
    from torch)."""
    from safetensors.torch import save_file

    encoder = build_encoder(width=0.125, embed_dim=16)
    path = save_encoder(tmp_path / "enc.pth", encoder, meta={"clip_settings": SETTINGS})
    payload = torch.load(path, weights_only=True)
    key, value = {"meta list": ("meta", ["a"]), "meta text": ("meta", "hello"), "embed_dim text": ("embed_dim", "x"),
                  "embed_dim negative": ("embed_dim", -5)}[change]
    if key == "meta":
        payload["meta"] = value
    else:
        payload["arch"] = {**payload["arch"], key: value}
    bad = tmp_path / f"bad.{kind}"
    if kind == "pth":
        torch.save(payload, bad)
    else:
        config = {"format": "coclr.encoder", "arch": payload["arch"], "meta": payload["meta"]}
        tensors = {f"{part}.{name}": tensor for part in ("backbone", "head") for name, tensor in payload[part].items()}
        save_file(tensors, str(bad), metadata={METADATA_KEY: json.dumps(config)})
    with pytest.raises(CheckpointError, match="bad"):
        load_encoder(bad)
    with pytest.raises(CheckpointError, match="bad"):
        export_encoder(bad, "safetensors", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_onnx_without_its_packages_is_one_line_before_any_write(encoder_file, tmp_path, monkeypatch):
    import sys

    from coclr.errors import ConfigError

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
    with pytest.raises(ConfigError, match="onnxruntime package: pip install 'coclr\\[export\\]'"):
        export_encoder(encoder_file, "onnx", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fmt", ["safetensors", "torchscript"])
def test_an_encoder_of_nan_weights_is_refused_before_any_write(fmt, tmp_path):
    encoder = build_encoder(width=0.125)
    with torch.no_grad():
        next(encoder.backbone.parameters()).view(-1)[0] = float("nan")  # one number: every feature is NaN
    save_encoder(tmp_path / "nan.pth", encoder, {"view": "rgb", "clip_settings": SETTINGS})
    with pytest.raises(CheckpointError, match=r"nan\.pth: not usable as weights: \[backbone\.Conv_1a\.conv1\.weight "
                                              r"\(NaN or infinite values\)\]; the file is damaged"):
        export_encoder(tmp_path / "nan.pth", fmt, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_safetensors_file_whose_config_has_a_head_it_lacks_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    encoder = build_encoder(width=0.125, embed_dim=16)
    export_encoder(save_encoder(tmp_path / "enc.pth", encoder, {"view": "rgb"}), "safetensors", tmp_path / "out")
    model = tmp_path / "out" / "model.safetensors"
    from safetensors import safe_open

    with safe_open(str(model), "pt") as file:
        metadata = file.metadata()
    tensors = {key: value for key, value in load_file(model).items() if not key.startswith("head.")}
    save_file(tensors, tmp_path / "headless.safetensors", metadata=metadata)
    with pytest.raises(CheckpointError, match=r"headless\.safetensors: arch\['embed_dim'\] is 16, but the file "
                                              r"holds no head tensors"):
        load_encoder(tmp_path / "headless.safetensors")


def test_a_negative_variance_is_refused_at_load(tmp_path):
    """A BatchNorm's negative running variance made every feature NaN; export blamed the ONNX graph for it."""
    encoder = build_encoder(width=0.125)
    with torch.no_grad():
        encoder.backbone.Conv_1a.bn1.running_var[0] = -1.0
    save_encoder(tmp_path / "neg.pth", encoder, {"view": "rgb", "clip_settings": SETTINGS})
    with pytest.raises(CheckpointError, match=r"neg\.pth: not usable as weights: \[backbone\.Conv_1a\.bn1\.running_var "
                                              r"\(a negative variance\)\]"):
        load_encoder(tmp_path / "neg.pth")


def test_an_encoder_whose_own_features_overflow_is_refused_before_any_write(tmp_path):
    encoder = build_encoder(width=0.125)
    with torch.no_grad():
        for name, value in encoder.backbone.named_parameters():  # finite weights, features beyond float32
            if name.endswith("weight") and "bn" in name:
                value.mul_(1e6)
    save_encoder(tmp_path / "big.pth", encoder, {"view": "rgb", "clip_settings": SETTINGS})
    with pytest.raises(CheckpointError, match=r"big\.pth: the encoder's own features are not finite"):
        export_encoder(tmp_path / "big.pth", "torchscript", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_safetensors_form_that_does_not_read_back_is_not_kept(encoder_file, tmp_path, monkeypatch):
    """The check after writing refused it but left the unreadable model.safetensors in the folder, naming it as if
    it were the input."""
    from coclr.models import exported

    def refused(path, backbone, head):
        raise CheckpointError(f"{path}: ProjectionHead does not match")

    monkeypatch.setattr(exported, "_check_safetensors", refused)
    with pytest.raises(CheckpointError, match=rf"{encoder_file.name}: its safetensors form does not read back"):
        export_encoder(encoder_file, "safetensors", tmp_path / "out")
    assert not (tmp_path / "out" / "model.safetensors").exists()


@pytest.mark.parametrize("clips, problem", [({"length": 4}, "length: must be >= 8"),
                                            ({"size": -4}, "size: must be >= 32"),
                                            ({"length": "eight"}, "length: expected an integer"),
                                            ({"std": [0, 0, 0]}, r"std: needs positive values, got \[0, 0, 0\]"),
                                            ({"mean": [0.5, 0.5]}, "mean: needs 3 values"),
                                            ({"fps": -3.0}, "fps: must be a number between"),
                                            ({"flow_bound": float("nan")}, "flow_bound: the flow bound must be"),
                                            ({"flow_bound": 0}, "flow_bound: the flow bound must be"),
                                            ({"short_side": "128"}, "short_side: must be a whole number of pixels")])
def test_recorded_clips_s3d_cannot_take_are_one_line_for_every_reader(clips, problem, tmp_path):
    save_encoder(tmp_path / "odd.pth", build_encoder(width=0.125), {"clip_settings": {**SETTINGS, **clips}})
    expected = f"odd.pth: the clips it records are not usable: {problem}"
    with pytest.raises(CheckpointError, match=expected):
        export_encoder(tmp_path / "odd.pth", "torchscript", tmp_path / "out")
    with pytest.raises(CheckpointError, match=expected):  # as embedding and evaluation read them
        read_clip_settings(tmp_path / "odd.pth")
    assert not (tmp_path / "out").exists()


def test_the_card_of_a_pretrain_checkpoint_says_how_it_was_trained(tmp_path):
    """A training checkpoint keeps its config and position, not a meta: the card said "not recorded", and "a short
    side of None px"."""
    from conftest import make_random_store
    from test_train import TINY

    store = make_random_store(tmp_path / "store")
    run = tmp_path / "run"
    assert main(["pretrain", f"data.store={store}", f"run.out={run}", *TINY, "optim.epochs=2",
                 "run.max_steps=1"]) == 0
    assert main(["export", str(run / "checkpoint_last.pth"), "--format", "safetensors", "--out",
                 str(tmp_path / "ex")]) == 0
    card = (tmp_path / "ex" / "README.md").read_text()
    training = card.split("## Training")[1].split("##")[0]
    assert '- method: "infonce"' in training and '- view: "rgb"' in training and '- steps: 1' in training
    assert "- epochs: 2" in training and "- epochs_done: 0" in training and "not recorded" not in training
    assert "None" not in card
    assert "init_checkpoint" not in training  # (not given: not said)
    warm = tmp_path / "warm"  # a warm start says what it started from (the card never did)
    assert main(["pretrain", f"data.store={store}", f"run.out={warm}", *TINY, "optim.epochs=2", "run.max_steps=1",
                 f"method.init_checkpoint={run / 'checkpoint_last.pth'}"]) == 0
    assert main(["export", str(warm / "checkpoint_last.pth"), "--format", "safetensors", "--out",
                 str(tmp_path / "warm_ex")]) == 0
    training = (tmp_path / "warm_ex" / "README.md").read_text().split("## Training")[1].split("##")[0]
    assert f'- init_checkpoint: "{run / "checkpoint_last.pth"}"' in training


def test_a_meta_of_number_keys_or_numbers_that_are_not_finite_exports_as_strict_json(tmp_path, capsys):
    """save_encoder allows int keys in meta: export gave a traceback (JSON's sort of str and int keys); a tuple key
    left a model file without its config; a NaN wrote `NaN` into config.json, which strict JSON readers refuse."""
    from coclr.models.encoder import build_encoder
    from coclr.models.loading import save_encoder

    encoder = build_encoder(width=0.125, embed_dim=16).eval()
    meta = {1: "a", "view": "rgb", "best": float("nan"), "loss": float("inf")}
    save_encoder(tmp_path / "keys.pth", encoder, meta=meta)
    assert main(["export", str(tmp_path / "keys.pth"), "--format", "safetensors", "--out", str(tmp_path / "a")]) == 0
    config = json.loads((tmp_path / "a" / "config.json").read_text(), parse_constant=lambda name: 1 / 0)
    assert config["meta"]["1"] == "a" and config["meta"]["best"] == "nan" and config["meta"]["loss"] == "inf"
    payload = torch.load(tmp_path / "keys.pth", weights_only=True)
    payload["meta"] = {("a", 1): 2}
    torch.save(payload, tmp_path / "tuple.pth")
    assert main(["export", str(tmp_path / "tuple.pth"), "--format", "torchscript", "--out", str(tmp_path / "b")]) == 2
    assert "meta has the key ('a', 1), a tuple, which its config (JSON) cannot hold" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_an_encoder_saved_with_its_view_alone_is_that_view_everywhere(tmp_path):
    """meta={"view": "flow"} without clip settings: export's config said flow, while embed fed it RGB frames."""
    from coclr.embed.settings import checkpoint_view
    from coclr.models.encoder import build_encoder
    from coclr.models.loading import read_clip_settings, save_encoder

    path = save_encoder(tmp_path / "flow.pth", build_encoder(width=0.125, embed_dim=16).eval(), meta={"view": "flow"})
    assert read_clip_settings(path) == {"view": "flow"} and checkpoint_view(path) == "flow"


def test_a_folder_whose_export_never_wrote_its_model_says_so(tmp_path, capsys):
    """An export stopped before its model was written left run.json alone: another encoder was refused as if the
    folder "holds an exported encoder", with no way on (export has no --restart)."""
    from coclr.models.encoder import build_encoder
    from coclr.models.exported import EXPORT_FOLDER
    from coclr.models.loading import save_encoder
    from coclr.runfolder import claim_folder

    with claim_folder(tmp_path / "half", EXPORT_FOLDER, {"encoder": "/x/enc.pth", "sha256": "ab" * 32,
                                                         "format": "safetensors"}):
        pass  # (stopped here: nothing written but its record)
    path = save_encoder(tmp_path / "enc.pth", build_encoder(width=0.125, embed_dim=16).eval(), meta={"view": "rgb"})
    assert main(["export", str(path), "--format", "safetensors", "--out", str(tmp_path / "half")]) == 2
    said = capsys.readouterr().err
    assert "holds an export that was stopped before it wrote its model, of another encoder or format (sha256=" in said
    assert "delete the folder to export into it, or give another folder" in said
    (tmp_path / "mine").mkdir()  # other refusals keep their own words (none of them is an unwritten export)
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    (tmp_path / "afile").write_text("")
    for out, words in (("mine", "holds notes.txt, which coclr export did not write"),
                       ("afile", "exists and is not a folder")):
        assert main(["export", str(path), "--format", "safetensors", "--out", str(tmp_path / out)]) == 2
        said = capsys.readouterr().err
        assert words in said and "stopped before" not in said, said


def test_the_card_says_what_embedding_feeds_an_encoder_that_records_little(tmp_path):
    """An encoder saved with its view alone had a card of "clips of None x None px", "mean None, std None" and no
    flow line, where coclr embed fed it 32 frames of 128 px, ImageNet's normalisation and flow clipped at 20 px; an
    rgb encoder whose settings held a flow bound got the flow line."""
    from coclr.embed.settings import resolve_settings

    flow = save_encoder(tmp_path / "flow.pth", build_encoder(width=0.125), {"view": "flow"})
    export_encoder(flow, "safetensors", tmp_path / "flow")
    card = (tmp_path / "flow" / "README.md").read_text().split("## Training")[0]
    used = resolve_settings(flow)
    assert "- view: flow" in card and "None" not in card
    assert (f"- clips of {used.length} frames (stride {used.stride}), {used.size} x {used.size} px, frames decoded at "
            f"a short side of {used.short_side} px") in card
    assert f"mean {list(used.flow_mean)}, std {list(used.flow_std)}" in card
    assert f"clipped to +-{used.flow_bound} px" in card
    assert ("- not recorded by the checkpoint (or recorded as none), so the values above are those coclr embed feeds "
            "it: length, stride, size, short_side, mean, std, flow_bound;") in card
    rgb = save_encoder(tmp_path / "rgb.pth", build_encoder(width=0.125), {"clip_settings": {
        "view": "rgb", "length": 8, "stride": 1, "size": 32, "short_side": 32, "mean": MEAN, "std": STD,
        "flow_bound": 5.0}})
    export_encoder(rgb, "safetensors", tmp_path / "rgb")
    card = (tmp_path / "rgb" / "README.md").read_text().split("## Training")[0]
    assert "optical flow" not in card and "not recorded" not in card
    whole = save_encoder(tmp_path / "whole.pth", build_encoder(width=0.125), {"clip_settings": {
        "view": "rgb", "length": 8, "stride": 1, "size": 32, "short_side": None, "mean": MEAN, "std": STD}})
    export_encoder(whole, "safetensors", tmp_path / "whole")  # (a synthetic store's frames: recorded as None)
    card = (tmp_path / "whole" / "README.md").read_text().split("## Training")[0]
    used = resolve_settings(whole)
    assert f"32 x 32 px, frames decoded at a short side of {used.short_side} px" in card
    assert "embed feeds it: short_side;" in card


def test_odd_recorded_clip_settings_export_or_are_refused_in_one_line(tmp_path):
    """Clip settings recorded as a list, or with None for the shape, failed export with a traceback (embed took
    them as none recorded); a view that is a number failed embed, eval and pretrain with tracebacks."""
    listed = save_encoder(tmp_path / "list.pth", build_encoder(width=0.125), {"clip_settings": [32, 128]})
    export_encoder(listed, "safetensors", tmp_path / "list")
    nones = save_encoder(tmp_path / "none.pth", build_encoder(width=0.125), {
        "clip_settings": {"length": None, "size": None, "view": "rgb"}})
    export_encoder(nones, "torchscript", tmp_path / "n")
    assert "clips of 32 frames (stride 1), 128 x 128 px" in (tmp_path / "n" / "README.md").read_text()
    numbered = save_encoder(tmp_path / "five.pth", build_encoder(width=0.125), {"clip_settings": {"view": 5}})
    with pytest.raises(CheckpointError, match=r"five\.pth: the clips it records are not usable: view: must be the "
                       r"name of a view \(rgb, flow, \.\.\.\), got 5$"):
        read_clip_settings(numbered)
    with pytest.raises(CheckpointError, match="view: must be the name of a view"):
        export_encoder(numbered, "safetensors", tmp_path / "five")
    assert not (tmp_path / "five").exists()


def test_a_file_without_its_stem_is_refused_before_the_network_is_built_at_its_claimed_width(tmp_path):
    """The width is read from the stem's filters; a file without them was built at the width its record claims (200:
    gigabytes) before its keys were checked, then "not enough memory"."""
    from coclr.models.loading import ENCODER_FORMAT

    encoder = build_encoder(width=0.125)
    backbone = {k: v for k, v in encoder.backbone.state_dict().items() if not k.startswith("Conv_1a.")}
    path = tmp_path / "stemless.pth"
    torch.save({"format": ENCODER_FORMAT, "arch": {"width": 200.0, "gating": False, "bn_eps": 1e-3,
                                                   "embed_dim": None}, "backbone": backbone, "head": None}, path)
    with pytest.raises(CheckpointError, match=r"stemless\.pth: S3D does not match: missing keys \[backbone\.Conv_1a"):
        load_encoder(path)
