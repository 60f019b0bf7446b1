"""`coclr study` and `coclr demo`: every row and column of Table 1 from one config, its plan, its scheduler, its
refusals and its results, on reduced sizes (1 epoch per stage)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from coclr.config import load_config
from coclr.errors import CheckpointError, CoclrError, ConfigError
from coclr.flow.options import FlowOptions
from coclr.jobs.scheduler import Job, run_jobs, wait_for_an_exit
from coclr.jobs.tasks import Flow, read_task_file
from coclr.study.config import QUICK_ROWS, ROWS, STUDY_SYNTH, STUDY_TRAIN, StudyConfig
from coclr.study.plan import plan_study
from coclr.study.results import claims, results_markdown, seeds_markdown, summarise_seeds
from coclr.train.config import MethodOptions, PipelineConfig, PretrainConfig
from conftest import REPO_ROOT
from test_train import with_options

REDUCED = ["data.synth={train_scenes: 4, test_scenes: 2, num_classes: 4, actions_per_scene: 4, clips_per_action: 1, "
           "frames: 10, motions: [translate_up, zoom_in, rotate, circle]}", "data.flow_backend=dis",
           "data.flow_bound=5", "train.run.batch_size=8", "train.method.queue_size=8", "train.method.topk=2",
           "train.optim.warmup_epochs=0.5", "train.method.own_positive_epochs=0.5", "schedule.infonce_epochs=1",
           "schedule.cycle_epochs=1", "schedule.decay_epochs=0",  # one epoch per stage: nothing to decay
           "eval.finetune={epochs: 1, milestones: []}", "schedule.supervised={epochs: 1}"]
ALL_ROWS = "rows=[" + ", ".join(ROWS) + "]"


def _coclr(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coclr", *args], capture_output=True, text=True, timeout=timeout)


CYCLE_EPOCHS = 5
"""The study's stages take no step until their queue is full (64 keys: 8 iterations of 8, four epochs of the 16
train clips); with five epochs each stage trains, so K and the mining reach the encoders."""
STUDY_OPTIONS = with_options(REDUCED, "train.method.queue_size=64", f"schedule.infonce_epochs={CYCLE_EPOCHS}",
                             f"schedule.cycle_epochs={CYCLE_EPOCHS}", "processes=2")  # K=50 < queue
STUDY_ARGS = ["--config", str(REPO_ROOT / "configs" / "study_demo.yaml"), "--seed", "3", *STUDY_OPTIONS]
"""configs/study_demo.yaml reduced: the quick study's rows and options (``coclr demo``'s) with every other row of
Table 1 and the finetune column."""


def expected_status(out: Path) -> int:
    """The exit status a finished study in ``out`` (one seed's, or ``--seeds``') must end with: 3 where an input
    failed or every row of a seed collapsed (at these reduced sizes every row, the supervised one too, can), else 0."""
    from coclr.study.results import every_row_collapsed

    seeds = out / "seeds.json"
    if seeds.is_file():
        summary = json.loads(seeds.read_text())
        return 3 if summary["failed_inputs"] or summary["all_collapsed"] else 0
    results = json.loads((out / "results.json").read_text())
    return 3 if results["failed_inputs"] or every_row_collapsed(results["rows"]) else 0


@pytest.fixture(scope="module")
def table_1(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The study of :data:`STUDY_ARGS`, run once for the tests that read its results (the quick study's rows are
    among its rows: ``coclr demo`` runs the same commands for them); returns its folder and the command's output."""
    out = tmp_path_factory.mktemp("study") / "study"
    result = _coclr("study", "--out", str(out), *STUDY_ARGS, timeout=900)
    assert (out / "results.json").is_file(), result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == expected_status(out), result.stdout[-3000:] + result.stderr[-3000:]
    return out, result


@pytest.mark.slow
def test_every_row_and_column_of_table_1(table_1) -> None:
    """configs/study_demo.yaml reduced: the eleven rows, each with linear probe, finetune and R@1, the paper's
    numbers beside them and every claim of the paper checked."""
    out, _ = table_1
    results = json.loads((out / "results.json").read_text())
    rows = yaml.safe_load((REPO_ROOT / "configs" / "study_demo.yaml").read_text())["rows"]
    assert len(rows) == 11 and [row["row"] for row in results["rows"]] == rows
    for row in results["rows"]:
        for value in (row["linear_top1"], row["finetune_top1"], row["retrieval"]["R@1"]):
            assert 0 <= value <= 100, row
    markdown = (out / "results.md").read_text()
    table = markdown[markdown.index("| Method"):markdown.index("\n\n", markdown.index("| Method"))].splitlines()
    assert table[0] == ("| Method | Input | Labels | Linear probe | paper | Finetune | paper | R@1 | paper | R@5 "
                        "| R@10 | R@20 |")
    assert len(table) == 2 + len(rows)
    assert re.match(r"\| Cross-Ent\.( ‡)? \| RGB \| ✓ \| [\d.]+ \| - \| [\d.]+ \| 77\.0 \| [\d.]+ \| 73\.5 \|",
                    table[5])
    assert re.match(r"\| CoCLR K=50( ‡)? \| RGB \| ✗ \| [\d.]+ \| 68\.3 \|", table[11])
    for claim in ("CoCLR-RGB > CMC-RGB (finetune)", "CoCLR-RGB K=5 >= K=1 and K=50 (R@1)",
                  "CoCLR-RGB alternating >= sim (linear probe)",
                  "CoCLR two-stream above every other self-supervised row (R@1)", "CoCLR-Flow > InfoNCE-Flow (R@1)"):
        assert claim in results["claims"] and f"- {claim}: " in markdown
    # The ablations start from the shared InfoNCE encoders; the two-stream row fuses the two finetunes.
    k1 = yaml.safe_load((out / "configs" / "coclr_k1.yaml").read_text())
    assert k1["pipeline"]["infonce_from"] == str(out / "pipeline") and k1["method"]["topk"] == 1
    assert not (out / "coclr_k1" / "infonce_rgb").exists() and (out / "coclr_k1" / "cycle2_rgb").is_dir()
    assert (out / "coclr_sim" / "cycle2_sim" / "encoder_rgb.pth").is_file()
    from coclr.atomic import file_sha256

    # Each CoCLR row trains (its stages take steps once the queue is full): K=1, K=2 and K=50 give three encoders.
    last = {folder: file_sha256(out / folder / "cycle2_rgb" / "encoder_rgb.pth")
            for folder in ("pipeline", "coclr_k1", "coclr_k50")}
    assert len(set(last.values())) == 3, last

    two_stream = json.loads((out / "eval" / "coclr_two_stream_finetune.json").read_text())
    coclr_rgb = file_sha256(out / "pipeline" / "cycle2_rgb" / "encoder_rgb.pth")[:12]
    assert Path(two_stream["per_stream"][0]["probabilities"]).parent.name == f"rgb_{coclr_rgb}_with_flow"
    assert (out / "logs" / "finetune_coclr_rgb.log").is_file()  # that folder's work: the single-stream job's


