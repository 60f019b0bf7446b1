"""Linear probe: accuracy on separable and random-label features, held-out selection, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from coclr.config import from_dict
from coclr.errors import ConfigError
from coclr.eval.features import VideoFeatures
from coclr.eval.linear import LinearProbeConfig, linear_probe, select_hyperparameters, stratified_holdout

SMALL_GRID = {"lrs": [0.01], "weight_decays": [0.0, 0.01], "epochs": [3, 15], "batch_size": 64}


def _features(labels: np.ndarray, rng: np.random.Generator, centres: np.ndarray, noise: float) -> VideoFeatures:
    x = centres[labels] + noise * rng.normal(size=(len(labels), centres.shape[1]))
    return VideoFeatures(x.astype(np.float32), labels.astype(np.int64), [f"v{i}" for i in range(len(labels))])


def _split(seed: int = 0, classes: int = 5, dim: int = 24, noise: float = 0.3):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim)) * 2 + 4  # offset and scale: BatchNorm has work to do
    train = _features(np.repeat(np.arange(classes), 30), rng, centres, noise)
    test = _features(np.repeat(np.arange(classes), 10), rng, centres, noise)
    return train, test


def test_separable_features_reach_full_accuracy():
    train, test = _split()
    result = linear_probe(train, test, 5, from_dict(LinearProbeConfig, SMALL_GRID))
    assert result.top1 == 1.0 and result.top5 == 1.0
    assert result.probabilities.shape == (50, 5)
    np.testing.assert_allclose(result.probabilities.sum(axis=1), 1.0, atol=1e-5)
    assert result.keys == test.keys


def test_random_labels_give_chance():
    rng = np.random.default_rng(1)
    classes = 10
    train = VideoFeatures(rng.normal(size=(400, 16)).astype(np.float32), rng.integers(0, classes, 400),
                          [str(i) for i in range(400)])
    test = VideoFeatures(rng.normal(size=(1000, 16)).astype(np.float32), rng.integers(0, classes, 1000),
                         [str(i) for i in range(1000)])
    result = linear_probe(train, test, classes, from_dict(LinearProbeConfig, SMALL_GRID))
    assert abs(result.top1 - 1 / classes) < 0.05  # chance is 0.10; 3 sigma of 1000 draws ~ 0.03


def test_stratified_holdout():
    labels = np.array([0] * 10 + [1] * 5 + [2] * 1 + [3] * 2)
    fit, held = stratified_holdout(labels, 0.2, seed=3)
    assert sorted(np.concatenate([fit, held]).tolist()) == list(range(len(labels)))
    counts = {c: int((labels[held] == c).sum()) for c in range(4)}
    assert counts == {0: 2, 1: 1, 2: 0, 3: 1}  # round(0.2 n), at least one, never a whole class
    again, _ = stratified_holdout(labels, 0.2, seed=3)
    np.testing.assert_array_equal(fit, again)
    assert not np.array_equal(stratified_holdout(labels, 0.2, seed=4)[1], held)


def test_selection_never_sees_test_data():
    """Shuffled test labels and replaced test features change neither the chosen hyper-parameters nor the
    held-out scores; selection itself is a function of the train features only."""
    train, test = _split(seed=2, noise=1.5)  # noisy: the grid points score differently
    config = from_dict(LinearProbeConfig, SMALL_GRID)
    first = linear_probe(train, test, 5, config)
    rng = np.random.default_rng(0)
    shuffled = VideoFeatures(rng.normal(size=test.features.shape).astype(np.float32), rng.permutation(test.labels),
                             test.keys)
    second = linear_probe(train, shuffled, 5, config)
    assert first.selected == second.selected
    assert first.grid == second.grid
    assert (first.selected, first.grid) == select_hyperparameters(train.features, train.labels, 5, config)
    assert len({g["val_top1"] for g in first.grid}) > 1


def test_deterministic_given_seed():
    train, test = _split(seed=5, noise=1.0)
    config = from_dict(LinearProbeConfig, SMALL_GRID)
    a, b = linear_probe(train, test, 5, config), linear_probe(train, test, 5, config)
    np.testing.assert_array_equal(a.probabilities, b.probabilities)
    other = linear_probe(train, test, 5, from_dict(LinearProbeConfig, {**SMALL_GRID, "seed": 1}))
    assert not np.array_equal(a.probabilities, other.probabilities)


def test_the_probe_is_the_same_on_any_number_of_threads():
    """The same features gave another probe on two threads than on one (BatchNorm's and Adam's sums rounded
    otherwise), and the grid chose another setting: 41.7 against 25.0 on a small store."""
    import torch

    rng = np.random.default_rng(2)
    centres = rng.normal(size=(4, 1024)) * 0.3 + 1
    train = _features(np.repeat(np.arange(4), 40), rng, centres, 1.0)
    test = _features(np.repeat(np.arange(4), 10), rng, centres, 1.0)
    config = from_dict(LinearProbeConfig, {**SMALL_GRID, "batch_size": 160})
    found = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 4):
            torch.set_num_threads(threads)
            found.append(linear_probe(train, test, 4, config).probabilities)
    finally:
        torch.set_num_threads(before)
    assert torch.get_num_threads() == before
    np.testing.assert_array_equal(found[0], found[1])
    np.testing.assert_array_equal(found[0], found[2])


def test_config_validation():
    with pytest.raises(ConfigError, match="val_fraction"):
        from_dict(LinearProbeConfig, {"val_fraction": 1.0})
    with pytest.raises(ConfigError, match="lrs"):
        from_dict(LinearProbeConfig, {"lrs": []})
    # (Adam's float32 step overflowed at an lr past about 3e37: a RuntimeError traceback mid-grid)
    with pytest.raises(ConfigError, match=r"^lrs: must lie in \(0, 1e\+30\], got 1e\+38$"):
        from_dict(LinearProbeConfig, {"lrs": [0.001, 1e38]})
    from coclr.eval.finetune import FinetuneConfig
    from coclr.train.config import OptimOptions

    for config_class in (FinetuneConfig, OptimOptions):
        with pytest.raises(ConfigError, match=r"^lr: must lie in \(0, 1e\+30\], got 1e\+38$"):
            from_dict(config_class, {"lr": 1e38, "milestones": []})
    from coclr.study.config import StudySchedule
    from coclr.train.config import PipelineOptions

    for config_class in (StudySchedule, PipelineOptions):  # (it was named as optim.lr, in a stage, later)
        with pytest.raises(ConfigError, match=r"^cycle_lr: must lie in \(0, 1e\+30\], got 1e\+38$"):
            from_dict(config_class, {"cycle_lr": 1e38})


def test_progress_counts_every_training_epoch_of_the_grid_and_the_final_probe(capsys):
    """A bar with an ETA over the grid's epochs (1 lr x 2 weight decays x 15) and the chosen final probe's."""
    train, test = _split()
    result = linear_probe(train, test, 5, from_dict(LinearProbeConfig, SMALL_GRID), progress=True)
    bar = capsys.readouterr().err.replace("\r", "\n").splitlines()
    final = int(result.selected["epochs"])
    assert any(line.startswith("linear probe") and f"/{30 + final} " in line for line in bar)
    assert linear_probe(train, test, 5, from_dict(LinearProbeConfig, SMALL_GRID)).top1 == result.top1
    assert capsys.readouterr().err == ""  # quiet by default


def test_features_and_labels_as_a_library_user_has_them_give_the_same_probe():
    """float64 features and int32 or float labels (NumPy's defaults) failed deep in torch; they are the same probe."""
    train, test = _split()
    config = from_dict(LinearProbeConfig, SMALL_GRID)
    base = linear_probe(train, test, 5, config)
    other = linear_probe(VideoFeatures(train.features.astype(np.float64), train.labels.astype(np.int32), train.keys),
                         VideoFeatures(test.features.astype(np.float64), test.labels.astype(float), test.keys),
                         5, config)
    np.testing.assert_array_equal(other.probabilities, base.probabilities)


@pytest.mark.parametrize("change, message", [
    (lambda f: f._replace(features=np.where(np.arange(len(f.labels))[:, None] == 3, np.nan, f.features)),
     "train features hold NaN or infinite values \\(in 1 video\\(s\\)\\)"),
    (lambda f: f._replace(labels=f.labels + 0.5), "train labels must be class indices \\(whole numbers\\)"),
    (lambda f: f._replace(labels=f.labels.astype(str)), "train labels must be class indices"),
    (lambda f: f._replace(labels=f.labels[:-1]), "train: 150 feature rows, 149 labels and 150 keys"),
    (lambda f: f._replace(features=f.features[:, :3]), "train and test features differ in size: 3 vs 24"),
])
def test_features_the_probe_cannot_score_are_refused_in_one_line(change, message):
    """One NaN row made every probability NaN, and the probe reported chance accuracy as its result."""
    from coclr.errors import DataError

    train, test = _split()
    with pytest.raises(DataError, match=message):
        linear_probe(change(train), test, 5, from_dict(LinearProbeConfig, SMALL_GRID))


def test_a_probe_batch_of_one_is_refused_and_the_grid_is_checked():
    """Batch-norm skips a step of one video, so a batch size of 1 trained nothing and scored the untrained probe."""
    train, test = _split()
    with pytest.raises(ConfigError, match="batch_size: must be >= 2"):
        from_dict(LinearProbeConfig, {"batch_size": 1})
    with pytest.raises(ConfigError, match="epochs: need values >= 1"):
        linear_probe(train, test, 5, LinearProbeConfig(epochs=[0]))  # built directly, not through a config file


def test_the_probe_takes_unit_length_features_as_the_authors_do():
    """Each video's feature is L2-normalised before the BatchNorm (the authors' probe): rescaling each video's
    feature by its own factor changes nothing; without the normalisation it did (large rows dominated BN)."""
    train, test = _split(seed=3, noise=2.0)
    rng = np.random.default_rng(4)

    def rescaled(features: VideoFeatures) -> VideoFeatures:  # powers of two: exact, so the same bits
        factors = 2.0 ** rng.integers(-20, 20, size=(len(features.labels), 1))
        return features._replace(features=(features.features * factors).astype(np.float32))

    config = from_dict(LinearProbeConfig, SMALL_GRID)
    plain = linear_probe(train, test, 5, config)
    scaled = linear_probe(rescaled(train), rescaled(test), 5, config)
    np.testing.assert_array_equal(scaled.probabilities, plain.probabilities)
    assert scaled.top1 == plain.top1


def test_a_probe_that_diverges_is_refused_not_scored():
    """lrs 1e30 gave NaN probabilities, val_loss NaN, and top-1 33.3 (NaN rows sorted in class order: class 0's
    share) at exit 0; a NaN held-out loss broke the grid's tie rule and could win it."""
    from coclr.errors import CoclrError

    train, test = _split()
    with pytest.raises(CoclrError, match="the linear probe diverged at every setting of its grid"):
        linear_probe(train, test, 5, from_dict(LinearProbeConfig, {**SMALL_GRID, "lrs": [1e30],
                                                                  "weight_decays": [0.0]}))
    selected, grid = select_hyperparameters(train.features, train.labels, 5, from_dict(
        LinearProbeConfig, {**SMALL_GRID, "lrs": [1e30, 0.01], "weight_decays": [0.0]}))
    assert selected["lr"] == 0.01 and any(point["val_loss"] is None for point in grid)  # (diverged: last)
