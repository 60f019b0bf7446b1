"""Every command in the README parses with the real CLI, and the configs it names load and validate."""

from __future__ import annotations

import platform
import re
import shlex
from importlib.metadata import version

import pytest

from coclr import __version__
from coclr.cli import build_parser
from coclr.config import load_config
from conftest import REPO_ROOT


def readme_commands() -> list[list[str]]:
    text = (REPO_ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            argv = shlex.split(line)
            if argv[0] == "torchrun":
                argv = argv[argv.index("-m") + 2:]
            elif argv[0] == "coclr":
                argv = argv[1:]
            else:
                continue
            commands.append(argv)
    return commands


COMMANDS = readme_commands()


def test_readme_documents_the_main_steps() -> None:
    names = {" ".join(argv[:2]) if argv[0] in ("data", "eval") else argv[0] for argv in COMMANDS}
    assert {"demo", "study", "data index", "data store", "flow", "pipeline", "pretrain", "eval retrieval",
            "eval linear", "eval finetune", "report", "embed", "search", "learn", "data synth", "export"} <= names


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: " ".join(argv[:2]))
def test_readme_command_parses(argv: list[str], capsys) -> None:
    if argv == ["--version"]:  # prints one line, exits 0
        with pytest.raises(SystemExit) as stopped:
            build_parser().parse_args(argv)
        assert stopped.value.code in (0, None)
        line = capsys.readouterr().out
        assert line.startswith(f"coclr {__version__} (Python {platform.python_version()}; ") and line.count("\n") == 1
        for label, name in (("torch", "torch"), ("PyAV", "av"), ("NumPy", "numpy")):
            assert f"{label} {version(name)}" in line
        return
    args = build_parser().parse_args(argv)
    assert callable(args.func)
    if argv[0] in ("pretrain", "pipeline"):
        from coclr.train.config import PipelineConfig, PretrainConfig

        config_class = PipelineConfig if argv[0] == "pipeline" else PretrainConfig
        load_config(config_class, REPO_ROOT / args.config, args.overrides)
    if argv[0] == "study":
        from coclr.study.config import StudyConfig

        load_config(StudyConfig, REPO_ROOT / args.config, args.overrides)


def test_readme_python_embedding_example_runs(tmp_path, monkeypatch) -> None:
    """The README's Embedder example, run as written on a small video and a tiny encoder with its file names."""
    from test_embed import moving_square, write_video
    from test_eval_helpers import save_tiny_encoder

    text = (REPO_ROOT / "README.md").read_text()
    example = next(block for block in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "Embedder" in block)
    assert len(example.strip().splitlines()) == 3
    monkeypatch.chdir(tmp_path)
    save_tiny_encoder(tmp_path / "encoder_rgb.pth")
    write_video(tmp_path / "clip.mp4", moving_square(40, height=128, width=160))
    namespace: dict = {}
    exec(compile(example, "README.md", "exec"), namespace)
    result = namespace["result"]
    assert result.vector.shape == (128,) and result.windows.shape == (2, 128)
    assert result.starts.tolist() == [0.0, 8 / 25] and result.ends[-1] == 40 / 25
