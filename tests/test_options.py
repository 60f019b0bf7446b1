"""Options mean what they say: values that would silently give a wrong result are refused in one line, before any
work (issue 36, 3e). The synth seed case lives beside its command's tests (test_synth); embed's
non-finite --mean is refused by the embed work (test_embed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coclr.cli import main
from coclr.curate.run import CurateOptions
from coclr.embed.options import EmbedJob, SearchOptions
from coclr.embed.settings import EmbedSettings
from coclr.errors import ConfigError, DataError
from coclr.eval.options import ClipConfig, FinetuneConfig, LinearProbeConfig
from coclr.flow.options import FlowOptions
from coclr.learn.options import LearnOptions
from coclr.store.options import InfoOptions, StoreOptions, VerifyOptions
from coclr.video.indexes import folder_index
from coclr.video.options import IndexOptions


def _touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")


@pytest.mark.parametrize("layout", ["plain", "by_split"])
def test_folder_index_refuses_videos_beside_the_class_folders(tmp_path, capsys, layout):
    """`data index --format folder` silently dropped the videos lying in the root beside class folders."""
    prefix = "train/" if layout == "by_split" else ""
    for path in (f"{prefix}walk/a.mp4", f"{prefix}run/b.mp4", f"{prefix}stray.mp4", f"{prefix}notes.txt"):
        _touch(tmp_path / "videos" / path)
    with pytest.raises(DataError, match=r"1 video\(s\) lie beside the class folders.*stray\.mp4"):
        folder_index(tmp_path / "videos")
    out = tmp_path / "index.json"
    assert main(["data", "index", "--format", "folder", "--root", str(tmp_path / "videos"), "--out", str(out)]) == 2
    assert "stray.mp4" in capsys.readouterr().err and not out.exists()
    (tmp_path / "videos" / prefix / "stray.mp4").unlink()
    assert len(folder_index(tmp_path / "videos").entries) == 2


def test_repeated_seeds_are_refused_before_any_work(tmp_path, capsys):
    """`study --seeds 0 0` reported one run as two agreeing seeds (+- 0.0)."""
    from coclr.cli.study import check_seeds

    assert check_seeds([2, 0, 1]) == [2, 0, 1]
    with pytest.raises(ConfigError, match="--seeds: 0 given more than once"):
        check_seeds([0, 1, 0])
    out = tmp_path / "study"
    assert main(["study", "--out", str(out), "--seeds", "0", "0"]) == 2
    assert "--seeds: 0 given more than once" in capsys.readouterr().err and not out.exists()


def _subparser(*path: str):
    import argparse

    from coclr.cli import build_parser

    parser = build_parser()
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


GENERATED = [  # (command, the class its flags are generated from, the arguments it needs)
    (("learn",), LearnOptions, ["v.mp4", "--out", "o"]),
    (("embed",), EmbedJob, ["v.mp4", "--out", "o", "--checkpoint", "c"]),
    (("embed",), EmbedSettings, ["v.mp4", "--out", "o", "--checkpoint", "c"]),
    (("eval", "linear"), LinearProbeConfig, ["--checkpoint", "c", "--store", "s"]),
    (("eval", "finetune"), FinetuneConfig, ["--checkpoint", "c", "--store", "s"]),
    (("eval", "retrieval"), ClipConfig, ["--checkpoint", "c", "--store", "s"]),
    (("curate",), CurateOptions, ["e", "--out", "o"]),
    (("search",), SearchOptions, ["d", "--query", "0"]),
    (("flow",), FlowOptions, []),  # (options before STORE: what follows is parsed apart)
    (("data", "index"), IndexOptions, ["--format", "folder", "--out", "i.json"]),
    (("data", "store"), StoreOptions, ["--index", "i.json", "--root", "r", "--out", "s"]),
    (("data", "info"), InfoOptions, ["s"]),
    (("data", "verify"), VerifyOptions, ["s"]),
]


@pytest.mark.parametrize("command, config_class, needed", GENERATED,
                         ids=[f"{' '.join(c)}:{k.__name__}" for c, k, _ in GENERATED])
def test_a_commands_flags_are_its_options_declared_once(command, config_class, needed):
    """Every option of the class is a flag whose help shows its documentation; without flags the command gets the
    library's defaults (written only in the class), and each flag given sets its field."""
    import dataclasses
    import typing

    from coclr.cli._options import given_flags

    parser = _subparser(*command)
    assert given_flags(config_class, parser.parse_args(needed)) == {}
    helps = {option: action.help for action in parser._actions for option in action.option_strings}
    hints = typing.get_type_hints(config_class)
    for field in dataclasses.fields(config_class):
        cli = field.metadata.get("cli", {})
        if cli.get("hidden"):
            continue
        flag = cli.get("flag", "--" + field.name.replace("_", "-"))
        assert field.metadata["help"].replace("%", "%%")[:40] in helps[flag], flag
        kind = str(hints[field.name])
        if cli.get("switch"):
            value, argv = True, [flag]
        elif cli.get("negate") or "bool" in kind:
            value, argv = False, ([flag] if cli.get("negate") else [f"--no-{flag[2:]}"])
        elif cli.get("choices"):
            value, argv = cli["choices"][-1], [flag, cli["choices"][-1]]
        elif "parse" in cli:
            continue  # its own test (the budget's, the precision's)
        elif cli.get("append"):  # the flag repeated, a value each time
            value, argv = ["x", "y"], [flag, "x", flag, "y"]
        elif "float" in kind:
            count = cli.get("nargs", 1) if isinstance(cli.get("nargs", 1), int) else 2
            value, argv = [0.25] * count, [flag, *["0.25"] * count]
            value = value[0] if "list" not in kind and "tuple" not in kind else value
        elif "int" in kind:
            value, argv = ([3, 4], [flag, "3", "4"]) if "list" in kind else (3, [flag, "3"])
        else:
            value, argv = (["x"] if "list" in kind else "x"), [flag, "x"]
        got = given_flags(config_class, parser.parse_args([*needed, *argv]))
        assert got == {field.name: value}, flag


