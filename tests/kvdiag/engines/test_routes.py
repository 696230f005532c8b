"""No module outside kvdiag/engines/ spells a server path beyond OpenAI's /v1 API: reset,
version, server info, /props, abort and /metrics are named once, in kvdiag.engines.routes
(or an engine's own protocol), and asked for by those names. kvdiag's own routes
(/kvdiag/...) and filesystem paths are not a server's."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
PATH = re.compile(r"^/[a-z_\-]+(/[a-z_\-.]+)*$")  # a URL path: /metrics, /server_info, /a/b
OWN = ("/v1/", "/kvdiag/", "/proc/", "/sys/", "/dev/", "/tmp/", "/usr/", "/etc/")


def spelled_paths(source: str) -> list[tuple[int, str]]:
    """(line, literal) of every string constant shaped as a server path that is not OpenAI's
    /v1 API, kvdiag's own route or a filesystem path (docstrings are prose, and an f-string's
    pieces are text, not calls)."""
    tree = ast.parse(source)
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node.body and isinstance(node.body[0], ast.Expr)}
    docs |= {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
            and PATH.match(n.value) and not n.value.startswith(OWN)]


def test_no_module_outside_engines_names_an_engines_path():
    engines = ROOT / "kvdiag" / "engines"
    found = [f"{p.relative_to(ROOT)}:{line}: {text!r}"
             for p in sorted((ROOT / "kvdiag").rglob("*.py")) if engines not in p.parents
             for line, text in spelled_paths(p.read_text(encoding="utf-8"))]
    assert not found, "engine paths named outside kvdiag/engines/:\n" + "\n".join(found)


def test_the_scan_sees_a_path_where_there_is_one():
    source = ('"""A module that asks /props (prose)."""\n'
              'r = get("/props")\nq = post("/v1/completions")\nm = Route("/kvdiag/metrics")\n'
              'x = ("/server_info", "/get_server_info")\nopen("/proc/cpuinfo")\nf"{case}/ground_truth"\n')
    assert [text for _, text in spelled_paths(source)] == ["/props", "/server_info", "/get_server_info"]
