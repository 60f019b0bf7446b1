"""One device picker (coclr.distributed.pick_device) for every command."""

from __future__ import annotations

import pytest
import torch

from coclr.distributed import pick_device
from coclr.errors import ConfigError
from coclr.train.setup import resolve_device


def test_auto_and_none_pick_cuda_when_available_else_the_cpu() -> None:
    expected = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    assert pick_device(None).type == pick_device("auto").type == expected.type
    assert pick_device("cpu") == torch.device("cpu") == resolve_device("cpu")


def test_bad_devices_are_refused_naming_the_option() -> None:
    with pytest.raises(ConfigError, match=r"--device: 'gpu0' is not a torch device"):
        pick_device("gpu0", "--device")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"run.device: 'cuda' was asked for but CUDA is not available"):
            resolve_device("cuda")


def test_cuda_is_the_processes_own_gpu_under_torchrun(monkeypatch) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert pick_device("cuda") == torch.device("cuda:0")
