"""``coclr export``'s folder: an encoder in another format, its config and model card, checked by running it.

``OUT/model.safetensors`` (or ``model.onnx``, ``model.pt``), ``OUT/config.json`` (:func:`~.export.encoder_config`
plus, for a network, its input and output), ``OUT/README.md`` (the model card: what the file holds, how it was
trained, how to load it, and the check), ``OUT/run.json`` (the folder's record: the same command on the same folder
returns at once, another encoder or format is refused before any work). A network format is accepted only when it
gives the PyTorch encoder's features on the clips compared (:data:`~.export.MIN_COSINE`); a safetensors file is
read back and compared tensor by tensor.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coclr.atomic import atomic_write_json, atomic_write_text, file_sha256, read_json_record
from coclr.clips import FLOW_BOUND, IMAGENET_MEAN, IMAGENET_STD, SHORT_SIDE, ClipSettings, is_flow_view
from coclr.errors import CheckpointError, DataError
from coclr.models.export import (
    FORMATS,
    MIN_COSINE,
    SUFFIXES,
    compare,
    encoder_config,
    export_network,
    pooled_features,
    require_packages,
    run_exported,
    save_safetensors,
)
from coclr.runfolder import FolderRefused, FolderRule, check_folder, claim_folder, read_record

EXPORT_FOLDER = FolderRule("export", "an exported encoder", may_differ=("encoder",))
"""How an export folder is continued or refused (:mod:`coclr.runfolder`): by the encoder's content and the format;
the encoder's path may differ (a copy or a moved file of the same bytes is the same encoder)."""
CHECK_CLIPS = 4
"""Clips compared when none are given (seeded normal noise of the encoder's clip shape)."""


@dataclass
class Exported:
    """What :func:`export_encoder` wrote: the model file, the check's figures, whether it was there already."""

    out: Path
    model: Path
    check: dict[str, float] = field(default_factory=dict)
    already_done: bool = False
    changed: bool = False
    """the folder's model file was not the one exported (damaged, or replaced): exported again"""

    def __str__(self) -> str:
        if self.already_done:
            return f"{self.model}: exported already (the same encoder and format); nothing written"
        figures = ", ".join(f"{key.replace('_', ' ')} {value:.3g}" for key, value in self.check.items())
        again = f"{self.model.name} was not the file exported (its sha256 differs, or config.json records none): " \
            "written again; " if self.changed else ""
        return (f"{again}wrote {self.model}, config.json and README.md in {self.out}; checked against the encoder: "
                f"{figures}")


