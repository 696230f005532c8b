"""llama.cpp's sentinel, model-free: it is C++ in a source patch (kvdiag/engines/llamacpp/
sentinel.patch) that every binary kvdiag builds carries, so what can be held here is its
contract with the Python side: the lines it writes are the ones kvdiag.sentinel.log reads, its
own account of what it trusts reaches the verdict, and it runs by default only where kvdiag
built the binary. Its behaviour against real faults is in test_llamacpp_plants_live.py."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from kvdiag.commands.probe import sentinel_path
from kvdiag.engines.llamacpp import build
from kvdiag.errors import KvdiagError
from kvdiag.runners.live.sentinel import observe
from kvdiag.sentinel.facts import Counters, Finding
from kvdiag.targets import parse_target
from kvdiag.verdicts.sentinel import judge_sentinel

PATCH = build.SENTINEL_PATCH.read_text()


def _keys(kind: str) -> set[str]:
    """The keys of the JSON line of `kind` the patch's C++ writes (its json{...} literal)."""
    added = "\n".join(line[1:] for line in PATCH.splitlines() if line.startswith("+"))
    start = added.index(f'{{"type", "{kind}"}}')
    body = added[start:added.index("});", start)]
    return set(re.findall(r'\{"(\w+)",', body)) - {"type"}


def test_its_counters_and_findings_are_the_lines_the_reader_reads():
    assert _keys("counters") == {f.name for f in dataclasses.fields(Counters)}
    assert _keys("finding") == {f.name for f in dataclasses.fields(Finding)}
    assert {"engine", "version", "block_size", "pid", "time", "trusts"} == _keys("start")
    assert re.search(r'^\+.*"KVDIAG_SENTINEL"', PATCH, re.M)  # the variable the launcher sets


def test_what_it_trusts_is_its_own_and_a_pass_says_so(tmp_path):
    path = tmp_path / "sentinel.jsonl"
    trusts = "it trusts the kernels to write K/V into the cells the batch was given"
    counters = {f.name: 0 for f in dataclasses.fields(Counters)} | {"steps": 3, "requests": 2, "reads": 40}
    path.write_text("\n".join(json.dumps(row) for row in (
        {"type": "start", "engine": "llama.cpp", "version": "b11434-sentinel", "block_size": 1,
         "pid": 1, "time": 0.0, "trusts": trusts},
        {"type": "counters", **counters})) + "\n")
    block, _ = observe(path, wait=0)
    assert block.engine == "llama.cpp" and block.trusts == trusts
    judged = judge_sentinel(block)
    assert judged.verdict.value == "pass" and trusts in judged.reason and "40 KV slot reads" in judged.reason


@pytest.mark.parametrize(("target", "on"), [
    ("llamacpp-local", False),  # the stock build as shipped
    ("llamacpp-local:prefix-overrun", True),  # a binary kvdiag built
    ("llamacpp-local:upstream-fixes", True),
    ("vllm-local", True),
    ("http://127.0.0.1:9", False),  # somebody else's server: only where told
])
def test_it_runs_by_default_where_kvdiag_built_the_binary(target, on):
    assert parse_target(target).sentinel_default is on


def test_it_is_asked_for_on_the_stock_build_and_refused_where_kvdiag_starts_nothing():
    assert sentinel_path(parse_target("llamacpp-local"), "on") is True
    assert sentinel_path(parse_target("llamacpp-local"), None) is None
    with pytest.raises(KvdiagError, match="--sentinel on"):
        sentinel_path(parse_target("http://127.0.0.1:9"), "on")


def test_every_build_kvdiag_makes_carries_it_first_and_the_sentinel_build_only_it():
    from kvdiag.engines.llamacpp.faults import FAULTS, FIXES

    for name in [*FAULTS, *FIXES]:
        assert build.patch_chain(name)[0] == build.SENTINEL_PATCH
    assert build.patch_chain(build.SENTINEL) == [build.SENTINEL_PATCH]
    assert build.build_name(build.SENTINEL) == "b11434-sentinel"
    assert "tools/server/server-kvdiag.h" in build.patched_files(build.SENTINEL_PATCH)  # a file it adds