def test_config_files_and_seeds_no_run_can_take_are_one_line_before_any_work(tmp_path, capsys):
    from coclr.cli import main

    command = ["pretrain", f"data.store={tmp_path / 'store'}", f"run.out={tmp_path / 'run'}"]
    cases = {
        b"optim:\n- lr: 0.01\n": "yaml: optim: expected a mapping, got [{'lr': 0.01}]",  # (lost before)
        b"optim:\n  lr: \xff\xfe\n": "not UTF-8 text (byte 0xff at offset 13); save it as UTF-8",
        b"optim:\n\tlr: 1\n": "invalid YAML at line 2, column 1: found character '\\t' that cannot start any token",
        b"optim: {lr: 0.1}\n---\noptim: {lr: 0.2}\n": "invalid YAML at line 2, column 1: expected a single document in "
                                                    "the stream, but found another document",
        b"optim:\n  lr: 1\noptim:\n  epochs: 2\n": "invalid YAML at line 3, column 1: the key 'optim' is given "
                                                   "twice (the second would replace the first)",  # lr was lost
    }
    for number, (text, message) in enumerate(cases.items()):
        config = tmp_path / f"config{number}.yaml"
        config.write_bytes(text)
        assert main([*command, "optim.epochs=1", "--config", str(config)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
    from coclr.config import parse_yaml

    assert parse_yaml("base: &b {lr: 1, epochs: 2}\noptim: {<<: *b, lr: 3}\n")["optim"] == {"lr": 3, "epochs": 2}
    assert main([*command[:2], "run.out=[a"]) == 2  # one line, not the parser's three
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot parse the value as YAML at line 1, column 3" in err, err
    assert main([*command, "run.seed=-1"]) == 2  # (NumPy refused it once training had started)
    assert "run.seed: must be from 0 to 2**32 - 1, got -1" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_pipeline_of_a_store_that_is_not_there_writes_nothing(tmp_path, capsys):
    from coclr.cli import main

    assert main(["pipeline", f"data.store={tmp_path / 'nowhere'}", f"run.out={tmp_path / 'run'}"]) == 2
    assert f"data.store: not a directory: {tmp_path / 'nowhere'}" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # (it was claimed, and the corrected command then refused)


def test_a_pipelines_starting_checkpoints_are_read_before_any_stage(tmp_path, capsys):
    from coclr.cli import main
    from coclr.synth.output import random_store
    from test_eval_helpers import save_tiny_encoder

    store = random_store(tmp_path / "store", videos=4, frames=3, size=(16, 16), views=("rgb", "flow"))
    flow = save_tiny_encoder(tmp_path / "flow.pth", meta={"clip_settings": {"view": "flow", "length": 8, "size": 32}})
    (tmp_path / "cut.pth").write_bytes(flow.read_bytes()[:200])
    for key, path, message in (("miner", flow, "pipeline.miner: "),
                               ("init", tmp_path / "cut.pth", f"{tmp_path / 'cut.pth'}: ")):
        assert main(["pipeline", f"data.store={store}", f"run.out={tmp_path / 'run'}", f"pipeline.{key}={path}"]) == 2
        err = capsys.readouterr().err
        assert message in err and ("was trained on 'flow' clips" in err if key == "miner" else "damaged" in err), err
    assert not (tmp_path / "run").exists()  # before the first stage, not after InfoNCE trained


@pytest.mark.parametrize("argv, said", [
    (["pretrain", "run.out=R", "--restart", "optim.lr=x"], "coclr pretrain: error: optim.lr: expected a number"),
    (["study", "schedule.cycle_epochs=3", "--check", "schedule.cycles=x"], "schedule.cycles: expected an integer"),
    (["data", "synth", "--out", "S", "--seed", "6", "train_scenes=abc"], "train_scenes: expected an integer"),
])
def test_overrides_are_read_wherever_they_stand(argv, said, tmp_path, capsys, monkeypatch):
    """argparse gave the positional overrides one place: one after a flag was "coclr: error: unrecognized
    arguments", under the top-level usage."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert said in capsys.readouterr().err and not any(tmp_path.iterdir())


def test_an_unknown_flag_is_the_subcommand_s_error_with_its_usage(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for argv, usage in ((["pretrain", "run.out=R", "--restart", "--bogus"], "usage: coclr pretrain"),
                        (["data", "synth", "--out", "S", "--bogus"], "usage: coclr data synth")):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and usage in err and "unrecognized arguments: --bogus" in err


@pytest.mark.parametrize("argv", [["flow", "S", "--view", ""], ["embed", "v.mp4", "--checkpoint", "c.pth", "--out", ""],
                                  ["search", "E", "--query", "0", "--html", ""],
                                  ["eval", "retrieval", "--checkpoint", "c.pth", "--store", "S", "--name", ""],
                                  ["eval", "retrieval", "--checkpoint", "c.pth", "--store", "S", "--ks", "1", ""]])
def test_an_empty_value_is_refused_by_its_flag(argv, tmp_path, capsys, monkeypatch):
    """``--view ''`` wrote the default view, ``--out ''`` into the current folder, ``--html ''`` no page, ``--name
    ''`` no name, each without a word."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(argv)
    flag = next(token for token in reversed(argv) if token.startswith("--"))
    assert stop.value.code == 2 and f"argument {flag}: empty: give a value" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
    with pytest.raises(SystemExit) as stop:  # a required option has no default to fall back on
        main(["embed", "v.mp4", "--checkpoint", "c.pth", "--out", ""])
    assert capsys.readouterr().err.rstrip().endswith("argument --out: empty: give a value")


@pytest.mark.parametrize("argv, name", [
    (["embed", "", "--checkpoint", "c.pth", "--out", "o"], "INPUT"), (["search", "", "--query", "0"], "DIR"),
    (["learn", "v.mp4", "", "--out", "o"], "VIDEOS"), (["curate", "", "--out", "o"], "EMBED_DIR"),
    (["pretrain", "run.out=R", ""], "key=value"), (["flow", ""], "STORE")])
def test_an_empty_argument_is_refused_by_its_name(argv, name, tmp_path, capsys, monkeypatch):
    """``coclr embed --checkpoint c.pth --out o "$VIDEOS"`` with the variable unset embedded every video under the
    current folder (an empty path is "."): an empty positional argument is refused as an empty option value is."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "v.mp4").write_bytes(b"")
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and f"argument {name}: empty: give a value" in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["v.mp4"]


def test_a_config_file_is_named_when_it_is_a_folder_or_holds_an_unknown_option(tmp_path, capsys):
    (tmp_path / "typo.yaml").write_text("optim:\n  lrr: 1\n")
    (tmp_path / "dotted.yaml").write_text("optim.lr: 0.01\n")  # ("did you mean optim.lr for optim.lr?")
    (tmp_path / "section.yaml").write_text("optim: 5\n")  # (the error named no file)
    for config, said in ((tmp_path / "typo.yaml", "typo.yaml: unknown option(s): optim.lrr (known: epochs"),
                         (tmp_path / "dotted.yaml", "dotted.yaml: optim.lr: a file gives options nested under their "
                                                    "section (`optim:` then `  lr: ...` below it)"),
                         (tmp_path / "section.yaml", "section.yaml: optim: expected a mapping, got 5"),
                         (tmp_path, "is a folder, not a YAML file of options")):  # (it was "not found")
        assert main(["pretrain", "--config", str(config), f"data.store={tmp_path}", f"run.out={tmp_path / 'o'}"]) == 2
        assert said in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_small_refusals_and_names(tmp_path, capsys, monkeypatch):
    """A search of a folder that is not there says so (it said "not a coclr embed output folder"); a video given as
    the root of an index is a file (it was "not found"); --decode without --verify is refused (it was ignored); a
    view given twice to verify is checked once; a negative lr names its value."""
    from coclr.store.options import InfoOptions, VerifyOptions

    assert main(["search", str(tmp_path / "absent"), "--query", "0"]) == 2
    assert "absent: not found" in capsys.readouterr().err
    video = tmp_path / "x.mp4"
    video.write_bytes(b"")
    with pytest.raises(DataError, match="x.mp4: is a file, not a folder of videos"):
        folder_index(video)
    (tmp_path / "mine" / "walking").mkdir(parents=True)
    (tmp_path / "mine" / "walking" / "a.mp4").write_bytes(b"")
    monkeypatch.chdir(tmp_path / "mine")
    assert folder_index(".").name == "mine"  # an index of "." is named by the folder (it was '')
    (tmp_path / "link").symlink_to(tmp_path / "mine")
    assert folder_index(tmp_path / "link").name == "link"  # by the name given, not the link's target
    with pytest.raises(ConfigError, match="--decode: .* give --verify too"):
        InfoOptions(decode=True)
    assert VerifyOptions(view=["rgb", "rgb", "flow"]).view == ["rgb", "flow"]
    assert main(["pretrain", f"data.store={tmp_path}", f"run.out={tmp_path / 'o'}", "optim.lr=-1"]) == 2
    assert "optim.lr: must lie in (0, 1e+30], got -1" in capsys.readouterr().err


def test_embed_names_the_flag_of_a_refused_value(tmp_path, capsys):
    """A value given to ``coclr embed`` and refused was named by its settings key (``flow_bound: ...``), not by the
    flag the person typed (``--flow-bound``)."""
    from test_eval_helpers import save_tiny_encoder

    encoder = save_tiny_encoder(tmp_path / "rgb.pth", meta={"clip_settings": {"view": "rgb", "length": 8, "size": 32}})
    common = ["embed", str(tmp_path / "v.mp4"), "--out", str(tmp_path / "out"), "--checkpoint", str(encoder)]
    for flags, said in ((["--stride", "0"], "coclr embed: error: --stride: must be >= 1, got 0"),
                        (["--window-step", "0"], "error: --window-step: must be a whole number of frames, at least 1"),
                        (["--flow-bound", "5"], "error: --flow-bound: applies to a flow stream only")):
        assert main([*common, *flags]) == 2
        assert said in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_device_refused_names_the_flag_given(tmp_path, capsys):
    """``coclr learn --device cpu:3`` probed the videos, then was refused as ``run.device`` (an option of its
    children); ``coclr flow --device tpu`` named ``device``."""
    from coclr.synth.output import random_store
    from test_embed import moving_square, write_video

    for number in range(8):
        write_video(tmp_path / "videos" / f"v{number}.mp4", moving_square(4, seed=number))
    assert main(["learn", str(tmp_path / "videos"), "--out", str(tmp_path / "L"), "--device", "cpu:3"]) == 2
    err = capsys.readouterr().err
    assert "coclr learn: error: --device: must be auto, cpu, cuda or cuda:N, got 'cpu:3'" in err, err
    assert "probing" not in err and not (tmp_path / "L").exists()
    store = random_store(tmp_path / "store", videos=2, frames=3, size=(16, 16), views=("rgb",))
    from test_eval_helpers import save_tiny_encoder

    encoder = save_tiny_encoder(tmp_path / "rgb.pth", meta={"clip_settings": {"view": "rgb", "length": 8, "size": 32}})
    assert main(["eval", "retrieval", "--checkpoint", str(encoder), "--store", str(store), "--device", "cpu:3"]) == 2
    assert "--device: 'cpu:3': the CPU is one device, not numbered; give cpu" in capsys.readouterr().err
    assert main(["flow", str(store), "--backend", "dis", "--device", "tpu"]) == 2
    assert "coclr flow: error: --device: the dis backend runs on the CPU" in capsys.readouterr().err
