"""How options are read: an override's text as its option's type, YAML 1.2's numbers and booleans, each option
given once, values shown as they are typed."""

from __future__ import annotations

from pathlib import Path

import pytest

from coclr.config import load_config, parse_yaml
from coclr.errors import ConfigError
from coclr.train.config import PretrainConfig

BASE = ["data.store=store", "run.out=runs/r"]


def config(*overrides: str) -> PretrainConfig:
    return load_config(PretrainConfig, None, [*BASE[: 2 - any(o.startswith("run.out=") for o in overrides)],
                                              *overrides])


@pytest.mark.parametrize("override, attribute, value", [
    ("run.out=runs/c #2", "run.out", "runs/c #2"),  # YAML took " #2" for a comment: another folder continued
    ("run.out=001", "run.out", "001"),  # "expected a string, got 1"
    ("run.out=on", "run.out", "on"),  # (True)
    ("run.out=2024-01-01", "run.out", "2024-01-01"),  # (a date)
    ("optim.epochs=010", "optim.epochs", 10),  # YAML 1.1: 8
    ("optim.lr=1e-3", "optim.lr", 0.001),
    ("optim.milestones=[010, 20]", "optim.milestones", [10, 20]),
    ("run.deterministic=True", "run.deterministic", True),
    ("data.segment_frames=null", "data.segment_frames", None),
    ("data.segment_frames=None", "data.segment_frames", None),  # as --list-options printed it
    ("data.segment_frames=16", "data.segment_frames", 16),
    ("method.queue_size=16_384", "method.queue_size", 16384),  # (YAML 1.1 read it so)
])
def test_an_override_is_read_as_its_options_type(override: str, attribute: str, value) -> None:
    section, name = attribute.split(".")
    assert getattr(getattr(config(override), section), name) == value


@pytest.mark.parametrize("overrides, said", [
    (["optim.epochs=1:30"], "optim.epochs: expected an integer, got '1:30'"),  # YAML 1.1: 90
    (["optim.weight_decay=1:0"], "optim.weight_decay: expected a number, got '1:0'"),  # (60.0)
    (["run.deterministic=yes"], "run.deterministic: expected true or false, got 'yes'"),
    (["run.deterministic=tRuE"], "run.deterministic: expected true or false, got 'tRuE'"),  # (as a file reads it)
    (["optim.lr=nan"], "optim.lr: expected a finite number"),
    (["optim={1: 2}"], "unknown option(s): optim.1"),  # (a TypeError's traceback)
    ([" optim.lr=0.1"], "the key ' optim.lr' has spaces or an empty part in it; give it as one word of dotted names, "
                        "e.g. optim.lr=0.1"),  # ("unknown option(s):  optim", the space unseen)
    (["optim.lr =0.1"], "e.g. optim.lr=0.1"),  # ("did you mean optim.lr for optim.lr ?")
    (["optim..lr=1"], "e.g. optim.lr=1"),
])
def test_what_cannot_be_read_as_written_is_refused_naming_it(overrides: list[str], said: str) -> None:
    with pytest.raises(ConfigError) as error:
        config(*overrides)
    assert said in str(error.value)


def test_a_file_is_read_as_yaml_1_2(tmp_path: Path) -> None:
    assert parse_yaml("a: 010\nb: 1:30\nc: on\nd: 2024-01-01\ne: 1e-3\nf: 0x1F\ng: TRUE\nh: -5\ni: 1.5e3\nj: ~") == {
        "a": 10, "b": "1:30", "c": "on", "d": "2024-01-01", "e": 0.001, "f": 31, "g": True, "h": -5, "i": 1500.0,
        "j": None}
    path = tmp_path / "keys.yaml"
    path.write_text("1: 2\n")
    with pytest.raises(ConfigError, match=r"keys.yaml: unknown option\(s\): 1 \(known"):
        load_config(PretrainConfig, path, BASE)


def test_values_are_shown_as_they_are_typed(capsys) -> None:
    """Refusals and --list-options printed Python's None and True, which an override did not take back."""
    from coclr.cli import main
    from coclr.config import differences

    assert differences({"a": None, "b": True, "c": [False]}, {"a": 1, "b": False, "c": [True]}) == [
        "a=null (given 1)", "b=true (given false)", "c=[false] (given [true])"]
    assert main(["pretrain", "--list-options"]) == 0
    listed = capsys.readouterr().out
    assert "data.segment_frames = null" in listed and "run.deterministic = false" in listed
    assert not [line for line in listed.splitlines() if " = None" in line or " = True" in line]


