"""The house stays as built: small modules, short functions, no import circle in the package,
and packages layered bottom to top (each imports only the ones below it)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "lmdata"
MODULE_LINES = 500
FUNCTION_LINES = 60
# Long on purpose, by name: the training loop and the ingest job read best top to bottom.
LONG_FUNCTIONS = {"lmdata.train.loop.train", "lmdata.ingest.job.ingest"}
LONG_BY_A_LITTLE = {"lmdata.data.loader.make_loader"}  # 63: the loader's one constructor, keyword by keyword

# The packages bottom to top (a top-level module counts as its own unit). Each may import only
# units on a lower floor; units on one floor import nothing of each other. ``config`` sits below
# the jobs whose arguments its dataclasses are (data, train, bench), above what it names (model,
# sources, store).
LAYERS = [
    {"lmdata", "errors", "_lazy", "_eot", "_whole"},  # ``lmdata``: the package's own __init__ (its version)
    {"io"},
    {"_ownership", "_progress", "_mp", "_gc_pause", "text_sniff"},
    {"sources"},
    {"tokenizer"},
    {"store"},
    {"ingest", "inspect", "model"},
    {"config"},
    {"data"},
    {"train"},
    {"bench"},
    {"pipeline"},
    {"cli"},
    {"_console"},  # the console script
    {"__main__"},  # ``python -m lmdata``
]


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return out


def _lines(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def test_no_module_over_budget():
    over = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MODULE_LINES:
            over[name] = n
    assert not over, f"modules over {MODULE_LINES} lines (split them): {over}"


def test_no_function_over_budget():
    over = {}
    for module, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _lines(node) > FUNCTION_LINES:
                if f"{module}.{node.name}" not in LONG_FUNCTIONS | LONG_BY_A_LITTLE:
                    over[f"{module}.{node.name}"] = _lines(node)
    assert not over, f"functions over {FUNCTION_LINES} lines (split them): {over}"


def _imports(module: str, tree: ast.Module, known: set[str]) -> set[str]:
    """The package modules ``module`` imports (anywhere in it, lazy imports included)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
            if not all(n in known for n in names):  # names from the module itself, not only its submodules
                names.append(node.module)
        else:
            continue
        found |= {n for n in names if n in known and n != module}
    return found


def import_cycles() -> list[list[str]]:
    """Every circle of the package's import graph (a package imports its ``__init__`` only)."""
    trees = _modules()
    extensions = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts) for p in PACKAGE.rglob("*.c")}
    graph = {m: _imports(m, t, set(trees) | extensions) & set(trees) for m, t in trees.items()}
    cycles, state = [], {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = "open"
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n, stack + [n])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return cycles


def test_the_import_graph_has_no_circle():
    assert import_cycles() == []


def unit(module: str) -> str:
    """``lmdata.store.formats.memmap`` -> ``store``; ``lmdata.config`` -> ``config``; ``lmdata`` -> itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_imports() -> dict[tuple[str, str], list[str]]:
    """(importing unit, imported unit) -> the module-level imports behind it (lazy ones included)."""
    trees = _modules()
    found: dict[tuple[str, str], list[str]] = {}
    for module, tree in trees.items():
        for other in _imports(module, tree, set(trees)):
            if unit(module) != unit(other):
                found.setdefault((unit(module), unit(other)), []).append(f"{module} -> {other}")
    return found


def test_every_package_is_on_a_floor():
    floors = set().union(*LAYERS)
    assert {unit(m) for m in _modules()} <= floors, "put the new package on a floor of LAYERS"


def test_packages_import_only_downward():
    floor = {name: i for i, names in enumerate(LAYERS) for name in names}
    upward = {pair: why for pair, why in package_imports().items() if floor[pair[0]] <= floor[pair[1]]}
    assert not upward, f"imports that go up or sideways between packages: {upward}"


def test_io_imports_nothing_of_lmdata_but_errors():
    outside = {pair: why for pair, why in package_imports().items() if pair[0] == "io" and pair[1] != "errors"}
    assert not outside, outside
