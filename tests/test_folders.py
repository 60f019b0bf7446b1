"""Refused means untouched: for every kind of folder the project writes (pretrain, eval, finetune, embed, store,
flow, study), a second job with other options, and one started while another job holds the folder's lock, is
refused, and the folder is byte for byte what it was (every file's name and bytes, hidden and lock files
included). Plus the rule itself (:class:`coclr.runfolder.FolderRule`) against a slow reference."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from coclr.cli import main
from coclr.config import from_dict, load_config
from coclr.errors import ConfigError, DataError
from coclr.runfolder import LOCK_FILE, FolderRefused, FolderRule, claim_folder
from conftest import locked_by_another_process, make_random_store, view_locked_by_another_process
from test_embed import moving_square, write_video
from test_eval_helpers import make_tiny_store, save_tiny_encoder
from test_store import make_dataset
from test_train import TINY


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every entry under ``folder`` by relative path: a file's bytes, None for a folder."""
    found: dict[str, bytes | None] = {}
    for directory, folders, files in os.walk(folder):
        for name in folders:
            found[os.path.relpath(os.path.join(directory, name), folder)] = None
        for name in files:
            path = os.path.join(directory, name)
            found[os.path.relpath(path, folder)] = Path(path).read_bytes()
    return found


def refused_untouched(folder: Path, run, error: type[Exception] | None = None, match: str = "") -> None:
    """``run()`` is refused (raises ``error`` matching ``match``, or returns the CLI's code 2) and leaves
    ``folder`` as it was."""
    before = snapshot(folder)
    assert before, f"{folder} is empty: nothing to compare"
    if error is None:
        assert run() == 2
    else:
        with pytest.raises(error, match=match):
            run()
    assert snapshot(folder) == before


# ----------------------------------------------------------------------------------------------- the rule


def reference_differences(recorded: dict, given: dict, may_differ: set[str], may_add: bool, prefix: str = "") -> set:
    """The differing dotted keys, by brute force over the flattened settings."""
    def flat(options: dict, prefix: str = "") -> dict:
        out = {}
        for key, value in options.items():
            if isinstance(value, dict) and value:
                out.update(flat(value, f"{prefix}{key}."))
            else:
                out[f"{prefix}{key}"] = value
        return out

    old, new = flat(recorded), flat(given)
    keys = set(old) & set(new) if may_add else set(old) | set(new)
    return {key for key in keys if key not in may_differ and old.get(key) != new.get(key)}


@pytest.mark.parametrize("may_add", [False, True])
def test_the_rule_names_each_differing_key_with_both_values(may_add):
    recorded = {"a": 1, "run": {"progress": True, "seed": 0}, "old": "x", "m": {"k": [1, 2]}}
    given = {"a": 2, "run": {"progress": False, "seed": 0}, "new": 5, "m": {"k": [1, 3]}}
    rule = FolderRule("pretrain", "a run", may_differ=("run.progress",), may_add=may_add, restart=True)
    differ = rule.differing(recorded, given)
    assert {item.split("=")[0] for item in differ} == reference_differences(recorded, given, {"run.progress"},
                                                                              may_add)
    assert "a=1 (given 2)" in differ and "m.k=[1, 2] (given [1, 3])" in differ
    with pytest.raises(FolderRefused, match=r"^F holds a run with .*a=1 \(given 2\).*; use the same options to "
                       r"continue it, another folder, or --restart to move it aside and start over$"):
        rule.check("F", recorded, given)
    assert rule.check("F", recorded, {**recorded, "run": {"progress": False, "seed": 0}}) is True
    assert rule.check("F", None, given) is False
    assert issubclass(FolderRefused, ConfigError) and issubclass(FolderRefused, DataError)


