"""How long the parts of training a network take on this machine: starting a stage, a training step and an
inference forward (each on every thread and on one), the end of an epoch. ``coclr learn`` sizes its plan from these
(:mod:`coclr.learn.budget`); they are measured on a store of random frames, so any network can be timed before
any footage is decoded."""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from coclr.atomic import scratch_folder
from coclr.distributed import alone as only_this_process
from coclr.threads import torch_threads

INFERENCE_BATCH = 16
"""Clips per inference forward (``coclr embed``'s default batch, the quality measures'): the unit of the timed
forward."""
TIMED_EPOCHS = 4
"""Epochs of the short run that times the end of an epoch as training pays it."""


@only_this_process()
def time_training(width: float, size: int, length: int, folder: Path, device, batch: int, steps: int = 5,
                  started: float | None = None, stages: bool = True) -> dict[str, float]:
    """Seconds of the parts of training S3D of ``width`` on clips of ``length`` frames of ``size`` px, on a store of
    random frames in ``folder``: starting a stage (again, after a first start), one InfoNCE training step (after
    two untimed ones), the end of an epoch (its checkpoint, after a first one, or what a short run of
    :data:`TIMED_EPOCHS` epochs spent between them if more), one clip's forward without gradients
    (in a batch of :data:`INFERENCE_BATCH`; each of the step and the forward also on one thread, ``single_step`` and
    ``single_forward``, on a CPU of several), the quality measures' units (:func:`time_inference`: ``window`` on
    the threads :func:`inference_on_one_thread` picks, ``load``), and (``ready``) from ``started`` (a
    ``time.time()``) until the first step could run. ``stages`` false: without the stage starts, the short run
    (the first start's seconds and the save alone stand for them) and the quality measures' units."""
    from coclr.atomic import read_json_lines  # noqa: PLC0415
    from coclr.config import from_dict  # noqa: PLC0415
    from coclr.synth.output import random_store  # noqa: PLC0415
    from coclr.train.config import PretrainConfig  # noqa: PLC0415
    from coclr.train.run import start_run  # noqa: PLC0415

    # two batches an epoch, and one video more than the queue holds (a queue as large as the store is warned of)
    store = random_store(folder / "store", videos=2 * batch + 1, frames=length + 2, size=(size, size * 4 // 3),
                         views=("rgb",))
    def config(out: str, epochs: int = 300) -> PretrainConfig:
        return from_dict(PretrainConfig, {
            "data": {"store": str(store), "length": length, "size": size, "workers": 0},
            "model": {"width": width}, "optim": {"epochs": epochs},
            "method": {"queue_size": 2 * batch, "topk": 1, "wait_for_full_queue": False},
            "run": {"out": str(folder / out), "batch_size": batch, "progress": False, "device": str(device)}})

    begin = time.perf_counter()
    with start_run(config("run")) as trainer:
        first = time.perf_counter() - begin
        timings = time_steps(trainer, length, size, batch, steps, first, started)
        if not stages:
            return timings
        timings.update(time_inference(trainer, store, folder, length, size,
                                      inference_on_one_thread(timings["forward"], timings["single_forward"])))
    # Stages started again (the median of three): the first start in a process also paid its one-time costs
    # (imports, kernels), which the stages of a run pay once, not per stage; a write that waits for the disk can
    # slow any one.
    starts = []
    for number in range(3):
        begin = time.perf_counter()
        with start_run(config(f"again{number}")):
            starts.append(time.perf_counter() - begin)
    timings["stage"] = float(np.median(starts))
    # The end of an epoch as a run pays it (its checkpoint and logs, the next epoch's start, beside the save timed
    # alone): a short run's wall time less its epochs' own seconds, on the threads its steps were faster on.
    alone = timings["single_step"] < timings["step"]
    with (contextlib.redirect_stdout(io.StringIO()), start_run(config("epochs", TIMED_EPOCHS)) as trainer,
          torch_threads(1 if alone else None)):  # its lines are not the caller's
        begin = time.perf_counter()
        trainer.run()
        wall = time.perf_counter() - begin
    trained = sum(record["epoch_seconds"] for record in read_json_lines(folder / "epochs" / "log.jsonl")
                  if "epoch_seconds" in record)
    timings["epoch"] = max(timings["epoch"], (wall - trained) / TIMED_EPOCHS)
    return timings


def time_steps(trainer, length: int, size: int, batch: int, steps: int, stage: float,
               started: float | None) -> dict[str, float]:
    """The timings of :func:`time_training` on the run ``trainer`` loops (clips of ``length`` frames of ``size``
    px; ``stage``: the seconds it took to start)."""
    import torch  # noqa: PLC0415 (heavy)

    from coclr.data.batch_decode import collate_clips  # noqa: PLC0415

    trainer._set_train_mode()
    loader = torch.utils.data.DataLoader(trainer.dataset, batch_size=batch, collate_fn=collate_clips)
    data = next(iter(loader))
    sync = torch.cuda.synchronize if trainer.device.type == "cuda" else (lambda: None)
    def seconds(work: Callable[[], object]) -> float:  # one run, timed alone (medians ignore a slowed one)
        sync()
        begin = time.perf_counter()
        work()
        sync()
        return time.perf_counter() - begin

    def one_step() -> None:
        trainer.train_step(data, queue_full=True)

    for _ in range(2):  # the first steps build the kernels and the allocator's pools
        trainer.train_step(data, queue_full=True)
    ready = time.time() - started if started is not None else 0.0
    threads = trainer.device.type == "cpu" and torch.get_num_threads() > 1  # one thread against every core too
    if threads:
        with torch_threads(1):
            trainer.train_step(data, queue_full=True)
    every, single = [], []
    for number in range(steps):  # A B B A: a slower moment of the machine falls on both
        for alone in ((False, True) if number % 2 == 0 else (True, False)):
            if not alone:
                every.append(seconds(one_step))
            elif threads:
                with torch_threads(1):
                    single.append(seconds(one_step))
    step = float(np.median(every))
    single_step = float(np.median(single)) if single else step
    trainer.save(best=True)  # the first save also loads what saving needs
    epoch = float(np.median([seconds(lambda: trainer.save(best=True)) for _ in range(3)]))  # a slow write among them
    encoder = next(iter(trainer.model.learners.values())).encoder_k
    clips = torch.randn(INFERENCE_BATCH, 3, length, size, size, device=trainer.device)
    every, single = [], []
    with torch.no_grad():
        encoder(clips)
        if threads:
            with torch_threads(1):
                encoder(clips)
        for number in range(steps):  # A B B A, as the steps
            for alone in ((False, True) if number % 2 == 0 else (True, False)):
                if not alone:
                    every.append(seconds(lambda: encoder(clips)))
                elif threads:
                    with torch_threads(1):
                        single.append(seconds(lambda: encoder(clips)))
    forward = float(np.median(every)) / INFERENCE_BATCH
    single_forward = float(np.median(single)) / INFERENCE_BATCH if single else forward
    return {"step": step, "single_step": single_step, "forward": forward, "single_forward": single_forward,
            "epoch": epoch, "stage": stage, "ready": ready}


def time_one_thread(width: float, size: int, length: int, batch: int, steps: int, launched: float
                    ) -> dict[str, float]:
    """In one of the processes that train side by side (the caller gave it one thread): the seconds from
    ``launched`` (a ``time.time()`` of the parent) until it could train, and of one training step."""
    with scratch_folder("timing") as tmp:
        timing = time_training(width, size, length, Path(tmp), "cpu", batch, steps, started=launched, stages=False)
    return {"step": timing["step"], "started": timing["ready"]}


def inference_on_one_thread(forward: float, single_forward: float) -> bool:
    """Whether inference (the quality measures) runs on one thread: a forward took less there than on every thread
    (a tiny network's operations are too small to share, and with OpenMP's passive wait a second thread wakes
    late)."""
    return single_forward < forward


def time_inference(trainer, store: Path, folder: Path, length: int, size: int, one_thread: bool,
                   repeats: int = 3) -> dict[str, float]:
    """Seconds of the units of the quality measures as they run (:func:`coclr.learn.stages.stage_quality`): a
    stored window read and through the backbone (``window``: :func:`~coclr.eval.features.window_features` over the
    sliding windows of ``store``, in batches of :data:`INFERENCE_BATCH`, on one thread with ``one_thread``), and a
    stage's encoder file loaded (``load``: each file once, as the measures load each stage's); each the median of
    ``repeats`` after a first (which loads what they need)."""
    import torch  # noqa: PLC0415 (heavy)

    from coclr.eval.features import window_features  # noqa: PLC0415
    from coclr.eval.options import ClipConfig  # noqa: PLC0415
    from coclr.models.loading import load_encoder, save_encoder  # noqa: PLC0415
    from coclr.store.clipstore import ClipStore  # noqa: PLC0415

    encoder = next(iter(trainer.model.learners.values())).encoder_q
    loads = []
    for number in range(repeats + 1):  # a file of its own each time, as the measures load them: a file loaded
        # again reads faster than the first time
        path = save_encoder(folder / f"encoder{number}.pth", encoder)
        begin = time.perf_counter()
        backbone, _ = load_encoder(path)
        loads.append(time.perf_counter() - begin)
    backbone.to(trainer.device).eval()
    clips = ClipConfig(length=length, stride=1, size=size, batch_size=INFERENCE_BATCH)
    clip_store = ClipStore(store)
    runs = []
    with torch.inference_mode(), torch_threads(1 if one_thread else None):
        for _ in range(repeats + 1):
            begin = time.perf_counter()
            features = window_features(backbone, clip_store, "rgb", "train", clips, trainer.device)[0]
            runs.append((time.perf_counter() - begin) / max(1, len(features)))
    return {"window": float(np.median(runs[1:])), "load": float(np.median(loads[1:]))}
