"""The package layout's rules, read from the source: who may import temporalio, and no cycles.

Every ``import`` / ``from ... import`` statement counts, including those inside functions and
under ``TYPE_CHECKING``: a function-level import is still an edge a newcomer has to follow.
``from pkg import name`` counts as an import of ``pkg.name`` when that is a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = "durable_rollouts"
ROOT = Path(__file__).resolve().parents[1] / PKG

# Layers allowed to import temporalio (DESIGN.md "Package layout").
TEMPORAL_LAYERS = ("workflows", "activities", "worker", "temporal")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Absolute names of every module ``name`` imports (ours resolved to modules; others as is)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            submodules = {f"{target}.{a.name}" for a in node.names} & MODULES.keys()
            found |= submodules
            if len(submodules) < len(node.names):  # names from the module itself
                found.add(target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _ours(name: str) -> str | None:
    """The module of ours that ``name`` refers to (``a.b.c`` -> the longest existing prefix)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _layer(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_only_the_temporal_layers_import_temporalio() -> None:
    """temporalio is imported by workflows/, activities/, worker.py and temporal/ only."""
    offenders = sorted(
        name for name, deps in GRAPH.items()
        if _layer(name) not in TEMPORAL_LAYERS
        and any(d == "temporalio" or d.startswith("temporalio.") for d in deps)
    )
    assert not offenders, "\n".join(offenders)


def test_sdk_never_imports_temporal_or_its_layers() -> None:
    """sdk/ imports no temporalio, workflows, activities, temporal or worker (not even lazily)."""
    banned = ("temporalio", f"{PKG}.workflows", f"{PKG}.activities", f"{PKG}.temporal",
              f"{PKG}.worker", f"{PKG}.cli", f"{PKG}.gc")
    offenders = sorted(
        f"{name} -> {dep}" for name, deps in GRAPH.items()
        if name.startswith(f"{PKG}.sdk")
        for dep in deps if dep.split(".")[0] == "temporalio" or dep.startswith(banned)
    )
    assert not offenders, "\n".join(offenders)


def test_workflows_import_only_models_and_their_own_package() -> None:
    """Workflows stay deterministic: besides temporalio and stdlib, only models and workflows/."""
    allowed = (f"{PKG}.models", f"{PKG}.step_io", f"{PKG}.workflows", f"{PKG}.admission")
    offenders = sorted(
        f"{name} -> {dep}" for name, deps in GRAPH.items() if _layer(name) == "workflows"
        for dep in deps if dep.startswith(PKG) and not dep.startswith(allowed)
    )
    assert not offenders, "\n".join(offenders)


def test_there_is_no_import_cycle_between_modules() -> None:
    """The module graph (function-level imports included) is acyclic."""
    edges = {
        name: {m for d in deps if (m := _ours(d)) and m != name and m != PKG}
        for name, deps in GRAPH.items()
    }
    # The package root only re-exports: an edge to it would be a cycle through every module.
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_the_graph_sees_function_level_imports() -> None:
    """The parser is not blind: a known function-level import shows up as an edge."""
    assert f"{PKG}.envserver.entry" in GRAPH[f"{PKG}.cli.task"]