def test_claim_checks_locks_checks_again_and_records(tmp_path):
    rule = FolderRule("x", "an x run")
    with claim_folder(tmp_path / "f", rule, {"a": 1}) as held:
        assert held is False and (tmp_path / "f" / LOCK_FILE).is_file() and (tmp_path / "f" / "run.json").is_file()
    with claim_folder(tmp_path / "f", rule, {"a": 1}) as held:
        assert held is True
    refused_untouched(tmp_path / "f", lambda: claim_folder(tmp_path / "f", rule, {"a": 2}).__enter__(),
                      FolderRefused, r"a=1 \(given 2\)")
    with locked_by_another_process(tmp_path / "f" / LOCK_FILE) as pid:
        refused_untouched(tmp_path / "f", lambda: claim_folder(tmp_path / "f", rule, {"a": 1}).__enter__(),
                          DataError, rf"another coclr x is writing this folder \(pid {pid} on")
        refused_untouched(tmp_path / "f", lambda: claim_folder(tmp_path / "f", rule, {"a": 1},
                                                               restart=True).__enter__(), DataError, "writing")
    with pytest.raises(FolderRefused):
        claim_folder(tmp_path / "f", FolderRule("y", "a y run"), {"a": 1}).__enter__()


def test_a_claim_removes_what_a_killed_writer_left_half_written(tmp_path):
    """A kill -9 left ``.checkpoint_last.pth.<pid>.<random>.partial`` in a run folder for good (pretrain, learn's
    stages); the next claim removes those of a process that is gone, not a live writer's, nor a subfolder's."""
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    folder = tmp_path / "f"
    rule = FolderRule("x", "an x run")
    with claim_folder(folder, rule, {"a": 1}):
        pass
    (folder / "sub").mkdir()
    stale = folder / f".checkpoint_last.pth.{gone}.c8a38f02f73c.partial"
    live = folder / f".log.{os.getpid()}.ab.partial"
    inner = folder / "sub" / f".x.{gone}.cd.partial"
    for path in (stale, live, inner):
        path.write_bytes(b"half")
    with claim_folder(folder, rule, {"a": 1}):
        assert not stale.exists() and live.exists() and inner.exists()


