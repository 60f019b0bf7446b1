"""Shared command-line plumbing for commands configured by a YAML file plus ``key=value`` overrides."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import types
import typing

from coclr.clips import PAPER_CLIPS
from coclr.config import finite_number


def add_config_arguments(parser: argparse.ArgumentParser, example: str = "optim.lr=0.0005") -> None:
    """``--config FILE``, ``--list-options`` and trailing ``key=value`` overrides (``example``: one valid
    override of this command, shown in its help)."""
    parser.add_argument("--config", help="YAML file of options (see configs/)")
    parser.add_argument("--list-options", action="store_true", help="print every option with its default and help")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help=f"option overrides, e.g. {example}")


def print_options(config_class: type, set_elsewhere: typing.Collection[str] = (),
                  preset: typing.Mapping[str, typing.Any] | None = None) -> None:
    """Every option of ``config_class`` with its default and help, but those the command sets itself
    (``set_elsewhere``: given, they are refused); ``preset``: values that replace the defaults (a preset's)."""
    from coclr.config import describe, value_text

    preset = preset or {}
    for key, default, text in describe(config_class):
        if key not in set_elsewhere:
            print(f"{key} = {value_text(preset[key]) if key in preset else default}\n    {text}")


def add_clip_arguments(parser: argparse.ArgumentParser, scope: str = "") -> None:
    """How test clips are cut and fed to the network (the evaluation commands share these options:
    :class:`coclr.eval.options.ClipConfig`), and the device; ``scope`` opens each help text."""
    from coclr.eval.options import ClipConfig

    add_option_flags(parser, ClipConfig, scope=scope, shown=lambda field: (
        f"what the checkpoint was trained on, else {field.default}" if field.name in PAPER_CLIPS
        else repr(field.default)))
    parser.add_argument("--device", help=f"{scope}torch device (default: cuda when available, else cpu)")


def add_option_flags(parser: argparse.ArgumentParser, config_class: type,
                     shown: typing.Callable[[dataclasses.Field], str] | None = None, scope: str = "") -> None:
    """One ``--flag`` per field of the dataclass ``config_class`` (``--name-with-dashes``), its type, help and
    default taken from the field (:func:`coclr.config.option`, whose ``cli`` says where the flag differs: its name,
    ``parse``, ``shown`` default, ``metavar``, ``choices``, ``nargs``, ``append``, ``negate``, ``hidden``): the options
    are declared once, in the library. A ``Literal`` type gives the choices, a tuple or list the element type (its
    values after one flag, or with ``append`` one per flag, the flag repeated).
    ``shown(field)``: how the defaults read, where another rule sets them (e.g. "the checkpoint's, else 32");
    ``scope`` opens each help text (e.g. "--run: ").
    :func:`options_from_flags` builds the dataclass back from the parsed arguments."""
    hints = typing.get_type_hints(config_class)
    for field in dataclasses.fields(config_class):
        cli = field.metadata.get("cli", {})
        if cli.get("hidden"):
            continue
        base = _without_none(hints[field.name])
        choices, nargs = cli.get("choices"), cli.get("nargs")
        if typing.get_origin(base) is typing.Literal:
            choices, base = choices or typing.get_args(base), type(typing.get_args(base)[0])
        elif typing.get_origin(base) in (tuple, list):
            base, nargs = typing.get_args(base)[0], None if cli.get("append") else cli.get("nargs", "+")
        flag = _flag(field)
        dest = _dest(field)
        default = cli.get("shown") or (shown(field) if shown else _default_text(field))
        text = scope + field.metadata.get("help", "").replace("%", "%%")
        if cli.get("negate"):
            parser.add_argument(flag, dest=dest, action="store_const", const=False, default=None, help=text)
        elif cli.get("switch"):  # a flag that only turns something on (--restart)
            parser.add_argument(flag, dest=dest, action="store_const", const=True, default=None, help=text)
        elif base is bool:
            parser.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None,
                                help=f"{text} (default {default})")
        else:
            kind = str if "parse" in cli else finite_number if base is float else base
            parser.add_argument(flag, dest=dest, type=kind, default=None,
                                choices=choices, nargs=nargs, action="append" if cli.get("append") else "store",
                                help=f"{text} (default {default})".replace("(default None)", "").rstrip(),
                                metavar=None if choices else cli.get("metavar", field.name.upper()))


def _without_none(kind: typing.Any) -> typing.Any:
    """``X`` of ``X | None`` (``Optional[X]``); any other type as it is."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return next(t for t in typing.get_args(kind) if t is not type(None))
    return kind


def _flag(field: dataclasses.Field) -> str:
    """A field's flag: its ``cli`` ``flag``, else ``--name-with-dashes``."""
    return field.metadata.get("cli", {}).get("flag", "--" + field.name.replace("_", "-"))


def _dest(field: dataclasses.Field) -> str:
    """Where argparse keeps a field's flag: its flag's name (two classes of one command may share a field name)."""
    flag = field.metadata.get("cli", {}).get("flag")
    return flag.lstrip("-").replace("-", "_") if flag else field.name