@pytest.mark.slow
def test_the_quick_studys_rows_write_every_result(table_1, tmp_path: Path) -> None:
    """The quick study's rows, stages, tables, plot, gallery, configurations and store, as ``coclr demo`` writes
    them: the demo plans the same commands, the same data and the same evaluation as the study of the fixture for
    them (checked first; the next test checks that the demo is the quick study); a rerun reproduces them, another
    option is refused."""
    out, result = table_1
    demo = _coclr("demo", "--out", str(tmp_path / "demo"), "--seed", "3", *REDUCED, "--check")
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert f"6 rows ({', '.join(QUICK_ROWS)}), columns linear, retrieval" in demo.stdout, demo.stdout
    options = [*STUDY_OPTIONS, "seed=3"]
    quick = plan_study(load_config(StudyConfig, overrides=options), out)
    study = plan_study(load_config(StudyConfig, REPO_ROOT / "configs" / "study_demo.yaml", options), out)
    jobs = {job.name: job.task for job in study.jobs}
    assert {job.name: job.task for job in quick.jobs}.items() <= jobs.items()
    assert all(study.configs[name] == config for name, config in quick.configs.items())
    assert (quick.synth, quick.clips, quick.probe) == (study.synth, study.clips, study.probe)
    results = json.loads((out / "results.json").read_text())
    assert results["seed"] == 3 and results["wall_seconds"] > 0
    by_key = {row["row"]: row for row in results["rows"]}
    rows = {(by_key[key]["method"], by_key[key]["view"]): by_key[key] for key in QUICK_ROWS}
    assert set(rows) == {("InfoNCE", "RGB"), ("InfoNCE", "Flow"), ("UberNCE", "RGB"), ("CoCLR", "RGB"),
                         ("CoCLR", "Flow"), ("CoCLR", "RGB+Flow")}
    for row in rows.values():
        assert 0 <= row["linear_top1"] <= 100
        recall = [row["retrieval"][f"R@{k}"] for k in (1, 5, 10, 20)]
        assert all(0 <= r <= 100 for r in recall) and recall == sorted(recall)
    assert rows[("CoCLR", "RGB")]["paper"] == {"linear": 70.2, "finetune": 81.4, "retrieval": 51.8}
    markdown = (out / "results.md").read_text()
    assert re.search(r"\| CoCLR( ‡)? \| RGB\+Flow \|", markdown) and "gap closed" in markdown
    assert "| paper |" in markdown and "degenerate features" in markdown  # ‡: 1 epoch per stage, collapsed
    stages = results["stages"]
    assert [(s["stage"], s["view"]) for s in stages] == [
        ("infonce_rgb", "RGB"), ("infonce_flow", "Flow"), ("cycle1_rgb", "RGB"), ("cycle1_flow", "Flow"),
        ("cycle2_rgb", "RGB"), ("cycle2_flow", "Flow")]
    assert stages[-1]["R@1"] == rows[("CoCLR", "Flow")]["retrieval"]["R@1"]
    assert all(s["mined_precision"] is None for s in stages)  # 2 steps per stage: nothing logged (log_every 50)
    assert "| cycle2_rgb | RGB | " in markdown
    table = (out / "table.md").read_text()  # Labels read from the checkpoints: UberNCE's is a training one
    for row in (r"\| InfoNCE( ‡)? \| RGB \| ✗ \|", r"\| UberNCE( ‡)? \| RGB \| ✓ \|", r"\| CoCLR( ‡)? \| R\+F \| ✗ \|"):
        assert re.search(row, table), table  # ‡: one epoch per stage leaves these tiny encoders collapsed
    assert (out / "stage_recall.png").stat().st_size > 1000
    gallery = (out / "gallery.html").read_text()
    assert "data:image/gif;base64," in gallery and "http://" not in gallery and "https://" not in gallery
    manifest = json.loads((out / "pipeline" / "manifest.json").read_text())
    assert [s["name"] for s in manifest["stages"]] == ["infonce_rgb", "infonce_flow", "cycle1_rgb", "cycle1_flow",
                                                       "cycle2_rgb", "cycle2_flow"]
    assert all(s["status"] == "done" for s in manifest["stages"])
    # CoCLR's dropped own key stays a negative, as in the authors' code (docs/synth.md).
    method = manifest["config"]["method"]
    reference = MethodOptions()
    assert (method["own_drop_prob"], method["dropped_own_as_negative"]) == (reference.own_drop_prob, True)
    assert method["own_positive_epochs"] == 0.5 and reference.own_positive_epochs == 0  # the study's, passed on
    # The oracle uses CoCLR's loss by default, so that only the positive set differs ...
    oracle_config = yaml.safe_load((out / "configs" / "ubernce_rgb.yaml").read_text())
    oracle = oracle_config["method"]
    assert (oracle["name"], oracle["loss_form"]) == ("ubernce", "mil") and method["loss_form"] == "auto"
    # ... and starts where CoCLR-RGB starts, for as many epochs as CoCLR-RGB's two stages.
    assert Path(oracle["init_checkpoint"]) == out / "pipeline" / "infonce_rgb" / "checkpoint_last.pth"
    assert oracle_config["optim"]["epochs"] == 2 * CYCLE_EPOCHS
    # InfoNCE trains at lr; the stages that start from its encoders (the oracle, CoCLR) at cycle_lr.
    defaults = StudyConfig()
    lr, cycle_lr = defaults.train["optim"]["lr"], defaults.schedule.cycle_lr
    assert oracle_config["optim"]["lr"] == cycle_lr != lr
    stage_lrs = {s["name"]: torch.load(out / "pipeline" / s["checkpoint"], weights_only=True)["config"]["optim"]["lr"]
                 for s in manifest["stages"]}
    assert stage_lrs == {"infonce_rgb": lr, "infonce_flow": lr, **{f"cycle{c}_{v}": cycle_lr for c in (1, 2)
                                                                   for v in ("rgb", "flow")}}
    oracle_log = (out / "ubernce_rgb" / "log.jsonl").read_text()
    assert sum('"epoch_loss"' in line for line in oracle_log.splitlines()) == 2 * CYCLE_EPOCHS
    stage = yaml.safe_load((out / "configs" / "infonce_rgb.yaml").read_text())
    assert stage["augment"]["crop_area"] == STUDY_TRAIN["augment"]["crop_area"] and stage["augment"]["blur_p"] == 0.0
    # Every training process keeps the decoded frames in memory (reads are the same; tests/test_datasets.py).
    assert stage["data"]["cache_mb"] == oracle_config["data"]["cache_mb"] == STUDY_TRAIN["data"]["cache_mb"] > 0
    synth = json.loads((out / "store" / "store.json").read_text())["meta"]["synth"]
    assert synth["actor_cue"] == STUDY_SYNTH["actor_cue"] and synth["train_scenes"] == 4 and synth["seed"] == 3
    classes = json.loads((out / "store" / "index.json").read_text())["classes"]
    assert classes == ["translate_up", "zoom_in", "rotate", "circle"]
    # Flow of the 16 train clips first; the 8 test clips' flow beside the training, at the same bound.
    assert "flow: 16 done" in result.stdout and "flow: 8 done" in (out / "logs" / "flow_test.log").read_text()
    assert json.loads((out / "store" / "store.json").read_text())["meta"]["flow_bound_px"] == 5.0
    # Running it again finds everything done: each record of the same inputs stands, and one evaluated again (its
    # record deleted) reproduces the same numbers.
    records = {path.name: path.stat().st_mtime_ns for path in (out / "eval").glob("*.json")}
    (out / "eval" / "infonce_rgb_linear.json").unlink()
    again = _coclr("study", "--out", str(out), *STUDY_ARGS)
    assert again.returncode == result.returncode, again.stderr[-3000:]
    assert json.loads((out / "results.json").read_text())["rows"] == results["rows"]
    rewritten = {path.name for path in (out / "eval").glob("*.json") if path.stat().st_mtime_ns != records[path.name]}
    assert rewritten == {"infonce_rgb_linear.json"} and len(records) == 33
    # With another option it refuses at once, naming the option, and leaves the results as they were; how many
    # commands run at once may change.
    before = (out / "results.json").read_text()
    other = _coclr("study", "--out", str(out), *with_options(STUDY_ARGS, "train.method.topk=3"))
    assert other.returncode != 0 and "train.method.topk=2 (given 3)" in other.stderr, other.stderr[-3000:]
    assert (out / "results.json").read_text() == before
    assert _coclr("study", "--out", str(out), *with_options(STUDY_ARGS, "processes=1"), "--check").returncode == 0


def test_the_quick_study_plans_the_demo_and_checks_every_option(tmp_path: Path) -> None:
    """The defaults are the quick study of `coclr demo`: six rows, two columns, the demo's training; a bad option
    is named before any work, nested ones included."""
    config = load_config(StudyConfig)
    assert config.rows == QUICK_ROWS and config.columns == ["linear", "retrieval"]
    plan = plan_study(config, tmp_path / "out")
    assert [job.name for job in plan.jobs] == ["infonce_rgb", "infonce_flow", "infonce", "coclr", "ubernce_rgb",
                                              "flow_test"]
    assert plan.synth.actor_cue == STUDY_SYNTH["actor_cue"] and plan.synth.seed == 0
    infonce = plan.configs["infonce_rgb"]
    assert (infonce["optim"]["epochs"], infonce["optim"]["milestones"], infonce["optim"]["schedule"]) == (
        40, [35], "milestones")
    assert (plan.clips.length, plan.clips.size, plan.clips.batch_size) == (8, 32, 64)
    changed = load_config(StudyConfig, overrides=["train.optim.lr=0.01", "data.synth.actor_cue=0.5"])
    assert changed.train["optim"] == {"lr": 0.01, "warmup_epochs": 2.0} and changed.train["model"]["width"] == 0.125
    assert plan_study(changed, tmp_path / "other").synth.train_scenes == STUDY_SYNTH["train_scenes"]
    for empty in ("train.optim=null", "train.method=null"):  # an empty section: coclr pretrain's defaults (a traceback)
        emptied = plan_study(load_config(StudyConfig, overrides=[empty]), tmp_path / "empty")
        assert emptied.configs["infonce_rgb"]["optim"]["lr"] == PretrainConfig().optim.lr
    for override, key in (("rows=[coclr_k2_rgb]", "rows"), ("columns=[mAP]", "columns"),
                          ("train.method.tpok=3", r"train \(the .*\): unknown option\(s\): method\.tpok"),
                          ("train.optim.lr=-1", "optim.lr"), ("data.synth.colour=1", r"data\.synth\.colour"),
                          ("schedule.decay_epochs=20", "decay_epochs"), ("eval.linear.lrs=[]", r"eval\.linear\.lrs"),
                          ("data.flow_bound=-5", "flow_bound"), ("data.source=ucf101", r"data\.root")):
        with pytest.raises(ConfigError, match=key):
            plan_study(load_config(StudyConfig, overrides=[override]), tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_the_ucf101_config_is_checked_on_a_small_ucf101_folder(tmp_path: Path, capsys) -> None:
    """configs/study_ucf101.yaml: every option known, the split files read and every video found before work."""
    from coclr.cli import main

    lists = tmp_path / "ucfTrainTestlist"
    lists.mkdir()
    (lists / "classInd.txt").write_text("1 ApplyEyeMakeup\n2 Archery\n")
    train = [f"{name}/v_{name}_g{group:02d}_c01.avi {label}" for label, name in ((1, "ApplyEyeMakeup"), (2, "Archery"))
             for group in range(8, 24)]  # a batch of 32: the plan refuses a training split smaller than one batch
    test = ["ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01.avi", "Archery/v_Archery_g01_c02.avi"]
    (lists / "trainlist01.txt").write_text("\n".join(train) + "\n")
    (lists / "testlist01.txt").write_text("\n".join(test) + "\n")
    for line in train + test:
        video = tmp_path / "UCF-101" / line.split()[0]
        video.parent.mkdir(parents=True, exist_ok=True)
        video.write_bytes(b"")
    args = ["study", "--config", str(REPO_ROOT / "configs" / "study_ucf101.yaml"), "--check", "--out",
            str(tmp_path / "out"), f"data.root={tmp_path / 'UCF-101'}", f"data.annotations={lists}",
            f"data.store={tmp_path / 'store'}"]
    assert main(args) == 0
    plan = capsys.readouterr().out
    assert "11 rows" in plan and "clips 32x128" in plan and "cross_entropy_rgb: finetune (rgb), 500 epochs" in plan
    config = load_config(StudyConfig, REPO_ROOT / "configs" / "study_ucf101.yaml")  # the paper's recipe
    assert (config.train["method"]["momentum"], config.train["method"]["queue_size"]) == (0.999, 2048)
    assert config.train["augment"]["blur_p"] == 0.5 and config.train["data"]["cache_mb"] == 0
    assert not (tmp_path / "out").exists() and not (tmp_path / "store").exists()
    (tmp_path / "UCF-101" / test[1]).unlink()
    assert main(args) == 2
    assert "Archery/v_Archery_g01_c02.avi" in capsys.readouterr().err
    assert main([*args, "schedule.cycel_epochs=3"]) == 2
    assert "schedule.cycel_epochs" in capsys.readouterr().err


def test_gpus_that_cannot_take_effect_are_refused_before_any_work(tmp_path: Path, capsys, monkeypatch) -> None:
    """gpus=[99] ran every job on the CPU without a word: a GPU the machine lacks, or jobs set to train on the CPU,
    make gpus do nothing."""
    import torch

    from coclr.cli import main

    count = torch.cuda.device_count()
    assert main(["study", "--out", str(tmp_path / "s"), "rows=[infonce_rgb]", f"gpus=[{count}]", "--check"]) == 2
    assert f"gpus: no GPU {count} on this machine (it has {count} CUDA device(s)" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
    from coclr.config import from_dict
    from coclr.errors import ConfigError
    from coclr.study.config import StudyConfig
    from coclr.study.run import check_gpus

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # a machine with two GPUs
    with pytest.raises(ConfigError, match=r"gpus: \[0\] given, but the jobs train on cpu \(train.run.device\)"):
        check_gpus(from_dict(StudyConfig, {"gpus": [0]}))  # the study's training runs on the CPU by default
    for device in ("cuda", "auto", None):  # auto, none: CUDA where there is one (the UCF101 study's config: auto)
        check_gpus(from_dict(StudyConfig, {"gpus": [0, 1], "train": {"run": {"device": device}}}))
    monkeypatch.undo()
    # a worker count's 0 is named by what it means here (it said "work in this process")
    assert main(["study", "--out", str(tmp_path / "w"), "data.flow_workers=-1", "--check"]) == 2
    assert "data.flow_workers: must be 0 or more (0: the study's processes), got -1" in capsys.readouterr().err
    # without gpus, a device this machine lacks passed --check and failed every job after the data step
    if not torch.cuda.is_available():
        assert main(["study", "--out", str(tmp_path / "c"), "rows=[infonce_rgb]", "train.run.device=cuda",
                     "--check"]) == 2
        assert "train.run.device: 'cuda' was asked for but CUDA is not available" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"train\.run\.device: 'gpu' is not a torch device"):
        check_gpus(from_dict(StudyConfig, {"train": {"run": {"device": "gpu"}}}))


