"""Load S3D encoders from our checkpoints and from outside ones, strictly and safely.

:func:`load_encoder` recognises the format of a file by its keys:

- ours (``{"format": "coclr.encoder" | "coclr.train", "arch", "backbone", "head"}``, see :func:`save_encoder`),
  also as safetensors with the config in its metadata (:mod:`coclr.models.export`);
- the CoCLR authors' pretraining checkpoints (``state_dict`` with ``encoder_q.*``; InfoNCE, UberNCE, CoCLR);
- the CoCLR authors' classifier checkpoints (``backbone.*``, ``final_bn.*``, ``final_fc.*``);
- torchvision's ``s3d`` state dict (``features.*``, ``classifier.*``; BatchNorm eps 1e-3);
- a bare S3D state dict in the authors' naming (``Conv_1a.*`` ...).

A ``module.`` prefix (DataParallel / DDP) is removed everywhere. Mapping is strict: any missing, unexpected or
mis-shaped key raises :class:`~coclr.errors.CheckpointError` naming the keys (the authors' code printed the
mismatches and went on with random weights). Files are read with ``torch.load(weights_only=True)``, so a
checkpoint carrying pickled Python objects is refused, never executed. A process reads each unchanged file once
(:func:`open_checkpoint`): its format, recorded clip settings, sha256 and weights come from the same bytes.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import pickle
import pickletools
import re
import threading
import zipfile
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from coclr.atomic import atomic_torch_save, file_state
from coclr.clips import CLIP_KEYS, FORMAT_CLIPS, check_recorded
from coclr.errors import CheckpointError, ConfigError
from coclr.models.encoder import Encoder
from coclr.models.export import is_safetensors, read_safetensors
from coclr.models.heads import LinearClassifier, ProjectionHead
from coclr.models.s3d import S3D, check_arch, scaled_channels

__all__ = ["load_encoder", "load_classifier", "save_encoder", "read_clip_settings", "implied_clip_settings",
           "read_checkpoint_file",
           "checkpoint_format", "checkpoint_sha256", "open_checkpoint", "CheckpointFile", "CLIP_SETTING_KEYS",
           "ENCODER_FORMAT", "TRAIN_FORMAT"]

ENCODER_FORMAT = "coclr.encoder"
TRAIN_FORMAT = "coclr.train"
_OUR_FORMATS = (ENCODER_FORMAT, TRAIN_FORMAT)
_ARCH_KEYS = ("width", "gating", "embed_dim", "bn_eps")

#: The authors' S3D registers every layer twice: ``blockN.i`` aliases of the named layers.
_AUTHOR_ALIASES = {
    "block1.0": "Conv_1a",
    "block2.1": "Conv_2b",
    "block2.2": "Conv_2c",
    "block3.1": "Mixed_3b",
    "block3.2": "Mixed_3c",
    "block4.1": "Mixed_4b",
    "block4.2": "Mixed_4c",
    "block4.3": "Mixed_4d",
    "block4.4": "Mixed_4e",
    "block4.5": "Mixed_4f",
    "block5.1": "Mixed_5b",
    "block5.2": "Mixed_5c",
}

#: Our layer -> torchvision ``features`` index; and our conv/bn leaf -> torchvision's Sequential indices.
_TORCHVISION_LAYERS = {
    "Conv_1a": "features.0",
    "Conv_2b": "features.2",
    "Conv_2c": "features.3",
    "Mixed_3b": "features.5",
    "Mixed_3c": "features.6",
    "Mixed_4b": "features.8",
    "Mixed_4c": "features.9",
    "Mixed_4d": "features.10",
    "Mixed_4e": "features.11",
    "Mixed_4f": "features.12",
    "Mixed_5b": "features.14",
    "Mixed_5c": "features.15",
}
_TORCHVISION_LEAVES = {"conv": "0", "bn": "1", "conv1": "0.0", "bn1": "0.1", "conv2": "1.0", "bn2": "1.1"}
_TORCHVISION_BN_EPS = 1e-3

#: Dropout rate given to an authors' classifier with a ``Sequential(Dropout, Linear)`` head: their files do not
#: store it; 0.9 is their finetuning rate. It has no effect in eval mode.
AUTHORS_CLASSIFIER_DROPOUT = 0.9

Tensors = dict[str, torch.Tensor]


# --------------------------------------------------------------------------------------------- public API


def load_encoder(path: str | os.PathLike[str], map_location: Any = "cpu") -> tuple[S3D, ProjectionHead | None]:
    """Load an S3D backbone and its projection head from a checkpoint of any supported format.

    Args:
        path: checkpoint file (ours, the CoCLR authors' pretraining or classifier checkpoint, torchvision's
            ``s3d`` state dict, or a bare S3D state dict); the format is recognised from its keys.
        map_location: the device the modules are moved to (a name or ``torch.device``).

    Returns:
        ``(backbone, head)``: ``backbone`` is an :class:`S3D` whose forward gives the 5-D feature map; ``head``
        the :class:`ProjectionHead` applied to the pooled feature (before L2 normalisation), or None when the
        file has no projection head (classifier and torchvision files). Both are in eval mode.

    Raises:
        CheckpointError: unreadable file, pickled objects (refused), unknown format, or any missing,
            unexpected or mis-shaped key (all named).
    """
    return open_checkpoint(path).encoder(map_location)


def load_classifier(path: str | os.PathLike[str], map_location: Any = "cpu") -> tuple[S3D, LinearClassifier]:
    """Load an authors' classifier checkpoint (linear probe or finetuned) as ``(backbone, classifier)``.

    The classifier takes the pooled backbone feature. Its layout (``final_bn`` or not, ``final_fc.0`` =
    Linear or ``final_fc.1`` = Dropout then Linear) is taken from the keys; the dropout rate, which the
    authors' files do not store, is set to :data:`AUTHORS_CLASSIFIER_DROPOUT`. A file with ``final_bn`` is a linear
    probe's, which L2-normalises the features before it (their code sets the two together). Both modules are in
    eval mode.
    """
    return open_checkpoint(path).classifier(map_location)


def save_encoder(path: str | os.PathLike[str], encoder: Encoder, meta: Mapping[str, Any] | None = None) -> Path:
    """Write ``encoder`` in the ``"coclr.encoder"`` format, atomically (temporary file + ``os.replace``).

    The file is a dict ``{"format", "arch", "backbone", "head", "meta"}`` of tensors and plain values, so it
    loads with ``torch.load(weights_only=True)``; ``meta`` (e.g. method, view, epoch) must hold only plain
    values (str, int, float, bool, None, tensors, and lists / dicts of them). Returns the path written.
    """
    path = Path(path)
    meta = dict(meta or {})
    _check_plain(meta, "meta")
    head = encoder.head
    dim = encoder.backbone.out_channels
    if head is not None and (head.in_dim, head.hidden_dim) != (dim, dim):
        raise ValueError(
            f"cannot save an Encoder whose head is {head.in_dim}->{head.hidden_dim}->{head.out_dim}: the format "
            f"rebuilds the head as {dim}->{dim}->embed_dim (see build_encoder)"
        )
    payload = {
        "format": ENCODER_FORMAT,
        "arch": encoder.arch,
        "backbone": _cpu_state(encoder.backbone),
        "head": None if head is None else _cpu_state(head),
        "meta": meta,
    }
    atomic_torch_save(payload, path)
    return path


CLIP_SETTING_KEYS = ("view", *CLIP_KEYS, "fps", "short_side", "mean", "std", "flow_bound", "flow_method")
"""What a checkpoint records about the clips its encoder was trained on (``read_clip_settings``): the store view,
frames per clip, frame stride, crop size, the store's frame rate (None: every decoded frame) and short side, the
normalisation, and for flow views the clipping bound in pixels and how the flow was computed (the view's
``<view>_method``: backend, TV-L1 parameters, mode; :func:`coclr.store.flow_views.flow_method`)."""


def read_clip_settings(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The clip settings a checkpoint recorded from its training (keys of :data:`CLIP_SETTING_KEYS`; only the
    recorded ones), so that evaluation and embedding feed an encoder the clips it was trained on.

    Our training checkpoints and exported encoders record them (``clip_settings``); a training checkpoint written
    before that gives what its configuration says (view, length, stride, size). Files from elsewhere (the
    authors', torchvision's) record nothing: ``{}``.
    """
    return open_checkpoint(path).clip_settings