def _default_text(field: dataclasses.Field) -> str:
    """A field's default as its help shows it (a list or dict default is built by its factory)."""
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
        return " ".join(map(str, value)) if isinstance(value, list) else repr(value)
    return repr(field.default)


def given_flags(config_class: type, args: argparse.Namespace) -> dict[str, typing.Any]:
    """The fields of ``config_class`` whose flags (:func:`add_option_flags`) were given, each ``parse``d where the
    field says so."""
    given = {}
    for field in dataclasses.fields(config_class):
        value = getattr(args, _dest(field), None)
        if value is not None and not field.metadata.get("cli", {}).get("hidden"):
            parse = field.metadata.get("cli", {}).get("parse")
            given[field.name] = parse(value) if parse else value
    return given


def options_from_flags(config_class: type, args: argparse.Namespace, **code: typing.Any):
    """The dataclass ``config_class`` with the flags :func:`add_option_flags` added that were given, and the fields
    set by ``code``; a refusal names the flag (:func:`named_by_flags`)."""
    with named_by_flags(config_class, code):
        return config_class(**given_flags(config_class, args), **code)


def config_from_flags(config_class: type, args: argparse.Namespace, **code: typing.Any):
    """:func:`options_from_flags` read through :func:`coclr.config.from_dict` (its values typed and checked)."""
    from coclr.config import from_dict

    given = given_flags(config_class, args)
    with named_by_flags(config_class, [key for key in code if key not in given]):  # (a flag given, passed on as code)
        return from_dict(config_class, {**given, **code})


@contextlib.contextmanager
def named_by_flags(config_class: type, code: typing.Collection[str] = ()) -> typing.Iterator[None]:
    """A :class:`~coclr.errors.ConfigError` ``"field: ..."`` raised inside, of a field of ``config_class`` that has a
    flag (not one of ``code``, set by the command), raised again as ``"--flag: ..."``: the field's name may be another
    flag's (the probe's ``batch_size`` is ``--probe-batch-size``, ``--batch-size`` the clips')."""
    from coclr.errors import ConfigError

    try:
        yield
    except ConfigError as error:
        key, colon, rest = str(error).partition(":")
        field = next((f for f in dataclasses.fields(config_class) if f.name == key and f.name not in code), None)
        if not colon or field is None or field.metadata.get("cli", {}).get("hidden"):
            raise
        raise ConfigError(f"{_flag(field)}:{rest}") from None


class _GivenOnce(argparse.Action):
    """An option refused when given a second time (``remedy`` says what to give instead), as ``key=value`` overrides
    given twice are; mixed in before argparse's action class."""

    remedy = "give it once"

    def __call__(self, parser, namespace, values, option_string=None):
        given = namespace.__dict__.setdefault(_GIVEN, set())
        if self.dest in given:
            parser.error(f"{'/'.join(self.option_strings)} given twice: the later would replace the earlier; "
                         f"{self.remedy}")
        given.add(self.dest)
        super().__call__(parser, namespace, values, option_string)


class _StoreOnce(_GivenOnce, argparse._StoreAction):
    """An option that takes one value: given twice, refused (``--config a.yaml --config b.yaml`` dropped the first
    file without a word, as ``--out``, ``--seed`` the earlier value)."""


class _SwitchOnce(_GivenOnce, argparse.BooleanOptionalAction):
    """An on/off option (``--amp`` / ``--no-amp``): both given, or one twice, refused (the last one won without a
    word)."""

    remedy = "give one of them once"


_GIVEN = "_options_given"
"""Where :class:`_StoreOnce` keeps the options given so far in the parsed namespace (a command that parses more of
its line later, as ``coclr flow`` what follows STORE, refuses those given again there too)."""


def _given(kind: typing.Callable[[str], typing.Any] | None, required: bool) -> typing.Callable[[str], typing.Any]:
    """``kind`` (argparse's ``type``; None: the text itself) refusing an empty value: ``--view ''`` wrote the default
    view, ``--out ''`` the current folder, ``--html ''`` no page, each without a word."""
    def convert(text: str) -> typing.Any:
        if text == "":
            raise argparse.ArgumentTypeError("empty: give a value" if required else
                                             "empty: give a value, or leave the option out for its default")
        return text if kind is None else kind(text)

    convert.__name__ = getattr(kind, "__name__", "str")  # (argparse names the type in its "invalid" message)
    return convert


def given_once(parser: argparse.ArgumentParser) -> None:
    """Make every option of ``parser`` and its subcommands that stores one value a :class:`_StoreOnce`, and refuse an
    empty value of any option or positional argument that takes values (:func:`_given`: ``coclr embed ""``, an
    unset shell variable, embedded the whole current folder)."""
    for action in parser._actions:
        if type(action) in (argparse._StoreAction, argparse._AppendAction) and action.nargs != argparse.REMAINDER:
            action.type = _given(action.type, action.required or not action.option_strings)  # (a remainder: its own
            # parser's arguments, refused there)
        if type(action) is argparse._StoreAction and action.option_strings:
            action.__class__ = _StoreOnce
        elif type(action) is argparse.BooleanOptionalAction:
            action.__class__ = _SwitchOnce
        elif isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                given_once(child)