_KILLED_WITH_A_WORKER = """
import os, sys, time
from coclr.filelock import exclusive_lock
with exclusive_lock(sys.argv[1], lambda who: who):
    if os.fork() == 0:  # a worker: it inherits the lock, and outlives its parent by a second
        time.sleep(1.5)
        os._exit(0)
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_lock_held_by_the_workers_of_a_killed_job_is_waited_for(tmp_path):
    """kill -9 of a job whose workers inherited its lock: the next run was refused, naming the dead process, for the
    seconds its workers took to exit. It waits for them; a live holder is still refused at once."""
    import signal
    import subprocess
    import sys
    import time

    from coclr.filelock import exclusive_lock

    lock = tmp_path / ".lock"
    job = subprocess.Popen([sys.executable, "-c", _KILLED_WITH_A_WORKER, str(lock)], stdout=subprocess.PIPE,
                           text=True)
    assert job.stdout.readline().strip() == "held"
    os.kill(job.pid, signal.SIGKILL)
    job.wait()
    begun = time.monotonic()
    with exclusive_lock(lock, lambda who: f"refused: {who}"):
        assert time.monotonic() - begun < 20
    with locked_by_another_process(lock):
        with pytest.raises(DataError, match="refused"):
            exclusive_lock(lock, lambda who: f"refused: {who}").__enter__()


def test_restart_moves_aside_only_the_commands_own_folder(tmp_path):
    """``--restart`` once moved whatever ``--out`` named: a user's folder, a file, the command's own input."""
    rule = FolderRule("curate", "a curate run", restart=True)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    refused_untouched(mine, lambda: claim_folder(mine, rule, {"a": 1}, restart=True).__enter__(), FolderRefused,
                      r"mine: holds notes\.txt, which coclr curate did not write; --restart moves aside only")
    page = tmp_path / "notes.html"
    page.write_text("mine")
    with pytest.raises(FolderRefused, match="exists and is not a folder; --restart moves aside only"):
        claim_folder(page, rule, {"a": 1}, restart=True).__enter__()
    assert page.read_text() == "mine"
    store = make_random_store(tmp_path / "store")  # another command's output (a store; an embed folder alike)
    refused_untouched(store, lambda: claim_folder(store, rule, {"a": 1}, restart=True).__enter__(), FolderRefused,
                      r"the output folder of `coclr data store`, not of `coclr curate`")
    refused_untouched(store, lambda: main(["pretrain", f"data.store={store}", f"run.out={store}", *TINY,
                                           "run.max_steps=1", "--restart"]))
    assert not list(tmp_path.glob("*.replaced-*"))
    for record in (b'{"command": "curate", "opt', b'{"options": {"a": 1}}'):  # damaged; from before "command"
        damaged = tmp_path / "damaged"
        damaged.mkdir()
        (damaged / "run.json").write_bytes(record)
        (damaged / "curate.json").write_text("{}")
        with claim_folder(damaged, rule, {"a": 1}, restart=True):  # its own all the same: moved aside
            pass
        assert not (damaged / "curate.json").exists()
        for aside in tmp_path.glob("damaged.replaced-*"):
            shutil.rmtree(aside)
        shutil.rmtree(damaged)
    with claim_folder(tmp_path / "run", rule, {"a": 1}):
        (tmp_path / "run" / "result.txt").write_text("old")
    with claim_folder(tmp_path / "run", rule, {"a": 2}, restart=True) as held:  # its own: moved aside, started over
        assert held is False
    aside, = tmp_path.glob("run.replaced-*")
    assert (aside / "result.txt").read_text() == "old" and not (tmp_path / "run" / "result.txt").exists()


# ----------------------------------------------------------------------------------- the seven folder kinds


def test_pretrain(tmp_path):
    store = make_random_store(tmp_path / "store")
    run = tmp_path / "run"
    args = ["pretrain", f"data.store={store}", f"run.out={run}", *TINY, "optim.epochs=1", "run.max_steps=1"]
    assert main(args) == 0
    refused_untouched(run, lambda: main([*args, "optim.lr=0.002"]))
    with locked_by_another_process(run / LOCK_FILE):
        refused_untouched(run, lambda: main(args))
        refused_untouched(run, lambda: main([*args, "--restart"]))
    assert not list(tmp_path.glob("run.replaced-*"))


def test_pipeline(tmp_path):
    from coclr.train.config import PipelineConfig
    from coclr.train.pipeline import run_pipeline

    store = make_random_store(tmp_path / "store")
    overrides = [f"data.store={store}", f"run.out={tmp_path / 'run'}", *TINY, "run.max_steps=1",
                 "pipeline.infonce_epochs=1", "pipeline.cycles=1", "pipeline.cycle_epochs=1"]
    run_pipeline(load_config(PipelineConfig, None, overrides), until="infonce_rgb")
    run = tmp_path / "run"
    refused_untouched(run, lambda: run_pipeline(load_config(PipelineConfig, None, [*overrides, "optim.lr=0.002"])),
                      FolderRefused, r"optim\.lr=0\.001 \(given 0\.002\)")
    with locked_by_another_process(run / LOCK_FILE):
        refused_untouched(run, lambda: run_pipeline(load_config(PipelineConfig, None, overrides)), DataError,
                          "another coclr pipeline is writing this folder")
    # a stage restarted on its own would be taken from the pipeline, which records it as done
    stage = ["pretrain", f"data.store={store}", f"run.out={run / 'infonce_rgb'}", *TINY, "run.max_steps=1"]
    refused_untouched(run, lambda: main([*stage, "--restart"]))
    assert not list(run.glob("*.replaced-*"))


def test_eval(tmp_path):
    store = make_tiny_store(tmp_path / "store", train_per_class=2, test_per_class=1, frames=8)
    checkpoint = save_tiny_encoder(tmp_path / "encoder.pt")
    out = tmp_path / "eval"
    args = ["eval", "retrieval", "--checkpoint", str(checkpoint), "--store", str(store), "--out",
            str(out / "r.json"), "--cache-dir", str(out / "cache"), "--length", "8", "--size", "32", "--quiet"]
    assert main(args) == 0
    refused_untouched(out, lambda: main([*args, "--ks", "0"]))
    refused_untouched(out, lambda: main([*args, "--view", "flow"]))
    refused_untouched(store, lambda: main([*args, "--view", "flow"]))


def test_finetune(tmp_path):
    from coclr.atomic import file_sha256
    from coclr.eval.features import ClipConfig
    from coclr.eval.finetune import FinetuneConfig, finetune
    from coclr.store.clipstore import ClipStore

    store = ClipStore(make_tiny_store(tmp_path / "store", train_per_class=2, test_per_class=1, frames=8))
    checkpoint = save_tiny_encoder(tmp_path / "encoder.pt")
    clips = ClipConfig(length=8, size=32, batch_size=3)
    config = from_dict(FinetuneConfig, {"epochs": 1, "milestones": [1]})
    out = tmp_path / "finetune"

    def again(**changed):
        return finetune(checkpoint, file_sha256(checkpoint), store, "rgb", out, clips,
                        from_dict(FinetuneConfig, {"epochs": 1, "milestones": [1], **changed}), progress=False)

    again()
    refused_untouched(out, lambda: again(lr=0.002), FolderRefused, r"--lr=0\.001 \(given 0\.002\)")
    with locked_by_another_process(out / LOCK_FILE):
        refused_untouched(out, again, DataError, "another coclr finetune is writing this folder")
    assert config.lr == 0.001


def test_two_stream_finetune_checks_both_folders_before_any_work(tmp_path):
    from coclr.eval.features import ClipConfig, Stream
    from coclr.eval.finetune import FinetuneConfig, evaluate_finetune
    from coclr.store.clipstore import ClipStore

    store = ClipStore(make_tiny_store(tmp_path / "store", train_per_class=2, test_per_class=1, frames=8))
    first, second, third = (save_tiny_encoder(tmp_path / f"encoder{seed}.pt", seed=seed) for seed in range(3))
    clips = ClipConfig(length=8, size=32, batch_size=3)
    out = tmp_path / "finetune"

    def evaluate(checkpoints, lr):
        return evaluate_finetune(store, [Stream(path, "rgb") for path in checkpoints], out, clips,
                                 from_dict(FinetuneConfig, {"epochs": 1, "milestones": [1], "lr": lr}), progress=False)

    evaluate([first, second], 0.001)
    # The second stream's folder holds other options: refused before the first stream (a new folder) is trained.
    refused_untouched(out, lambda: evaluate([third, second], 0.002), FolderRefused, r"--lr=0\.001 \(given "
                      r"0\.002\)")


def test_embed(tmp_path):
    encoder = save_tiny_encoder(tmp_path / "encoder.pth")
    videos = tmp_path / "videos"
    for seed in range(2):
        write_video(videos / f"v{seed}.mp4", moving_square(12, seed=seed))
    def embed(out: Path, *extra: str) -> int:
        return main(["embed", str(videos), "--checkpoint", str(encoder), "--out", str(out), "--length", "8", "--size",
                     "32", "--short-side", "32", "--quiet", "--workers", "0", *extra])

    out = tmp_path / "out"
    assert embed(out) == 0
    refused_untouched(out, lambda: embed(out, "--window-step", "2"))
    with locked_by_another_process(out / LOCK_FILE):
        refused_untouched(out, lambda: embed(out))
    # A folder of other files is refused without a lock file left in it.
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    refused_untouched(other, lambda: embed(other))


def test_store(tmp_path):
    from coclr.video.indexes import VideoIndex

    index = make_dataset(tmp_path / "videos", 3, frames=6)
    index.save(tmp_path / "index.json")
    VideoIndex("toy", index.classes, index.entries[:2]).save(tmp_path / "fewer.json")
    out = tmp_path / "store"

    def store(index_file: str = "index.json", short_side: str = "16") -> int:
        return main(["data", "store", "--index", str(tmp_path / index_file), "--root", str(tmp_path / "videos"),
                     "--out", str(out), "--short-side", short_side, "--workers", "1"])

    assert store() == 0
    refused_untouched(out, lambda: store(short_side="24"))
    with view_locked_by_another_process(out, "rgb"):
        refused_untouched(out, lambda: store("fewer.json"))  # the index is not replaced by a refused job
        refused_untouched(out, store)
    assert store("fewer.json") == 0 and len(VideoIndex.load(out / "index.json")) == 2


def test_flow(tmp_path):
    from coclr.store.flow_extract import extract_flow

    store = make_tiny_store(tmp_path / "store", train_per_class=1, test_per_class=1, frames=6)
    keys = ["red_class/train_00.avi"]
    extract_flow(store, backend="dis", workers=1, keys=keys, bound=5.0)
    refused_untouched(store, lambda: extract_flow(store, backend="dis", workers=1, bound=20.0), FolderRefused,
                      r"flow view 'flow_dis' with --bound=5\.0 \(given 20\.0\)")
    with view_locked_by_another_process(store, "flow_dis"):
        refused_untouched(store, lambda: extract_flow(store, backend="dis", workers=1, bound=5.0), DataError,
                          "view 'flow_dis' is being written by another job")
        # a new view is refused by its lock too, before its bound and method are added to the store's metadata
    with view_locked_by_another_process(store, "flow_new"):
        refused_untouched(store, lambda: extract_flow(store, backend="dis", view="flow_new", workers=1), DataError,
                          "view 'flow_new' is being written by another job")


def test_study(tmp_path, monkeypatch):
    from coclr.study import run as study_run
    from coclr.study.config import StudyConfig

    def stop(plan):
        raise KeyboardInterrupt  # a study stopped in its first step: its folder holds what it wrote before

    monkeypatch.setattr(study_run, "prepare_data", stop)
    out = tmp_path / "study"
    with pytest.raises(KeyboardInterrupt):
        study_run.run_study(load_config(StudyConfig), out)
    assert (out / "run.json").is_file() and (out / "configs").is_dir()
    refused_untouched(out, lambda: study_run.run_study(load_config(StudyConfig, overrides=["train.method.topk=3"]),
                                                       out), FolderRefused, r"train\.method\.topk=5 \(given 3\)")
    with locked_by_another_process(out / LOCK_FILE):
        refused_untouched(out, lambda: study_run.run_study(load_config(StudyConfig), out), DataError,
                          "another coclr study is writing this folder")


def test_a_rooted_folder_continues_only_where_it_was_made(tmp_path: Path) -> None:
    """A study, learn or pipeline folder names its parts by absolute path (its stages' store, the checkpoints they
    start from): copied elsewhere it went on with the original's files, or was refused only after its data step,
    naming an option; now it is refused before any work, and reached through a link it is the same folder."""
    rule = FolderRule("x", "an x run", rooted=True, paths=("store",))
    made = tmp_path / "made"
    with claim_folder(made, rule, {"store": str(made / "store")}):
        pass
    (tmp_path / "link").symlink_to(made)
    with claim_folder(tmp_path / "link", rule, {"store": str(tmp_path / "link" / "store")}) as held:
        assert held is True  # the same folder and the same store, through a link
    copied = Path(shutil.copytree(made, tmp_path / "copied"))
    refused_untouched(copied, lambda: claim_folder(copied, rule, {"store": str(copied / "store")}).__enter__(),
                      FolderRefused, rf"^{copied}: made as {made}, and moved or copied since: .*move it back, or "
                                     "use another folder to start over$")
    with claim_folder(made, rule, {"store": str(made / "store")}) as held:  # the original goes on
        assert held is True
    unrooted = FolderRule("y", "a y run")
    with claim_folder(tmp_path / "y", unrooted, {"a": 1}):
        pass
    moved = tmp_path / "y moved"
    os.rename(tmp_path / "y", moved)
    with claim_folder(moved, unrooted, {"a": 1}) as held:  # (a pretrain run names nothing inside itself)
        assert held is True


def test_a_moved_study_is_refused_before_its_data_step(tmp_path, monkeypatch):
    from coclr.study import run as study_run
    from coclr.study.config import StudyConfig

    def stop(plan):
        raise KeyboardInterrupt

    monkeypatch.setattr(study_run, "prepare_data", stop)
    with pytest.raises(KeyboardInterrupt):
        study_run.run_study(load_config(StudyConfig), tmp_path / "study")
    os.rename(tmp_path / "study", tmp_path / "moved")
    refused_untouched(tmp_path / "moved", lambda: study_run.run_study(load_config(StudyConfig), tmp_path / "moved"),
                      FolderRefused, "made as .*study, and moved or copied since")


def test_a_key_added_later_is_compared_only_where_a_folder_records_it(tmp_path: Path) -> None:
    """A folder written before a setting was recorded continues (it cannot say what it held); one that records
    it is refused when it differs, naming it."""
    rule = FolderRule("finetune", "a finetuning job", since=("added",))
    assert rule.check(tmp_path, {"a": 1}, {"a": 1, "added": "x"})
    assert rule.check(tmp_path, {"a": 1, "added": "x"}, {"a": 1, "added": "x"})
    with pytest.raises(FolderRefused, match=r"added='x' \(given 'y'\)"):
        rule.check(tmp_path, {"a": 1, "added": "x"}, {"a": 1, "added": "y"})
    with pytest.raises(FolderRefused, match=r"a=1 \(given 2\)"):
        rule.check(tmp_path, {"a": 1}, {"a": 2, "added": "x"})


def test_a_learn_folder_holds_its_own_curation_and_embeddings_only_where_it_puts_them(tmp_path):
    """`coclr curate E --out my_learn/curate2` (or into my_learn/embeddings/) wrote into the learn folder."""
    from coclr.atomic import atomic_write_json
    from coclr.runfolder import check_place

    learn = tmp_path / "learn"
    atomic_write_json(learn / "run.json", {"command": "learn", "options": {}})
    check_place(learn / "curate", "curate")
    check_place(learn / "embeddings" / "rgb", "embed")
    check_place(learn / "curate" / "calibration" / "embeddings", "embed")  # the curation's own copies
    check_place(learn / "pipeline" / "infonce_rgb", "pretrain")
    for path, command in ((learn / "curate2", "curate"), (learn / "embeddings" / "zz", "curate"),
                          (learn / "mine", "embed")):
        with pytest.raises(FolderRefused, match=f"inside {learn}, the output folder of `coclr learn`"):
            check_place(path, command)
    # a pipeline's stages are its own (`coclr pretrain run.out=my_pipeline/mine` was accepted)
    pipeline = tmp_path / "pipeline"
    atomic_write_json(pipeline / "run.json", {"command": "pipeline", "options": {}})
    for stage in ("infonce_rgb", "infonce_flow_dis", "cycle2_flow", "cycle1_sim"):
        check_place(pipeline / stage, "pretrain")
    with pytest.raises(FolderRefused, match=f"inside {pipeline}, the output folder of `coclr pipeline`"):
        check_place(pipeline / "mine", "pretrain")


def test_a_run_record_whose_options_are_not_a_mapping_is_named(tmp_path):
    """A hand-damaged run.json (`"options": 5`) was an AttributeError when the run was continued."""
    from coclr.atomic import atomic_write_json
    from coclr.errors import DataError
    from coclr.runfolder import read_record

    atomic_write_json(tmp_path / "run.json", {"command": "pretrain", "options": 5})
    with pytest.raises(DataError, match=r"run\.json: not a coclr run record \(no options\)"):
        read_record(tmp_path)