def implied_clip_settings(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The clips a checkpoint takes: what it recorded (:func:`read_clip_settings`), else what its format implies
    (:data:`coclr.clips.FORMAT_CLIPS`: torchvision's ``s3d`` its own transform's); ``{}`` for a file of another
    format that records none (the paper's clips, ImageNet's normalisation)."""
    read = open_checkpoint(path)
    return read.clip_settings or dict(FORMAT_CLIPS.get(read.format, {}))


def _clip_settings(payload: Any) -> dict[str, Any]:
    """:func:`read_clip_settings` of a checkpoint's payload."""
    if not isinstance(payload, dict):
        return {}
    settings: Any = None
    if payload.get("format") == TRAIN_FORMAT:
        settings = payload.get("clip_settings")
        if settings is None:
            config = payload.get("config")
            data = config.get("data") if isinstance(config, dict) else None
            if isinstance(data, dict):
                settings = {key: data[key] for key in ("view", *CLIP_KEYS) if key in data}
    elif payload.get("format") == ENCODER_FORMAT:
        meta = payload.get("meta")
        settings = meta.get("clip_settings") if isinstance(meta, dict) else None
        if isinstance(meta, dict) and isinstance(meta.get("view"), str) and not (
                isinstance(settings, dict) and settings.get("view")):  # (an encoder saved with its view alone:
            settings = {**(settings if isinstance(settings, dict) else {}), "view": meta["view"]}  # that view, as
            # an export's config says: embedding fed an encoder of flow RGB frames)
    if not isinstance(settings, dict):
        return {}
    return {key: settings[key] for key in CLIP_SETTING_KEYS if key in settings}


def checkpoint_format(path: str | os.PathLike[str]) -> str:
    """The format :func:`load_encoder` recognises in a file: ``"ours"``, ``"authors_pretrain"``,
    ``"authors_classifier"``, ``"torchvision"`` or ``"bare"`` (each expects its own input normalisation)."""
    return open_checkpoint(path).format


def checkpoint_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of a checkpoint file's bytes, hashed from the bytes it is loaded from (:func:`open_checkpoint`)."""
    return open_checkpoint(path).sha256


@dataclass(frozen=True, eq=False)
class CheckpointFile:
    """One checkpoint file as read once: its bytes' sha256 and its payload (tensors on the CPU and plain values,
    shared by every reader in the process: never modified), from which the format, the recorded clip settings
    and the modules are derived."""

    path: Path
    sha256: str
    payload: Any

    @property
    def format(self) -> str:
        """``"ours"``, ``"authors_pretrain"``, ``"authors_classifier"``, ``"torchvision"`` or ``"bare"``."""
        return _detect_format(self.path, self.payload)[0]

    @property
    def clip_settings(self) -> dict[str, Any]:
        """What it recorded about its training clips (:func:`read_clip_settings`), a new dict per call; settings no
        reader can use (a clip shape S3D cannot take, a normalisation of zeros, a NaN bound:
        :func:`coclr.clips.check_recorded`) are a :class:`CheckpointError`."""
        settings = _clip_settings(self.payload)
        try:
            check_recorded(settings)
        except ConfigError as error:
            raise CheckpointError(f"{self.path}: the clips it records are not usable: {error}") from None
        return settings

    def encoder(self, map_location: Any = "cpu") -> tuple[S3D, ProjectionHead | None]:
        """New ``(backbone, head)`` modules in eval mode on ``map_location`` (:func:`load_encoder`)."""
        path, payload = self.path, self.payload
        kind, state = _detect_format(path, payload)
        with _own_rng():
            backbone, head = self._modules(kind, state)
        return _finish(backbone, map_location), _finish(head, map_location)

    def _modules(self, kind: str, state: Tensors) -> tuple[S3D, ProjectionHead | None]:
        path, payload = self.path, self.payload
        if kind == "ours":
            backbone, head = _load_ours(path, payload)
        elif kind == "authors_pretrain":
            backbone, head = _load_authors_pretrain(path, state)
        elif kind == "authors_classifier":
            backbone, head = _load_authors_classifier(path, state)[0], None
        elif kind == "torchvision":
            backbone, head = _load_torchvision(path, state), None
        else:
            backbone, head = _load_bare_backbone(path, state), None
        return backbone, head

    def classifier(self, map_location: Any = "cpu") -> tuple[S3D, LinearClassifier]:
        """New ``(backbone, classifier)`` modules of an authors' classifier file (:func:`load_classifier`)."""
        kind, state = _detect_format(self.path, self.payload)
        if kind != "authors_classifier":
            raise CheckpointError(f"{self.path}: not a classifier checkpoint (found the {kind!r} format; expected "
                                  "backbone.*, final_fc.*)")
        with _own_rng():
            backbone, classifier = _load_authors_classifier(self.path, state)
        return _finish(backbone, map_location), _finish(classifier, map_location)


def _own_rng() -> Any:
    """Building the modules initialises their weights from torch's global generator before the file's replace
    them: a loader must leave the caller's random stream where it was (a seeded script that loads an encoder
    draws the same numbers as one that does not)."""
    return torch.random.fork_rng(devices=[])


_OPENED: OrderedDict[tuple[Any, ...], CheckpointFile] = OrderedDict()
_OPENED_LOCK = threading.Lock()
_KEEP_OPENED = 4
"""How many checkpoint files a process keeps read (the most recently used)."""


def open_checkpoint(path: str | os.PathLike[str]) -> CheckpointFile:
    """The checkpoint at ``path``, read once per process while the file is unchanged: its bytes are read in one
    open, hashed and parsed (:func:`read_checkpoint_file`'s checks), and later calls for the same file in the same
    state (:func:`coclr.atomic.file_state`) get the same object."""
    path = Path(path)
    state = file_state(path)
    if state is None or not path.is_file():
        raise _not_a_file(path)
    key = (str(path.resolve()), *state)
    with _OPENED_LOCK:
        found = _OPENED.get(key)
        if found is not None:
            _OPENED.move_to_end(key)
            return found
    data = path.read_bytes()
    opened = CheckpointFile(path, hashlib.sha256(data).hexdigest(), _parse_checkpoint(path, data, "cpu"))
    with _OPENED_LOCK:
        _OPENED[key] = opened
        while len(_OPENED) > _KEEP_OPENED:
            _OPENED.popitem(last=False)
    return opened


# --------------------------------------------------------------------------------------------- reading


_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_PROTOCOLS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
_REFUSED_GLOBAL = re.compile(r"(?:GLOBAL|global) ([\w.]+)")


def read_checkpoint_file(path: str | os.PathLike[str], map_location: Any = "cpu") -> Any:
    """``torch.load(path, weights_only=True)``: tensors and plain values only, never executed code (a safetensors
    file: :func:`coclr.models.export.read_safetensors`, the same payload). Every failure
    is a :class:`CheckpointError` naming the file and what it is: missing, empty, not a PyTorch file (random bytes,
    text, an interrupted download), damaged, or holding pickled objects (refused, and named)."""
    path = Path(path)
    if not path.is_file():
        raise _not_a_file(path)
    return _parse_checkpoint(path, path.read_bytes(), map_location)


def require_checkpoint_file(path: str | os.PathLike[str], option: str | None = None) -> Path:
    """``path`` when it names a file; else one line (after the ``option`` it was given as) saying it names a folder
    or nothing. Checked before any work by every command that takes a checkpoint."""
    path = Path(path)
    if not path.is_file():
        error = _not_a_file(path)
        raise CheckpointError(f"{option}: {error}" if option else str(error))
    return path


def _not_a_file(path: Path) -> CheckpointError:
    """The error of a checkpoint path that names no file: a folder, or nothing."""
    if path.is_dir():
        return CheckpointError(f"{path}: is a folder, not a checkpoint file; give the checkpoint file in it")
    return CheckpointError(f"checkpoint not found: {path}")


def _parse_checkpoint(path: Path, data: bytes, map_location: Any) -> Any:
    """:func:`read_checkpoint_file` of a file's bytes."""
    if not data:
        raise CheckpointError(f"{path}: the file is empty (0 bytes), not a checkpoint")
    if is_safetensors(data[:9]):
        return read_safetensors(path, map_location, data=data)
    head = data[:4]
    if head != _ZIP_MAGIC and head[:2] not in _PICKLE_PROTOCOLS and path.suffix.lower() == ".onnx":
        raise CheckpointError(f"{path}: an ONNX network (as `coclr export --format onnx` writes), not a checkpoint; "
                              "give the checkpoint it was exported from (its folder's README.md names it)")
    if head != _ZIP_MAGIC and head[:2] not in _PICKLE_PROTOCOLS:
        raise CheckpointError(f"{path}: not a PyTorch checkpoint (it is neither torch.save's zip format, its "
                              "legacy format nor safetensors; an incomplete download or another kind of file?)")
    if head == _ZIP_MAGIC and _is_torchscript(data):
        raise CheckpointError(f"{path}: a TorchScript network (as `coclr export --format torchscript` writes), not a "
                              "checkpoint: it holds code, which is not run here; give the checkpoint it was exported "
                              "from (its folder's README.md names it)")
    if head == _ZIP_MAGIC:
        _check_zip_entries(path, data)
    objects = _first_pickle_globals(data) if head != _ZIP_MAGIC else []
    if objects:  # (torch.save's legacy format begins with a pickled number: no object)
        raise CheckpointError(f"{path}: refused: a pickle of Python objects ({objects[0]}), not a PyTorch checkpoint; "
                              "nothing in it was executed; use a checkpoint of tensors and plain values (a state "
                              "dict)")
    try:
        return torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as error:  # damaged, or a refused pickle
        text = str(error)
        refused = _REFUSED_GLOBAL.search(text)
        if isinstance(error, pickle.UnpicklingError) and refused and head != _ZIP_MAGIC and _cut_short(data):
            raise CheckpointError(f"{path}: damaged: the file ends inside its pickled header (cut short: an "
                                  "incomplete download or copy?)") from None
        if isinstance(error, pickle.UnpicklingError) and refused:
            raise CheckpointError(
                f"{path}: refused: the file holds a pickled Python object ({refused.group(1)}) that a tensors-only "
                "load does not allow, and it was not executed; use a checkpoint of tensors and plain values (a "
                "state dict)") from None
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        reason = type(error).__name__ + (f": {first}" if first and "weights_only" not in first else "")
        raise CheckpointError(f"{path}: damaged, or not a PyTorch checkpoint ({reason})") from None


_LEGACY_PICKLES = 5
"""The pickles torch.save's legacy format begins with (magic number, protocol, system info, the object, the storage
keys), before the storages' raw bytes."""


def _cut_short(data: bytes) -> bool:
    """Whether the pickles a legacy-format file begins with end before their STOP: the file was cut short (a name
    cut there reads as an unknown global). Read as opcodes only (:func:`pickletools.genops`): nothing is run."""
    stream = io.BytesIO(data)
    for _ in range(_LEGACY_PICKLES):
        if stream.tell() == len(data):
            return False  # (whole pickles, then nothing: not cut inside one)
        try:
            for _ in pickletools.genops(stream):
                pass
        except ValueError as error:  # cut: "pickle exhausted before seeing STOP", "not enough data in stream";
            return "unknown" not in str(error)  # not cut: other bytes after a whole pickle ("opcode ... unknown")
    return False


def _first_pickle_globals(data: bytes) -> list[str]:
    """The Python objects (``module.name``) the first pickle of ``data`` names, read as opcodes only
    (:func:`pickletools.genops`: nothing is run); [] for one that names none, or that cannot be read (left to
    ``torch.load``, which says why)."""
    names, strings = [], []
    try:
        for opcode, arg, _ in pickletools.genops(io.BytesIO(data)):
            if "UNICODE" in opcode.name:
                strings.append(str(arg))
            elif opcode.name == "GLOBAL":
                names.append(str(arg).replace(" ", "."))
            elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                names.append(f"{strings[-2]}.{strings[-1]}")
    except ValueError:
        return []
    return names


def _check_zip_entries(path: Path, data: bytes) -> None:
    """Refuse zip bytes an entry of which fails its CRC-32 (torch.save writes one per entry; torch.load checks none,
    so a bit flipped in a copy loaded as a wrong weight); bytes that are no readable zip are left to ``torch.load``."""
    bad = None
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for entry in archive.infolist():
                if entry.CRC == 0:  # written without checksums (torch.serialization.set_crc32_options(False))
                    continue
                with archive.open(entry) as member:  # (zipfile checks the CRC-32 as the entry is read to its end)
                    while member.read(1 << 24):
                        pass
    except zipfile.BadZipFile as error:
        if "CRC" not in str(error):  # (not a readable zip: torch.load says what it is)
            return
        bad = str(error).rpartition(" for file ")[2].strip("'") or "an entry"
    except (ValueError, OSError, EOFError, NotImplementedError, RuntimeError):  # (compression or encryption zipfile
        return  # does not read: torch.load says what it is)
    except zlib.error:  # (a compressed entry that does not inflate)
        bad = "a compressed entry"
    if bad is not None:
        raise CheckpointError(f"{path}: damaged: {bad} fails its checksum (a corrupted download or copy?); fetch or "
                              "copy the file again")


def _is_torchscript(data: bytes) -> bool:
    """Whether zip bytes are a TorchScript archive (``torch.jit.save``: it has ``constants.pkl`` and ``code/``
    entries, which ``torch.save`` never writes); bytes that are no readable zip are left to ``torch.load``."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, ValueError, OSError):
        return False
    return any(name.endswith("/constants.pkl") for name in names) and any("/code/" in name for name in names)


def _strip_module(path: Path, state: Mapping[str, Any]) -> dict[str, Any]:
    """Remove leading ``module.`` prefixes (DataParallel / DDP) from every key; a key that is not a name (no state
    dict has one) is refused naming the file."""
    out: dict[str, Any] = {}
    for key, value in state.items():
        if not isinstance(key, str):
            raise CheckpointError(f"{path}: a state-dict key is not a name but {type(key).__name__} {key!r}: not a "
                                  "checkpoint this version reads")
        while key.startswith("module."):
            key = key[len("module.") :]
        out[key] = value
    return out


def _detect_format(path: Path, payload: Any) -> tuple[str, dict[str, Any]]:
    """The format name and the (prefix-stripped) state dict it keeps its tensors in."""
    if not isinstance(payload, dict):
        raise CheckpointError(f"{path}: unknown checkpoint format: it holds a {type(payload).__name__}, not a dict")
    declared = payload.get("format")
    if declared in _OUR_FORMATS:
        return "ours", {}
    if declared is not None:
        raise CheckpointError(
            f"{path}: unknown checkpoint format {declared!r} (this version reads {', '.join(_OUR_FORMATS)})"
        )
    nested = payload.get("state_dict")
    state = _strip_module(path, nested if isinstance(nested, dict) else payload)
    keys = list(state)

    def has(prefix: str) -> bool:
        return any(key.startswith(prefix) for key in keys)

    if has("encoder_q."):
        return "authors_pretrain", state
    if has("backbone.") and has("final_fc."):
        return "authors_classifier", state
    if has("features.0.0.0."):
        return "torchvision", state
    if has("Conv_1a.") or has("block1.0."):
        return "bare", state
    prefixes = sorted({key.split(".")[0] for key in keys})
    raise CheckpointError(
        f"{path}: unknown checkpoint format. Top-level keys: {_names(map(str, payload))}; state-dict key "
        f"prefixes: {_names(prefixes)}. Expected ours ('format': {' | '.join(_OUR_FORMATS)}), the CoCLR "
        f"authors' (encoder_q.* or backbone.* + final_fc.*), torchvision s3d (features.*) or a bare S3D "
        f"state dict (Conv_1a.*)"
    )


# --------------------------------------------------------------------------------------------- formats


def _load_ours(path: Path, payload: dict[str, Any]) -> tuple[S3D, ProjectionHead | None]:
    """Our ``coclr.encoder`` / ``coclr.train`` files: rebuild from ``arch``, then load strictly."""
    missing = [key for key in ("arch", "backbone", "head") if key not in payload]
    if missing:
        raise CheckpointError(f"{path}: {payload['format']} checkpoint lacks the top-level keys {_names(missing)}")
    arch = payload["arch"]
    if payload.get("meta") is not None and not isinstance(payload["meta"], dict):
        raise CheckpointError(f"{path}: 'meta' must be a dict (how the encoder was trained), got "
                              f"{type(payload['meta']).__name__}")
    if not isinstance(arch, dict) or any(key not in arch for key in _ARCH_KEYS):
        raise CheckpointError(f"{path}: 'arch' must be a dict with keys {_names(_ARCH_KEYS)}, got {arch!r}")
    state = _strip_module(path, _tensors(path, payload["backbone"], "backbone"))
    try:
        check_arch(arch["width"], arch["gating"], arch["bn_eps"])  # (before the network is built at its width)
    except ValueError as error:
        raise CheckpointError(f"{path}: invalid 'arch': {error}") from None
    width, bn_eps = float(arch["width"]), float(arch["bn_eps"])
    stem = "Conv_1a.conv1.weight"  # the network is built only at the size its tensors have (no file's word for it)
    if stem in state and _width_from_stem(path, state[stem], f"backbone.{stem}") != scaled_channels(64, width) / 64:
        raise CheckpointError(f"{path}: invalid 'arch': width {width:g}, but backbone.{stem} holds "
                              f"{state[stem].shape[0]} filters (width {state[stem].shape[0] / 64:g})")
    head_tensors, embed_dim = None, arch["embed_dim"]
    if payload["head"] is None and embed_dim is not None:  # (it read as an encoder without its head, silently)
        raise CheckpointError(f"{path}: arch['embed_dim'] is {embed_dim!r}, but the file holds no head tensors "
                              "(head.*): it is damaged, or was edited")
    if payload["head"] is not None:
        if embed_dim is None:
            raise CheckpointError(f"{path}: the file has a 'head' but arch['embed_dim'] is None")
        if isinstance(embed_dim, bool) or not isinstance(embed_dim, int) or embed_dim < 1:
            raise CheckpointError(f"{path}: invalid 'arch': embed_dim must be a positive whole number, got "
                                  f"{embed_dim!r}")
        head_tensors = _strip_module(path, _tensors(path, payload["head"], "head"))
        last = head_tensors.get("fc2.weight")
        if last is not None and last.dim() == 2 and last.shape[0] != embed_dim:
            raise CheckpointError(f"{path}: invalid 'arch': embed_dim {embed_dim}, but head.fc2.weight holds "
                                  f"{last.shape[0]} outputs")
    try:
        with torch.device("meta"):  # (its keys and shapes first: a file lacking the stem, by which the width is
            shaped = S3D(width=width, gating=arch["gating"], bn_eps=bn_eps)  # read, built one of width 200 in GBs)
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{path}: invalid 'arch' {arch!r}: {error}") from None
    _check_keys(path, shaped, state, "backbone.")
    backbone = S3D(width=width, gating=arch["gating"], bn_eps=bn_eps)
    _load_strict(path, backbone, state, "backbone.")
    if head_tensors is None:
        return backbone, None
    dim = backbone.out_channels
    head = ProjectionHead(dim, dim, embed_dim)
    _load_strict(path, head, head_tensors, "head.")
    return backbone, head


def _load_authors_pretrain(path: Path, state: dict[str, Any]) -> tuple[S3D, ProjectionHead | None]:
    """``encoder_q.0`` = S3D (with block aliases), ``encoder_q.2/.4`` = 1x1x1 conv head; other keys ignored."""
    prefix = "encoder_q."
    query = {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}
    backbone_state = _collapse_aliases(path, {k[2:]: v for k, v in query.items() if k.startswith("0.")}, "encoder_q.0.")
    backbone = _backbone_for(path, backbone_state, "encoder_q.0.", bn_eps=1e-5)
    head_keys = ("2.weight", "2.bias", "4.weight", "4.bias")
    unexpected = [prefix + k for k in query if not k.startswith("0.") and k not in head_keys]
    present = [k for k in head_keys if k in query]
    if unexpected or (present and len(present) < len(head_keys)):
        missing = [prefix + k for k in head_keys if k not in query] if present else []
        raise CheckpointError(
            f"{path}: projection head does not match (encoder_q.2 = Conv3d 1x1x1 -> ReLU -> encoder_q.4 = "
            f"Conv3d 1x1x1): {_problems(missing, unexpected, [])}"
        )
    _load_strict(path, backbone, backbone_state, "encoder_q.0.")
    if not present:
        return backbone, None
    head_state = {
        "fc1.weight": _conv1x1_as_linear(path, query["2.weight"], prefix + "2.weight"),
        "fc1.bias": _as_tensor(path, query["2.bias"], prefix + "2.bias"),
        "fc2.weight": _conv1x1_as_linear(path, query["4.weight"], prefix + "4.weight"),
        "fc2.bias": _as_tensor(path, query["4.bias"], prefix + "4.bias"),
    }
    dim = backbone.out_channels
    head = ProjectionHead(dim, head_state["fc1.weight"].shape[0], head_state["fc2.weight"].shape[0])
    sources = {"fc1": "encoder_q.2", "fc2": "encoder_q.4"}
    _load_strict(path, head, head_state, "", rename=lambda key: sources[key[:3]] + key[3:])
    return backbone, head


def _load_authors_classifier(path: Path, state: dict[str, Any]) -> tuple[S3D, LinearClassifier]:
    """``backbone.*`` = S3D (with block aliases), optional ``final_bn.*``, ``final_fc.{0,1}.*`` = Linear."""
    backbone_state = _collapse_aliases(
        path, {k[len("backbone.") :]: v for k, v in state.items() if k.startswith("backbone.")}, "backbone."
    )
    backbone = _backbone_for(path, backbone_state, "backbone.", bn_eps=1e-5)
    head_state = {k: _as_tensor(path, v, k) for k, v in state.items() if not k.startswith("backbone.")}
    dropout_layout = "final_fc.1.weight" in head_state
    fc_weight = head_state.get("final_fc.1.weight" if dropout_layout else "final_fc.0.weight")
    if not isinstance(fc_weight, torch.Tensor) or fc_weight.dim() != 2:
        raise CheckpointError(
            f"{path}: classifier has no 2-D final_fc.0.weight or final_fc.1.weight; found {_names(head_state)}"
        )
    final_bn = any(k.startswith("final_bn.") for k in head_state)
    classifier = LinearClassifier(
        in_dim=backbone.out_channels,
        num_classes=fc_weight.shape[0],
        final_bn=final_bn,
        dropout=AUTHORS_CLASSIFIER_DROPOUT if dropout_layout else 0.0,
        l2_norm=final_bn,  # their main_classifier.py sets final_norm and final_bn together (the linear probe)
    )
    _load_strict(path, backbone, backbone_state, "backbone.")
    _load_strict(path, classifier, head_state, "")
    return backbone, classifier


def _load_torchvision(path: Path, state: dict[str, Any]) -> S3D:
    """torchvision ``s3d``: ``features.*`` map onto our layers; the Kinetics ``classifier.*`` is dropped."""
    first = state["features.0.0.0.weight"]
    backbone = S3D(width=_width_from_stem(path, first, "features.0.0.0.weight"), bn_eps=_TORCHVISION_BN_EPS)
    ours_by_theirs = {_torchvision_name(key): key for key in backbone.state_dict()}
    mapped: Tensors = {}
    unexpected: list[str] = []
    for key, value in state.items():
        if key.startswith("classifier."):
            continue
        if key in ours_by_theirs:
            mapped[ours_by_theirs[key]] = _as_tensor(path, value, key)
        else:
            unexpected.append(key)
    _load_strict(path, backbone, mapped, "", rename=_torchvision_name, unexpected=unexpected)
    return backbone


def _load_bare_backbone(path: Path, state: dict[str, Any]) -> S3D:
    """A plain S3D state dict in the authors' naming (with or without the ``blockN.i`` aliases)."""
    backbone_state = _collapse_aliases(path, state, "")
    backbone = _backbone_for(path, backbone_state, "", bn_eps=1e-5)
    _load_strict(path, backbone, backbone_state, "")
    return backbone


# --------------------------------------------------------------------------------------------- helpers


def _collapse_aliases(path: Path, state: Mapping[str, Any], prefix: str) -> Tensors:
    """Map ``blockN.i.*`` aliases onto the named layers, checking that both copies hold the same values."""
    out: Tensors = {}
    source: dict[str, str] = {}
    for key, value in state.items():
        value = _as_tensor(path, value, prefix + key)
        parts = key.split(".", 2)
        alias = ".".join(parts[:2])
        target = f"{_AUTHOR_ALIASES[alias]}.{parts[2]}" if alias in _AUTHOR_ALIASES and len(parts) == 3 else key
        if target in out:
            other = out[target]
            if other.shape != value.shape or not torch.equal(other, value):
                raise CheckpointError(
                    f"{path}: {prefix}{source[target]} and its alias {prefix}{key} hold different values; "
                    f"the file is inconsistent"
                )
            continue
        out[target] = value
        source[target] = key
    return out


def _backbone_for(path: Path, state: Tensors, prefix: str, bn_eps: float) -> S3D:
    """An S3D whose width and gating are inferred from the tensors (stem channels, ``gating_b*`` keys)."""
    stem_key = "Conv_1a.conv1.weight"
    if stem_key not in state:
        raise CheckpointError(f"{path}: missing key {prefix}{stem_key} (the S3D stem); cannot infer the width")
    gating = any(".gating_b" in key for key in state)
    stem = _width_from_stem(path, state[stem_key], prefix + stem_key)
    return S3D(width=_width_from_channels(state, gating, stem), gating=gating, bn_eps=bn_eps)


def _width_from_channels(state: Tensors, gating: bool, stem: float) -> float:
    """The width every convolution's filter count agrees with (each count ``n`` of a layer of ``c`` filters at width 1
    needs a width in ``[(n - 0.5) / c, (n + 0.5) / c)``, :func:`~coclr.models.s3d.scaled_channels`): ``stem``, the
    stem's count over 64, when it does, else the shortest decimal that does (the stem alone made a width-0.3
    network 0.296875, whose other layers then had a filter fewer: 57 where the file held 58). ``stem`` when none
    does (the load then names the mis-shaped keys)."""
    with torch.device("meta"):
        reference = S3D(width=1.0, gating=gating)
    low, high = 0.0, float("inf")
    for key, tensor in reference.state_dict().items():
        given = state.get(key)
        if tensor.dim() == 5 and isinstance(given, torch.Tensor) and given.dim() == 5:
            count, full = given.shape[0], tensor.shape[0]
            low, high = max(low, (count - 0.5) / full if count > 1 else 0.0), min(high, (count + 0.5) / full)
    if low <= stem < high or not low < high:
        return stem
    for digits in range(1, 9):
        width = math.ceil(low * 10 ** digits - 1e-9) / 10 ** digits
        if low <= width < high:
            return width
    return stem


def _width_from_stem(path: Path, weight: torch.Tensor, name: str) -> float:
    """Width multiplier from the stem conv's output channels (64 at width 1)."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 5 or weight.shape[1] != 3:
        shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise CheckpointError(f"{path}: {name} should be a [C, 3, 1, 7, 7] conv weight, got {shape}")
    return weight.shape[0] / 64


def _torchvision_name(key: str) -> str:
    """Our S3D state-dict key -> torchvision's ``s3d`` key (``Mixed_3b.branch1.1.conv2.weight`` -> ...)."""
    layer, *rest = key.split(".")
    parts = [_TORCHVISION_LAYERS[layer]]
    if layer.startswith("Mixed_"):
        branch, index, *rest = rest
        # torchvision's branch0 is the conv block itself; the other branches are Sequentials like ours.
        parts += [branch] if branch == "branch0" else [branch, index]
    leaf, *tail = rest
    return ".".join([*parts, _TORCHVISION_LEAVES[leaf], *tail])


def _conv1x1_as_linear(path: Path, weight: Any, name: str) -> torch.Tensor:
    """A Conv3d 1x1x1 weight ``[out, in, 1, 1, 1]`` as a Linear weight ``[out, in]``."""
    weight = _as_tensor(path, weight, name)
    if weight.dim() != 5 or tuple(weight.shape[2:]) != (1, 1, 1):
        raise CheckpointError(f"{path}: {name} should be a [out, in, 1, 1, 1] conv weight, got {tuple(weight.shape)}")
    return weight.reshape(weight.shape[0], weight.shape[1])


def _load_strict(
    path: Path,
    module: nn.Module,
    state: Tensors,
    prefix: str,
    rename: Callable[[str], str] | None = None,
    unexpected: Iterable[str] = (),
) -> None:
    """``load_state_dict`` after checking every key; errors name keys as the file spells them."""
    expected = module.state_dict()
    _check_keys(path, module, state, prefix, rename, unexpected)
    unfit = [f"{_spelled(key, prefix, rename)} ({why})" for key, value in state.items()
             if (why := _unfit(value, expected[key], key)) is not None]
    if unfit:
        raise CheckpointError(f"{path}: not usable as weights: {_names(unfit)}; the file is damaged, or not a "
                              "trained network's")
    module.load_state_dict(state, strict=True)


def _check_keys(path: Path, module: nn.Module, state: Tensors, prefix: str,
                rename: Callable[[str], str] | None = None, unexpected: Iterable[str] = ()) -> None:
    """Refuse ``state`` unless it holds every tensor of ``module`` at its shape and no other (a module on the meta
    device checks a file before the network is built at the size its record claims), naming keys as the file
    spells them."""

    def name(key: str) -> str:
        return _spelled(key, prefix, rename)

    expected = module.state_dict()
    missing = [name(key) for key in expected if key not in state]
    extra = [*unexpected, *(name(key) for key in state if key not in expected)]
    misshaped = [
        f"{name(key)} {tuple(value.shape)} (expected {tuple(expected[key].shape)})"
        for key, value in state.items()
        if key in expected and tuple(value.shape) != tuple(expected[key].shape)
    ]
    if missing or extra or misshaped:
        raise CheckpointError(f"{path}: {type(module).__name__} does not match: {_problems(missing, extra, misshaped)}")


def _spelled(key: str, prefix: str, rename: Callable[[str], str] | None) -> str:
    """A module's ``key`` as the file spells it."""
    return prefix + (rename(key) if rename is not None else key)


def _unfit(value: torch.Tensor, expected: torch.Tensor, key: str = "") -> str | None:
    """Why ``value`` cannot stand for the module's tensor ``expected`` (named ``key``; None: it can): a sparse or
    other non-dense tensor, whole numbers or complex ones where the module has real numbers (cast silently, they gave
    vectors of zeros), real numbers where it counts (a BatchNorm's ``num_batches_tracked``), NaN or infinite values,
    a negative variance (a BatchNorm's ``running_var``: every feature NaN)."""
    if value.layout != torch.strided:
        return f"a {str(value.layout).removeprefix('torch.')} tensor"
    if expected.is_floating_point():
        if not value.is_floating_point():
            return f"{str(value.dtype).removeprefix('torch.')}, not real numbers"
        if not bool(torch.isfinite(value).all()):
            return "NaN or infinite values"
        if key.endswith("running_var") and bool((value < 0).any()):
            return "a negative variance"
    elif value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        return f"{str(value.dtype).removeprefix('torch.')}, not whole numbers"
    return None


def _problems(missing: list[str], unexpected: list[str], misshaped: list[str]) -> str:
    parts = []
    if missing:
        parts.append(f"missing keys {_names(missing)}")
    if unexpected:
        parts.append(f"unexpected keys {_names(unexpected)}")
    if misshaped:
        parts.append(f"mis-shaped keys {_names(misshaped)}")
    return "; ".join(parts)


def _names(items: Iterable[str], limit: int = 25) -> str:
    """``[a, b, c, ... and N more]`` for error messages."""
    items = list(items)
    shown = ", ".join(items[:limit])
    more = f", ... and {len(items) - limit} more" if len(items) > limit else ""
    return f"[{shown}{more}]"


def _as_tensor(path: Path, value: Any, name: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise CheckpointError(f"{path}: {name} should be a tensor, got {type(value).__name__}")
    return value


def _tensors(path: Path, state: Any, name: str) -> Tensors:
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: '{name}' should be a state dict, got {type(state).__name__}")
    return {key: _as_tensor(path, value, f"{name}.{key}") for key, value in state.items()}


def _cpu_state(module: nn.Module) -> Tensors:
    return {key: value.detach().cpu() for key, value in module.state_dict().items()}


def _check_plain(value: Any, where: str) -> None:
    """Raise ValueError unless ``value`` is readable by a weights-only load (plain values and tensors)."""
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_plain(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, int)):
                raise ValueError(f"{where}: key {key!r} must be a str or int")
            _check_plain(item, f"{where}[{key!r}]")
        return
    raise ValueError(f"{where} holds a {type(value).__name__}; checkpoints store only plain values and tensors")


def _finish(module: nn.Module | None, map_location: Any) -> Any:
    """Eval mode, on ``map_location``."""
    if module is None:
        return None
    if map_location is not None and str(map_location) != "cpu":
        module.to(torch.device(map_location))
    return module.eval()
