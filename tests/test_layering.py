"""The import layering of ``flashrec/`` and ``harness/``, read from the source with ``ast``
(nothing is imported).

Counted as a module's imports for the cycle check: its module-level imports, those inside
module-level ``if`` / ``try`` / ``with`` blocks and class bodies included (they run when the
module is imported). Not counted: imports inside functions (they run on call, after every
module has loaded) and imports under ``if TYPE_CHECKING:`` (they never run). ``from a import
b`` counts as importing the module ``a.b`` where that is a module, else ``a``; a package's
``__init__`` is not counted as imported along with its submodules. A second check counts the
in-function imports too: a circle closed by one (as ``engine.request`` importing
``engine.engine.load_tokenizer`` did) is a tangle of responsibilities even when it loads.

The harness gets the same two cycle checks, a third over its packages (each module folded
into its wing: ``harness.load.client`` -> ``harness.load``), and may import nothing of the
engine or the server (it talks to servers over HTTP). Its registries name modules as
``"module:function"`` strings imported on use (the run's stages, the CLI's subcommands): each
must name a function that exists, and the stage registry's entries count as its in-function
imports.
Its wings are listed (:data:`HARNESS_WINGS`), each importing only wings listed before it, and
the CLI (``harness.cli``) is imported by nothing but ``python -m harness``.

The layer rules (the packages below the engine, layers and the KV cache among them, know
nothing of the engine or the server; kernels nothing of those or the layers; the engine nothing
of the server) are checked on every import in a file, function-level and ``TYPE_CHECKING``
ones included.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flashrec", "harness")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {
        _module_name(p): p
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if "__pycache__" not in p.parts
    }


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(body: list[ast.stmt], *, load_time_only: bool):
    """The Import / ImportFrom statements of ``body``, recursively; with ``load_time_only``
    those in function bodies and ``if TYPE_CHECKING:`` blocks are skipped."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if not load_time_only:
                yield from _import_nodes(node.body, load_time_only=False)
        elif isinstance(node, ast.If) and load_time_only and _is_type_checking(node.test):
            yield from _import_nodes(node.orelse, load_time_only=True)
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for sub in getattr(node, field, ()):
                    inner = (
                        sub.body if isinstance(sub, ast.excepthandler | ast.match_case) else [sub]
                    )
                    yield from _import_nodes(inner, load_time_only=load_time_only)


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The absolute module names one import statement names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    out = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        out.append(sub if sub in MODULES else base)
    return out


# modules that name others as "module:function" strings, imported on use (importlib); the
# stage registry's entries count as its imports (the CLI's table sits above everything: its
# subcommands reuse the matrix run, whose help lists the table)
REGISTRIES = ("harness.run.stages", "harness.cli.commands")
IMPORTING_REGISTRIES = ("harness.run.stages",)
_ENTRY = re.compile(r"^(harness(?:\.\w+)*):(\w+)$")


def registered(module: str) -> list[tuple[str, str]]:
    """The ``(module, function)`` pairs a registry module names as ``"module:function"``."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"), str(MODULES[module]))
    return [
        (m.group(1), m.group(2))
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if (m := _ENTRY.match(node.value))
    ]


def imports(module: str, *, load_time_only: bool) -> set[str]:
    """The names ``module`` imports (any package, not only ours); a registry's entries count
    as in-function imports."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"), str(MODULES[module]))
    out = {
        target
        for node in _import_nodes(tree.body, load_time_only=load_time_only)
        for target in _targets(module, node)
    }
    if not load_time_only and module in IMPORTING_REGISTRIES:
        out.update(target for target, _ in registered(module))
    return out


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (or a self-import), as a
    sorted list: Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    found.append(sorted(component))
    return found