def export_encoder(encoder: str | os.PathLike[str], fmt: str, out: str | os.PathLike[str],
                   clips: torch.Tensor | None = None, notes: Sequence[str] = ()) -> Exported:
    """Write ``encoder`` (any file :func:`~coclr.models.loading.load_encoder` reads) as ``fmt`` into the folder
    ``out`` with its config and model card (``notes``: further lines for the card, e.g. the run's label-free
    measures), and check it: a network format on ``clips`` (``[B, C, T, H, W]``, normalised as the encoder was
    trained; default :data:`CHECK_CLIPS` clips of noise), safetensors by reading it back. Refused in one line,
    before any write, for an unknown format, an unreadable encoder or a folder holding another export."""
    from coclr.models.loading import implied_clip_settings, load_encoder, open_checkpoint  # noqa: PLC0415

    if fmt not in FORMATS:
        raise CheckpointError(f"--format {fmt}: not a format coclr exports ({', '.join(FORMATS)})")
    require_packages(fmt)
    encoder, out = Path(encoder), Path(out)
    backbone, head = load_encoder(encoder)
    read = open_checkpoint(encoder)
    read.clip_settings  # noqa: B018 (checked: clips S3D takes, before any write)
    meta = dict(read.payload.get("meta") or training_meta(read.payload)) if isinstance(read.payload, dict) else {}
    if "clip_settings" not in meta:  # a training checkpoint keeps them beside its meta; torchvision's: its format's
        implied = implied_clip_settings(encoder)
        meta["clip_settings"] = {key: list(value) if isinstance(value, tuple) else value
                                 for key, value in implied.items()} or None
    options = {"encoder": str(encoder.resolve()), "sha256": read.sha256, "format": fmt}
    model = out / f"model{SUFFIXES[fmt]}"
    changed = False
    _refuse_unwritten_export(out, options)
    if check_folder(out, EXPORT_FOLDER, options) and model.is_file() and (out / "README.md").is_file():
        try:
            recorded = (read_json_record(out / "config.json") or {}).get("sha256")  # the model file's, as exported
        except DataError:  # (damaged too: written again with the model)
            recorded = None
        if recorded is not None and recorded == file_sha256(model):
            return Exported(out, model, already_done=True)
        changed = True  # (no hash to tell it by: config.json gone, or from before the hash: written again)
    try:
        config = encoder_config(backbone, head, meta)  # refuses a meta JSON cannot hold, before any write
    except CheckpointError as error:
        raise CheckpointError(f"{encoder}: {error}") from None
    settings = config["clip_settings"]
    if clips is None:
        generator = torch.Generator().manual_seed(0)
        side = settings.get("size") or ClipSettings.size  # (a key recorded as None: not recorded)
        shape = (CHECK_CLIPS, 3, settings.get("length") or ClipSettings.length, side, side)
        clips = torch.randn(shape, generator=generator)
    reference = None
    if fmt != "safetensors":  # the encoder's own features first, before any write
        with torch.no_grad():
            reference = pooled_features(backbone)(clips).numpy()
        if not np.isfinite(reference).all():  # (it was called a difference of the export's)
            raise CheckpointError(f"{encoder}: the encoder's own features are not finite on random clips (its "
                                  "weights or BatchNorm statistics are damaged); nothing was exported")
    with claim_folder(out, EXPORT_FOLDER, options):
        if fmt == "safetensors":
            save_safetensors(model, backbone, head, meta)
            try:
                check = _check_safetensors(model, backbone, head)
            except CheckpointError as error:  # (an unreadable file was left behind, named as if it were the input)
                model.unlink()
                raise CheckpointError(f"{encoder}: its safetensors form does not read back as it ({error}); nothing "
                                      "was kept") from None
        else:
            export_network(backbone, fmt, model, clips[:1])
            check = compare(reference, run_exported(model, fmt, clips))
            if not check["min_cosine"] >= MIN_COSINE:  # NaN features included
                model.unlink()
                raise CheckpointError(f"{encoder}: the {fmt} export gives other features than the encoder (cosine "
                                      f"{check['min_cosine']:.6f} < {MIN_COSINE}); nothing was kept")
            config["input"] = {"name": "clips", "shape": ["batch", clips.shape[1], *clips.shape[2:]],
                               "dtype": "float32"}
            if settings.get("view") == RGB_DIFFERENCES:
                config["input"]["frames"] = "differences of consecutive normalised frames, x[t+1] - x[t]"
            config["output"] = {"name": "features", "shape": ["batch", config["feature_dim"]]}
        config["check"] = {"clips": int(clips.shape[0]) if fmt != "safetensors" else 0, **check}
        config["sha256"] = file_sha256(model)  # of the model file: a later run tells it is still the one exported
        atomic_write_json(out / "config.json", config)
        atomic_write_text(out / "README.md", model_card(config, fmt, encoder, notes))
    return Exported(out, model, check, changed=changed)


def _refuse_unwritten_export(out: Path, options: dict[str, Any]) -> None:
    """Refuse, saying so, a folder whose export of another encoder or format was stopped before it wrote its model
    (its record alone): :func:`~coclr.runfolder.check_folder` said it "holds an exported encoder", and export has no
    --restart to go on with."""
    if not out.is_dir() or any((out / f"model{suffix}").is_file() for suffix in SUFFIXES.values()):
        return
    try:
        record = read_record(out)
    except DataError:  # (a damaged record: check_folder's own refusal says so)
        return
    if record is None or record.get("command") != EXPORT_FOLDER.command:
        return
    differing = EXPORT_FOLDER.differing(record["options"], options)
    if differing:
        raise FolderRefused(f"{out}: holds an export that was stopped before it wrote its model, of another "
                            f"encoder or format ({'; '.join(differing)}): delete the folder to export into it, or "
                            "give another folder")


