"""Encoders in formats other tools load: safetensors with a JSON config, ONNX and TorchScript, each checked.

- **safetensors** (:func:`save_safetensors`): the tensors of our ``coclr.encoder`` format (``backbone.*``,
  ``head.*``) and, in the file's metadata under ``"coclr"``, the JSON :func:`encoder_config` (architecture, view,
  clip shape, normalisation, feature dimension, how it was trained). Tensors and text only: nothing in it is
  executed when it is read. :func:`coclr.models.loading.load_encoder` reads it back (:func:`read_safetensors`).
- **ONNX** and **TorchScript** (:func:`export_network`): the network that gives the pooled backbone feature of a
  batch of normalised clips ``[B, C, T, H, W] -> [B, D]`` (``coclr embed``'s per-window feature), batch size free.
  ONNX through ``torch.onnx.export``'s ``torch.export`` path (the TorchScript-based exporter cannot express S3D's
  max-pools), TorchScript by tracing (S3D has no data-dependent control flow).

:func:`compare` runs an exported network on clips beside the PyTorch encoder: the largest difference of the
features and the smallest cosine, which :data:`MIN_COSINE` bounds. Knows nothing of files beyond the one it
writes, nor of the CLI; imports torch only when it runs (the CLI reads :data:`FORMATS`).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from coclr.atomic import atomic_open
from coclr.errors import CheckpointError, ConfigError

FORMATS = ("safetensors", "onnx", "torchscript")
"""The formats :func:`coclr.models.export` writes; ``coclr export --format`` offers these."""
SUFFIXES = {"safetensors": ".safetensors", "onnx": ".onnx", "torchscript": ".pt"}
METADATA_KEY = "coclr"
"""The safetensors metadata key that holds the JSON config."""
MIN_COSINE = 0.9999
"""An exported network is accepted when the cosine of its feature and the PyTorch encoder's is at least this on
every clip compared."""


def pooled_features(backbone):
    """The network that exports write: clips ``[B, C, T, H, W]`` -> the pooled backbone features ``[B, D]``
    (:meth:`coclr.models.encoder.Encoder.features` as its forward)."""
    from coclr.models.encoder import Encoder  # noqa: PLC0415 (heavy: torch)

    class PooledFeatures(Encoder):
        def forward(self, clips):  # (the input's name is the exported graph's)
            return self.features(clips)

    return PooledFeatures(backbone, None)


def encoder_config(backbone, head, meta: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON config of an encoder: its architecture (``arch``, as :func:`coclr.models.encoder.build_encoder`
    takes it), the pooled feature's dimension, the view, clip shape and normalisation it was trained with
    (``clip_settings``, empty when the checkpoint recorded none) and the rest of its ``meta`` (how it was trained).
    Refused (:class:`~coclr.errors.CheckpointError`) when ``meta`` holds values JSON cannot (tensors)."""
    from coclr.models.encoder import Encoder  # noqa: PLC0415 (heavy: torch)

    arch = Encoder(backbone, head).arch
    meta = _as_json(dict(meta), "meta")
    settings = meta.get("clip_settings") if isinstance(meta.get("clip_settings"), dict) else {}  # (a list: none)
    view = settings.get("view") if isinstance(settings.get("view"), str) else None
    view = view or (meta.get("view") if isinstance(meta.get("view"), str) else None)
    return {"format": "coclr.encoder", "arch": arch, "feature_dim": backbone.out_channels,
            "view": view or None, "clip_settings": settings, "meta": meta}


