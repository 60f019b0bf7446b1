"""Every command in the README parses with the real CLI, and the configs it names load and validate."""

from __future__ import annotations

import re
import shlex

import pytest

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
            "eval linear", "eval finetune", "report"} <= names


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda argv: " ".join(argv[:2]))
def test_readme_command_parses(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert callable(args.func)
    if argv[0] in ("pretrain", "pipeline"):
        from coclr.train.config import PipelineConfig, PretrainConfig

        config_class = PipelineConfig if argv[0] == "pipeline" else PretrainConfig
        load_config(config_class, REPO_ROOT / args.config, args.overrides)
    if argv[0] == "study":
        from coclr.study.config import StudyConfig

        load_config(StudyConfig, REPO_ROOT / args.config, args.overrides)
