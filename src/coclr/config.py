"""Typed configuration: dataclasses filled from YAML files and ``key=value`` overrides.

Every option is a dataclass field whose ``metadata["help"]`` documents it where it is defined. Loading is
strict: an unknown key, a value of the wrong type or a value a ``validate()`` method rejects raises
:class:`~coclr.errors.ConfigError` naming the dotted key, before any compute starts.

Example::

    cfg = load_config(PretrainConfig, "configs/ucf101_infonce_rgb.yaml", ["optim.lr=0.0005", "data.view=flow"])
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import math
import numbers
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import yaml

from coclr.errors import ConfigError

T = TypeVar("T")


def option(default: Any = dataclasses.MISSING, help: str = "", *, cli: dict[str, Any] | None = None,
           **kwargs: Any) -> Any:
    """A dataclass field with its documentation attached (shown by ``describe``). ``cli``: how a command-line flag
    generated from it (:func:`coclr.cli._options.add_option_flags`) differs from the field: ``flag`` (its name),
    ``parse`` (text -> value, e.g. ``"15m"`` -> seconds; its errors are the command's one-line errors), ``shown``
    (the default as the flag writes it), ``metavar``, ``negate`` (a boolean flag that sets the field false),
    ``switch`` (one that sets it true), ``hidden`` (no flag: set by code only)."""
    metadata = {"help": help, **({"cli": cli} if cli else {})}
    if isinstance(default, (list, dict)):
        value = default
        kwargs["default_factory"] = lambda: copy.deepcopy(value)
        return dataclasses.field(metadata=metadata, **kwargs)
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


class _OnceLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that gives a key twice (the later one would replace the earlier one
    without a word: a second ``data:`` block drops the first)."""

    def construct_mapping(self, node, deep=False):
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: merged keys an explicit one may override
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)) or key is None:  # (the loader refuses what is unhashable)
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"the key {key!r} is given twice (the second "
                                                        "would replace the first)", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


