"""The package's layers, read from its source: imports run one way and form no circle.

Every import counts, including those inside functions and, for the layers and circles, those under
``if TYPE_CHECKING:`` (they never run, but a circle of types is still a circle of concepts). pyspark
may be named for types anywhere: only its imports that run are kept under ``spark/`` and ``jobs/``.
The layers, from the bottom up, are listed in :data:`LAYERS`; a module may
import its own layer and those below it. docs/architecture.md explains the rule.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mqspark"

# Bottom to top. A name ending in "." is a package: every module under it.
LAYERS: list[tuple[str, ...]] = [
    ("mqspark.errors", "mqspark.clock"),
    ("mqspark.store.",),
    ("mqspark.model.",),
    ("mqspark.engine.",),
    ("mqspark.cluster.",),
    ("mqspark.services.",),
    ("mqspark.qmgr", "mqspark.reconnect"),
    ("mqspark.status",),
    ("mqspark.spark.", "mqspark.jobs."),
    ("mqspark.cli", "mqspark.cli.", "mqspark.console."),
    ("mqspark.demo", "mqspark"),
]
# pyspark is imported only here (the package's own __init__ loads Spark lazily, on first use).
SPARK_PLACES = ("mqspark.spark.", "mqspark.jobs.", "mqspark")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(tree: ast.AST, types_only: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Each import statement, and whether it is only for types (under ``if TYPE_CHECKING:``)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for branch, only in ((node.body, True), (node.orelse, types_only)):  # an else branch runs
                yield from _imports(ast.Module(body=branch, type_ignores=[]), only)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            yield node, types_only
        else:
            yield from _imports(node, types_only)


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> Iterator[str]:
    """The modules an import statement loads (a name imported from a package may be a submodule)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([base] if base else []))
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        yield submodule if submodule in known else base


def import_graph() -> nx.DiGraph:
    paths = sorted(PACKAGE.rglob("*.py"))
    known = {_module_name(path) for path in paths}
    graph = nx.DiGraph()
    for path in paths:
        module = _module_name(path)
        graph.add_node(module)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node, types_only in _imports(tree):
            for target in _targets(module, path.name == "__init__.py", node, known):
                if (target.startswith("mqspark") or (target.startswith("pyspark") and not types_only)) and (
                    target != module
                ):
                    graph.add_edge(module, target, line=node.lineno)
    return graph


def layer_of(module: str) -> int:
    for index, layer in enumerate(LAYERS):
        for place in layer:
            if module == place or (place.endswith(".") and (module + ".").startswith(place)):
                return index
    raise AssertionError(f"module {module} is in no layer: add it to LAYERS and docs/architecture.md")


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    return import_graph()


def test_the_package_has_no_import_circle(graph):
    circles = sorted(sorted(component) for component in nx.strongly_connected_components(graph) if len(component) > 1)
    assert circles == []


def test_every_module_imports_only_its_own_layer_or_those_below(graph):
    upward = [
        f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)}) at line {line}"
        for module, target, line in graph.edges(data="line")
        if target.startswith("mqspark") and layer_of(target) > layer_of(module)
    ]
    assert upward == []


def test_pyspark_is_imported_only_under_spark_and_jobs(graph):
    outside = sorted(
        f"{module} imports {target}"
        for module, target in graph.edges()
        if target.startswith("pyspark")
        and not any(module == place or module.startswith(place) for place in SPARK_PLACES if place.endswith("."))
        and module != "mqspark"
    )
    assert outside == []


def test_every_module_says_what_it_owns():
    without = [
        _module_name(path)
        for path in sorted(PACKAGE.rglob("*.py"))
        if not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert without == []


def test_the_checks_see_an_upward_import_and_a_circle():
    """The graph is built from real source: imports inside functions and under TYPE_CHECKING count."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from mqspark.qmgr import QueueManager\n"
        "def f():\n    from mqspark.spark import session\n"
    )
    found = [
        (target, types_only)
        for node, types_only in _imports(ast.parse(source))
        for target in _targets("mqspark.engine.x", False, node, {"mqspark.spark.session"})
        if target.startswith("mqspark")
    ]
    assert found == [("mqspark.qmgr", True), ("mqspark.spark.session", False)]
    assert layer_of("mqspark.spark.session") > layer_of("mqspark.engine.x")
    looped = nx.DiGraph([("a", "b"), ("b", "a")])
    assert [sorted(c) for c in nx.strongly_connected_components(looped) if len(c) > 1] == [["a", "b"]]