def _check_safetensors(path: Path, backbone, head) -> dict[str, float]:
    """Read ``path`` back as :func:`~coclr.models.loading.load_encoder` does and compare every tensor."""
    from coclr.models.loading import load_encoder  # noqa: PLC0415

    read_backbone, read_head = load_encoder(path)
    pairs = [(backbone, read_backbone)] + ([(head, read_head)] if head is not None else [])
    difference = 0.0
    for written, read in pairs:
        if read is None:
            raise CheckpointError(f"{path}: the projection head did not read back")
        mine, theirs = written.state_dict(), read.state_dict()
        if mine.keys() != theirs.keys():
            raise CheckpointError(f"{path}: its tensors do not read back as the encoder's")
        for key, value in mine.items():
            difference = max(difference, float((value.cpu().double() - theirs[key].double()).abs().max())
                             if value.numel() else 0.0)
    if difference:
        raise CheckpointError(f"{path}: the tensors read back differ from the encoder's by {difference:g}")
    return {"max_difference": difference}


def training_meta(payload: dict[str, Any]) -> dict[str, Any]:
    """What a ``coclr pretrain`` checkpoint (its ``config`` and ``position``, no ``meta``) says of its training, as
    an encoder file's ``meta`` does: the method, the view, the store, the epochs planned, those finished and the
    steps done, and the checkpoints it started from and mined with (what it lacks left out); {} for others."""
    config, position = payload.get("config"), payload.get("position")
    if not isinstance(config, dict) or not isinstance(position, dict):
        return {}
    method, data, optim = (config.get(key) if isinstance(config.get(key), dict) else {} for key in
                           ("method", "data", "optim"))
    found = {"method": method.get("name"), "view": data.get("view"), "store": data.get("store"),
             "epochs": optim.get("epochs"), "epochs_done": position.get("epoch"), "steps": position.get("global_step"),
             **{key: method.get(key) for key in ("init_checkpoint", "second_init_checkpoint", "sampler_checkpoint")}}
    return {key: value for key, value in found.items() if value is not None and value != ""}


RGB_DIFFERENCES = "rgbdiff"
"""The view whose clips are frame differences (:mod:`coclr.data.augment`'s ``"rgbdiff"`` kind, by its name: the
clips a checkpoint records name the view, not its kind)."""


def input_lines(config: dict[str, Any]) -> list[str]:
    """The card's input section: the clips the encoder takes, as it recorded them, and for each value it did not
    record the one ``coclr embed`` feeds it (:mod:`coclr.clips`' defaults), said to be so (a card said "None x None
    px" and "mean None" where embedding fed 128 px and ImageNet's normalisation)."""
    settings = {key: value for key, value in config["clip_settings"].items() if value is not None}  # (a short side
    # recorded as none, a synthetic store's frames or --short-side 0, is one embedding does not take: it feeds 128)
    defaults = {"length": ClipSettings.length, "stride": ClipSettings.stride, "size": ClipSettings.size,
                "short_side": SHORT_SIDE, "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD),
                "flow_bound": FLOW_BOUND}
    view = config.get("view")
    flow = view is not None and is_flow_view(view)
    unrecorded = [key for key in defaults if key not in settings and (key != "flow_bound" or flow)]
    value = {**defaults, **settings}
    length = value["length"]
    lines = [f"- view: {view or 'rgb (implied: the checkpoint records no view)'}",
             f"- clips of {length} frames (stride {value['stride']}), {value['size']} x {value['size']} px, frames "
             f"decoded at a short side of {value['short_side']} px" + (f", {value['fps']} fps" if value.get("fps")
                                                                         else ""),
             f"- normalised: (x / 255 - mean) / std, mean {value['mean']}, std {value['std']}"]
    if view == RGB_DIFFERENCES:
        lines.append(f"- the clip is the differences of consecutive normalised frames, x[t+1] - x[t]: {length} "
                     f"differences of {length} + 1 consecutive frames (not the frames themselves)")
    if flow:
        method = settings.get("flow_method")  # (a checkpoint written before they recorded it does not say)
        how = (f"computed by {method.get('backend')}" + (f" with parameters {json.dumps(method['params'])}"
                                                         if method.get("params") else "") + "; "
               if isinstance(method, dict) else "")
        lines.append(f"- optical flow as its training store held it ({how}channels u, v and a constant 128), "
                     f"clipped to +-{value['flow_bound']} px and mapped linearly to [0, 255] before the normalisation")
    if unrecorded:
        lines.append(f"- not recorded by the checkpoint (or recorded as none), so the values above are those coclr "
                     f"embed feeds it: "
                     f"{', '.join(unrecorded)}; give the clips its training used if they differ")
    return lines


