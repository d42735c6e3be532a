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
    banned = {"workflows", "activities", "temporal", "worker", "cli", "gc"}
    offenders = sorted(
        f"{name} -> {dep}" for name, deps in GRAPH.items()
        if name.startswith(f"{PKG}.sdk")
        for dep in deps if dep.split(".")[0] == "temporalio"
        or (dep.startswith(f"{PKG}.") and _layer(dep) in banned)
    )
    assert not offenders, "\n".join(offenders)


def test_workflows_import_only_models_and_their_own_package() -> None:
    """Workflows stay deterministic: besides temporalio and stdlib, only models, the plan
    (``steps.plan``, plain data), the admission limits (a pure model) and workflows/."""
    allowed = (f"{PKG}.models", f"{PKG}.step_io", f"{PKG}.ids", f"{PKG}.workflows", f"{PKG}.steps.plan",
               f"{PKG}.admission")
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


# -- the layer order (DESIGN.md "Package layout"), bottom up ---------------------------------

LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(layer) for layer in (
    # pure and shared by every layer
    {"models", "protocol", "errors", "step_io", "settings", "paths", "locks", "backoff",
     "processes", "streams", "release", "hud_detect", "graders", "moved", "ids", "_lazy", "capacity",
     "admission", "malloc"},
    {"envserver", "client", "stores"},  # the env side, the control-channel client, claim checks
    {"runtimes"},  # where an env runs
    {"steps"},  # the card's steps and the plan
    {"sdk"},  # what users import
    {"workflows", "activities"},  # Temporal's workflows and the activities over steps/
    {"temporal"},  # the client side of Temporal: connection, storage, the job reader, batches
    {"gc"},  # the orphan sweep, generic over runtimes
    {"worker"},  # builds and runs the worker
    {"cli"},  # the command line
    # the public surface: the package root and the seeds' module paths re-export every layer
    {"", "environment", "capabilities", "eval", "agents"},
))

# Lazy entry points: function-level imports that climb on purpose, each named with its reason.
# Nothing at module level may climb.
LAZY_CLIMBS: dict[tuple[str, str], str] = {
    ("temporal.batches", "worker"): "Taskset.run starts its in-process worker on use",
    ("temporal.plugin", "worker"): "the plugin hands a user's own Worker our workflows and activities",
}


def _rank(name: str) -> int:
    layer = _layer(name)
    for rank, members in enumerate(LAYERS):
        if layer in members:
            return rank
    raise AssertionError(f"{name}: its room {layer!r} is in no layer of LAYERS")


def _module_level_imports(path: Path) -> set[int]:
    """Line numbers of the import statements outside functions and TYPE_CHECKING blocks."""
    lines: set[int] = set()

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                lines.add(child.lineno)
            walk(child)

    walk(ast.parse(path.read_text(), str(path)))
    return lines


def climbs(graph: dict[str, set[str]] = GRAPH) -> list[str]:
    """Every import of ours that reaches a higher layer, except the named lazy entry points."""
    found = []
    for name, deps in sorted(graph.items()):
        for dep in sorted(deps):
            target = _ours(dep)
            if target is None or target == PKG or _rank(target) <= _rank(name):
                continue
            key = (name.removeprefix(f"{PKG}."), _layer(target))
            if key in LAZY_CLIMBS:
                continue
            found.append(f"{name} -> {target}")
    return found


def test_every_room_has_a_layer_and_no_import_climbs() -> None:
    """models/protocol/errors < envserver, client, stores < runtimes < steps < sdk <
    workflows/activities < temporal < gc < worker < cli < the public surface."""
    assert not climbs(), "imports that climb the layers:\n" + "\n".join(climbs())


def test_lazy_climbs_stay_inside_functions() -> None:
    """A named lazy entry point is a function-level import; at module level it would climb."""
    for (importer, room), _reason in LAZY_CLIMBS.items():
        path = MODULES[f"{PKG}.{importer}"]
        tree = ast.parse(path.read_text(), str(path))
        top = _module_level_imports(path)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and node.lineno in top:
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(f"{PKG}.{room}" in n or n == room for n in names), (importer, room)


def test_a_planted_upward_import_is_caught() -> None:
    """The check is not blind: steps/ importing sdk/, or runtimes/ importing steps/, is a climb."""
    planted = {name: set(deps) for name, deps in GRAPH.items()}
    planted[f"{PKG}.steps.substrate"].add(f"{PKG}.sdk.run")
    planted[f"{PKG}.runtimes.base"].add(f"{PKG}.steps.plan")
    found = climbs(planted)
    assert f"{PKG}.steps.substrate -> {PKG}.sdk.run" in found
    assert f"{PKG}.runtimes.base -> {PKG}.steps.plan" in found


def test_client_code_never_imports_activities() -> None:
    """cli/, sdk/ and the job reader read a job through ``temporal.jobs`` and ``stores/``, never
    through worker-side modules; only ``RolloutsPlugin`` (it builds a worker) may."""
    client_side = ("cli", "sdk", "temporal")
    offenders = sorted(
        f"{name} -> {dep}" for name, deps in GRAPH.items()
        if _layer(name) in client_side and name != f"{PKG}.temporal.plugin"
        for dep in deps if dep.startswith(f"{PKG}.activities")
    )
    assert not offenders, "\n".join(offenders)