def _as_json(value: Any, where: str) -> Any:
    """``value`` as strict JSON holds it: a one-number tensor or NumPy scalar (a training script's ``best_acc``) as
    its number, a number that is not finite as its text (``"nan"``, ``"inf"``: JSON has none), a key that is a
    number, a boolean or None as its JSON text (``1`` as ``"1"``, as :func:`coclr.models.loading.save_encoder`
    allows); anything else JSON cannot hold refused, naming where it is in the meta (before any file is written)."""
    import math  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415

    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise CheckpointError(f"the encoder's {where} has the key {key!r}, a {type(key).__name__}, which its "
                                      "config (JSON) cannot hold; only its tensors can be exported as they are")
            converted = _as_json(key, where)  # (a key that is not finite: its text already)
            name = converted if isinstance(converted, str) else json.dumps(converted)
            if name in out:
                raise CheckpointError(f"the encoder's {where} has two keys written {name!r} in JSON ({key!r} and "
                                      "another); only its tensors can be exported as they are")
            out[name] = _as_json(item, f"{where}[{key!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [_as_json(item, f"{where}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_complex():
        return _as_json(value.item(), where)
    if isinstance(value, np.generic) and not np.iscomplexobj(value):
        return _as_json(value.item(), where)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    what = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
    raise CheckpointError(f"the encoder's {where} is {what}, which its config (JSON) cannot hold; only its tensors "
                          "can be exported as they are")


def safetensors_bytes(backbone, head, meta: Mapping[str, Any]) -> bytes:
    """The encoder as a safetensors file (tensors ``backbone.*`` and ``head.*``, the JSON config in the metadata):
    the same bytes for the same encoder."""
    from safetensors.torch import save  # noqa: PLC0415 (only here and when reading one)

    tensors = {f"backbone.{key}": value.detach().cpu().contiguous() for key, value in backbone.state_dict().items()}
    if head is not None:
        tensors.update({f"head.{key}": value.detach().cpu().contiguous() for key, value in head.state_dict().items()})
    config = encoder_config(backbone, head, meta)
    return save(tensors, metadata={METADATA_KEY: json.dumps(config, sort_keys=True)})


def save_safetensors(path: str | os.PathLike[str], backbone, head, meta: Mapping[str, Any]) -> bool:
    """Write the encoder to ``path`` as safetensors (:func:`safetensors_bytes`), atomically, unless it holds those
    bytes already; returns whether it wrote."""
    data = safetensors_bytes(backbone, head, meta)
    path = Path(path)
    if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
        return False
    with atomic_open(path, "wb") as file:
        file.write(data)
    return True


def is_safetensors(head: bytes) -> bool:
    """Whether a file's first 9 bytes open a safetensors file (a little-endian header length, then its JSON)."""
    return len(head) == 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") < 100_000_000


def read_safetensors(path: Path, map_location: Any = "cpu", data: bytes | None = None) -> dict[str, Any]:
    """A safetensors encoder as the payload of our ``coclr.encoder`` format (``format``, ``arch``, ``backbone``,
    ``head``, ``meta``), so that every reader of checkpoints reads it. A file without our config (another tool's
    safetensors) gives its tensors as a state dict, whose keys name its format. ``data``: the file's bytes, when
    they were read already (then the file is not opened)."""
    import torch  # noqa: PLC0415 (heavy)
    from safetensors import SafetensorError, safe_open  # noqa: PLC0415
    from safetensors.torch import load as load_bytes  # noqa: PLC0415

    device = str(map_location) if isinstance(map_location, (str, torch.device)) else "cpu"
    try:
        if data is None:
            with safe_open(str(path), framework="pt", device=device) as file:
                metadata = file.metadata() or {}
                tensors = {key: file.get_tensor(key) for key in file.keys()}
        else:
            size = int.from_bytes(data[:8], "little")
            metadata = json.loads(data[8:8 + size]).get("__metadata__") or {}
            tensors = {key: value.to(device) for key, value in load_bytes(data).items()}
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"{path}: damaged safetensors file ({error})") from None
    if METADATA_KEY not in metadata:
        return tensors
    try:
        config = json.loads(metadata[METADATA_KEY])
        arch, meta = config["arch"], config.get("meta") or {}
        if not isinstance(meta, dict):
            raise TypeError(f"its meta is a {type(meta).__name__}, not a mapping")
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise CheckpointError(f"{path}: its '{METADATA_KEY}' metadata is not coclr's config ({error!r})") from None
    unknown = sorted({key.split(".")[0] for key in tensors} - {"backbone", "head"})
    if unknown:
        raise CheckpointError(f"{path}: unexpected tensors {', '.join(unknown)}.* beside backbone.* and head.*")
    part = {name: {key[len(name) + 1:]: value for key, value in tensors.items() if key.startswith(f"{name}.")}
            for name in ("backbone", "head")}
    return {"format": config.get("format", "coclr.encoder"), "arch": arch, "backbone": part["backbone"],
            "head": part["head"] or None, "meta": meta}


