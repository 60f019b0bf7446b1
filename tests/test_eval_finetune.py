"""Finetuning: classifier layout, learning rates, and (slow) an end-to-end run with a ten-crop test and resume."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from coclr.config import from_dict
from coclr.eval.features import ClipConfig
from coclr.eval.finetune import Classifier, FinetuneConfig, build_optimizer, finetune, load_probabilities
from test_eval_helpers import make_tiny_store, save_tiny_encoder


def test_classifier_dropout_and_backbone_lr():
    from coclr.models.s3d import S3D

    model = Classifier(S3D(width=0.125), num_classes=7, dropout=0.9)
    assert isinstance(model.classifier.final_fc[0], torch.nn.Dropout) and model.classifier.final_fc[0].p == 0.9
    assert model.classifier.final_bn is None
    optimizer = build_optimizer(model, from_dict(FinetuneConfig, {"lr": 0.002}))
    classifier_group, backbone_group = optimizer.param_groups
    assert classifier_group["lr"] == 0.002 and backbone_group["lr"] == pytest.approx(0.0002)
    assert {id(p) for p in backbone_group["params"]} == {id(p) for p in model.backbone.parameters()}
    model.eval()
    logits = model(torch.randn(2, 3, 8, 32, 32))
    assert logits.shape == (2, 7)


def test_milestones_past_the_last_epoch_are_refused_before_any_work(capsys):
    """``--epochs 10`` kept the default milestones (60, 80): the lr never dropped, and nothing said so; the rule is
    pretraining's (:func:`coclr.config.require_milestones`)."""
    from coclr.cli import main
    from coclr.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^milestones: \[60, 80\] must lie in 1\.\.epochs \(10\): when you "
                       r"change epochs, set the milestones too \(e\.g\. --milestones with no value, or \[\] in a "
                       r"config, for none\)$"):
        from_dict(FinetuneConfig, {"epochs": 10})
    for milestones in ([0], [11]):
        with pytest.raises(ConfigError, match="milestones"):
            from_dict(FinetuneConfig, {"epochs": 10, "milestones": milestones})
    assert from_dict(FinetuneConfig, {"epochs": 10, "milestones": [10]}).milestones == [10]
    assert from_dict(FinetuneConfig, {"epochs": 10, "milestones": []}).milestones == []
    # the command refuses in one line, before it reads the (missing) checkpoint
    assert main(["eval", "finetune", "--checkpoint", "missing.pth", "--store", "missing", "--epochs", "3"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "coclr eval: error: --milestones: [60, 80] must lie in 1..epochs (3): when you change epochs, set the "
        "milestones too (e.g. --milestones with no value, or [] in a config, for none)"]


@pytest.mark.slow
def test_finetune_end_to_end_and_resume(tmp_path, monkeypatch):
    from coclr.atomic import file_sha256
    from coclr.eval import finetune as module
    from coclr.store.clipstore import ClipStore

    store = ClipStore(make_tiny_store(tmp_path / "store", train_per_class=2, test_per_class=1, frames=8))
    checkpoint = save_tiny_encoder(tmp_path / "enc.pt")
    sha = file_sha256(checkpoint)
    clips = ClipConfig(length=8, size=32, batch_size=3)
    config = from_dict(FinetuneConfig, {"epochs": 2, "milestones": [1]})
    told = []  # (each epoch done and kept, as a study's progress counts it)
    whole = finetune(checkpoint, sha, store, "rgb", tmp_path / "whole", clips, config, progress=False,
                     on_epoch=told.append)
    assert told == [1, 2]
    probabilities = load_probabilities(whole["probabilities"])
    assert probabilities["center"].shape == probabilities["ten_crop"].shape == (3, 3)
    np.testing.assert_allclose(probabilities["ten_crop"].sum(axis=1), 1.0, atol=1e-5)
    assert not np.allclose(probabilities["center"], probabilities["ten_crop"])
    top1 = (probabilities["ten_crop"].argmax(1) == probabilities["labels"]).mean()
    assert whole["top1"] == pytest.approx(100 * top1) and len(whole["train_losses"]) == 2

    original = module.train_epoch
    calls = []

    def crash_on_second_epoch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(module, "train_epoch", crash_on_second_epoch)
    told.clear()
    with pytest.raises(KeyboardInterrupt):
        finetune(checkpoint, sha, store, "rgb", tmp_path / "resumed", clips, config, progress=False,
                 on_epoch=told.append)
    monkeypatch.setattr(module, "train_epoch", original)
    resumed = finetune(checkpoint, sha, store, "rgb", tmp_path / "resumed", clips, config, progress=False,
                       on_epoch=told.append)
    assert told == [1, 2]  # the epoch under way when it stopped was not told, and is trained again
    assert len(resumed["train_losses"]) == 2  # every epoch's, the first's kept with its state (it listed only the last)
    assert resumed["train_losses"] == pytest.approx(whole["train_losses"], rel=1e-5)
    np.testing.assert_allclose(load_probabilities(resumed["probabilities"])["ten_crop"], probabilities["ten_crop"],
                               rtol=1e-4, atol=1e-6)


def test_finetuning_continued_on_another_thread_count_says_it_drifts(tmp_path, monkeypatch):
    """Its sums are ordered by the thread count on a CPU: continued under another one, it mixed two runs in
    silence (top-1 25.0 on one thread, 37.5 on two)."""
    import warnings

    import torch

    from coclr.atomic import file_sha256
    from coclr.eval import finetune as module
    from coclr.store.clipstore import ClipStore

    store = ClipStore(make_tiny_store(tmp_path / "store", train_per_class=2, test_per_class=1, frames=8))
    checkpoint = save_tiny_encoder(tmp_path / "enc.pt")
    clips = ClipConfig(length=8, size=32, batch_size=3)
    config = from_dict(FinetuneConfig, {"epochs": 2, "milestones": [1]})
    original, calls = module.train_epoch, []

    def stopped_on_second_epoch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        monkeypatch.setattr(module, "train_epoch", stopped_on_second_epoch)
        with pytest.raises(KeyboardInterrupt):
            finetune(checkpoint, file_sha256(checkpoint), store, "rgb", tmp_path / "f", clips, config, progress=False)
        monkeypatch.setattr(module, "train_epoch", original)
        torch.set_num_threads(2)
        with pytest.warns(UserWarning, match="the finetuning trained on 1 thread.s. and continues on 2"):
            finetune(checkpoint, file_sha256(checkpoint), store, "rgb", tmp_path / "f", clips, config, progress=False)
        (tmp_path / "f" / module.RESULT_FILE).unlink()  # (finished: tested again, its training done)
        torch.set_num_threads(1)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing left to train: nothing said
            finetune(checkpoint, file_sha256(checkpoint), store, "rgb", tmp_path / "f", clips, config, progress=False)
    finally:
        torch.set_num_threads(before)


def test_a_finetuned_encoder_records_its_normalisation_and_flow_bound(tmp_path):
    """Its record held no mean or std when they were ImageNet's, and no flow bound: an export of it said "mean
    None, std None" and named no bound."""
    from coclr.atomic import file_sha256
    from coclr.clips import IMAGENET_MEAN, IMAGENET_STD
    from coclr.eval import finetune as module
    from coclr.models.loading import read_clip_settings
    from coclr.store.clipstore import ClipStore

    store = ClipStore(make_tiny_store(tmp_path / "store", train_per_class=2, test_per_class=1, frames=9,
                                      views=("rgb", "flow")))
    checkpoint = save_tiny_encoder(tmp_path / "enc.pt")
    clips = ClipConfig(length=8, size=32, batch_size=3)
    config = from_dict(FinetuneConfig, {"epochs": 1, "milestones": [1]})
    for view in ("rgb", "flow"):
        finetune(checkpoint, file_sha256(checkpoint), store, view, tmp_path / view, clips, config, progress=False)
        recorded = read_clip_settings(tmp_path / view / module.ENCODER_FILE)
        assert recorded["mean"] == list(IMAGENET_MEAN) and recorded["std"] == list(IMAGENET_STD)
        assert recorded.get("flow_bound") == (20.0 if view == "flow" else None)


def test_a_state_from_before_losses_were_kept_resumes_twice(tmp_path):
    """Its epochs' losses are unknown (None): saved again, a second resume read float(None)."""
    from coclr.eval import finetune as module
    from coclr.models.s3d import S3D

    model = Classifier(S3D(width=0.125), 3, 0.0)
    config = from_dict(FinetuneConfig, {"epochs": 3, "milestones": [2]})
    optimizer = build_optimizer(model, config)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, config.milestones, gamma=0.1)
    path = tmp_path / "state.pt"
    module._save_state(path, model, optimizer, scheduler, 1, {}, [0.5])
    state = torch.load(path, weights_only=True)
    del state["losses"]  # as written before
    torch.save(state, path)
    losses = module._resume(path, model, optimizer, scheduler, config.epochs)
    assert losses == [None]
    module._save_state(path, model, optimizer, scheduler, 2, {}, [*losses, 0.25])
    assert module._resume(path, model, optimizer, scheduler, config.epochs) == [None, 0.25]