def test_seeds_are_read_before_the_options_and_each_gets_its_folder(tmp_path: Path, capsys) -> None:
    from coclr.cli import main

    assert main(["study", "--out", str(tmp_path / "s"), "--seeds", "4", "5", "rows=[infonce_rgb]", "--check"]) == 0
    out = capsys.readouterr().out
    assert f"study in {tmp_path / 's' / 'seed4'}: 1 rows (infonce_rgb)" in out and "seed 5" in out
    from coclr.runfolder import claim_folder
    from coclr.study.run import STUDY_FOLDER

    with claim_folder(tmp_path / "s" / "seed5", STUDY_FOLDER, {"seed": 5, "rows": ["other"]}):
        pass  # seed 5 begun with other options
    assert main(["study", "--out", str(tmp_path / "s"), "--seeds", "4", "5", "rows=[infonce_rgb]"]) == 2
    assert "seed5 holds a study run with" in capsys.readouterr().err
    assert not (tmp_path / "s" / "seed4").exists()  # refused before seed 4's work, not after it
    with claim_folder(tmp_path / "one", STUDY_FOLDER, {"seed": 0}):
        (tmp_path / "one" / "eval").mkdir()  # a study of one seed: its files are coclr study's
    assert main(["study", "--out", str(tmp_path / "one"), "--seeds", "0", "1", "--check"]) == 2
    assert "holds a study of one seed; --seeds writes a folder per seed" in capsys.readouterr().err
    # a seed out of range is named as given (it was "train (the CoCLR pipeline): run.seed", which a study refuses)
    assert main(["study", "--out", str(tmp_path / "big"), "--seeds", "1", "5000000000", "--check"]) == 2
    assert "error: --seeds: must be from 0 to 2**32 - 1, got 5000000000" in capsys.readouterr().err
    # --seeds followed by options only ran a study of one seed without a word
    assert main(["study", "--out", str(tmp_path / "none"), "--seeds", "rows=[infonce_rgb]", "--check"]) == 2
    assert "error: --seeds: give at least one seed before the key=value options" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()
    assert main(["study", "--out", str(tmp_path / "big"), "--seed", "5000000000", "--check"]) == 2
    assert "error: seed: must be from 0 to 2**32 - 1" in capsys.readouterr().err
    # a finetune test short side the crops do not fit: said by --check, not after the finetuning's every epoch
    assert main(["study", "--out", str(tmp_path / "crops"), "eval.finetune.ten_crop_short_side=10",
                 "columns=[finetune]", "--check"]) == 2
    assert "error: eval.finetune.ten_crop_short_side 10: the ten 32 px crops do not fit" in capsys.readouterr().err


@pytest.mark.slow
def test_seeds_give_mean_and_spread_and_how_often_each_claim_held(tmp_path: Path) -> None:
    out = tmp_path / "seeds"
    result = _coclr("study", "--out", str(out), "--seeds", "1", "2", *REDUCED,
                    "rows=[infonce_rgb, infonce_flow]", "columns=[retrieval]")
    assert (out / "seeds.json").is_file(), result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == expected_status(out), result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((out / "seeds.json").read_text())
    assert summary["seeds"] == [1, 2]
    per_seed = [json.loads((out / f"seed{s}" / "results.json").read_text()) for s in (1, 2)]
    r1 = [r["rows"][0]["retrieval"]["R@1"] for r in per_seed]
    mean, std = summary["rows"][0]["retrieval"]["R@1"]
    assert mean == pytest.approx(sum(r1) / 2) and std == pytest.approx(abs(r1[0] - r1[1]) / 2 ** 0.5)
    claim = summary["claims"]["InfoNCE-Flow > InfoNCE-RGB (R@1)"]
    assert claim["held_on"] == sum(r["claims"]["InfoNCE-Flow > InfoNCE-RGB (R@1)"] for r in per_seed)
    assert "InfoNCE-Flow > InfoNCE-RGB (R@1): " in (out / "seeds.md").read_text()


def test_claims_follow_the_rows_present() -> None:
    def row(key: str, r1: float, linear: float) -> dict:
        return {"row": key, "retrieval": {"R@1": r1}, "linear_top1": linear}

    rows = [row("infonce_rgb", 20, 30), row("ubernce_rgb", 60, 70), row("coclr_rgb", 40, 45),
            row("infonce_flow", 30, 50), row("coclr_flow", 35, 49), row("coclr_two_stream", 45, 55),
            row("cmc_rgb", 41, 44)]
    found = claims(rows, ["retrieval", "linear"])
    assert found["UberNCE-RGB > CoCLR-RGB > InfoNCE-RGB (R@1)"] and found["gap closed by CoCLR-RGB (R@1)"] == 0.5
    assert found["CoCLR-Flow > InfoNCE-Flow (R@1)"] and not found["CoCLR-Flow > InfoNCE-Flow (linear probe)"]
    assert not found["CoCLR-RGB > CMC-RGB (R@1)"] and found["CoCLR-RGB > CMC-RGB (linear probe)"]
    assert found["CoCLR two-stream above every other self-supervised row (R@1)"]
    assert not any("K=1" in claim or "sim" in claim for claim in found)  # those rows are not in the study
    summary = summarise_seeds([{"seed": s, "columns": ["retrieval"], "rows": rows,
                                "claims": claims(rows, ["retrieval"])} for s in (0, 1)])
    assert summary["claims"]["gap closed by CoCLR-RGB (R@1)"]["mean_std"] == (0.5, 0.0)
    assert "2 of 2 seeds" in seeds_markdown(summary)
    assert "gap closed by CoCLR-RGB (R@1): 50% ± 0% over the seeds (" in seeds_markdown(summary)
    # defined on one seed of two (UberNCE not above InfoNCE on the other): it read "± 0% over the seeds"
    flat = [row("ubernce_rgb", 10, 70) if r["row"] == "ubernce_rgb" else r for r in rows]
    mixed = summarise_seeds([{"seed": seed, "columns": ["retrieval"], "rows": these,
                              "claims": claims(these, ["retrieval"])} for seed, these in ((0, rows), (1, flat))])
    assert "gap closed by CoCLR-RGB (R@1): 50% (one seed: no spread) (" in seeds_markdown(mixed)
    # a gap claim beside a row's mined positives (the default rows give both): seeds.md failed to be written
    mined = [{**r, "mined_precision": 40.0 + seed} if r["row"] == "coclr_flow" else r for r in rows for seed in (0,)]
    both = summarise_seeds([{"seed": seed, "columns": ["retrieval"], "rows": mined,
                             "claims": claims(mined, ["retrieval"])} for seed in (0, 1)])
    text = seeds_markdown(both)
    assert "gap closed by CoCLR-RGB (R@1): 50% ± 0% over the seeds (" in text and text.endswith(": 40.0 ± 0.0\n")


def test_results_markdown_lists_the_stages_with_their_mined_precision() -> None:
    rows = [{"row": "infonce_rgb", "method": "InfoNCE", "view": "RGB", "labels": False, "linear_top1": 20.0,
             "paper": {"linear": 46.8}, "retrieval": {"R@1": 25.0, "R@5": 50.0, "R@10": 60.0, "R@20": 70.0}}]
    stages = [{"stage": "infonce_rgb", "view": "RGB", "R@1": 25.0, "mined_precision": None},
              {"stage": "cycle1_rgb", "view": "RGB", "R@1": 41.4, "mined_precision": 46.25}]
    markdown = results_markdown(rows, ["linear", "retrieval"], {}, 60.0, 0, stages)
    assert "| infonce_rgb | RGB | 25.0 | - |" in markdown and "| cycle1_rgb | RGB | 41.4 | 46.2 |" in markdown
    assert "| InfoNCE | RGB | ✗ | 20.0 | 46.8 | 25.0 | - | 50.0 | 60.0 | 70.0 |" in markdown
    assert "| Stage |" not in results_markdown(rows, ["linear", "retrieval"], {}, 60.0, 0)
    # one row tests no claim: the heading stood over nothing
    assert "Claims of the paper" not in markdown and "No claim of the paper rests on these rows alone" in markdown
    # a note names a video as written: its Markdown was rendered (bold, an <img> tag, a link)
    noted = results_markdown(rows, ["linear"], {}, 60.0, 0, notes=["failed: train/**b** <img src=x> [l](http:e).mp4"])
    assert r"- failed: train/\*\*b\*\* &lt;img src=x&gt; \[l\](http:e).mp4" in noted


def test_the_oracle_gets_as_many_rgb_epochs_as_coclr_rgb(tmp_path: Path) -> None:
    """From InfoNCE-RGB the oracle trains for CoCLR-RGB's stages; from scratch, for InfoNCE's epochs too."""
    options = ["schedule.infonce_epochs=10", "schedule.cycle_epochs=3", "schedule.cycles=2",
               "train.method.own_positive_epochs=1", "schedule.decay_epochs=2"]
    assert plan_study(load_config(StudyConfig, overrides=options), tmp_path).configs["ubernce_rgb"]["optim"][
        "epochs"] == 6
    scratch = plan_study(load_config(StudyConfig, overrides=[*options, "schedule.ubernce_start=scratch"]), tmp_path)
    assert scratch.configs["ubernce_rgb"]["optim"]["epochs"] == 16
    assert "init_checkpoint" not in scratch.configs["ubernce_rgb"]["method"]


