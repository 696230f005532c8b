"""The engine registry (kvdiag.engines.spec): each engine's catalog, fault check, launcher and
log resolve from its one entry; an unknown engine or fault is one KvdiagError naming the known
ones; targets and fleets carry the entry they parsed; and no module outside kvdiag/engines/
dispatches on an engine's name. No engine runs, none need be installed."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvdiag.engines.spec import ENGINES, engine_spec
from kvdiag.errors import KvdiagError
from kvdiag.targets import parse_target

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", list(ENGINES))
def test_every_fault_of_a_catalog_passes_its_check(name):
    spec = engine_spec(name)
    catalog = spec.catalog()
    assert catalog and all(spec.check_fault(fault) == fault for fault in catalog)
    assert spec.check_fault(None) is None
    with pytest.raises(KvdiagError, match=f"unknown {spec.label} fault 'nope'") as e:
        spec.check_fault("nope")
    assert all(fault in str(e.value) for fault in catalog)


@pytest.mark.parametrize("name", list(ENGINES))
def test_the_launcher_is_named_and_logs_as_its_entry_says(name):
    spec = engine_spec(name)
    launcher = spec.launcher()
    assert (spec.label, spec.log_name) == (launcher.NAME, launcher.LOG_NAME)


def test_an_unknown_engine_names_the_known_ones():
    with pytest.raises(KvdiagError) as e:
        engine_spec("trt", "--engine")
    assert str(e.value) == "--engine 'trt': expected vllm, sglang or llamacpp"
    with pytest.raises(KvdiagError, match="expected reference:ALLOCATOR"):
        parse_target("trt-local")


def test_a_target_carries_its_engine_and_a_fleet_labels_it_by_it(tmp_path):
    from kvdiag.fleet.spec import load_fleet

    fault = next(iter(ENGINES["sglang"].catalog()))
    target = parse_target(f"sglang-local:{fault}")
    assert (target.engine, target.fault, target.kind) == (ENGINES["sglang"], fault, "sglang-local")
    assert parse_target("vllm-local").kind == "vllm-local"
    assert parse_target("http://127.0.0.1:1").kind == "url"
    targets = [{"name": n, "target": f"{n}-local", "suites": ["smoke"]} for n in ENGINES]
    (tmp_path / "fleet.yaml").write_text(json.dumps({"targets": targets}))  # JSON is YAML
    fleet = load_fleet(tmp_path / "fleet.yaml")
    assert [(t.kind, t.is_local) for t in fleet.targets] == [(f"{n}-local", True) for n in ENGINES]


def test_detect_refuses_the_audit_of_an_engine_without_one():
    from kvdiag.commands.detect import choose

    no_audit = [s for s in ENGINES.values() if s.no_audit]
    assert no_audit  # SGLang: probed live only
    for spec in no_audit:
        with pytest.raises(KvdiagError, match=f"--engine {spec.name} has no model-free audit"):
            choose(spec, None, ["audit"])
        assert choose(spec, None, ["live"])[1] == ["live"]


def test_the_registry_imports_no_engine_module():
    """kvdiag runs without vLLM or SGLang: their entries load nothing until asked."""
    code = ("import sys, kvdiag.targets; "
            "print(sorted(m for m in sys.modules if m.startswith(('vllm', 'sglang', "
            "'kvdiag.engines.vllm.launcher', 'kvdiag.engines.sglang'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT)
    assert out.stdout.strip() == "[]"


def _compares_engine_name(node: ast.AST, names: set[str]) -> bool:
    """`x == "vllm"`, `x in ("vllm-local", ...)`: a comparison with an engine's name or kind."""
    if not isinstance(node, ast.Compare):
        return False
    for side in (node.left, *node.comparators):
        items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
        if any(isinstance(i, ast.Constant) and i.value in names for i in items):
            return True
    return False


def test_no_module_outside_engines_dispatches_on_an_engine_name():
    names = {n for s in ENGINES.values() for n in (s.name, s.target_kind)}
    found = []
    for path in sorted((ROOT / "kvdiag").rglob("*.py")):
        if (ROOT / "kvdiag" / "engines") in path.parents:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [f"{path.relative_to(ROOT)}:{n.lineno}" for n in ast.walk(tree)
                  if _compares_engine_name(n, names)]
    assert found == []