def _graph(package: str, *, load_time_only: bool = True) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports."""
    return {
        m: {t for t in imports(m, load_time_only=load_time_only) if _within(t, package)}
        & MODULES.keys()
        for m in MODULES
        if _within(m, package)
    }


def test_every_module_parses_and_the_walk_sees_known_imports():
    # the walker itself: a module-level import, an in-function one, relative ones
    rel = ast.parse("from ..kvcache import pool\nfrom . import scheduler, nothing_such").body
    assert _targets("flashrec.engine.runner", rel[0]) == ["flashrec.kvcache.pool"]
    assert _targets("flashrec.engine.runner", rel[1]) == [
        "flashrec.engine.scheduler",
        "flashrec.engine",
    ]
    assert "flashrec.kvcache.pool" in imports("flashrec.layers.attention", load_time_only=True)
    assert "flashrec.config" in imports("flashrec.kvcache.pool", load_time_only=True)
    assert "transformers" not in imports("flashrec.prompt", load_time_only=True)
    assert "transformers" in imports("flashrec.prompt", load_time_only=False)
    for m in MODULES:
        imports(m, load_time_only=False)


def test_cycle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _cycles(graph) == [["a", "b", "c"], ["e"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_flashrec():
    assert _cycles(_graph("flashrec")) == []


def test_no_import_cycle_in_flashrec_counting_in_function_imports():
    assert _cycles(_graph("flashrec", load_time_only=False)) == []


def _upward(package: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    bad = {}
    for m in MODULES:
        if _within(m, package):
            hits = sorted(t for t in imports(m, load_time_only=False)
                          if any(_within(t, f) for f in forbidden))  # fmt: skip
            if hits:
                bad[m] = hits
    return bad


# packages below the engine; flashrec.layers and flashrec.kvcache are the ones the engine
# builds on most directly
BELOW_ENGINE = (
    "flashrec.config",
    "flashrec.profiler",
    "flashrec.prompt",
    "flashrec.sid",
    "flashrec.synth",
    "flashrec.beam",
    "flashrec.kernels",
    "flashrec.kvcache",
    "flashrec.layers",
    "flashrec.models",
    "flashrec.parentwatch",
)


@pytest.mark.parametrize("package", BELOW_ENGINE)
def test_packages_below_the_engine_import_nothing_of_it_or_the_server(package):
    assert any(_within(m, package) for m in MODULES), package
    assert _upward(package, ("flashrec.engine", "flashrec.server")) == {}


def test_engine_imports_nothing_of_the_server():
    assert _upward("flashrec.engine", ("flashrec.server",)) == {}


def test_the_engine_interface_is_a_leaf():
    """``flashrec.server.engine_api`` (what the server needs of an engine) imports nothing of
    flashrec when loaded: the engine satisfies it by shape, and a module it imported would sit
    between the server and every engine."""
    m = "flashrec.server.engine_api"
    assert m in MODULES
    assert sorted(t for t in imports(m, load_time_only=True) if _within(t, "flashrec")) == []


def test_kernels_import_nothing_of_the_engine_server_or_layers():
    forbidden = ("flashrec.engine", "flashrec.server", "flashrec.layers")
    assert _upward("flashrec.kernels", forbidden) == {}


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` with each module folded into its package one level below the root
    (``harness.load.client`` -> ``harness.load``; top-level modules stay themselves)."""

    def wing(m: str) -> str:
        return ".".join(m.split(".")[:2])

    out: dict[str, set[str]] = {}
    for m, targets in graph.items():
        out.setdefault(wing(m), set()).update(wing(t) for t in targets if wing(t) != wing(m))
    return out


def test_package_graph_folds_modules_and_finds_a_planted_circle():
    planted = {"h.a.x": {"h.b.y"}, "h.a.z": set(), "h.b.y": {"h.a.z"}, "h.c": {"h.a.x"}}
    folded = _package_graph(planted)
    assert folded == {"h.a": {"h.b"}, "h.b": {"h.a"}, "h.c": {"h.a"}}
    assert _cycles(folded) == [["h.a", "h.b"]]  # no circle between modules, one between wings


def test_no_import_cycle_in_harness():
    assert _cycles(_graph("harness")) == []


def test_no_import_cycle_in_harness_counting_in_function_imports():
    assert _cycles(_graph("harness", load_time_only=False)) == []


def test_no_import_cycle_between_harness_packages():
    assert _cycles(_package_graph(_graph("harness", load_time_only=False))) == []


def test_harness_imports_nothing_of_the_engine_or_the_server():
    assert _upward("harness", ("flashrec.engine", "flashrec.server")) == {}


def test_harness_checks_see_planted_violations(tmp_path, monkeypatch):
    # two planted wings closing a circle only through an in-function import, one of them also
    # importing the engine inside a function: the load-time graph misses both; the checks above
    # (in-function imports counted) see the circle between modules and between packages, and
    # the engine import
    a = tmp_path / "a.py"
    a.write_text("import harness.zz_b.m\n")
    b = tmp_path / "b.py"
    b.write_text("def f():\n    import harness.zz_a.m\n    import flashrec.engine\n")
    monkeypatch.setitem(MODULES, "harness.zz_a.m", a)
    monkeypatch.setitem(MODULES, "harness.zz_b.m", b)
    planted = ["harness.zz_a.m", "harness.zz_b.m"]
    assert planted not in _cycles(_graph("harness"))
    assert planted in _cycles(_graph("harness", load_time_only=False))
    wings = _cycles(_package_graph(_graph("harness", load_time_only=False)))
    assert ["harness.zz_a", "harness.zz_b"] in wings
    assert _upward("harness", ("flashrec.engine", "flashrec.server")) == {
        "harness.zz_b.m": ["flashrec.engine"]
    }