def test_decay_epochs_run_the_end_of_every_stage_at_a_tenth_of_its_lr(tmp_path: Path) -> None:
    """The last decay_epochs of each stage (InfoNCE: 10 epochs, CoCLR: 4, the oracle: 8) at lr x0.1; without
    decay every stage keeps a constant lr."""
    from coclr.train.config import PipelineConfig, PretrainConfig
    from coclr.train.pipeline import plan_stages, stage_config

    options = ["schedule.infonce_epochs=10", "schedule.cycle_epochs=4", "train.method.own_positive_epochs=1",
               "train.optim.warmup_epochs=1"]

    def optims(*extra: str) -> dict[str, dict]:
        plan = plan_study(load_config(StudyConfig, overrides=[*options, *extra]), tmp_path)
        found = {name: vars(load_config(PretrainConfig, base=plan.configs[name]).optim)
                 for name in ("infonce_rgb", "infonce_flow", "ubernce_rgb")}
        pipeline = load_config(PipelineConfig, base=plan.configs["pipeline"])
        for stage in plan_stages(pipeline)[2:]:
            found[stage.name] = vars(stage_config(pipeline, stage, tmp_path / "pipeline").optim)
        return found

    decayed = optims("schedule.decay_epochs=3")
    assert set(decayed) == {"infonce_rgb", "infonce_flow", "ubernce_rgb", "cycle1_rgb", "cycle1_flow",
                            "cycle2_rgb", "cycle2_flow"}
    assert {name: o["epochs"] - o["milestones"][0] for name, o in decayed.items()} == dict.fromkeys(decayed, 3)
    assert {(o["schedule"], o["gamma"]) for o in decayed.values()} == {("milestones", 0.1)}
    assert (decayed["infonce_rgb"]["epochs"], decayed["cycle1_rgb"]["epochs"], decayed["ubernce_rgb"]["epochs"]) == (
        10, 4, 8)
    assert {o["schedule"] for o in optims("schedule.decay_epochs=0").values()} == {"constant"}


def _flow(store: Path, **options) -> Flow:
    """A flow task on ``store`` (DIS, in the child process itself)."""
    return Flow(store, FlowOptions(**{"backend": "dis", "view": "flow", "workers": 0, **options}))


def test_gpus_index_into_the_gpus_the_user_left_visible(tmp_path: Path, monkeypatch) -> None:
    """With CUDA_VISIBLE_DEVICES=1 and gpus=[0], the jobs saw CUDA_VISIBLE_DEVICES=0: the GPU the user had left out
    (another's, under a shared scheduler)."""
    from coclr.config import from_dict
    from coclr.errors import ConfigError
    from coclr.study.config import StudyConfig
    from coclr.study.run import check_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    shows = [sys.executable, "-c", "import os; print('visible', os.environ['CUDA_VISIBLE_DEVICES'])"]
    run_jobs([Job("a", _flow(tmp_path / "store"))], tmp_path, processes=1, gpus=[1], poll_seconds=0.05, command=shows)
    assert "visible 5" in (tmp_path / "logs" / "a.log").read_text()
    with pytest.raises(ConfigError, match=r"gpus: no GPU 2 on this machine \(it has 2 CUDA device\(s\): 0 to 1 of "
                                          r"CUDA_VISIBLE_DEVICES\)"):
        check_gpus(from_dict(StudyConfig, {"gpus": [2], "train": {"run": {"device": "cuda"}}}))


def test_a_training_job_runs_on_the_studys_threads_whatever_processes_is(tmp_path: Path, monkeypatch) -> None:
    """Each job ran on the cores shared by processes (2 threads with processes=1, 1 with 2), and a CPU training's
    result depends on its thread count: the same study gave CoCLR-RGB R@1 6.25 or 21.9 by processes."""
    from coclr.jobs import scheduler
    from coclr.jobs.tasks import Pretrain

    monkeypatch.setattr(scheduler, "usable_cores", lambda: 4)
    shows = [sys.executable, "-c", "import os; print('threads', os.environ['OMP_NUM_THREADS'])"]
    training = Pretrain.__new__(Pretrain)  # (not run: the command stands for its process)
    assert Pretrain.thread_bound and not type(_flow(tmp_path / "store")).thread_bound
    for processes in (1, 2):
        logs = tmp_path / f"p{processes}"
        monkeypatch.setattr(scheduler, "check_records", lambda pairs: {name: {} for name, _ in pairs})
        monkeypatch.setattr(scheduler, "_claimed_folders", lambda task: frozenset())
        run_jobs([Job("train", training), Job("flow", _flow(tmp_path / "store"))], logs, processes=processes,
                 poll_seconds=0.05, command=shows, threads=3)
        assert "threads 3" in (logs / "logs" / "train.log").read_text()
        assert f"threads {4 // processes}" in (logs / "logs" / "flow.log").read_text()
        # recorded for a retry by hand (`coclr task`: it ran on the shell's count, another result)
        assert json.loads((logs / "logs" / "train.task.json").read_text())["threads"] == 3
        assert "threads" not in json.loads((logs / "logs" / "flow.task.json").read_text())


def test_a_job_some_of_whose_inputs_failed_is_done_and_said(tmp_path: Path) -> None:
    """A flow job that went through its videos with one failed (exit status 3) failed the whole study, after all its
    training, every time it was run: it is done (the jobs after it run on the videos that worked) and returned."""
    some_failed = [sys.executable, "-c", "import sys; print('failed: videos/bad.mp4: no video stream'); sys.exit(3)"]
    task = _flow(tmp_path / "store")  # (not run: the command stands for its process)
    assert run_jobs([Job("flow_test", task), Job("finetune", task, ("flow_test",))], tmp_path, processes=1,
                    poll_seconds=0.05, command=some_failed) == ["flow_test", "finetune"]


def test_a_failed_job_says_how_it_ended_and_shows_this_runs_lines_only(tmp_path: Path) -> None:
    """A job killed by SIGKILL (the out-of-memory killer's way) showed its log's tail, an earlier run's lines
    included (one said "interrupted (SIGTERM)"), and nothing of how it ended."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.log").write_text("coclr task: interrupted (SIGTERM); an earlier run\n")
    killed = [sys.executable, "-c", "import os, signal; print('this run', flush=True); "
              "os.kill(os.getpid(), signal.SIGKILL)"]
    with pytest.raises(CoclrError, match=r"--- a, killed by SIGKILL \(out of memory\?\)") as raised:
        run_jobs([Job("a", _flow(tmp_path / "store"))], tmp_path, processes=1, poll_seconds=0.05, command=killed)
    assert "this run" in str(raised.value) and "an earlier run" not in str(raised.value)


def test_the_scheduler_runs_jobs_after_their_dependencies_and_stops_what_a_failure_blocks(tmp_path: Path) -> None:
    """Each job's task runs in a child process that reads it from its record (``coclr task``); a failure stops the
    jobs that need it, the others run on, and the error shows the failed job's log and how to rerun it alone."""
    from coclr.synth.output import random_store

    names = ("first", "never", "beside", "after")
    ok = {name: _flow(random_store(tmp_path / name, videos=2, frames=3, size=(16, 16), views=("rgb",)))
          for name in names}  # (a store each: two jobs on one view would be refused by its lock)
    bad = _flow(tmp_path / "missing")
    jobs = [Job("first", ok["first"]), Job("broken", bad, ("first",)), Job("never", ok["never"], ("broken",)),
            Job("beside", ok["beside"]), Job("after", ok["after"], ("beside", "first"))]
    with pytest.raises(CoclrError, match="failed: broken; not run, as they need them: never") as raised:
        run_jobs(jobs, tmp_path, processes=2, poll_seconds=0.05)
    logs = tmp_path / "logs"
    assert "missing" in str(raised.value) and f"coclr task {logs / 'broken.task.json'}" in str(raised.value)
    assert all("0 failed" in (logs / f"{name}.log").read_text() for name in ("first", "beside", "after"))
    assert [(tmp_path / name / "flow").is_dir() for name in names] == [True, False, True, True]
    assert not (logs / "never.log").exists()
    assert read_task_file(logs / "first.task.json") == (ok["first"], None)  # what the child ran, and reruns it by hand
    with pytest.raises(CoclrError, match="wait for nowhere, which no job provides"):
        run_jobs([Job("lost", ok["first"], ("nowhere",))], tmp_path, processes=1, poll_seconds=0.05)


def test_a_task_reads_back_from_its_record_and_coclr_task_runs_it(tmp_path: Path, capsys) -> None:
    """The child's side: ``coclr task RECORD`` runs the recorded task (here a flow view); a record it cannot take is
    one line and status 2, and a task whose options would not read back is refused before any job starts."""
    from coclr.atomic import atomic_write_json
    from coclr.cli import main
    from coclr.synth.output import random_store

    store = random_store(tmp_path / "store", videos=2, frames=3, size=(16, 16), views=("rgb",))
    task = _flow(store, bound=5.0)
    record = tmp_path / "flow.task.json"
    atomic_write_json(record, task.record())
    assert json.loads(record.read_text())["options"]["bound"] == 5.0
    assert main(["task", str(record)]) == 0
    assert json.loads((store / "store.json").read_text())["meta"]["flow_bound_px"] == 5.0
    record.write_text(json.dumps({**task.record(), "stride": 2}))
    assert main(["task", str(record)]) == 2
    assert "coclr task: error: task flow: unknown option(s) stride" in capsys.readouterr().err
    import torch  # a job's recorded threads: a retry by hand runs on them (it ran on the shell's count)

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        record.write_text(json.dumps({**task.record(), "threads": 1}))
        assert main(["task", str(record)]) == 0 and torch.get_num_threads() == 1
        record.write_text(json.dumps({**task.record(), "threads": 0}))
        assert main(["task", str(record)]) == 2
        assert "threads must be a whole number of at least 1, got 0" in capsys.readouterr().err
    finally:
        torch.set_num_threads(before)
    for change, message in (({"task": ["flow"]}, "task: ['flow'] is not a kind of task"),
                            ({"store": 5}, "store: expected a path, got 5"),
                            ({"options": None}, "options: needs a value, got null"),
                            ({"options": [1]}, "options: expected a mapping of options")):
        record.write_text(json.dumps({**task.record(), **change}))  # a record of other types: one line, no traceback
        assert main(["task", str(record)]) == 2
        assert f"coclr task: error: {message}" in capsys.readouterr().err
    unreadable = _flow(store, bound="five")  # a value its record cannot carry back (typed options refuse it)
    with pytest.raises(CoclrError, match="job broken: its task cannot be recorded for its process: .*bound"):
        run_jobs([Job("broken", unreadable)], tmp_path / "run", processes=1, poll_seconds=0.05)
    assert not (tmp_path / "run").exists()  # refused before any work


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_the_scheduler_sees_a_command_end_at_once_not_at_its_next_poll() -> None:
    """A job that needs another starts as soon as that one exits: the wait returns then, not after the poll."""
    import time

    process = subprocess.Popen([sys.executable, "-c", "pass"])
    started = time.monotonic()
    wait_for_an_exit([process], 120.0)
    assert process.poll() == 0 and time.monotonic() - started < 60
    started = time.monotonic()
    wait_for_an_exit([], 0.2)  # nothing running: the poll's length
    assert time.monotonic() - started >= 0.2