def test_the_synthetic_datasets_listing_shows_the_presets_values(capsys) -> None:
    """--preset study --list-options printed the generator's defaults, not the values its overrides go over."""
    from coclr.cli import main
    from coclr.study.config import STUDY_SYNTH

    assert main(["data", "synth", "--preset", "study", "--list-options"]) == 0
    listed = dict(line.split(" = ") for line in capsys.readouterr().out.splitlines() if " = " in line)
    assert listed["train_scenes"] == str(STUDY_SYNTH["train_scenes"]) and listed["actor_cue"] == "1.0"
    assert main(["data", "synth", "--list-options"]) == 0
    assert "train_scenes = 24" in capsys.readouterr().out


def test_the_pipelines_listing_leaves_out_what_each_stage_sets(capsys) -> None:
    """It listed optim.epochs, method.name and the checkpoints, each refused when given to a pipeline."""
    from coclr.cli import main
    from coclr.train.config import PER_STAGE

    assert main(["pipeline", "--list-options"]) == 0
    listed = {line.split(" = ")[0] for line in capsys.readouterr().out.splitlines() if " = " in line}
    assert "pipeline.cycle_epochs" in listed and "optim.lr" in listed and not listed & set(PER_STAGE)


def test_an_unknown_option_is_answered_with_the_one_meant() -> None:
    """`lr=0.1` listed only the sections; `optim.lrr` only the section's options."""
    with pytest.raises(ConfigError, match=r"unknown option\(s\): lr \(known: .*\); did you mean optim.lr for lr\?$"):
        config("lr=0.1")
    with pytest.raises(ConfigError, match=r"did you mean optim.lr for optim.lrr\?$"):
        config("optim.lrr=0.1")
    with pytest.raises(ConfigError, match=r"unknown option\(s\): optim.zzz \(known: [a-z_, ]*\)$"):
        config("optim.zzz=1")  # nothing near: no guess


def test_a_home_relative_path_is_expanded(monkeypatch) -> None:
    """`run.out=~/runs/a` (the shell expands no tilde after `=`) wrote into a folder named "~" in the current one."""
    monkeypatch.setenv("HOME", "/home/someone")
    loaded = config("run.out=~/runs/a", "data.store=~/store")
    assert (loaded.run.out, loaded.data.store) == ("/home/someone/runs/a", "/home/someone/store")
    assert config("run.out=a~/b").run.out == "a~/b"


@pytest.mark.parametrize("argv, option", [
    (["pretrain", "--config", "a.yaml", "--config", "b.yaml"], "--config"),
    (["study", "--check", "--out", "a", "--out", "b"], "--out"),
    (["study", "--check", "--out", "a", "--seed", "1", "--seed", "2"], "--seed"),
    (["search", "E", "--query", "1", "-k", "3", "-k", "4"], "-k"),
])
def test_an_option_given_twice_is_refused(argv: list[str], option: str, tmp_path: Path, capsys, monkeypatch) -> None:
    """The first of two --config files was dropped without a word (the error then named a key of it as missing)."""
    from coclr.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    assert f"{option} given twice: the later would replace the earlier; give it once" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv, said", [
    (["pretrain", *BASE, "optim.lr=0.2", "optim.lr=0.1"],
     "'optim.lr=0.2' and 'optim.lr=0.1': the later would replace the earlier; give each option once"),
    (["pretrain", *BASE, "optim.epochs=1", "optim={lr: 0.1}"], "'optim.epochs=1' and 'optim={lr: 0.1}'"),
    (["study", "--check", "--out", "s", "seed=5", "--seed", "3"], "--seed and seed=: each gives the seed"),
    (["study", "--check", "--out", "s", "--seeds", "0", "1", "seed=4"], "--seeds and seed=: each gives the seed"),
    (["study", "--check", "--out", "s", "train.run.seed=7"], "train.run.seed: is set by the study for every stage"),
    (["study", "--check", "--out", "s", "train.data.view=flow"], "train.data.view: is set by the study"),
    (["study", "--check", "--out", "s", "eval.linear.seed=7"], "eval.linear.seed: is the study's seed"),
    (["study", "--check", "--out", "s", "train.optim=3"], "train.optim: expected a mapping"),  # (a traceback)
    (["study", "--check", "--out", "s", "columns=[linear, linear]"], "columns: must list columns, each once"),
    (["study", "--check", "--out", "s", "train.run.max_steps=1"], "train.run.max_steps: is set by the study"),
    (["study", "--check", "--out", "s", "data.synth={seed: 3}"], "data.synth.seed: is the study's seed"),
    (["data", "synth", "--out", "s", "height=100000"], "height: must be from 16 to 4320 pixels"),
    (["eval", "linear", "--checkpoint", "c.pth", "--store", "s", "--seed", "-1"], "seed: must be from 0 to 2**32"),
    (["pretrain", *BASE, "optim.schedule=constant", "optim.milestones=[1]"],  # (the lr stayed constant, unsaid)
     "optim.milestones: [1] are read only with optim.schedule=milestones (given constant)"),
    (["pipeline", *BASE, "optim.schedule=plateau", "pipeline.cycle_milestones=[1]"],
     "pipeline.cycle_milestones: [1] are read only with optim.schedule=milestones (given plateau)"),
    (["pipeline", *BASE, "optim.epochs=300"],  # (the default, given: dropped without a word; another was refused)
     "optim.epochs: is set by each stage of a pipeline: give pipeline.infonce_epochs and pipeline.cycle_epochs"),
    (["pipeline", *BASE, "method.name=infonce"], "method.name: is set by each stage of a pipeline"),
    (["pretrain", *BASE, "data.second_view= flow"], "data.second_view: invalid view name ' flow'"),  # (named no key)
    (["pretrain", *BASE, "data.view=motion"],  # (refused once training had started, its run folder left behind)
     "data.view: view 'motion': unknown kind; name it 'rgb', 'rgbdiff' or 'flow...' (a view's kind is read from"),
])
def test_a_command_line_that_would_lose_an_option_is_refused(argv: list[str], said: str, tmp_path: Path, capsys,
                                                            monkeypatch) -> None:
    """The later of two values replaced the earlier, and a study replaced what its train section set, without a
    word; a negative probe seed failed after the features were extracted."""
    from coclr.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], lines