def test_registry_entries_name_functions_that_exist():
    # a registry entry is a string, so nothing else notices a moved or renamed target
    for registry in REGISTRIES:
        entries = registered(registry)
        assert entries, registry
        for module, func in entries:
            assert module in MODULES, f"{registry}: no module {module}"
            tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
            defined = {
                n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            }
            assert func in defined, f"{registry}: {module} defines no {func}"
    assert "harness.quality.stage" in imports("harness.run.stages", load_time_only=False)
    assert "harness.quality.stage" not in imports("harness.run.stages", load_time_only=True)


# the harness's packages, bottom up: each imports only those listed before it (function-level
# imports and registry entries counted); a new package takes its place here
HARNESS_WINGS = (
    "harness",  # the package root: the report's schema version
    "harness.names",  # the names a matrix may refer to (metrics, report sections, cell fields)
    "harness.spec",  # matrix YAML -> validated spec -> cells
    "harness.load",  # SIDs, prompts, one request per protocol, the load loops
    "harness.servers",  # server processes, the HF reference and its HTTP server
    "harness.trace",  # profiler traces: capture and summary
    "harness.metrics",  # records -> metrics, the server's and the host's counters
    "harness.baseline",  # HF generate per cell, in its own process
    "harness.parity",  # the parity stage: beams against a reference
    "harness.quality",  # the per-cell quality stage and ``eval``
    "harness.determinism",  # the determinism stage: fresh processes, bit for bit
    "harness.run",  # the run: cells on servers, then the stages
    "harness.report",  # report.json and its renderings
    "harness.judge",  # gates, targets, two runs compared, the A/B gate
    "harness.quick",  # the matrix of ``flashrec-bench quick``
    "harness.witness",  # GuideLLM beside flashrec-bench on one cell
    "harness.soak",  # ``flashrec-bench soak``: fixed-rate load for hours, probe, resource trends
    "harness.cli",  # the command line: wires the above, imported by nothing
    "harness.__main__",  # ``python -m harness``
)


def _wing_order_violations(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    rank = {w: i for i, w in enumerate(HARNESS_WINGS)}
    return {
        w: sorted(t for t in targets if rank.get(t, len(rank)) >= rank.get(w, -1))
        for w, targets in graph.items()
        if any(rank.get(t, len(rank)) >= rank.get(w, -1) for t in targets)
    }


def test_harness_wings_are_listed_and_import_only_wings_below():
    graph = _package_graph(_graph("harness", load_time_only=False))
    assert sorted(graph) == sorted(HARNESS_WINGS)
    assert _wing_order_violations(graph) == {}


def _cli_importers() -> dict[str, list[str]]:
    """Modules outside ``harness.cli`` that import it (``python -m harness`` excepted)."""
    return {
        m: hits
        for m, hits in _upward("harness", ("harness.cli",)).items()
        if not _within(m, "harness.cli") and m != "harness.__main__"
    } | _upward("flashrec", ("harness.cli",))


def test_nothing_imports_the_cli():
    # the CLI wires the library; a library module that reaches back into it (to run a matrix,
    # to reuse a parser) makes the path double back
    assert _cli_importers() == {}


def test_wing_and_cli_checks_see_planted_violations(tmp_path, monkeypatch):
    # a planted library module importing the CLI, and the spec importing the run (upward)
    a = tmp_path / "a.py"
    a.write_text("def f():\n    from harness.cli.run import main\n")
    b = tmp_path / "b.py"
    b.write_text("import harness.run.campaign\n")
    monkeypatch.setitem(MODULES, "harness.quick.zz_a", a)
    monkeypatch.setitem(MODULES, "harness.spec.zz_b", b)
    assert _cli_importers() == {"harness.quick.zz_a": ["harness.cli.run"]}
    graph = _package_graph(_graph("harness", load_time_only=False))
    assert _wing_order_violations(graph)["harness.spec"] == ["harness.run"]
