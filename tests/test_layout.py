"""The layout shows the design: packages by concern, imports pointing one way, no import circle, no package
larger than a fifth of the code, no ``sys.path`` patching."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "coclr"

# Each unit (a package, or a top-level module) may import only from units of a lower layer. The root package
# ``coclr`` (its ``__version__``) is the lowest.
LAYERS = [
    {"coclr", "errors"},
    {"atomic", "config", "seeding", "filelock", "threads", "progress", "interrupts"},
    {"runfolder", "distributed", "clips"},
    {"core", "models", "video"},
    {"store"},
    {"flow", "synth", "data"},
    {"eval"},
    {"train", "embed"},
    {"study"},
    {"learn"},
    {"cli"},
    {"__main__"},
]
LAYER = {unit: level for level, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "coclr"


def imports_of(path: Path) -> set[str]:
    """Every coclr module imported anywhere in ``path`` (inside functions too), resolved to a module name."""
    found = set()
    modules = {module_name(p) for p in SRC.rglob("*.py")}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "coclr"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "coclr":
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules else node.module)
    return found


def graph() -> dict[str, set[str]]:
    return {module_name(path): imports_of(path) for path in SRC.rglob("*.py")}


def test_every_unit_has_a_layer():
    units = {unit_of(module) for module in graph()}
    assert units <= set(LAYER), f"units without a layer in LAYERS: {sorted(units - set(LAYER))}"


def test_imports_point_down_the_layers():
    upward = sorted(f"{module} imports {target}" for module, targets in graph().items() for target in targets
                    if unit_of(target) != unit_of(module) and LAYER[unit_of(target)] >= LAYER[unit_of(module)])
    assert not upward, "imports from a unit of the same or a higher layer:\n" + "\n".join(upward)


def test_no_import_circle():
    edges = graph()
    state: dict[str, int] = {}
    circles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges.get(module, ())):
            if target not in edges:
                continue
            if state.get(target) == 1:
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_no_package_holds_more_than_a_fifth_of_the_code():
    lines: dict[str, int] = {}
    for path in SRC.rglob("*.py"):
        unit = unit_of(module_name(path))
        lines[unit] = lines.get(unit, 0) + len(path.read_text().splitlines())
    total = sum(lines.values())
    assert max(lines.values()) <= total / 5, {unit: round(n / total, 3) for unit, n in lines.items()}


PATCH = re.compile(r"sys\.path\.(insert|append|extend)|sys\.path\s*[+]?=")


@pytest.mark.parametrize("folder", ["src", "tests", "benchmarks"])
def test_nothing_patches_sys_path(folder):
    patched = [f"{path.relative_to(REPO)}:{number}" for path in (REPO / folder).rglob("*.py")
               for number, line in enumerate(path.read_text().splitlines(), 1)
               if PATCH.search(line) and path.name != "test_layout.py"]
    assert not patched, f"sys.path patched (import the installed package instead): {patched}"
