"""The layout docs/architecture.md maps, as the code has it: stage packages, faces, no circles.

Reads the source with ``ast`` (nothing is imported): an import of ``a.b.c`` is an edge
to the most specific module of that name that exists, at any depth of the file (imports
inside functions count: they hid two circles before).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("fusion_core", "app", "worker")
PREFIXES = tuple(f"autofusion.{layer}" for layer in LAYERS)
TOP_LEVEL_LIMIT = 7  # fusion_core modules outside a stage package (``__init__`` aside)


def _module_name(path: Path) -> str:
    parts = ("autofusion", *path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for layer in LAYERS for p in (REPO / layer).rglob("*.py")}


def _type_only(tree: ast.Module) -> set[int]:
    """Ids of the import nodes under ``if TYPE_CHECKING:``: never run, never a circle."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            ids |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return ids


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_only(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _graph(layer_prefixes: tuple[str, ...]) -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        if not name.startswith(layer_prefixes):
            continue
        edges = graph.setdefault(name, set())
        for _, imported in _imports(path):
            target = _resolve(imported, modules)
            # a package's own face importing its submodules is not a circle
            inside = target is not None and name.startswith(target + ".")
            if target and target != name and target.startswith(layer_prefixes) and not inside:
                edges.add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_reaches_a_private_module_of_another_package() -> None:
    modules = _modules()
    wrong = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for line, imported in _imports(path):
            parts = imported.split(".")
            for i, part in enumerate(parts):
                if part.startswith("_") and not part.startswith("__"):
                    owner = ".".join(parts[:i])
                    private = ".".join(parts[: i + 1])
                    if private in modules and not (
                        package == owner or package.startswith(owner + ".")
                    ):
                        wrong.append(f"{path.relative_to(REPO)}:{line} imports {private}")
                    break
    wrong = list(dict.fromkeys(wrong))
    assert not wrong, "import the package's public face instead:\n" + "\n".join(wrong)


def test_no_import_circles() -> None:
    cycles = _cycles(_graph(PREFIXES))
    assert not cycles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_fusion_core_keeps_its_stages_in_packages() -> None:
    top = sorted(p.name for p in (REPO / "fusion_core").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= TOP_LEVEL_LIMIT, f"{len(top)} loose modules in fusion_core: {top}"
    for stage in ("prepasses", "patterns", "cost", "strategies", "rewriters", "pipeline",
                  "validate", "profiling", "report"):  # fmt: skip
        assert (REPO / "fusion_core" / stage / "__init__.py").is_file(), stage


# docs/architecture.md's import rules inside fusion_core, by stage: the stages each may
# import (besides itself) ...
ONLY_FROM = {"sizes": ("ir", "patterns")}
# ... and the earlier stages' faces a later one must not reach into: the rewriters read
# shape values and the proven-size rule from ``sizes``, which canonical's rules share.
NEVER_FROM = {"rewriters": ("canonical",)}


def _stage_imports(stage: str) -> list[tuple[str, str]]:
    """``(where, stage imported)`` for each fusion_core module ``stage``'s modules import."""
    modules = _modules()
    core = "autofusion.fusion_core."
    found = []
    for name, path in modules.items():
        if not (name + ".").startswith(core + stage + "."):
            continue
        for line, imported in _imports(path):
            target = _resolve(imported, modules) or ""
            other = target.removeprefix(core).split(".")[0]
            if target.startswith(core) and other != stage:
                found.append((f"{path.relative_to(REPO)}:{line}", other))
    return list(dict.fromkeys(found))


def test_sizes_imports_only_what_the_architecture_allows() -> None:
    for stage, allowed in ONLY_FROM.items():
        wrong = [f"{at} imports {other}" for at, other in _stage_imports(stage)
                 if other not in allowed]  # fmt: skip
        assert not wrong, f"{stage} imports only {allowed}:\n" + "\n".join(wrong)


def test_rewriters_read_shape_values_from_sizes_not_canonical() -> None:
    for stage, banned in NEVER_FROM.items():
        wrong = [f"{at} imports {other}" for at, other in _stage_imports(stage)
                 if other in banned]  # fmt: skip
        assert not wrong, (
            f"{stage} imports nothing from {banned} (shape values: fusion_core.sizes):\n"
            + "\n".join(wrong)
        )


MAX_FUNCTION_LINES = 60  # issue 16: a function longer than this is split


def test_no_function_is_longer_than_the_limit() -> None:
    long = []
    for path in _modules().values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {lines}")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


# Services flush; the caller (a route, the worker's session_scope, the CLI) commits, so a
# unit of work is one transaction the caller can see. The exceptions end a read before a
# compare-and-swap write on purpose: on SQLite a read transaction that later writes fails
# with "database is locked" when another writer committed in between, so the swap must
# start a fresh transaction. The idempotent create inserts, and on a duplicate key
# rolls back and reads the winner's job.
COMMITTING_SERVICES = {
    "app/services/versioned.py": "compare-and-swap on a pattern's or strategy's version",
    "app/services/uploads/_accept.py": "insert-or-read on the idempotency key",
}


def test_services_flush_and_leave_the_commit_to_their_caller() -> None:
    committing = {}
    for path in sorted((REPO / "app" / "services").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "commit"
            ):
                committing.setdefault(str(path.relative_to(REPO)), []).append(node.lineno)
    unexpected = {p: lines for p, lines in committing.items() if p not in COMMITTING_SERVICES}
    assert not unexpected, f"services that commit (flush; let the caller commit): {unexpected}"
    stale = set(COMMITTING_SERVICES) - set(committing)
    assert not stale, f"no longer commit: drop them from COMMITTING_SERVICES: {stale}"
