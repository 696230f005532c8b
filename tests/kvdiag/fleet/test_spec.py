"""FLEET.yaml through pydantic: a good file resolves to its targets and cells; a bad one is one
KvdiagError line naming the file and the key. The driver starts a local Ray up to
START_ATTEMPTS times (tenacity) and an existing cluster once, shutting Ray down after each
failure (a stand-in `ray` module: no Ray starts)."""

from __future__ import annotations

import json
import sys
import types

import pytest

from kvdiag.errors import KvdiagError
from kvdiag.fleet.driver import START_ATTEMPTS, _start_ray
from kvdiag.fleet.spec import ENDPOINT_CPUS, ENGINE_CPUS, load_fleet

GOOD = {"name": "a", "target": "reference:guarded", "suites": ["smoke"]}


def _load(tmp_path, data):
    (tmp_path / "fleet.yaml").write_text(json.dumps(data))  # JSON is YAML
    return load_fleet(tmp_path / "fleet.yaml")


def test_a_good_file_resolves_targets_and_cells(tmp_path):
    url = {"name": "u", "target": "http://127.0.0.1:1", "model": "m", "flags": {"tp": 2},
           "suites": [{"suite": "smoke", "cases": "all"}], "concurrency": 2, "api_key_env": "K"}
    fleet = _load(tmp_path, {"time_limit": 60, "max_retries": 0, "history": "h.sqlite",
                             "targets": [GOOD | {"num_cpus": 2}, url]})
    a, u = fleet.targets
    assert (a.kind, a.num_cpus, a.concurrency, a.requests) == ("reference", 2.0, 1, 16)
    assert (u.kind, u.num_cpus, u.flags, u.api_key_env) == ("url", ENDPOINT_CPUS, {"tp": "2"}, "K")
    assert [c.id for c in fleet.cells] == ["a.smoke.trigger", "u.smoke.trigger"]
    assert fleet.by_name["u"] is u and (fleet.time_limit, fleet.max_retries) == (60.0, 0)
    assert str(fleet.history) == "h.sqlite" and fleet.cells[0].model_dump() == {
        "target": "a", "suite": "smoke", "suite_name": "smoke", "case": "trigger"}
    assert _load(tmp_path, {"targets": [GOOD]}).targets[0].num_cpus == ENGINE_CPUS


@pytest.mark.parametrize("data, message", [
    ([GOOD], "expected a mapping with a non-empty list `targets`"),
    ({"targets": []}, "targets: List should have at least 1 item"),
    ({"nope": 1, "targets": [GOOD]}, "nope: unknown key"),
    ({"targets": ["a"]}, "targets[0]: expected a mapping"),
    ({"targets": [GOOD | {"nope": 1}]}, "targets[0].nope: unknown key"),
    ({"targets": [GOOD | {"name": "-a"}]}, "targets[0].name: '-a' is not a name"),
    ({"targets": [{"target": "reference:guarded", "suites": ["smoke"]}]}, "targets[0].name: Field required"),
    ({"targets": [GOOD | {"concurrency": 0}]}, "targets[0].concurrency: Input should be greater than 0"),
    ({"targets": [GOOD | {"requests": "16"}]}, "targets[0].requests: Input should be a valid integer"),
    ({"targets": [GOOD | {"num_cpus": True}]}, "targets[0].num_cpus: Input should be a valid number"),
    ({"targets": [GOOD | {"flags": [1]}]}, "targets[0].flags: expected a mapping"),
    ({"targets": [GOOD | {"suites": []}]}, "targets[0].suites: List should have at least 1 item"),
    ({"targets": [GOOD | {"suites": [3]}]}, "targets[0].suites[0]: expected a suite name or {suite: S"),
    ({"time_limit": 0, "targets": [GOOD]}, "time_limit: Input should be greater than 0 (got 0)"),
    ({"max_retries": -1, "targets": [GOOD]}, "max_retries: Input should be greater than or equal to 0"),
    ({"targets": [GOOD, GOOD]}, "targets[1].name: duplicate target name 'a'"),
    ({"targets": [GOOD | {"target": "http://h:1"}]}, "targets[0].model: a URL target needs"),
])
def test_a_bad_file_is_one_line_naming_the_key(tmp_path, data, message):
    with pytest.raises(KvdiagError) as e:
        _load(tmp_path, data)
    assert str(e.value).startswith(f"{tmp_path / 'fleet.yaml'}: ") and "\n" not in str(e.value)
    assert message in str(e.value)


def _fake_ray(monkeypatch, failures: int) -> dict:
    calls = {"init": [], "shutdown": 0}

    def init(**kw):
        calls["init"].append(kw)
        if len(calls["init"]) <= failures:
            raise RuntimeError("raylet missed its deadline\nmore text")

    def shutdown():
        calls["shutdown"] += 1

    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(init=init, shutdown=shutdown))
    return calls


def test_a_local_ray_is_started_again_after_a_failure(monkeypatch):
    calls = _fake_ray(monkeypatch, failures=START_ATTEMPTS - 1)
    _start_ray(None, 2)
    assert calls["init"] == [{"num_cpus": 2, "include_dashboard": False, "log_to_driver": False}] \
        * START_ATTEMPTS
    assert calls["shutdown"] == START_ATTEMPTS - 1


def test_ray_that_never_starts_is_one_line(monkeypatch):
    calls = _fake_ray(monkeypatch, failures=99)
    with pytest.raises(KvdiagError, match=r"^Ray could not start locally: raylet missed its deadline$"):
        _start_ray(None, 2)
    assert len(calls["init"]) == START_ATTEMPTS and calls["shutdown"] == START_ATTEMPTS
    calls = _fake_ray(monkeypatch, failures=99)
    with pytest.raises(KvdiagError, match=r"^Ray could not start ray://head:10001: raylet"):
        _start_ray("ray://head:10001", None)  # an existing cluster: tried once
    assert calls["init"] == [{"address": "ray://head:10001", "log_to_driver": False}]
    assert calls["shutdown"] == 1