def test_a_signal_during_a_poll_stops_the_scheduler_after_it_not_inside_it(tmp_path: Path, monkeypatch) -> None:
    """``Popen.poll`` takes a lock that an exception landing just after it leaves taken (the study then hangs in
    ``wait`` as it stops its commands): SIGTERM arriving inside a poll lets the poll end, then stops the study, which
    stops its commands."""
    import os
    import signal

    from coclr.interrupts import Interrupted

    polls, ended = [], []
    poll = subprocess.Popen.poll

    def poll_where_the_signal_lands(process: subprocess.Popen) -> int | None:
        polls.append(process)
        if len(polls) == 4:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs between these bytecodes
                pass
            ended.append(process)  # reached: the poll the signal landed in runs to its end
        return poll(process)

    monkeypatch.setattr(subprocess.Popen, "poll", poll_where_the_signal_lands)
    sleeper = [sys.executable, "-c", "import sys, time; time.sleep(60)"]
    task = _flow(tmp_path / "store")  # (not run: the sleeper stands for its process)
    with pytest.raises(Interrupted) as caught:
        run_jobs([Job("a", task), Job("b", task)], tmp_path, processes=2, poll_seconds=0.05, command=sleeper)
    assert caught.value.signum == signal.SIGTERM and ended
    commands = set(polls)
    assert len(commands) == 2 and all(process.returncode is not None for process in commands)  # stopped


def test_a_study_stopped_by_sigterm_stops_its_running_commands(tmp_path: Path) -> None:
    """``kill STUDY_PID`` must not leave its commands training on (and holding their folders) behind its back."""
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "study.py"
    script.write_text(
        "import sys\nfrom pathlib import Path\nfrom coclr.jobs.scheduler import Job, run_jobs\n"
        "from coclr.jobs.tasks import Flow\nfrom coclr.flow.options import FlowOptions\n"
        "out = Path(sys.argv[1])\n"
        "sleeper = [sys.executable, '-c', 'import os, sys, time; "  # its argument: the task's record
        "open(sys.argv[1] + \".tmp\", \"w\").write(str(os.getpid())); "
        "os.replace(sys.argv[1] + \".tmp\", sys.argv[1] + \".pid\"); time.sleep(120)']\n"
        "task = Flow(out / 'store', FlowOptions())\n"
        "try:\n"
        "    run_jobs([Job('a', task), Job('b', task)], out, processes=2, poll_seconds=0.05, command=sleeper)\n"
        "except KeyboardInterrupt:\n"
        "    sys.exit(130)\n")
    study = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stderr=subprocess.DEVNULL)
    pids = [tmp_path / "logs" / "a.task.json.pid", tmp_path / "logs" / "b.task.json.pid"]
    deadline = time.monotonic() + 60
    while not all(p.exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    children = [int(p.read_text()) for p in pids]
    assert all(_alive(pid) for pid in children)
    study.send_signal(signal.SIGTERM)
    assert study.wait(60) == 130
    assert not any(_alive(pid) for pid in children), "a command of the study was left running"


def test_a_study_whose_stage_would_only_fill_its_queue_is_refused_as_it_is_planned(tmp_path: Path) -> None:
    """The study's stages take no step until their queue is full: one whose iterations would all fill it (or that
    has fewer videos than one batch) is refused when the study is planned (before its data is built), named by its
    folder with the study's options; a stage no row runs is not checked."""
    def plan(*options: str):
        return plan_study(load_config(StudyConfig, overrides=[*REDUCED, *options]), tmp_path / "study")

    with pytest.raises(ConfigError, match=r"^the stage in pipeline/infonce_rgb: train\.method\.queue_size=64: infonce "
                                          r"takes no optimiser step until its queue is full, after 8 iterations of 8 "
                                          r"clips, and this run has 2 .*raise schedule\.infonce_epochs$"):
        plan("train.method.queue_size=64")
    with pytest.raises(ConfigError, match=r"^the stage in pipeline/cycle1_rgb: .*raise schedule\.cycle_epochs$"):
        plan("train.method.queue_size=64", "schedule.infonce_epochs=5")
    with pytest.raises(ConfigError, match=r"^the stage in pipeline/infonce_rgb: train\.run\.batch_size=32: 16 "
                                          r"training video\(s\) are fewer than one batch of 32 clips; lower "
                                          r"train\.run\.batch_size$"):
        plan("train.run.batch_size=32")
    plan("rows=[infonce_rgb]", "columns=[linear]", "train.method.queue_size=64", "schedule.infonce_epochs=5")
    assert not (tmp_path / "study").exists()


def test_jobs_that_would_write_one_folder_run_one_after_the_other(tmp_path: Path) -> None:
    """Two rows whose encoder files have the same bytes finetune in one folder, named by the bytes (seen: CoCLR
    stages of a study too short to take a step, refused since): the second job starts once the first has ended
    (beside it, it would find the folder claimed and fail the study), while a job writing elsewhere runs beside
    them."""
    import shutil

    from coclr.eval.options import ClipConfig, FinetuneConfig
    from coclr.jobs.tasks import Finetune
    from coclr.models.encoder import build_encoder
    from coclr.models.loading import save_encoder

    torch.manual_seed(0)
    first = save_encoder(tmp_path / "k1.pth", build_encoder(width=0.125), {"view": "rgb"})
    shutil.copyfile(first, tmp_path / "k50.pth")
    other = save_encoder(tmp_path / "other.pth", build_encoder(width=0.125), {"view": "rgb"})

    def finetune(checkpoint: Path) -> Finetune:
        return Finetune(checkpoint, "rgb", tmp_path / "store", tmp_path / "finetune", ClipConfig(), FinetuneConfig(),
                        ("flow",))

    assert finetune(first).writes() == finetune(tmp_path / "k50.pth").writes() != finetune(other).writes()
    timed = [sys.executable, "-c", "import json, sys, time; started = time.time(); time.sleep(2.0); "
             "open(sys.argv[1] + '.times', 'w').write(json.dumps([started, time.time()]))"]
    run_jobs([Job("k1", finetune(first)), Job("k50", finetune(tmp_path / "k50.pth")), Job("other", finetune(other))],
             tmp_path, processes=3, poll_seconds=0.05, command=timed)
    times = {name: json.loads((tmp_path / "logs" / f"{name}.task.json.times").read_text())
             for name in ("k1", "k50", "other")}
    assert times["k50"][0] >= times["k1"][1]  # after the job that writes its folder
    assert times["other"][0] < times["k1"][1]  # beside it


MINER_ROWS = ["infonce_rgb", "infonce_flow", "ubernce_rgb", "coclr_rgb", "coclr_flow", "coclr_ubernce_miner_flow",
              "coclr_infonce_miner_flow"]


def test_the_miner_rows_train_flow_alone_mined_by_a_fixed_rgb_encoder(tmp_path: Path) -> None:
    """Issue 48: CoCLR-Flow with every positive mined by UberNCE-RGB or by InfoNCE-RGB; the flow stages are today's
    (epochs, init, lr, schedule) but for the miner, no RGB stage is trained, and the oracle's row comes first."""
    from coclr.config import from_dict
    from coclr.train.config import PipelineConfig
    from coclr.train.pipeline import plan_stages, stage_config

    out = tmp_path / "out"
    plan = plan_study(load_config(StudyConfig, overrides=["rows=[" + ", ".join(MINER_ROWS) + "]",
                                                         "columns=[linear, finetune, retrieval]"]), out)
    jobs = {job.name: job for job in plan.jobs}
    main = from_dict(PipelineConfig, plan.configs["pipeline"])
    today = {s.name: stage_config(main, s, out / "pipeline") for s in plan_stages(main)}
    assert today["cycle1_flow"].method.sampler_checkpoint == str(out / "pipeline" / "cycle1_rgb" / "encoder_rgb.pth")
    for key, folder, miner, deps in (
            ("coclr_ubernce_miner_flow", "coclr_ubernce_miner", out / "ubernce_rgb" / "checkpoint_last.pth",
             ("infonce", "ubernce_rgb")),
            ("coclr_infonce_miner_flow", "coclr_infonce_miner", out / "pipeline" / "infonce_rgb" / "encoder_rgb.pth",
             ("infonce",))):
        assert plan.encoders[ROWS[key].miner] == miner
        options = plan.configs[folder]
        assert options["pipeline"] == {**plan.configs["pipeline"]["pipeline"], "infonce_from": str(out / "pipeline"),
                                       "miner": str(miner)}
        assert {k: v for k, v in options.items() if k not in ("pipeline", "run")} == {
            k: v for k, v in plan.configs["pipeline"].items() if k not in ("pipeline", "run")}
        pipeline = from_dict(PipelineConfig, options)
        stages = plan_stages(pipeline)
        assert [(s.name, s.trains) for s in stages] == [("cycle1_flow", ["flow"]), ("cycle2_flow", ["flow"])]
        for stage in stages:
            config = stage_config(pipeline, stage, out / folder)
            assert config.method.sampler_checkpoint == str(miner)
            expected = today[stage.name]
            init = (out / "pipeline" / "infonce_flow" / "encoder_flow.pth" if stage.cycle == 1
                    else out / folder / "cycle1_flow" / "encoder_flow.pth")
            assert config.method.init_checkpoint == str(init)
            assert (config.optim, config.data, config.augment) == (expected.optim, expected.data, expected.augment)
            assert {k: v for k, v in vars(config.method).items() if not k.endswith("checkpoint")} == {
                k: v for k, v in vars(expected.method).items() if not k.endswith("checkpoint")}
        job = jobs[key]
        assert job.deps == deps and job.task.until == "cycle2_flow" and job.epochs == 40
        assert plan.encoders[key] == out / folder / "cycle2_flow" / "encoder_flow.pth"
        assert plan.mining[key] == tuple(out / folder / f"cycle{c}_flow" / "log.jsonl" for c in (1, 2))
        assert jobs[f"finetune_{key}"].deps == (key, "flow_test")
    assert plan.mining["coclr_flow"] == tuple(out / "pipeline" / f"cycle{c}_flow" / "log.jsonl" for c in (1, 2))
    assert plan.mining["coclr_rgb"] == tuple(out / "pipeline" / f"cycle{c}_rgb" / "log.jsonl" for c in (1, 2))
    # The oracle mines with labels, so the row uses them; InfoNCE-RGB does not.
    assert ROWS["coclr_ubernce_miner_flow"].labels and not ROWS["coclr_infonce_miner_flow"].labels
    assert ROWS["coclr_ubernce_miner_flow"].method == "CoCLR mined by UberNCE-RGB"
    # A miner row alone still trains the oracle that mines for it.
    alone = plan_study(load_config(StudyConfig, overrides=["rows=[coclr_ubernce_miner_flow]"]), tmp_path / "alone")
    assert [job.name for job in alone.jobs[:5]] == ["infonce_rgb", "infonce_flow", "infonce",
                                                    "coclr_ubernce_miner_flow", "ubernce_rgb"]


QUICK_STUDY_PLAN = "84502657f96779c3ef5c8ead7d25ac6696a222ef8e8c7fcf0b88f16f98c9bf46"
"""The digest of the quick study's plan (:func:`_plan_digest`), as computed by the code whose demo numbers
docs/synth.md records (recorded at commit 54f77cf, before `pipeline.miner`; recorded again when the jobs became
typed tasks instead of command lines, the demo's results and encoders the same before and after:
docs/experiments/2026-11-29-house57-tasks-same-results.md)."""


ADDED_SINCE = {("data", "segment_frames"): None, ("method", "mine_in"): "other"}
"""Options added to every stage's configuration since the digest was recorded, with the value that trains as before
(``data.segment_frames`` null: each video one instance, the samples of the code before it bit for bit,
``tests/test_datasets.py``; ``method.mine_in`` other: the paper's mining, the only one before it): left out of
the digest at that value, so that it still compares with the record."""


def _without_added(options: dict) -> dict:
    options = json.loads(json.dumps(options, default=str))
    for (section, key), inert in ADDED_SINCE.items():
        if options.get(section, {}).get(key, inert) == inert:
            options.get(section, {}).pop(key, None)
    return options


def _plan_digest(out: Path) -> str:
    import hashlib

    from coclr.config import from_dict, to_dict
    from coclr.train.config import PipelineConfig
    from coclr.train.pipeline import plan_stages, stage_config

    plan = plan_study(load_config(StudyConfig), out)
    stages = {}
    for folder, options in plan.configs.items():
        if "pipeline" in options:
            pipeline = from_dict(PipelineConfig, options)
            stages[folder] = {s.name: _without_added(to_dict(stage_config(pipeline, s, out / folder)))
                              for s in plan_stages(pipeline)}
    record = {"configs": {name: _without_added(options) for name, options in plan.configs.items()}, "stages": stages,
              "jobs": [[job.name, job.task.record(), list(job.deps), job.epochs] for job in plan.jobs]}
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).replace(str(out), "OUT").encode()).hexdigest()