def model_card(config: dict[str, Any], fmt: str, encoder: Path, notes: Sequence[str]) -> str:
    """The README.md of an export: what it is, how it was trained, how to load it, what was checked."""
    arch, settings, meta = config["arch"], config["clip_settings"], config["meta"]
    view = (f"{config['view']} view" if config.get("view") else  # (as its input section says)
            "rgb view, implied by its format" if settings else "view unknown: the checkpoint does not record it")
    lines = [f"# S3D video encoder ({view}), exported by coclr", "",
             f"Exported from `{encoder.name}` as {fmt}. An S3D network (width {arch['width']}, gating "
             f"{arch['gating']}) whose pooled feature has {config['feature_dim']} dimensions.", "",
             "## Input", ""]
    lines += input_lines(config)
    lines += ["", "## Training", ""]
    trained = {key: value for key, value in meta.items() if key != "clip_settings"}
    lines += [f"- {key}: {json.dumps(value)}" for key, value in trained.items()] or ["- not recorded"]
    lines += [f"- {note}" for note in notes]
    lines += ["", "## Loading", ""]
    if fmt == "safetensors":
        lines += ["```python", "import coclr", "backbone, head = coclr.load_encoder(\"model.safetensors\")",
                  "features = backbone(clips).mean(dim=(2, 3, 4))  # clips: [B, C, T, H, W]", "```", "",
                  "Or with `safetensors.torch.load_file`: the tensors `backbone.*` (S3D)"
                  + (" and `head.*` (the projection head)" if arch.get("embed_dim") else "")
                  + "; the file's metadata `coclr` holds config.json."]
    elif fmt == "onnx":
        _, channels, frames, height, width = config["input"]["shape"]
        lines += ["```python", "import onnxruntime",
                  "session = onnxruntime.InferenceSession(\"model.onnx\")",
                  f"features = session.run(None, {{\"clips\": clips}})[0]  # float32 [B, {channels}, {frames}, "
                  f"{height}, {width}] -> [B, D]", "```", "",
                  f"The graph takes clips of exactly {frames} frames of {height} x {width} px, any batch size"
                  + ("" if settings.get("length") and settings.get("size") else
                     " (the paper's clips: the checkpoint records none; export a checkpoint that does, or use the "
                     "safetensors or TorchScript form, which take any)") + "."]
    else:
        lines += ["```python", "import torch", "network = torch.jit.load(\"model.pt\")",
                  "features = network(clips)  # float32 [B, C, T, H, W] -> [B, D]", "```"]
    check = config["check"]
    lines += ["", "## Checked", ""]
    if fmt == "safetensors":
        lines.append("Read back with `coclr.load_encoder`: every tensor equal to the encoder's.")
    else:
        lines.append(f"Run by {'onnxruntime' if fmt == 'onnx' else 'torch.jit'} on {check['clips']} clips beside "
                     f"the PyTorch encoder: largest difference of the features {check['max_difference']:.3g} "
                     f"({check['relative_difference']:.3g} of their largest magnitude), smallest cosine "
                     f"{check['min_cosine']:.7f}.")
    return "\n".join(lines) + "\n"