def test_finetune_of_a_finished_folder_returns_its_results_without_work(tmp_path, monkeypatch):
    """The same call on a finished folder returns the recorded results and neither trains nor tests, with its
    probabilities' file as this call names the folder (the first call's path, relative to its working folder, named
    another folder's file, which a two-stream test then fused); other inputs (another test split) test again."""
    from coclr.atomic import file_sha256
    from coclr.eval import finetune as module
    from coclr.store.clipstore import ClipStore

    store = ClipStore(make_tiny_store(tmp_path / "store", train_per_class=2, test_per_class=1, frames=8))
    checkpoint = save_tiny_encoder(tmp_path / "enc.pt")
    sha = file_sha256(checkpoint)
    clips = ClipConfig(length=8, size=32, batch_size=3)
    config = from_dict(FinetuneConfig, {"epochs": 1, "milestones": [1]})
    monkeypatch.chdir(tmp_path)
    first = finetune(checkpoint, sha, store, "rgb", Path("out"), clips, config, progress=False)

    def no_work(*args, **kwargs):
        raise AssertionError("a finished folder was worked on again")

    monkeypatch.setattr(module, "train_epoch", no_work)
    monkeypatch.setattr(module, "predict_windows", no_work)
    (tmp_path / "elsewhere" / "out").mkdir(parents=True)  # what the first path names from there
    monkeypatch.chdir(tmp_path / "elsewhere")
    again = finetune(checkpoint, sha, store, "rgb", Path("../out"), clips, config, progress=False)
    assert {**again, "probabilities": None} == {**first, "probabilities": None}
    assert Path(again["probabilities"]).resolve() == (tmp_path / "out" / Path(first["probabilities"]).name)
    with pytest.raises(AssertionError, match="worked on again"):
        finetune(checkpoint, sha, store, "rgb", tmp_path / "out", clips, config, test_split="train", progress=False)