def test_options_a_method_does_not_read_are_not_refused_and_the_first_refusal_is_the_cause() -> None:
    """The README's `method.topk=1 data.view=flow` on the InfoNCE config was refused ("data.second_view: must differ
    from view"), InfoNCE reading one view; `pipeline method.name=coclr` asked for a sampler checkpoint, then, given
    one, said the pipeline sets the method."""
    from coclr.train.config import PipelineConfig
    from conftest import REPO_ROOT

    for name in ("infonce", "ubernce"):
        loaded = load_config(PretrainConfig, REPO_ROOT / "configs" / f"ucf101_{name}.yaml",
                             ["method.topk=1", "data.view=flow"])
        assert loaded.data.view == loaded.data.second_view == "flow"
    assert config("method.queue_size=4").method.topk == 5  # InfoNCE mines nothing
    with pytest.raises(ConfigError, match="data.second_view: must differ from data.view .'flow'.: cmc reads both"):
        config("method.name=cmc", "data.view=flow")
    with pytest.raises(ConfigError, match="method.topk: must be smaller than queue_size"):
        config("method.name=coclr", "method.queue_size=4", "method.sampler_checkpoint=x.pth")
    with pytest.raises(ConfigError, match="method.name: is set by each stage of a pipeline"):
        load_config(PipelineConfig, None, [*BASE, "method.name=coclr"])
    with pytest.raises(ConfigError, match="data.second_view: must differ from data.view .'flow'.: a pipeline"):
        load_config(PipelineConfig, None, [*BASE, "data.view=flow"])


@pytest.mark.parametrize("overrides, said", [
    (["method.name=infonce", "method.sampler_checkpoint=f.pth"], "method.sampler_checkpoint: is read by alternating "
                                                                 "coclr only .*; infonce reads none"),
    (["method.name=coclr", "method.simultaneous=true", "method.sampler_checkpoint=f.pth"],
     "method.sampler_checkpoint: .*coclr simultaneous reads none"),
    (["method.name=infonce", "method.second_init_checkpoint=f.pth"],
     "method.second_init_checkpoint: starts the second view's encoder .*; infonce trains one"),
    (["method.name=coclr", "method.sampler_checkpoint=f.pth", "method.second_init_checkpoint=f.pth"],
     "method.second_init_checkpoint: .*coclr trains one")])
def test_a_checkpoint_the_method_never_reads_is_refused(overrides, said) -> None:
    """Simultaneous CoCLR given a sampler (and no second start) trained its flow encoder from random weights while
    the user believed their flow checkpoint was used."""
    with pytest.raises(ConfigError, match=said):
        config(*overrides)
    assert config("method.name=cmc", "method.second_init_checkpoint=f.pth").method.second_init_checkpoint == "f.pth"