def test_the_quick_study_trains_what_it_trained(tmp_path: Path) -> None:
    """Every stage's configuration and every command of `coclr demo`, with their order, are those of the code
    that produced its recorded numbers: a change here changes the demo (then run it again and record both)."""
    assert _plan_digest(tmp_path / "out") == QUICK_STUDY_PLAN


def test_a_pipeline_miner_is_checked(tmp_path: Path) -> None:
    from coclr.train.config import PipelineConfig
    from coclr.train.pipeline import run_pipeline

    with pytest.raises(ConfigError, match="pipeline.miner: needs mode=alternate"):
        load_config(PipelineConfig, overrides=["pipeline.miner=x.pth", "pipeline.mode=sim", f"data.store={tmp_path}",
                                               f"run.out={tmp_path / 'sim'}"])
    config = load_config(PipelineConfig, overrides=[f"pipeline.miner={tmp_path / 'absent.pth'}",
                                                    f"run.out={tmp_path / 'run'}", f"data.store={tmp_path}"])
    with pytest.raises(CheckpointError, match="pipeline.miner: checkpoint not found"):
        run_pipeline(config)
    assert not (tmp_path / "run").exists()


def test_a_rows_mined_precision_is_the_mean_of_its_stages(tmp_path: Path) -> None:
    from coclr.study.run import row_mined_precision

    logs = []
    for number, values in enumerate(([0.2, 0.4], [0.9], [])):
        log = tmp_path / f"stage{number}" / "log.jsonl"
        log.parent.mkdir()
        log.write_text("".join(json.dumps({"step": 50 * i, "flow/mined_precision": v}) + "\n"
                               for i, v in enumerate(values, 1)) + json.dumps({"epoch_loss": 1.0}) + "\n")
        logs.append(log)
    assert row_mined_precision(logs, "flow") == pytest.approx((30.0 + 90.0) / 2)  # each stage's mean, then theirs
    assert row_mined_precision(logs[2:] + [tmp_path / "absent.jsonl"], "flow") is None
    assert row_mined_precision(logs, "rgb") is None


@pytest.mark.slow
def test_the_miner_rows_run_and_their_gain_is_plotted_against_their_precision(tmp_path: Path) -> None:
    """Issue 48 end to end on reduced sizes (a queue of one batch, so that every CoCLR stage steps): the flow
    stages mined by the oracle's checkpoint after the oracle, each row's mined precision in results.json, the
    miners' paired differences and the plot (`--seeds`)."""
    out = tmp_path / "miners"
    rows = ["infonce_flow", "coclr_flow", "coclr_ubernce_miner_flow", "coclr_infonce_miner_flow", "coclr_both_flow"]
    result = _coclr("study", "--out", str(out), "--seeds", "0", *REDUCED, "train.run.log_every=1",
                    "rows=[" + ", ".join([*rows, "coclr_both_rgb"]) + "]",
                    "columns=[retrieval]", timeout=900)
    assert (out / "seeds.json").is_file(), result.stdout[-3000:] + result.stderr[-3000:]
    assert result.returncode == expected_status(out), result.stdout[-3000:] + result.stderr[-3000:]
    seed = out / "seed0"
    record = json.loads((seed / "coclr_ubernce_miner" / "cycle1_flow" / "run.json").read_text())["options"]
    assert record["method"]["sampler_checkpoint"] == str(seed / "ubernce_rgb" / "checkpoint_last.pth")
    assert not (seed / "coclr_ubernce_miner" / "cycle1_rgb").exists()
    results = json.loads((seed / "results.json").read_text())
    precision = {row["row"]: row.get("mined_precision") for row in results["rows"]}
    assert precision["infonce_flow"] is None and all(0 <= precision[key] <= 100 for key in rows[1:])
    summary = json.loads((out / "seeds.json").read_text())
    assert [(p["seed"], p["row"]) for p in summary["mining"]] == [(0, key) for key in rows[1:]]
    assert "CoCLR-Flow mined by UberNCE-RGB - InfoNCE-Flow (R@1)" in summary["paired"]
    assert (out / "mined_precision_flow.png").stat().st_size > 1000
    assert "- CoCLR mined by UberNCE-RGB (Flow): " in (out / "seeds.md").read_text()
    # issue 59: one pipeline trains both views mined in both, each row's stages' precision recorded
    assert 0 <= precision["coclr_both_rgb"] <= 100
    both = json.loads((seed / "coclr_both" / "cycle1_flow" / "run.json").read_text())["options"]
    assert both["method"]["mine_in"] == "both"
    assert both["method"]["sampler_checkpoint"] == str(seed / "coclr_both" / "cycle1_rgb" / "encoder_rgb.pth")
    assert both["method"]["init_checkpoint"] == str(seed / "pipeline" / "infonce_flow" / "encoder_flow.pth")
    assert "CoCLR-Flow mined in both views - CoCLR-Flow (mined precision)" in summary["paired"]


def test_both_views_mined_rows_share_one_pipeline(tmp_path: Path) -> None:
    """The two rows mined in both views are one pipeline (OUT/coclr_both): the RGB row's job runs its stages up
    to the last RGB stage, the flow row's continues it after that job, and only its CoCLR stages mine in both."""
    from coclr.config import from_dict
    from coclr.train.config import PipelineConfig
    from coclr.train.pipeline import plan_stages, stage_config

    out = tmp_path / "out"
    plan = plan_study(load_config(StudyConfig, overrides=[
        "rows=[infonce_rgb, infonce_flow, coclr_rgb, coclr_flow, coclr_both_rgb, coclr_both_flow]"]), out)
    jobs = {job.name: job for job in plan.jobs}
    rgb, flow = jobs["coclr_both_rgb"], jobs["coclr_both_flow"]
    assert rgb.task.until == "cycle2_rgb" and flow.task.until == "cycle2_flow"
    assert "coclr_both_rgb" in flow.deps and "infonce" in rgb.deps
    assert [p.name for p in rgb.runs] == ["cycle1_rgb", "cycle1_flow", "cycle2_rgb"]
    assert [p.name for p in flow.runs] == ["cycle2_flow"]
    pipeline = from_dict(PipelineConfig, plan.configs["coclr_both"])
    assert {s.name: stage_config(pipeline, s, out / "coclr_both").method.mine_in for s in plan_stages(pipeline)} == {
        f"cycle{c}_{v}": "both" for c in (1, 2) for v in ("rgb", "flow")}
    main = from_dict(PipelineConfig, plan.configs["pipeline"])
    assert {stage_config(main, s, out / "pipeline").method.mine_in for s in plan_stages(main)} == {"other"}


