"""The import graph has the shape the design says (docs/architecture.md): no import circles,
reference_engine never imports kvdiag, runners never import the CLI or the pipeline, and
the allocator registry and `kvdiag --help` load no torch. Lazy imports inside functions
count: a circle through them is still a circle for a reader."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kvdiag", "reference_engine")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                       and getattr(block.test, "id", getattr(block.test, "attr", "")) == "TYPE_CHECKING"
                       for stmt in block.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in typing_only:  # annotations only: never executed
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                    + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]
            else:
                continue
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def _without_package_inits(graph):
    """A package's __init__ that only re-exports its modules is not a circle of design."""
    return {m: {t for t in e if not m.startswith(t + ".")} for m, e in graph.items()}


def test_no_import_circles():
    assert _cycles(_without_package_inits(_graph())) == []


def _packages(graph: dict[str, set[str]], depth: int) -> dict[str, set[str]]:
    """The graph of units `depth` names deep (kvdiag.runners at 2, kvdiag.runners.live at 3):
    a module's edges become its unit's, edges inside a unit and up to a containing package's
    __init__ dropped."""
    def unit(m: str) -> str:
        return ".".join(m.split(".")[:depth])

    out: dict[str, set[str]] = {}
    for m, targets in graph.items():
        out.setdefault(unit(m), set())
        for t in targets:
            if unit(t) != unit(m) and not unit(m).startswith(unit(t) + "."):
                out[unit(m)].add(unit(t))
                out.setdefault(unit(t), set())
    return out


def test_no_package_circles():
    """canary never needs facts' users, engines never need targets, and so on: the folder
    tree reads as layers, at every depth."""
    graph = _graph()
    for depth in (2, 3, 4):
        assert _cycles(_packages(graph, depth)) == [], f"package circle at depth {depth}"


def test_the_package_test_sees_a_circle():
    """The check itself can fail: two packages that import each other are one circle."""
    graph = {"kvdiag.a.x": {"kvdiag.b.y"}, "kvdiag.b.y": {"kvdiag.a.z"}, "kvdiag.a.z": set()}
    assert _cycles(_packages(graph, 2)) == [["kvdiag.a", "kvdiag.b"]]
    assert _cycles(graph) == []  # no module circle: only the package picture shows it


def test_layers():
    graph = _graph()
    bad = [f"{m} -> {t}" for m, targets in graph.items() for t in targets
           if (m.startswith("reference_engine") and t.startswith("kvdiag"))
           or (m.startswith("kvdiag.runners") and t.startswith(("kvdiag.cli", "kvdiag.commands")))
           or (m != "kvdiag.__main__" and not m.startswith("kvdiag.cli") and t.startswith("kvdiag.cli"))]
    assert bad == []


def _loads_torch(code: str) -> bool:
    out = subprocess.run([sys.executable, "-c", code + "; import sys; print('torch' in sys.modules)"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return out.stdout.strip().splitlines()[-1] == "True"


def test_allocator_registry_and_help_import_no_torch():
    assert not _loads_torch("from reference_engine import allocators; "
                            "allocators.canonical_name('buggy')")
    assert not _loads_torch("from typer.testing import CliRunner; from kvdiag.cli import app; "
                            "assert CliRunner().invoke(app, ['--help']).exit_code == 0")
    assert not _loads_torch("import kvdiag.planning.suites, kvdiag.verdicts, kvdiag.vocab, kvdiag.commands.lifecycle")


def test_modules_stay_small():
    """Issue 38's rule for a reader: no kvdiag module over 300 lines, the median under 100."""
    import statistics

    sizes = {path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
             for path in (ROOT / "kvdiag").rglob("*.py")}
    assert not {p: n for p, n in sizes.items() if n > 300}
    assert statistics.median(sizes.values()) < 100