def test_a_file_s_wrong_values_name_the_file_and_every_unknown_key_is_named(tmp_path: Path) -> None:
    """A wrong type in a file was "optim.lr: expected a number" without the file; of three unknown keys in two
    sections, only the first section's was named; an empty section ("optim:") was "expected a mapping, got None"."""
    path = tmp_path / "options.yaml"
    path.write_text("optim:\n  lr: abc\n")
    with pytest.raises(ConfigError, match=r"options.yaml: optim.lr: expected a number, got 'abc'"):
        load_config(PretrainConfig, path, BASE)
    path.write_text("optim:\n  lrr: 1\ndata:\n  foo: 1\nrunn: {x: 2}\n")
    with pytest.raises(ConfigError, match=r"options.yaml: unknown option\(s\): runn, optim.lrr, data.foo"):
        load_config(PretrainConfig, path, BASE)
    path.write_text("optim:\nrun:\n  seed: 3\n")
    loaded = load_config(PretrainConfig, path, BASE)
    assert loaded.optim == PretrainConfig().optim and loaded.run.seed == 3


def test_the_day_s_review(tmp_path: Path, capsys) -> None:
    """A study recorded '1e-4' (YAML 1.1's text) where today's reading gives 0.0001: its folder continues; `flow`
    and `study --seeds` refuse an option given twice too; an override `optim=null` does not drop a file's section
    (a file's empty section alone takes its defaults); `!!int 0b1` is one line; a study's mapping values keep a
    '#' and take None; --list-options shows a mapping's values as typed."""
    import yaml

    from coclr.cli import main
    from coclr.config import value_text
    from coclr.study.config import StudyConfig
    from coclr.study.plan import options_record
    from coclr.study.run import STUDY_FOLDER

    recorded = options_record(load_config(StudyConfig, None, []))
    recorded["train"]["optim"]["lr"] = "1e-4"
    recorded["eval"]["linear"]["lrs"] = ["1e-3", "1e-2"]
    given = options_record(load_config(StudyConfig, None, ["train.optim.lr=1e-4", "eval.linear.lrs=[1e-3, 1e-2]"]))
    assert given["train"]["optim"]["lr"] == 0.0001 and STUDY_FOLDER.check(tmp_path, recorded, given)
    with pytest.raises(Exception, match=r"train.optim.lr=0.0001 \(given 0.0002\)"):
        STUDY_FOLDER.check(tmp_path, recorded, options_record(load_config(StudyConfig, None, [
            "train.optim.lr=2e-4", "eval.linear.lrs=[1e-3, 1e-2]"])))
    for argv in (["flow", str(tmp_path / "none"), "tau=0.1", "tau=0.2"],
                 ["study", "--check", "--out", str(tmp_path / "s"), "--seeds", "1", "2", "schedule.cycles=1",
                  "schedule.cycles=7"]):
        assert main(argv) == 2
        assert "the later would replace the earlier" in capsys.readouterr().err
    path = tmp_path / "options.yaml"
    path.write_text("optim: {lr: 0.5, epochs: 3}\n")
    with pytest.raises(ConfigError, match="optim: expected a mapping, got None"):
        load_config(PretrainConfig, path, [*BASE, "optim=null"])
    with pytest.raises(ConfigError, match="'0b1' is not a YAML 1.2 integer"):
        config("optim.milestones=[!!int 0b1]")
    with pytest.raises(yaml.YAMLError):
        parse_yaml("a: !!int 0X1F")
    study = load_config(StudyConfig, None, ["train.method.sampler_checkpoint=a #b", "train.data.segment_frames=None"])
    assert study.train["method"]["sampler_checkpoint"] == "a #b" and study.train["data"]["segment_frames"] is None
    assert value_text({"a": None, "b": [True]}) == "{a: null, b: [true]}"
    assert main(["study", "--list-options"]) == 0
    assert not [line for line in capsys.readouterr().out.splitlines() if "None" in line or "True" in line]


def test_coclr_flow_refuses_an_option_given_before_and_after_its_store(tmp_path, capsys) -> None:
    """Its options after STORE are parsed apart: `--workers 2 S --workers 3` used 3 without a word."""
    from coclr.cli import main

    for argv in (["flow", "--workers", "2", str(tmp_path), "--workers", "3"],
                 ["flow", str(tmp_path), "--workers", "2", "--workers", "3", "--list-options"]):
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == 2 and "--workers given twice" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["!!float abc", "!!bool maybe", "!!float", "!!timestamp notadate",
                                  "!!timestamp 2024-13-45"])
def test_a_tagged_value_its_tag_cannot_make_is_one_line(tmp_path, text) -> None:
    """PyYAML's constructors raise ValueError, KeyError, IndexError ... (a traceback), not a YAML error."""
    path = tmp_path / "tagged.yaml"
    path.write_text(f"optim:\n  lr: {text}\n")
    with pytest.raises(ConfigError, match=r"tagged.yaml: invalid YAML: a tagged value its tag cannot make"):
        load_config(PretrainConfig, path, BASE)
    with pytest.raises(ConfigError, match=r"cannot parse the value as YAML"):
        config(f"optim.milestones=[{text}]")