def test_every_job_of_the_full_study_is_a_task_that_reads_back_as_itself(tmp_path: Path) -> None:
    """The study's jobs (pretraining, pipelines, flow, finetuning) are typed tasks, built and checked when the study
    is planned; each reaches its child process through its record unchanged, with the options a command line of
    the same stage would have given (the finetuning's are the evaluation's own objects)."""
    from coclr.jobs.tasks import check_records, read_task
    from coclr.study.config import ROWS

    config = load_config(StudyConfig, overrides=[f"rows=[{', '.join(ROWS)}]", "columns=[linear, finetune, retrieval]"])
    plan = plan_study(config, tmp_path / "out")
    assert {job.task.kind for job in plan.jobs} == {"pretrain", "pipeline", "flow", "finetune"}
    records = check_records([(job.name, job.task) for job in plan.jobs])
    for job in plan.jobs:
        assert read_task(json.loads(json.dumps(records[job.name]))) == job.task
    jobs = {job.name: job for job in plan.jobs}
    assert jobs["infonce_rgb"].task.config == load_config(PretrainConfig, base=plan.configs["infonce_rgb"])
    assert jobs["coclr"].task.config == load_config(PipelineConfig, base=plan.configs["pipeline"])
    assert jobs["coclr_k1_rgb"].task.until == "cycle2_rgb"
    finetune = jobs["finetune_coclr_flow"].task
    assert (finetune.clips, finetune.options, finetune.also_views) == (plan.clips, plan.finetune, ("rgb",))
    assert jobs["flow_test"].task.options.split == "test"




def test_a_study_continues_with_options_that_never_change_a_result(tmp_path: Path) -> None:
    """The README says a study accepts other progress, workers, logging and device; its folder refused them."""
    from coclr.config import load_config
    from coclr.runfolder import FolderRefused
    from coclr.study.config import StudyConfig
    from coclr.study.plan import options_record
    from coclr.study.run import STUDY_FOLDER

    def record(*overrides: str) -> dict:
        return options_record(load_config(StudyConfig, None, list(overrides)))

    first = record()
    assert STUDY_FOLDER.check(tmp_path, first, record("train.run.progress=true", "train.run.log_every=5",
                                                      "train.data.cache_mb=0", "train.run.device=auto",
                                                      "train.data.workers=3", "data.flow_workers=1",
                                                      "train.run.deterministic=false"))  # (pretrain's default)
    with pytest.raises(FolderRefused, match=r"eval.batch_size=64 \(given 32\)"):  # finetuning trains in it
        STUDY_FOLDER.check(tmp_path, first, record("eval.batch_size=32"))
    with pytest.raises(FolderRefused, match=r"train.optim.lr=0.001 \(given 0.002\)"):
        STUDY_FOLDER.check(tmp_path, first, record("train.optim.lr=0.002"))
    with pytest.raises(FolderRefused, match="train.run.batch_size"):
        STUDY_FOLDER.check(tmp_path, first, record("train.run.batch_size=3"))


def recording_bar() -> tuple[type, dict[str, list[int]]]:
    """A stand-in for the scheduler's progress bar, and what it records: where each bar started, each update's
    count, and the count after each update."""
    record: dict[str, list[int]] = {"started": [], "updates": [], "seen": []}

    class Bar:
        def __init__(self, **kwargs):
            self.n = kwargs.get("initial", 0)
            record["started"].append(self.n)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def set_postfix_str(self, *args, **kwargs):
            pass

        def update(self, count):
            record["updates"].append(count)
            self.n += count
            record["seen"].append(self.n)

    return Bar, record


def test_the_scheduler_s_bar_moves_only_when_epochs_are_done(tmp_path: Path, monkeypatch) -> None:
    """Each poll updated the bar, by 0 when no epoch had ended: tqdm's clock of the epoch under way restarted at
    every poll, so an epoch was timed as one poll's second and the ETA was far too short."""
    from coclr.jobs import scheduler
    from coclr.synth.output import random_store

    Bar, record = recording_bar()
    updates = record["updates"]
    monkeypatch.setattr(scheduler, "progress_bar", Bar)
    store = random_store(tmp_path / "s", videos=2, frames=3, size=(16, 16), views=("rgb",))
    scheduler.run_jobs([Job("flow", _flow(store), epochs=1)], tmp_path, processes=1, poll_seconds=0.01)
    assert updates and all(count > 0 for count in updates)


def test_the_scheduler_counts_the_epochs_a_finetuning_job_tells(tmp_path: Path, monkeypatch) -> None:
    """Finetuning keeps no log.jsonl: its epochs counted only as its job ended (the bar stood still through it), and
    one an earlier run had finished counted as this run's work (the ETA too short). Its task tells each epoch kept
    (``coclr task``'s output, the job's log); the bar counts them, an earlier run's as where it starts."""
    from coclr.jobs import scheduler

    Bar, record = recording_bar()
    seen, started = record["seen"], record["started"]
    monkeypatch.setattr(scheduler, "progress_bar", Bar)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "ft.log").write_text("=== coclr job started 2026-12-01 10:00:00\n{\"epochs_done\": 2}\n"
                                              "coclr task: interrupted (SIGTERM)\n")
    tells = [sys.executable, "-c", "import time\nfrom coclr.jobs.tasks import tell_epochs_done\n"
             "for n in (3, 4):\n    time.sleep(0.5)\n    tell_epochs_done(n)\ntime.sleep(0.5)"]
    from coclr.eval.features import ClipConfig
    from coclr.eval.finetune import FinetuneConfig
    from coclr.jobs.tasks import Finetune

    task = Finetune(tmp_path / "enc.pth", "rgb", tmp_path / "store", tmp_path / "ft", ClipConfig(), FinetuneConfig())
    scheduler.run_jobs([Job("ft", task, epochs=5)], tmp_path, processes=1, poll_seconds=0.05, command=tells)
    assert started == [2] and seen == [3, 4, 5]
    # the last told counts (a finetune whose state was thrown away starts over from 1: not the 4 of before), and
    # only a task that tells: the same lines in a flow job's log are not its epochs
    (tmp_path / "logs" / "ft.log").write_text('{"epochs_done": 4}\n=== coclr job started\n{"epochs_done": 1}\n')
    assert scheduler._epochs_done(Job("ft", task, epochs=5), False, tmp_path / "logs") == 1
    (tmp_path / "logs" / "flow.log").write_text('{"epochs_done": 4}\n')
    assert scheduler._epochs_done(Job("flow", _flow(tmp_path / "store"), epochs=5), False, tmp_path / "logs") == 0


def test_a_synthetic_option_given_at_the_value_the_study_used_continues_it(tmp_path: Path) -> None:
    """`data.synth.frames=12` (the study's own) on a study made without it was refused as "frames=null (given 12)"."""
    from coclr.runfolder import FolderRefused, check_folder, claim_folder
    from coclr.study.plan import options_record
    from coclr.study.run import STUDY_FOLDER

    out = tmp_path / "study"
    with claim_folder(out, STUDY_FOLDER, options_record(load_config(StudyConfig))):
        pass
    frames = STUDY_SYNTH["frames"]
    same = load_config(StudyConfig, overrides=[f"data.synth.frames={frames}"])
    assert check_folder(out, STUDY_FOLDER, options_record(same)) is True
    other = load_config(StudyConfig, overrides=[f"data.synth.frames={frames + 1}"])
    with pytest.raises(FolderRefused, match=rf"data.synth.frames={frames} \(given {frames + 1}\)"):
        check_folder(out, STUDY_FOLDER, options_record(other))
    size = load_config(StudyConfig).train["data"]["size"]  # the test clips' null is the training clips' size
    assert check_folder(out, STUDY_FOLDER, options_record(load_config(StudyConfig, overrides=[f"eval.size={size}"])))
    with pytest.raises(FolderRefused, match=rf"eval.size={size} \(given {size + 32}\)"):
        check_folder(out, STUDY_FOLDER, options_record(load_config(StudyConfig, overrides=[f"eval.size={size + 32}"])))


def test_the_inputs_a_study_left_out_are_named_once_each_with_their_cause(tmp_path: Path) -> None:
    """A video that failed to decode failed in flow too ("no 'rgb' entry"): results.md listed it twice, the second
    time without its cause, and the test split's flow job's failures only as "each listed in its log". Each input
    is named once, with the first cause the store records; a job whose failures the store does not hold keeps its
    line."""
    from types import SimpleNamespace

    from coclr.jobs.tasks import Pretrain
    from coclr.store.clipstore import ClipStore, record_failures
    from coclr.study.run import failed_inputs
    from conftest import make_random_store

    root = make_random_store(tmp_path / "store", videos=6, frames=12, test_videos=2)
    record_failures(root, "rgb", ["c0/v000"], [("c0/v000", "VideoDecodeError: cannot open as a video")])
    record_failures(root, "flow", ["c0/v000", "c1/v001"], [
        ("c0/v000", "DataError: c0/v000: no 'rgb' entry (its RGB job failed)"),
        ("c1/v001", "DataError: c1/v001: 1 RGB frame, flow needs at least 2")])
    assert ClipStore(root).failed_inputs("rgb", "flow") == {
        "c0/v000": "VideoDecodeError: cannot open as a video", "c1/v001": "DataError: c1/v001: 1 RGB frame, flow "
        "needs at least 2"}
    jobs = [Job("flow_test", Flow(str(root), FlowOptions(view="flow", split="test"))),
            Job("infonce_rgb", Pretrain(PretrainConfig()))]
    plan = SimpleNamespace(store=root, out=tmp_path / "study", jobs=jobs)
    assert failed_inputs(plan, ["flow_test", "infonce_rgb"]) == [
        "c0/v000: VideoDecodeError: cannot open as a video",
        "c1/v001: DataError: c1/v001: 1 RGB frame, flow needs at least 2",
        f"some inputs of the job infonce_rgb failed, each listed in {tmp_path / 'study' / 'logs' / 'infonce_rgb.log'}"]


def test_seeds_whose_inputs_partly_failed_are_said_and_exit_3(tmp_path: Path, capsys, monkeypatch) -> None:
    """A seed's study that left failed inputs out exits 3 (its results.md lists them); run over seeds, it exited 0."""
    import coclr.study.run as study_run
    from coclr.cli import main

    monkeypatch.setattr(study_run, "check_study", lambda config, out: None)
    monkeypatch.setattr(study_run, "run_study", lambda config, out, check_only=False: {
        "seed": config.seed, "failed_inputs": ["videos/bad.mp4: no video stream"] if config.seed == 1 else [],
        "rows": [{"row": "infonce_rgb", "collapsed": False}]})
    monkeypatch.setattr(study_run, "summarise_seeds", lambda results: {"seeds": [r["seed"] for r in results]})
    monkeypatch.setattr(study_run, "seeds_markdown", lambda summary: "the seeds' table\n")
    assert main(["study", "--out", str(tmp_path / "s"), "--seeds", "0", "1", "rows=[infonce_rgb]"]) == 3
    assert "some inputs failed and were left out, on seed(s) 1" in capsys.readouterr().out
    assert json.loads((tmp_path / "s" / "seeds.json").read_text())["failed_inputs"] == {
        "1": ["videos/bad.mp4: no video stream"]}