def require_packages(fmt: str) -> None:
    """Refuse in one line (``ConfigError``) when a package writing or running ``fmt`` is missing: ONNX needs
    onnx and onnxscript to write it and onnxruntime to check it (the ``export`` extra)."""
    if fmt != "onnx":
        return
    try:
        import onnx  # noqa: F401, PLC0415 (optional: the export extra)
        import onnxruntime  # noqa: F401, PLC0415
        import onnxscript  # noqa: F401, PLC0415
    except ImportError as error:
        raise ConfigError(f"--format onnx needs the {error.name} package: pip install 'coclr[export]'") from None


def export_network(backbone, fmt: str, path: str | os.PathLike[str], example) -> Path:
    """Write the pooled-feature network of ``backbone`` (:func:`pooled_features`, in eval mode, on the CPU) to
    ``path`` as ``fmt`` ("onnx" or "torchscript"), traced on ``example`` clips; batch size free. Refused in one line
    (``ConfigError``) when the format's package is missing."""
    import torch  # noqa: PLC0415 (heavy)

    network = pooled_features(backbone).eval().cpu()
    example = example.cpu()
    if fmt == "torchscript":
        with warnings.catch_warnings():  # torch.jit's deprecation notices: TorchScript is the format asked for
            warnings.simplefilter("ignore")
            with torch.no_grad():
                traced = torch.jit.trace(network, example)
            with atomic_open(path, "wb") as file:
                torch.jit.save(traced, file)
        return Path(path)
    if fmt != "onnx":
        raise ValueError(f"format {fmt!r}: export_network writes onnx or torchscript")
    require_packages(fmt)
    import logging  # noqa: PLC0415

    batch = torch.export.Dim("batch", min=1)
    quiet = logging.getLogger("torch.onnx")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(network, (example,), dynamo=True, input_names=["clips"],
                                        output_names=["features"], dynamic_shapes={"clips": {0: batch}},
                                        external_data=False, verbose=False)
        with atomic_open(path, "wb") as file:
            file.write(program.model_proto.SerializeToString())
    finally:
        quiet.setLevel(level)
    return Path(path)


def run_exported(path: str | os.PathLike[str], fmt: str, clips):
    """The features an exported network (onnx or torchscript) gives for ``clips``, run by its own runtime
    (onnxruntime; ``torch.jit.load``)."""
    import torch  # noqa: PLC0415 (heavy)

    if fmt == "torchscript":
        with warnings.catch_warnings():  # torch.jit's deprecation notice: TorchScript is the format asked for
            warnings.simplefilter("ignore", DeprecationWarning)
            network = torch.jit.load(str(path), map_location="cpu")
        with torch.no_grad():
            return network(clips.cpu()).numpy()
    require_packages(fmt)
    import onnxruntime  # noqa: PLC0415 (optional: the export extra)

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"clips": clips.cpu().numpy()})[0]


def compare(reference, exported) -> dict[str, float]:
    """The largest absolute difference of two feature batches, its ratio to the features' largest magnitude, and
    the smallest cosine of a clip's two features."""
    import numpy as np  # noqa: PLC0415

    reference, exported = np.asarray(reference, np.float64), np.asarray(exported, np.float64)
    if reference.shape != exported.shape:
        raise CheckpointError(f"the exported network gives features of shape {exported.shape}, the encoder "
                              f"{reference.shape}")
    norms = np.linalg.norm(reference, axis=1) * np.linalg.norm(exported, axis=1)
    cosine = (reference * exported).sum(axis=1) / np.maximum(norms, 1e-300)
    scale = float(np.abs(reference).max())
    difference = float(np.abs(reference - exported).max())
    return {"max_difference": difference, "relative_difference": difference / scale if scale else difference,
            "min_cosine": float(cosine.min())}