def test_integers_past_a_c_long_are_refused_in_one_line(tmp_path) -> None:
    """A 401-digit lr in a file overflowed math.isfinite; a 22-digit segment_frames overflowed NumPy."""
    path = tmp_path / "huge.yaml"
    path.write_text(f"optim:\n  lr: 1{'0' * 400}\n")
    with pytest.raises(ConfigError, match=r"optim.lr: expected a finite number, got an integer of 401 digits"):
        load_config(PretrainConfig, path, BASE)
    with pytest.raises(ConfigError, match=r"data.segment_frames: expected an integer of at most 2\*\*63 - 1"):
        config("data.segment_frames=1000000000000000000000")
    assert config(f"data.segment_frames={2**63 - 1}").data.segment_frames == 2**63 - 1
    path.write_text(f"optim:\n  lr: 1{'0' * 20}\n")  # a float option takes an integer as far as a float goes
    assert load_config(PretrainConfig, path, BASE).optim.lr == 1e20


def test_a_home_relative_value_after_a_flags_equals_sign_is_expanded(tmp_path, monkeypatch, capsys) -> None:
    """The shell leaves `--out=~/x` as typed: a folder named '~' was made in the working folder."""
    from coclr.cli import main

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    assert main(["data", "synth", "--out=~/store", "--workers", "0", "train_scenes=2", "test_scenes=2",
                 "num_classes=2", "actions_per_scene=1", "frames=4"]) == 0
    assert (home / "store").is_dir() and not (work / "~").exists()


def test_a_refused_flag_is_named_as_typed(tmp_path, capsys) -> None:
    """`--probe-batch-size 1` was refused as "batch_size: ...", the name of the command's other flag --batch-size."""
    from coclr.cli import main
    from coclr.models import build_encoder, save_encoder

    checkpoint = save_encoder(tmp_path / "e.pth", build_encoder(width=0.125))
    common = ["eval", "linear", "--checkpoint", str(checkpoint), "--store", str(tmp_path / "none")]
    assert main([*common, "--probe-batch-size", "1"]) == 2
    assert "error: --probe-batch-size: must be >= 2" in capsys.readouterr().err
    assert main([*common, "--batch-size", "0"]) == 2
    assert "error: --batch-size: must be >= 1" in capsys.readouterr().err
    assert main([*common, "--size", "0"]) == 2  # (given, it reaches the clips through what the checkpoint records)
    assert "error: --size: must be >= 32" in capsys.readouterr().err


def test_a_quoted_boolean_is_said_to_be_text(tmp_path) -> None:
    """`progress: "true"` was refused as "expected true or false, got 'true'", which reads as a contradiction."""
    path = tmp_path / "quoted.yaml"
    path.write_text('run:\n  progress: "true"\n')
    with pytest.raises(ConfigError, match=r"run.progress: expected true or false, got 'true' as quoted text; leave"):
        load_config(PretrainConfig, path, BASE)
    with pytest.raises(ConfigError, match=r"run.progress: expected true or false, got 'yes'$"):
        config("run.progress=yes")


def test_an_on_off_flag_given_both_ways_is_refused(tmp_path, capsys) -> None:
    """`--amp --no-amp` was taken, the last one winning without a word (as a value option given twice was)."""
    from coclr.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(["eval", "linear", "--checkpoint", "c.pth", "--store", "s", "--amp", "--no-amp"])
    assert stopped.value.code == 2
    assert "--amp/--no-amp given twice" in capsys.readouterr().err


def test_a_list_split_by_the_shell_says_to_quote_it() -> None:
    """The README's `optim.milestones=[200, 250]`, typed as shown, reached the command as two words: "expected the
    node content, but found '<stream end>'", and no word of why."""
    from coclr.config import parse_overrides

    with pytest.raises(ConfigError, match=r"the shell split it at a space: quote the whole override "
                       r"\('optim\.milestones=\[200, 250\]'\) or leave out the spaces$"):
        parse_overrides(["optim.milestones=[200,", "250]"])
    for given in (["optim.milestones=[200, ]]"], ["optim.milestones=[200,250"], ["optim.milestones=[200,", "a=1"]):
        with pytest.raises(ConfigError) as caught:  # (a value wrong as typed, not split: no such hint)
            parse_overrides(given)
        assert "shell" not in str(caught.value), given