_BOOL, _INT, _FLOAT = (f"tag:yaml.org,2002:{name}" for name in ("bool", "int", "float"))
_OnceLoader.yaml_implicit_resolvers = {  # YAML 1.2's core schema for numbers, booleans and text
    first: [(tag, pattern) for tag, pattern in resolvers
            if tag not in (_BOOL, _INT, _FLOAT, "tag:yaml.org,2002:timestamp")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_OnceLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_OnceLoader.add_implicit_resolver(_INT, re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
                                  list("-+0123456789"))
_OnceLoader.add_implicit_resolver(
    _FLOAT, re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
                       r"|\.(?:nan|NaN|NAN))$"), list("-+0123456789."))
_OnceLoader.add_constructor(_INT, lambda loader, node: _integer(loader.construct_scalar(node), node))
"""YAML 1.1 read ``010`` as 8, ``1:30`` as 90, ``on`` and ``yes`` as true, ``1e-3`` as text and ``2024-01-01`` as a
date; YAML 1.2 (and every reader of it) reads numbers as written, booleans as ``true``/``false``, and the rest as
text."""


def _integer(text: str, node: yaml.Node) -> int:
    """A YAML 1.2 integer: decimal (leading zeros too), ``0o`` octal or ``0x`` hexadecimal; anything else (an
    explicit ``!!int`` of another form) a YAML error at its place."""
    try:
        return int(text, 0) if text.startswith(("0o", "0x")) else int(text, 10)
    except ValueError:
        raise yaml.constructor.ConstructorError(None, None, f"{text!r} is not a YAML 1.2 integer (decimal, 0o or "
                                                "0x)", node.start_mark) from None


class Given(str):
    """The text of a ``key=value`` override's plain value, read as its option's type (:func:`_coerce`): a path keeps
    a ``#`` and its leading zeros (read as YAML, ``runs/c #2`` was ``runs/c``), a number is read as written."""


LARGEST_INT = 2**63 - 1
"""The largest integer an option takes (a C long: NumPy and torch take no more)."""

NULLS = ("null", "Null", "NULL", "~", "None")
"""What an override of an option that may be None gives for None (YAML's nulls, and Python's name that
``--list-options`` once printed)."""


def parse_yaml(text: str) -> Any:
    """``text`` as YAML (safe: plain data), a key given twice refused (:class:`_OnceLoader`). A value its explicit tag
    cannot make (``!!float abc``, ``!!bool maybe``, an empty ``!!float``) is a ``yaml.YAMLError`` like any other
    (PyYAML's constructors raise Python's own errors for them)."""
    try:
        return yaml.load(text, Loader=_OnceLoader)  # noqa: S506 (a safe loader)
    except yaml.YAMLError:
        raise
    except (ValueError, KeyError, IndexError, AttributeError, TypeError, OverflowError) as error:
        raise yaml.constructor.ConstructorError(
            problem=f"a tagged value its tag cannot make ({type(error).__name__}: {error})") from None


def yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML error in one line: where (``at line L, column C``, when known) and what."""
    mark = getattr(error, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(error, "problem", None) or " ".join(str(error).split())
    context = getattr(error, "context", None)  # what the problem breaks ("expected a single document in the
    # stream", "while parsing a flow sequence"), where it says more than the scanner's "while scanning a token"
    said = context and getattr(error, "problem", None) and not context.startswith("while scanning")
    return f"{where}: {f'{context}, ' if said else ''}{problem}"


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """Turn ``["a.b=1", "c=x"]`` into a nested dict: a value in brackets, braces or quotes as YAML (lists,
    mappings, quoted text), any other as the text typed (:class:`Given`, read as its option's type). A later
    override of an option replaces an earlier one (a command line refuses that: :func:`refuse_repeated`)."""
    nested: dict[str, Any] = {}
    for number, item in enumerate(overrides):
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        parts = key.split(".")
        if any(not part or part != "".join(part.split()) for part in parts):  # (" optim.lr" was "unknown:  optim")
            named = ".".join(word for word in ("".join(part.split()) for part in parts) if word)
            raise ConfigError(f"override {item!r}: the key {key!r} has spaces or an empty part in it; give it as one "
                              f"word of dotted names, e.g. {named or 'optim.lr'}={raw.strip()}")
        value: Any = Given(raw)
        if raw.lstrip()[:1] in ("[", "{", "'", '"'):
            try:
                value = parse_yaml(raw)
            except yaml.YAMLError as error:
                rest = overrides[number + 1] if number + 1 < len(overrides) else ""
                cut = raw.lstrip()[:1] in "[{" and rest and "=" not in rest  # (its rest came as the next word)
                hint = (f"; the shell split it at a space: quote the whole override ('{item} {rest}') or leave out "
                        "the spaces" if cut else "")  # (the README's own example, [200, 250], typed as shown)
                raise ConfigError(f"override {item!r}: cannot parse the value as YAML{yaml_problem(error)}{hint}"
                                  ) from None
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r} conflicts with another override of {part!r}")
        node[parts[-1]] = value
    return nested


def refuse_repeated(overrides: list[str]) -> None:
    """Refuse an option given twice on a command line, or a section and an option in it: the later would replace
    the earlier without a word (``optim.epochs=1 optim={lr: 0.1}`` dropped the epochs)."""
    given: dict[str, str] = {}
    for item in overrides:
        key = item.partition("=")[0]
        earlier = next((given[k] for k in given if k == key or k.startswith(key + ".") or key.startswith(k + ".")),
                       None)
        if earlier is not None:
            raise ConfigError(f"{earlier!r} and {item!r}: the later would replace the earlier; give each option once")
        given[key] = item


def merge(base: dict[str, Any], update: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Recursively merge ``update`` into a copy of ``base``; a section of ``base`` that is not a mapping (nor empty)
    where ``update`` sets options in it is a :class:`ConfigError` (its value would be lost without a word)."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value, f"{prefix}{key}.")
        elif isinstance(value, dict) and out.get(key) is not None:
            raise ConfigError(f"{prefix}{key}: expected a mapping, got {out[key]!r}")
        else:
            out[key] = value
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, with errors that name the file."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder, not a YAML file of options; give the file (see configs/)")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}" if not path.exists() else
                          f"{path}: not a regular file; give a YAML file of options")
    try:
        data = parse_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text (byte {error.object[error.start]:#04x} at offset {error.start}); "
                          "save it as UTF-8") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: invalid YAML{yaml_problem(error)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of options")
    return data


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None,
                base: dict[str, Any] | None = None) -> T:
    """Build ``cls`` from defaults, then ``base``, then the YAML file at ``path``, then ``overrides``. Options that
    are mappings (``dict`` fields) are merged key by key with their default, so ``train.optim.lr=0.01`` changes one
    entry of a default mapping and keeps the others."""
    data = merge(dict_defaults(cls), dict(base or {}))
    refuse_given = getattr(cls, "refuse_given", None)  # (keys the class sets itself: given at all, refused)
    if refuse_given is not None:
        refuse_given(dict(base or {}))
    if path is not None:
        from_file = read_yaml(path)
        try:
            _refuse_unknown(cls, from_file, "", nested=True)
            _check_types(cls, from_file, "")
            if refuse_given is not None:
                refuse_given(from_file)
        except ConfigError as error:
            raise ConfigError(f"{path}: {error}") from None
        data = merge(data, from_file)
    given = parse_overrides(overrides or [])
    if refuse_given is not None:
        refuse_given(given)
    data = merge(data, given)
    return from_dict(cls, data)


def dict_defaults(cls: type) -> dict[str, Any]:
    """The defaults of the mapping-valued options of ``cls`` (nested ones included), as nested dicts."""
    out: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        tp = hints[field.name]
        if dataclasses.is_dataclass(tp):
            nested = dict_defaults(tp)
            if nested:
                out[field.name] = nested
        elif (tp is dict or get_origin(tp) is dict) and field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
            if default:
                out[field.name] = default
    return out


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    """Strictly build the dataclass ``cls`` from a nested dict, then run its ``validate`` methods."""
    config = _build(cls, data, prefix)
    validate(config, prefix)
    return config


def _build(cls: type, data: Any, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    _refuse_unknown(cls, data, prefix)
    kwargs = {name: _coerce(hints[name], data[name], prefix + name) for name in fields if name in data}
    missing = [prefix + f.name for f in fields.values()
               if f.name not in kwargs and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"missing required option(s): {', '.join(missing)}")
    return cls(**kwargs)


def _refuse_unknown(cls: type, data: dict[str, Any], prefix: str, nested: bool = False) -> None:
    """Refuse the keys of ``data`` that are no option of ``cls`` (``nested``: and of its sections, where ``data``
    holds mappings for them), naming them all, and the known ones of the first section that has one."""
    found = _unknown(cls, data, prefix, nested)
    if found:
        names = ", ".join(name for name, _ in found)
        keys = _dotted_keys(cls, prefix)
        dotted = [name for name, _ in found if name in keys]  # `optim.lr: 0.01` in a file: a nested key written flat
        if dotted:
            section, _, key = dotted[0].rpartition(".")
            raise ConfigError(f"{', '.join(dotted)}: a file gives options nested under their section (`{section}:` "
                              f"then `  {key}: ...` below it), not as one dotted key")
        meant = [f"{near} for {name}" for name, _ in found if (near := _nearest(name, keys))]
        raise ConfigError(f"unknown option(s): {names} (known: {', '.join(found[0][1])})"
                          + (f"; did you mean {', '.join(meant)}?" if meant else ""))


def _dotted_keys(cls: type, prefix: str) -> list[str]:
    """Every option of ``cls`` and of its sections, dotted."""
    hints = typing.get_type_hints(cls)
    keys = []
    for field in dataclasses.fields(cls):
        if field.init:
            keys += (_dotted_keys(hints[field.name], f"{prefix}{field.name}.")
                     if dataclasses.is_dataclass(hints[field.name]) else [prefix + field.name])
    return keys


def _nearest(name: str, keys: list[str]) -> str | None:
    """The option ``name`` was likely meant to be: the one of the same name in a section (``lr`` ->
    ``optim.lr``), else the closest spelling (``optim.lrr`` -> ``optim.lr``)."""
    leaf = name.rpartition(".")[2]
    placed = [key for key in keys if key.rpartition(".")[2] == leaf]
    if len(placed) == 1:
        return placed[0]
    close = difflib.get_close_matches(name, keys, n=1, cutoff=0.8)
    return close[0] if close else None


def _unknown(cls: type, data: dict[str, Any], prefix: str, nested: bool) -> list[tuple[str, list[str]]]:
    """``(dotted key, the known keys beside it)`` of every key of ``data`` that is no option of ``cls``."""
    fields = sorted(f.name for f in dataclasses.fields(cls) if f.init)
    found = [(prefix + str(key), fields) for key in sorted(set(data) - set(fields), key=str)]
    if nested:
        hints = typing.get_type_hints(cls)
        for name, value in data.items():
            if name in fields and dataclasses.is_dataclass(hints[name]) and isinstance(value, dict):
                found += _unknown(hints[name], value, f"{prefix}{name}.", nested=True)
    return found


def _check_types(cls: type, data: dict[str, Any], prefix: str) -> None:
    """Read each value of ``data`` (a file's options, known ones) as its option's type, so that a wrong one is
    refused naming the file (the options are checked together, with the overrides, afterwards); an empty section
    (``optim:`` with nothing under it) becomes an empty mapping: its defaults."""
    hints = typing.get_type_hints(cls)
    for name, value in data.items():
        if dataclasses.is_dataclass(hints[name]) and value is None:
            data[name] = {}
        elif dataclasses.is_dataclass(hints[name]) and isinstance(value, dict):
            _check_types(hints[name], value, f"{prefix}{name}.")
        elif dataclasses.is_dataclass(hints[name]):  # a section given a value (`optim: 5`)
            raise ConfigError(f"{prefix}{name}: expected a mapping, got {value!r} (a section: its options go under it)")
        else:
            _coerce(hints[name], value, prefix + name)


def _coerce(tp: Any, value: Any, key: str) -> Any:
    origin = get_origin(tp)
    if isinstance(value, Given):
        value = _read_given(tp, origin, value, key)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key + ".")
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, key)
            except ConfigError as error:
                errors.append(str(error))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: invalid value {value!r}")
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(repr, choices))}")
        return value
    if origin in (list, tuple):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        args = get_args(tp)
        item_type = args[0] if args else Any
        items = [_coerce(item_type, v, f"{key}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return _as_yaml(dict(value), key)
    if tp is Any:
        return _as_yaml(value, key)
    if tp is bool:
        if not isinstance(value, bool):
            quoted = (isinstance(value, str) and not isinstance(value, Given)  # ("true" in a file or brackets: text)
                      and value in ("true", "True", "TRUE", "false", "False", "FALSE"))
            raise ConfigError(f"{key}: expected true or false, got {value!r}"
                              + (" as quoted text; leave out the quotes" if quoted else ""))
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        if abs(value) > LARGEST_INT:  # (past a C long: an overflow deep in NumPy or torch)
            raise ConfigError(f"{key}: expected an integer of at most 2**63 - 1, got one of {len(str(abs(value)))} "
                              "digits")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        if isinstance(value, int):
            try:
                value = float(value)
            except OverflowError:  # (past a float's range, 10**309: math.isfinite overflowed)
                raise ConfigError(f"{key}: expected a finite number, got an integer of {len(str(abs(value)))} "
                                  "digits") from None
        if not math.isfinite(value):
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        # a home-relative path: the shell leaves `run.out=~/x` as typed, which made a folder named "~" here
        return os.path.expanduser(value) if value.startswith("~/") else value
    raise ConfigError(f"{key}: unsupported option type {tp!r}")


def _read_given(tp: Any, origin: Any, text: Given, key: str) -> Any:
    """An override's text (:class:`Given`) as a value of the option's type ``tp``: text as typed, numbers and
    booleans as written (YAML 1.2), None as one of :data:`NULLS`; lists and mappings as YAML."""
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if type(None) in args and text in NULLS:
            return None
        return text  # read by each type of the union in turn
    if tp is str or (origin is Literal and all(isinstance(choice, str) for choice in get_args(tp))):
        return str(text)
    if tp is bool:
        return {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}.get(
            text, str(text))  # (as YAML 1.2 reads them, in a file too)
    if tp is int:
        return int(text) if re.fullmatch(r"[-+]?[0-9]+(?:_[0-9]+)*", text) else str(text)
    if tp is float:
        try:
            return float(text)
        except ValueError:
            return str(text)
    try:
        return parse_yaml(text) if text != "" else ""
    except yaml.YAMLError as error:
        raise ConfigError(f"{key}: cannot parse {str(text)!r} as YAML{yaml_problem(error)}") from None


def _as_yaml(value: Any, key: str) -> Any:
    """``value`` with the override texts in it (:class:`Given`, under a mapping option such as a study's ``train``)
    read as YAML 1.2 values, as a file's would be (typed when the mapping is read as options)."""
    if isinstance(value, Given):
        if value in NULLS:
            return None
        return str(value) if " #" in value else _read_given(Any, None, value, key)  # (YAML: a comment)
    if isinstance(value, dict):
        return {name: _as_yaml(item, f"{key}.{name}") for name, item in value.items()}
    return value


def validate(config: Any, prefix: str = "") -> None:
    """Call ``validate()`` on ``config`` and every nested dataclass, innermost first; a dataclass's
    ``validate_first()``, before its sections' (a rule of the whole whose message says more than a section's: a
    pipeline's options set per stage)."""
    _checked(getattr(config, "validate_first", None), prefix)
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            validate(value, prefix + field.name + ".")
    _checked(getattr(config, "validate", None), prefix)


def _checked(check: Any, prefix: str) -> None:
    """Run a config's ``check`` (None: nothing), its refusal's key prefixed by ``prefix``."""
    if check is None:
        return
    try:
        check()
    except ConfigError as error:
        raise ConfigError(f"{prefix}{error}" if prefix and not str(error).startswith(prefix) else str(error)
                          ) from None


def to_dict(config: Any) -> dict[str, Any]:
    """The config as plain nested dicts (for YAML dumps and checkpoints)."""
    return dataclasses.asdict(config)


def differences(recorded: dict[str, Any], given: dict[str, Any], prefix: str = "") -> list[str]:
    """Every option whose value differs between two option dicts (nested ones by dotted key), as
    ``"key=<recorded> (given <given>)"``: what a resumable job prints when its output folder was made with
    other options. A key missing on one side counts as ``None`` there."""
    found = []
    for key in {**recorded, **given}:
        old, new = recorded.get(key), given.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            found.extend(differences(old, new, f"{prefix}{key}."))
        elif old != new:
            found.append(f"{prefix}{key}={value_text(old)} (given {value_text(new)})")
    return found


def value_text(value: Any) -> str:
    """``value`` as an override would give it (``null``, ``true``, ``[1, 2]``, ``'text'``), for messages and
    ``--list-options``: Python's ``None`` and ``True`` read back as text."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(value_text(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {value_text(item)}" for key, item in value.items()) + "}"
    return repr(value)


def describe(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, help) for every option of ``cls``, nested ones included."""
    rows = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        tp = hints[field.name]
        if dataclasses.is_dataclass(tp):
            rows.extend(describe(tp, prefix + field.name + "."))
            continue
        if field.default is not dataclasses.MISSING:
            default = value_text(field.default)
        elif field.default_factory is not dataclasses.MISSING:
            default = value_text(field.default_factory())
        else:
            default = "(required)"
        rows.append((prefix + field.name, default, field.metadata.get("help", "")))
    return rows


def finite_number(text: str) -> float:
    """A command-line number (argparse's ``type`` of every float option): a NaN or infinity is refused there, as in a
    config file (:func:`from_dict`)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def whole_number(value: Any) -> bool:
    """Whether ``value`` is a whole number (a NumPy one too; not a bool, not text, not 8.0): the one test of every
    count a library caller may give (a clip's frames, a batch, k, a queue's size)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def require(condition: bool, key: str, message: str) -> None:
    """Raise ``ConfigError("key: message")`` unless ``condition`` holds (for ``validate`` methods)."""
    if not condition:
        raise ConfigError(f"{key}: {message}")


MAX_LEARNING_RATE = 1e30


def require_learning_rate(lr: float, key: str) -> None:
    """The one rule of an Adam learning rate: positive, and at most :data:`MAX_LEARNING_RATE` (far past any that
    trains, where a run diverges and says so; past about 3e37 Adam's float32 step overflowed in a traceback)."""
    require(0 < lr <= MAX_LEARNING_RATE, key, f"must lie in (0, {MAX_LEARNING_RATE:g}], got {lr:g}")


def require_milestones(milestones: list[int], epochs: int, key: str, epochs_key: str, none: str) -> None:
    """The one rule of lr milestones (pretraining, a pipeline's stages, finetuning): each lies in 1..epochs, since
    one past the last epoch never lowers the lr, which a changed epoch count left unsaid (``epochs_key`` and
    ``none``, how the user writes the epochs and no milestones, for the message), and each is given once."""
    require(all(0 < m <= epochs for m in milestones), key,
            f"{milestones} must lie in 1..{epochs_key.rsplit('.', 1)[-1]} ({epochs}): when you change {epochs_key}, "
            f"set the milestones too (e.g. {none} for none)")
    repeated = sorted({m for m in milestones if milestones.count(m) > 1})
    require(not repeated, key, f"{milestones} gives epoch {', '.join(map(str, repeated))} more than once: the lr would "
            "be lowered there as often (a typo?); give each milestone once")
