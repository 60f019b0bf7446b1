"""The layout shows the design: packages by concern, imports pointing one way, no import circle (in the library,
its benchmarks and its tests), no package larger than a fifth of the code, no ``sys.path`` patching.

The import graph is read from the code itself (every ``import``, inside functions too, and every
``importlib.import_module``/``__import__`` call), and the test refuses what it cannot read: a dynamic import it
cannot follow, a layer that names no package, a graph that misses a file or an import statement of the code."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "coclr"
FOLDERS = {"src": SRC, "benchmarks": REPO / "benchmarks", "tests": REPO / "tests"}
"""Where the graph's modules come from: the library (``coclr.*``), and the top-level modules of benchmarks/ and
tests/ (importable by name: pytest's ``pythonpath``, the scripts' own folder)."""

# Each unit (a package, or a top-level module) may import only from units of a lower layer. ``version`` (the
# package's version) is the lowest; the root package ``coclr`` re-exports the public entry points, lazily, so it
# stands on top with ``__main__``.
LAYERS = [
    {"version", "errors", "text", "interrupts"},
    {"atomic", "config", "seeding", "filelock", "threads", "progress", "cpu"},
    {"runfolder", "clips", "distributed", "native"},
    {"core", "models", "video", "flow"},
    {"store"},
    {"synth", "data"},
    {"eval"},
    {"train", "embed"},
    {"jobs"},
    {"study", "curate"},
    {"learn"},
    {"cli"},
    {"coclr", "__main__"},
]
LAYER = {unit: level for level, units in enumerate(LAYERS) for unit in units}
DYNAMIC = ("import_module", "__import__")
"""The calls that import a module named by a value (``importlib.import_module``, ``__import__``)."""


def module_name(path: Path) -> str:
    """The module ``path`` defines: ``coclr.a.b`` under src/, the file's stem under benchmarks/ and tests/."""
    if path.is_relative_to(SRC):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return path.stem


def python_files() -> list[Path]:
    return sorted(path for folder in FOLDERS.values() for path in folder.rglob("*.py"))


MODULES = {module_name(path): path for path in python_files()}


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "coclr"


def is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def resolve(name: str, names: list[str] = ()) -> set[str]:
    """The modules of the graph an import of ``name`` (``from name import names``) reaches: ``name.x`` for each
    ``x`` of ``names`` that is a module, else ``name`` itself; nothing for a module outside the graph."""
    found = {f"{name}.{alias}" for alias in names if f"{name}.{alias}" in MODULES}
    if name in MODULES and (not names or len(found) < len(names)):
        found.add(name)
    return found


def dynamic_target(call: ast.Call, module: str) -> set[str] | None:
    """The modules a dynamic import ``call`` in ``module`` reaches: a literal name, or ``f"{__name__}.{...}"`` in a
    package (any of its own submodules); None when the name cannot be read from the code."""
    if len(call.args) != 1:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return resolve(arg.value)
    if (isinstance(arg, ast.JoinedStr) and len(arg.values) == 3 and is_package(module)
            and isinstance(arg.values[0], ast.FormattedValue) and isinstance(arg.values[0].value, ast.Name)
            and arg.values[0].value.id == "__name__" and isinstance(arg.values[1], ast.Constant)
            and arg.values[1].value == "." and isinstance(arg.values[2], ast.FormattedValue)):
        return {other for other in MODULES if other.rpartition(".")[0] == module}
    return None


def called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def read_imports(module: str) -> tuple[set[str], list[str], list[tuple[str, ...]]]:
    """What ``module`` imports: the modules of the graph, the dynamic imports that cannot be followed (as
    ``file:line``) and the modules named by each import statement (for :func:`test_graph_covers_the_code`)."""
    path = MODULES[module]
    found: set[str] = set()
    unfollowed, named = [], []
    package = module if is_package(module) else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            named.append(tuple(alias.name for alias in node.names))
            for alias in node.names:
                found |= resolve(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package (less one part per extra dot)
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            named.append((base,))
            found |= resolve(base, [alias.name for alias in node.names])
        elif isinstance(node, ast.Call) and called_name(node) in DYNAMIC:
            targets = dynamic_target(node, module)
            if targets is None:
                unfollowed.append(f"{path.relative_to(REPO)}:{node.lineno}")
            else:
                found |= targets
    return found - {module}, unfollowed, named


GRAPH = {module: read_imports(module) for module in MODULES}


def graph() -> dict[str, set[str]]:
    return {module: targets for module, (targets, _, _) in GRAPH.items()}


def library_graph() -> dict[str, set[str]]:
    return {module: targets for module, targets in graph().items() if module.split(".")[0] == "coclr"}


def count_statements(path: Path) -> int:
    """The import statements of ``path``, counted from its tokens (not its syntax tree, so that this count does
    not share the graph's reader): ``import`` or ``from`` where a statement starts."""
    tokens = [token for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
              if token.type not in (tokenize.COMMENT, tokenize.NL)]
    starts = (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    return sum(1 for i, token in enumerate(tokens) if token.type == tokenize.NAME
               and token.string in ("import", "from") and (i == 0 or tokens[i - 1].type in starts
                                                           or tokens[i - 1].string in (";", ":")))


def test_every_layer_names_a_unit_and_every_unit_has_a_layer():
    units = {unit_of(module) for module in library_graph()}
    assert units <= set(LAYER), f"units without a layer in LAYERS: {sorted(units - set(LAYER))}"
    assert set(LAYER) <= units, f"layers in LAYERS that name no unit (stale): {sorted(set(LAYER) - units)}"


def test_graph_covers_the_code():
    """Every Python file is a module of the graph, and every import statement of a module of the graph is an edge
    of it (an import statement that reaches no module of the graph names a missing module)."""
    assert len(python_files()) == len(MODULES) > 100, "two files define one module, or the folders were not found"
    assert len(library_graph()) == len(list(SRC.rglob("*.py")))
    missed = []
    for module, path in MODULES.items():
        edges, _, named = GRAPH[module]
        assert count_statements(path) == len(named), f"{path}: the graph misread its import statements"
        for name in (name for statement in named for name in statement):
            first = name.split(".")[0]
            if (first == "coclr" or name in MODULES) and not (resolve(name) | {e for e in edges
                                                                              if e.startswith(f"{name}.")}):
                missed.append(f"{path.relative_to(REPO)} imports {name}, not a module of the graph")
    assert not missed, "\n".join(missed)
    assert sum(len(edges) for edges in library_graph().values()) > 3 * len(library_graph())


def test_every_dynamic_import_is_followed():
    unfollowed = [where for _, found, _ in GRAPH.values() for where in found]
    assert not unfollowed, ("dynamic imports of a name the layout test cannot read (use a literal module name, or "
                            "f\"{__name__}.{name}\" for a package's own submodules):\n" + "\n".join(unfollowed))


def test_imports_point_down_the_layers():
    upward = sorted(f"{module} imports {target}" for module, targets in library_graph().items()
                    for target in targets
                    if unit_of(target) != unit_of(module) and LAYER[unit_of(target)] >= LAYER[unit_of(module)])
    assert not upward, "imports from a unit of the same or a higher layer:\n" + "\n".join(upward)


def test_no_import_circle():
    """None in the library, its benchmarks or its tests (lazy imports inside functions count)."""
    edges = graph()
    state: dict[str, int] = {}
    circles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(edges.get(module, ())):
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