def test_a_ten_crop_short_side_too_small_is_refused_before_training_and_another_only_tests_again(tmp_path,
                                                                                                   monkeypatch):
    """--ten-crop-short-side under the crop size failed after every epoch had trained, and the folder then refused
    any other value: refused before any work; a finished folder given another value is tested again, not trained."""
    from coclr.atomic import file_sha256
    from coclr.errors import ConfigError
    from coclr.eval import finetune as module
    from coclr.store.clipstore import ClipStore

    store = ClipStore(make_tiny_store(tmp_path / "store", train_per_class=2, test_per_class=1, frames=8))
    checkpoint = save_tiny_encoder(tmp_path / "enc.pt")
    sha = file_sha256(checkpoint)
    clips = ClipConfig(length=8, size=32, batch_size=3)
    bad = from_dict(FinetuneConfig, {"epochs": 1, "milestones": [1], "ten_crop_short_side": 20})
    with pytest.raises(ConfigError, match=r"--ten-crop-short-side 20: .*give at least 32"):
        finetune(checkpoint, sha, store, "rgb", tmp_path / "out", clips, bad, progress=False)
    assert not (tmp_path / "out").exists()
    config = from_dict(FinetuneConfig, {"epochs": 1, "milestones": [1], "ten_crop_short_side": 36})
    first = finetune(checkpoint, sha, store, "rgb", tmp_path / "out", clips, config, progress=False)

    def no_training(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(module, "train_epoch", no_training)
    other = from_dict(FinetuneConfig, {"epochs": 1, "milestones": [1], "ten_crop_short_side": 40})
    again = finetune(checkpoint, sha, store, "rgb", tmp_path / "out", clips, other, progress=False)
    assert again["ten_crop_short_side"] == 40 and first["ten_crop_short_side"] == 36
    assert again["train_losses"] == first["train_losses"]
    # each test's probabilities in a file of its own: the first result's file still holds the first test's
    assert again["probabilities"] != first["probabilities"]
    assert load_probabilities(first["probabilities"])["ten_crop"].shape == \
        load_probabilities(again["probabilities"])["ten_crop"].shape
    assert not np.array_equal(load_probabilities(first["probabilities"])["ten_crop"],
                              load_probabilities(again["probabilities"])["ten_crop"])


def test_a_store_relabelled_in_place_is_not_served_the_old_finetuning(tmp_path):
    """The store's index replaced in place (other labels, the same paths): the finished folder returned its old
    accuracies under the new inputs; now the training data is part of the folder's settings (refused, naming it),
    and other test labels are tested again."""
    import dataclasses

    from coclr.atomic import file_sha256
    from coclr.runfolder import FolderRefused
    from coclr.store.clipstore import ClipStore, create_store

    root = make_tiny_store(tmp_path / "store", train_per_class=2, test_per_class=1, frames=8)
    checkpoint = save_tiny_encoder(tmp_path / "enc.pt")
    sha = file_sha256(checkpoint)
    clips = ClipConfig(length=8, size=32, batch_size=3)
    config = from_dict(FinetuneConfig, {"epochs": 1, "milestones": [1]})
    first = finetune(checkpoint, sha, ClipStore(root), "rgb", tmp_path / "out", clips, config, progress=False)
    assert load_probabilities(first["probabilities"])["labels"].tolist() == [0, 1, 2]

    def relabelled(split: str) -> ClipStore:
        index = ClipStore(root).index
        entries = [dataclasses.replace(e, label=2) if e.split == split else e for e in index.entries]
        create_store(root, dataclasses.replace(index, entries=entries), replace_index=True)
        return ClipStore(root)

    retested = finetune(checkpoint, sha, relabelled("test"), "rgb", tmp_path / "out", clips, config, progress=False)
    assert load_probabilities(retested["probabilities"])["labels"].tolist() == [2, 2, 2]
    assert retested["train_losses"] == first["train_losses"]  # the trained network kept: only the test ran again
    with pytest.raises(FolderRefused, match="train_videos_sha256"):
        finetune(checkpoint, sha, relabelled("train"), "rgb", tmp_path / "out", clips, config, progress=False)


def test_finetuning_takes_the_normalisation_the_encoder_records(tmp_path, monkeypatch):
    """An encoder recording Kinetics' mean and standard deviation (torchvision's s3d implies them) had its frozen
    features under them but was finetuned and tested under ImageNet's; now under its own in training and at test,
    recorded in the finetuned encoder and in the folder's settings (a folder finetuned before under ImageNet's is
    refused, not served)."""
    from coclr.atomic import file_sha256
    from coclr.clips import KINETICS_MEAN, KINETICS_STD
    from coclr.eval import finetune as module
    from coclr.eval.features import IMAGENET, input_normalisation
    from coclr.models.loading import read_clip_settings
    from coclr.runfolder import FolderRefused
    from coclr.store.clipstore import ClipStore

    store = ClipStore(make_tiny_store(tmp_path / "store", train_per_class=2, test_per_class=1, frames=8))
    settings = {"view": "rgb", "mean": list(KINETICS_MEAN), "std": list(KINETICS_STD)}
    checkpoint = save_tiny_encoder(tmp_path / "kinetics.pt", meta={"method": "infonce", "view": "rgb",
                                                                   "clip_settings": settings})
    sha = file_sha256(checkpoint)
    seen = {"augment": [], "test": []}
    augment_init, predict = module.ClipAugment.__init__, module.predict_windows

    def spy_augment(self, *args, **kwargs):
        augment_init(self, *args, **kwargs)
        seen["augment"].append((tuple(self.mean), tuple(self.std)))

    def spy_predict(*args, **kwargs):
        seen["test"].append(kwargs.get("normalisation", IMAGENET))
        return predict(*args, **kwargs)

    monkeypatch.setattr(module.ClipAugment, "__init__", spy_augment)
    monkeypatch.setattr(module, "predict_windows", spy_predict)
    clips = ClipConfig(length=8, size=32, batch_size=3)
    config = from_dict(FinetuneConfig, {"epochs": 1, "milestones": [1]})
    finetune(checkpoint, sha, store, "rgb", tmp_path / "out", clips, config, progress=False)
    kinetics = (tuple(KINETICS_MEAN), tuple(KINETICS_STD))
    assert seen["augment"] == [kinetics] and seen["test"] == [kinetics, kinetics]
    assert input_normalisation(tmp_path / "out" / module.ENCODER_FILE) == kinetics
    recorded = read_clip_settings(tmp_path / "out" / module.ENCODER_FILE)
    assert recorded["mean"] == list(KINETICS_MEAN) and recorded["view"] == "rgb"

    # a folder of this encoder finetuned under ImageNet's (before): refused, naming the normalisation
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    del record["options"]["normalisation"]
    (tmp_path / "out" / "run.json").write_text(json.dumps(record))
    with pytest.raises(FolderRefused, match="normalisation"):
        finetune(checkpoint, sha, store, "rgb", tmp_path / "out", clips, config, progress=False)
    # an ImageNet encoder's folder records none (folders from before continue)
    imagenet = save_tiny_encoder(tmp_path / "imagenet.pt")
    finetune(imagenet, file_sha256(imagenet), store, "rgb", tmp_path / "other", clips, config, progress=False)
    assert "normalisation" not in json.loads((tmp_path / "other" / "run.json").read_text())["options"]


def test_a_damaged_state_file_says_what_to_do(tmp_path):
    """A finetuning state cut short (or another file in its place) was one line naming no remedy."""
    from coclr.errors import CheckpointError
    from coclr.eval.finetune import STATE_FILE, _read_state

    state = tmp_path / STATE_FILE
    torch.save({"format": "another"}, state)
    with pytest.raises(CheckpointError, match="not a finetuning state file .*: delete it to finetune from the first "
                                              "epoch, or give another --work-dir"):
        _read_state(state)
    state.write_bytes(state.read_bytes()[:40])
    with pytest.raises(CheckpointError, match=f"^{state}: .*; it is the finetuning state of this folder: delete it"):
        _read_state(state)


def test_a_finetuning_that_diverges_is_refused_not_scored(tmp_path):
    """A large --lr trained to a loss of NaN and reported top-1 33.3 (NaN probabilities sorted in class order) at exit
    0, its record not even JSON; its NaN state was kept for a rerun to continue from."""
    from coclr.atomic import file_sha256
    from coclr.errors import CoclrError
    from coclr.eval import finetune as module
    from coclr.store.clipstore import ClipStore

    store = ClipStore(make_tiny_store(tmp_path / "store", train_per_class=2, test_per_class=1, frames=8))
    checkpoint = save_tiny_encoder(tmp_path / "enc.pt")
    clips = ClipConfig(length=8, size=32, batch_size=3)
    config = from_dict(FinetuneConfig, {"epochs": 3, "milestones": [], "lr": 1e12, "backbone_lr_scale": 1.0,
                                        "dropout": 0.0})
    with pytest.raises(CoclrError, match=r"finetuning diverged: the training loss of epoch \d is (nan|inf)"):
        finetune(checkpoint, file_sha256(checkpoint), store, "rgb", tmp_path / "f", clips, config, progress=False)
    assert not (tmp_path / "f" / module.RESULT_FILE).exists()
    state = tmp_path / "f" / module.STATE_FILE
    if state.exists():  # (the epochs kept are those before it diverged)
        import torch

        saved = torch.load(state, weights_only=True)
        assert all(bool(torch.isfinite(value).all()) for value in saved["model"].values() if value.is_floating_point())


def _one_epoch(scaler, seed=0):
    """A classifier of the tiny S3D after one epoch of two batches, trained with ``scaler``."""
    from coclr.eval import finetune as module
    from coclr.models.s3d import S3D

    torch.manual_seed(seed)
    model = Classifier(S3D(width=0.125), 3, 0.0)
    optimizer = build_optimizer(model, from_dict(FinetuneConfig, {"epochs": 1, "milestones": []}))
    generator = torch.Generator().manual_seed(1)
    batches = [{"rgb": torch.randn(2, 1, 3, 8, 32, 32, generator=generator), "label": torch.tensor([0, 2])}
               for _ in range(2)]
    loss = module.train_epoch(model, batches, lambda clips, _generator: clips, optimizer, "rgb", torch.device("cpu"),
                              False, generator, False, "epoch", scaler)
    return model, loss


def test_float16_finetuning_scales_its_loss_and_skips_overflowed_steps():
    """Float16 autocast on CUDA trained without a loss scaler (its small gradients flush to zero); with one, a
    power-of-two scale leaves the step as it was, and a step whose scaled gradients overflow is skipped."""
    from coclr.eval.finetune import loss_scaler
    from coclr.models.s3d import S3D

    assert not loss_scaler(torch.device("cpu"), True).is_enabled()  # (bfloat16 on a CPU: nothing to scale)
    plain, plain_loss = _one_epoch(None)
    scaled, scaled_loss = _one_epoch(torch.amp.GradScaler("cpu", init_scale=2.0 ** 12, growth_interval=1))
    assert scaled_loss == plain_loss
    for a, b in zip(plain.state_dict().values(), scaled.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    torch.manual_seed(0)
    untrained = Classifier(S3D(width=0.125), 3, 0.0)
    overflow = torch.amp.GradScaler("cpu", init_scale=3e38, growth_interval=1000)
    skipped, _ = _one_epoch(overflow)
    assert overflow.get_scale() < 3e38  # lowered after the overflow
    weights = [name for name in untrained.state_dict() if name.endswith("weight")]
    assert weights and all(torch.equal(untrained.state_dict()[n], skipped.state_dict()[n]) for n in weights)


def test_the_loss_scale_is_kept_with_the_finetuning_state(tmp_path):
    from coclr.eval import finetune as module
    from coclr.models.s3d import S3D

    model = Classifier(S3D(width=0.125), 3, 0.0)
    config = from_dict(FinetuneConfig, {"epochs": 3, "milestones": [2]})
    optimizer = build_optimizer(model, config)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, config.milestones, gamma=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 9)
    scaler.scale(torch.ones(()))  # (its state exists once it has scaled)
    module._save_state(tmp_path / "state.pt", model, optimizer, scheduler, 1, {}, [0.5], scaler)
    resumed = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    module._resume(tmp_path / "state.pt", model, optimizer, scheduler, config.epochs, resumed)
    assert resumed.get_scale() == 2.0 ** 9