def test_a_study_whose_every_row_collapsed_says_so_and_exits_3(tmp_path: Path, capsys, monkeypatch) -> None:
    """A study (or a seed of one) in which every row's encoder collapsed learnt nothing to compare: it says so, with
    what to try, and exits 3 (it exited 0, as if its table meant something); one collapsed row among others is
    marked in results.md and the study is done."""
    import coclr.study.run as study_run
    from coclr.cli import main

    def fake_study(config, out, check_only=False) -> dict:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "results.md").write_text("the table\n")
        collapsed = {0: [True, False], 1: [True, True], 2: [True, True]}[config.seed]
        return {"seed": config.seed, "failed_inputs": [], "wall_seconds": 60.0,
                "rows": [{"row": key, "collapsed": c} for key, c in zip(("infonce_rgb", "infonce_flow"), collapsed)]}

    monkeypatch.setattr(study_run, "check_study", lambda config, out: None)
    monkeypatch.setattr(study_run, "run_study", fake_study)
    monkeypatch.setattr(study_run, "summarise_seeds", lambda results: {"seeds": [r["seed"] for r in results]})
    monkeypatch.setattr(study_run, "seeds_markdown", lambda summary: "the seeds' table\n")
    rows = "rows=[infonce_rgb, infonce_flow]"
    assert main(["study", "--out", str(tmp_path / "s"), "--seeds", "0", "1", "2", rows]) == 3
    out = capsys.readouterr().out
    assert "every row's encoder collapsed on seed(s) 1, 2: the study learnt nothing" in out and "try longer" in out
    assert json.loads((tmp_path / "s" / "seeds.json").read_text())["all_collapsed"] == ["1", "2"]
    assert main(["study", "--out", str(tmp_path / "one"), "--seed", "1", rows]) == 3
    assert "every row's encoder collapsed: the study learnt nothing" in capsys.readouterr().out
    assert main(["study", "--out", str(tmp_path / "other"), "--seed", "0", rows]) == 0
    assert "collapsed" not in capsys.readouterr().out
    assert main(["study", "--out", str(tmp_path / "s2"), "--seeds", "0", rows]) == 0


def test_a_given_store_whose_flow_the_study_would_not_continue_is_refused_before_its_folder(tmp_path: Path,
                                                                                             capsys) -> None:
    """A store whose flow was made with another bound or backend was refused by the flow job only after the study
    claimed its folder with those options: the options matching the store were then refused by the folder, and
    ``--check`` said nothing."""
    from coclr.cli import main
    from coclr.store.flow_extract import extract_flow
    from coclr.synth.output import random_store

    store = random_store(tmp_path / "store", videos=16, test_videos=2, frames=8, size=(16, 16), views=("rgb",))
    extract_flow(store, backend="tvl1", view="flow", workers=0, bound=5.0, split="train")
    given = [*(o for o in REDUCED if not o.startswith(("data.flow_", "data.synth"))), "data.source=store",
             f"data.store={store}"]
    for extra, said in ((["data.flow_backend=tvl1"], "data.flow_bound=5 (given 20)"),
                        (["data.flow_backend=dis", "data.flow_bound=5"], "data.flow_backend=tvl1 (given dis)")):
        for check in (["--check"], []):
            assert main(["study", "--out", str(tmp_path / "study"), *check, *given, *extra]) == 2
            err = capsys.readouterr().err
            assert f"data.store: the flow view of {store} was extracted with {said}: give those values" in err, err
            assert not (tmp_path / "study").exists()
    from coclr.study.run import check_store_flow

    for extra in (["data.flow_bound=5"], ["data.flow_bound=5", "data.flow_backend=auto"],
                  ["data.flow_bound=5", "data.flow_backend=opencv"]):
        check_store_flow(load_config(StudyConfig, overrides=[*given, *extra]), store)
    from coclr.flow.params import TVL1Params

    other = random_store(tmp_path / "other", videos=4, frames=4, size=(16, 16), views=("rgb",))
    extract_flow(other, backend="tvl1", view="flow", workers=0, params=TVL1Params(nscales=2, warps=1))
    with pytest.raises(ConfigError, match=r"TV-L1 parameters nscales=2, warps=1 \(a study extracts flow with "
                                          r"OpenCV's defaults\): give another store"):
        check_store_flow(load_config(StudyConfig, overrides=["data.source=store", f"data.store={other}"]), other)


def test_a_study_of_a_folder_with_a_link_to_nothing_says_what_to_do(tmp_path: Path, capsys) -> None:
    """A link to nothing named as a video is a missing video of the study's folder: refused before any work, with
    what to do (the study has no --drop-missing)."""
    from coclr.cli import main
    from test_embed import moving_square, write_video

    for split, kind in (("train", "a"), ("train", "b"), ("test", "a"), ("test", "b")):
        write_video(tmp_path / "videos" / split / kind / f"{kind}.mp4", moving_square(4))
    (tmp_path / "videos" / "train" / "a" / "gone.mp4").symlink_to(tmp_path / "nowhere.mp4")
    assert main(["study", "--out", str(tmp_path / "s"), "data.source=folder", f"data.root={tmp_path / 'videos'}",
                 "--check"]) == 2
    said = capsys.readouterr().err
    assert (f"train/a/gone.mp4 (a link to {tmp_path / 'nowhere.mp4'}, which does not exist); restore them, or "
            "remove them from data.root") in said, said
    assert not (tmp_path / "s").exists()


def test_a_study_of_one_class_is_refused_before_it_trains(tmp_path: Path, capsys) -> None:
    """Its evaluation refuses splits of one class (every score 100 by construction): a study found it only after
    every stage had trained; its plan refuses it."""
    from coclr.cli import main
    from test_embed import moving_square, write_video

    for split in ("train", "test"):
        write_video(tmp_path / "videos" / split / "a" / "a.mp4", moving_square(4))
    assert main(["study", "--out", str(tmp_path / "s"), "data.source=folder", f"data.root={tmp_path / 'videos'}",
                 "--check"]) == 2
    assert "evaluation (study): every 'train' and 'test' video is of one class" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_a_stage_option_no_stage_can_take_names_the_row_or_job_it_came_from(tmp_path: Path, capsys) -> None:
    """"method.topk: must be smaller than queue_size (32)" named a key the study spells train.method.topk, and not the
    row whose top-50 it was."""
    from coclr.cli import main

    synth = "data.synth={train_scenes: 8, test_scenes: 8}"
    assert main(["study", "--out", str(tmp_path / "a"), "--check", "rows=[infonce_rgb,coclr_k50_rgb]",
                 "train.method.queue_size=32", synth]) == 2
    assert ("error: train (the coclr_k50_rgb row's cycle1_rgb stage): method.topk: must be smaller than queue_size "
            "(32)") in capsys.readouterr().err
    assert main(["study", "--out", str(tmp_path / "b"), "--check", "rows=[infonce_rgb,coclr_rgb]",
                 "train.method.topk=40", "train.method.queue_size=32", synth]) == 2
    assert "error: train (the coclr job's cycle1_rgb stage): method.topk" in capsys.readouterr().err


def test_a_job_outside_the_epoch_count_is_said_to_be(tmp_path: Path) -> None:
    """The bar said 100%, nothing left, for a quarter of the phase while the test split's flow (no epochs) ran."""
    from coclr.jobs.scheduler import running_text

    flow = _flow(tmp_path / "store")
    assert running_text([Job("coclr", flow, (), 20), Job("flow_test", flow)]) == \
        "coclr, flow_test (not in the count or the ETA)"


def test_jobs_on_gpus_take_their_share_of_the_cores() -> None:
    """The study's threads hold the CPU's sums; a GPU's are not the threads', and one thread would starve it."""
    from coclr.config import from_dict
    from coclr.study.config import StudyConfig
    from coclr.study.run import job_threads

    assert job_threads(from_dict(StudyConfig, {"threads": 3, "train": {"run": {"device": "cpu"}}})) == 3
    assert job_threads(from_dict(StudyConfig, {"threads": 3, "gpus": [0]})) is None


def test_seeds_given_other_than_those_summarised_are_said_before_the_work(tmp_path: Path, capsys) -> None:
    """``--seeds 3 4`` on a folder whose seeds.json summarised 0, 1, 2 rewrote it for 3 and 4 in silence."""
    from coclr.atomic import atomic_write_json
    from coclr.cli import main

    out = tmp_path / "s"
    out.mkdir()
    atomic_write_json(out / "seeds.json", {"seeds": [0, 1, 2]})
    assert main(["study", "--out", str(out), "--seeds", "3", "4", "rows=[infonce_rgb]", "--check"]) == 0
    printed = capsys.readouterr().out
    assert (f"[study] note: {out / 'seeds.json'} summarises seeds 0, 1, 2; it will summarise 3, 4, the seeds given "
            "(the others' folders are kept: give --seeds 0 1 2 3 4 to summarise them all)") in printed
    assert printed.index("[study] note:") < printed.index("=== seed 3")
    atomic_write_json(out / "seeds.json", {"seeds": [3, 4]})
    assert main(["study", "--out", str(out), "--seeds", "4", "3", "rows=[infonce_rgb]", "--check"]) == 0
    assert "[study] note" not in capsys.readouterr().out  # the same seeds, in any order: nothing to say


def test_a_warm_up_longer_than_the_study_s_stages_is_refused_naming_its_schedule(tmp_path: Path, capsys) -> None:
    """Stages of one epoch under the study's warm-up of two were cut to it without a word."""
    from coclr.cli import main

    assert main(["study", "--out", str(tmp_path / "s"), "--check", "schedule.cycle_epochs=1",
                 "schedule.decay_epochs=0"]) == 2
    assert ("train (the CoCLR pipeline): optim.warmup_epochs: must lie in 0..1, the epochs of the pipeline's shortest "
            "stages (schedule.cycle_epochs)") in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
