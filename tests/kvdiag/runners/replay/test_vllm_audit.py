"""The vLLM audit: the trigger's traffic replayed through vLLM's own KVCacheManager /
BlockPool (vllm/v1/core) on CPU, audited with a shadow content map.

Tests that need vLLM skip where it is not importable; run them in the vLLM venv:

    make vllm-env && .venv-vllm/bin/python -m pytest tests/kvdiag/runners/replay/test_vllm_audit.py

The trace is the trigger schedule of tests/reference_engine/test_faults.py (16 sessions x 12
rounds, histories jumping 4095 -> 4112, uneven turns, a pool that forces recycling from
round 3) with random token ids: vLLM's block manager never sees a model.
"""

from __future__ import annotations

import json
import sys

import pytest

from kvdiag.errors import KvdiagError
from kvdiag.runners.replay.trace import (
    Trace,
    TraceConfig,
    TraceRequest,
    from_schedule,
    read_trace,
    write_trace,
)


def _vllm_importable() -> bool:
    try:
        import vllm.v1.core.kv_cache_manager  # noqa: F401
    except Exception:
        return False
    return True


needs_vllm = pytest.mark.skipif(not _vllm_importable(), reason="vllm is not importable here: "
                                "build it with `make vllm-env` and run these tests with "
                                ".venv-vllm/bin/python -m pytest tests/kvdiag/runners/replay/test_vllm_audit.py")


@pytest.fixture(scope="module")
def trigger_trace() -> Trace:
    from kvdiag.planning.scenarios import make_schedule
    from tests.sessions_util import answer_lengths

    return from_schedule(make_schedule("trigger", answer_lengths(16, 12), min_user=6))


@pytest.fixture(scope="module")
def api():
    from kvdiag.runners.replay.vllm_api import load

    return load()


def _by_round(records, key):
    out = {}
    for r in records:
        out[r.round] = out.get(r.round, 0) + getattr(r, key)
    return out


# --- without vLLM -------------------------------------------------------------------------
def test_trace_round_trips_and_bad_traces_name_the_line(tmp_path, trigger_trace):
    path = tmp_path / "t.jsonl"
    write_trace(trigger_trace, path)
    back = read_trace(path)
    assert back.config == trigger_trace.config
    assert [(r.session, r.round, r.prompt_ids, r.output_ids, r.think_steps) for r in back.requests] == \
        [(r.session, r.round, r.prompt_ids, r.output_ids, r.think_steps) for r in trigger_trace.requests]
    lines = path.read_text().splitlines()
    row = json.loads(lines[3])
    row["output_ids"] = "oops"
    (tmp_path / "bad.jsonl").write_text("\n".join(lines[:3] + [json.dumps(row)]) + "\n")
    with pytest.raises(KvdiagError, match=r"bad.jsonl:4: 'output_ids'"):
        read_trace(tmp_path / "bad.jsonl")
    (tmp_path / "nohead.jsonl").write_text("\n".join(lines[1:]) + "\n")
    with pytest.raises(KvdiagError, match="first line must be the header"):
        read_trace(tmp_path / "nohead.jsonl")


def test_missing_vllm_is_a_one_line_error(monkeypatch):
    from kvdiag.runners.replay.vllm_api import load

    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(KvdiagError, match="vllm is not importable .*make vllm-env") as e:
        load()
    assert "\n" not in str(e.value)


# --- against real vLLM --------------------------------------------------------------------
@needs_vllm
def test_unsupported_vllm_version_is_a_one_line_error(monkeypatch):
    import vllm

    from kvdiag.runners.replay.vllm_api import load

    monkeypatch.setattr(vllm, "__version__", "0.20.2")
    with pytest.raises(KvdiagError, match=r"vllm 0\.20\.2 is not supported .*0\.17\.x and 0\.33\.x"):
        load()


@needs_vllm
def test_trigger_through_vllm_reads_no_foreign_slot(trigger_trace, api, monkeypatch):
    from vllm.v1.core.block_pool import BlockPool

    from kvdiag.runners.replay.vllm import replay_vllm

    evicted = []
    real = BlockPool._maybe_evict_cached_block

    def counting(self, block):
        hit = real(self, block)
        evicted.append(hit)
        return hit

    monkeypatch.setattr(BlockPool, "_maybe_evict_cached_block", counting)
    result = replay_vllm(trigger_trace, api=api)
    assert sum(evicted) > 100  # cached blocks were recycled: the trigger's pressure held
    assert all(r.foreign_slots == 0 and r.unwritten_slots == 0 for r in result.records)
    assert result.stats["invariant_violations"] == 0 and result.violations == []
    # reuse from vLLM's own PrefixCacheStats, per request and over the run
    assert sum(r.cached_tokens for r in result.records) == result.stats["prefix_cache_hits"]
    assert result.stats["prefix_cache_queries"] == sum(r.prompt_tokens for r in result.records)
    assert 0.9 < result.stats["prefix_cache_hit_rate"] < 1.0
    hit, needed = _by_round(result.records, "blocks_hit"), _by_round(result.records, "blocks_needed")
    assert len(hit) == 12 and all(0.5 < hit[n] / needed[n] <= 1.0 for n in hit)
    assert result.target == api.label and {r.allocator for r in result.records} == {"vllm"}


@needs_vllm
def test_planted_stale_hash_in_vllm_is_detected_and_rounds_named(trigger_trace, api, monkeypatch):
    from vllm.v1.core.block_pool import BlockPool

    from kvdiag.runners.replay.audit import vllm_section
    from kvdiag.runners.replay.vllm import replay_vllm

    # The planted fault: a recycled block keeps its hash -> block entry.
    monkeypatch.setattr(BlockPool, "_maybe_evict_cached_block", lambda self, block: False)
    result = replay_vllm(trigger_trace, api=api)
    foreign = _by_round(result.records, "foreign_slots")
    section = vllm_section(result)
    assert section.corrupted
    named = section.corrupted_rounds
    assert named and named == sorted(n for n, v in foreign.items() if v or
                                     _by_round(result.records, "unwritten_slots")[n])
    assert foreign[1] == foreign[2] == 0  # nothing recycled yet
    assert sum(foreign.values()) > 100 and foreign[12] > 0
    assert result.stats["invariant_violations"] > 0
    assert any("holds other content" in v for v in result.violations)


@needs_vllm
def test_same_trace_through_prefix_cache_gives_vllms_hits_once_policies_align(trigger_trace, api):
    from kvdiag.runners.replay.hit_diff import explain

    stages = explain(trigger_trace, api)
    first, last = stages[0], stages[-1]
    assert first.differing, "the policies differ, so the raw hit counts do"
    assert last.differing == [] and last.ours_blocks_hit == last.vllm_blocks_hit
    # registration timing alone explains round 1: vLLM hits the shared prefix a request
    # admitted earlier in the same step is computing
    round_one = [d for d in first.differing if d[1] == 1]
    assert round_one and all(ours < theirs for _, _, ours, theirs in round_one)
    assert not [d for d in stages[1].differing if d[1] == 1]


def _tiny_trace(prompts, outputs, salts, num_blocks=64, max_num_seqs=4) -> Trace:
    config = TraceConfig(suite="t", case="c", block_size=16, num_blocks=num_blocks,
                         max_num_seqs=max_num_seqs)
    return Trace(config, [TraceRequest(session=f"s{i}", round=1, prompt_ids=p, output_ids=o,
                                       cache_salt=s, think_steps=0)
                          for i, (p, o, s) in enumerate(zip(prompts, outputs, salts))])


@needs_vllm
def test_cache_salt_isolates_tenants_in_vllm_and_ours(api):
    from kvdiag.runners.replay.drive import replay_allocator
    from kvdiag.runners.replay.vllm import replay_vllm

    prompt = list(range(10, 60))
    # s0 runs alone first (s1..s3 arrive after it finished: one request at a time)
    trace = _tiny_trace([prompt] * 4, [[5, 6]] * 4, [None, None, "a", "b"], max_num_seqs=1)
    for result in (replay_vllm(trace, api=api), replay_allocator(trace, "prefix-cache")):
        hits = {r.session: r.blocks_hit for r in result.records}
        assert hits == {"s0": 0, "s1": 3, "s2": 0, "s3": 0}, result.target
        assert all(r.foreign_slots == 0 for r in result.records)


@needs_vllm
def test_preemption_is_replayed_and_stays_clean(api):
    from kvdiag.runners.replay.vllm import replay_vllm

    # 4 requests of 40 prompt + 40 output tokens in a pool of 16 blocks: decode appends run
    # out of blocks and the last admitted request is preempted (recompute).
    prompts = [[3 + i] * 40 for i in range(4)]
    outputs = [list(range(20, 60))] * 4
    result = replay_vllm(_tiny_trace(prompts, outputs, [None] * 4, num_blocks=16), api=api)
    assert result.stats["preemptions"] > 0 and result.stats["preempted_requests"] > 0
    assert sum(r.preemptions for r in result.records) == result.stats["preemptions"]
    assert all(r.foreign_slots == 0 and r.unwritten_slots == 0 for r in result.records)
    assert result.stats["invariant_violations"] == 0


@needs_vllm
def test_audit_cli_writes_a_run_and_exits_by_verdict(tmp_path, trigger_trace, monkeypatch):
    import typer
    from typer.testing import CliRunner

    from kvdiag.cli.audit import audit_vllm

    app = typer.Typer()
    app.command("audit-vllm")(audit_vllm)
    app.command("noop")(lambda: None)  # two commands: typer keeps the sub-command name
    path = tmp_path / "trigger.jsonl"
    write_trace(trigger_trace, path)
    runner = CliRunner()
    ok = runner.invoke(app, ["audit-vllm", "--trace", str(path), "--out", str(tmp_path / "ok"), "--json"])
    assert ok.exit_code == 0, ok.output
    from tests.kvdiag.schema_util import assert_valid_summary

    summary = assert_valid_summary(tmp_path / "ok", "audit")  # a trace's digest names its model
    assert summary["verdict"] == "pass" and summary["vllm_audit"]["corrupted"] is False
    assert summary["vllm_audit"]["recycled_blocks"] > 0 and "model:trace-" in summary["signature"]
    assert (tmp_path / "ok" / "report.html").is_file() and (tmp_path / "ok" / "results.parquet").is_file()
    assert {r["allocator"] for r in summary["rounds"]} == {"contiguous", "vllm", "prefix-cache"}
    assert summary["vllm_audit"]["compare"]["explained"][-1]["requests_differing"] == 0
    differential = summary["vllm_audit"]["epilogue"]["differential"]
    assert differential["requests"] > 0 and differential["over_hits"] == 0, differential

    from vllm.v1.core.block_pool import BlockPool

    monkeypatch.setattr(BlockPool, "_maybe_evict_cached_block", lambda self, block: False)
    bad = runner.invoke(app, ["audit-vllm", "--trace", str(path), "--out", str(tmp_path / "bad"),
                              "--compare", "none"])
    assert bad.exit_code == 1, bad.output
    assert "foreign or unwritten slots read in rounds [" in bad.output
    missing = runner.invoke(app, ["audit-vllm", "--trace", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 2


@needs_vllm
@pytest.mark.slow
def test_reproduce_trigger_case_through_vllm(tmp_path):
    """The bundled suite's trigger case (canary model, contiguous reference) through
    run_suite with allocator "vllm", as `kvdiag reproduce --allocators vllm` runs it."""
    from kvdiag.commands.reproduce import measure
    from kvdiag.planning.suites import load_suite

    suite = load_suite("reproduce")
    measured = measure(suite, [suite.case("trigger")], allocators=["vllm"])
    rows = [r for r in measured.rounds if r["allocator"] == "vllm"]
    assert len(rows) == 12 and all(r["foreign_slots"] == 0 and r["unwritten_slots"] == 0 for r in rows)
    assert all(0.5 < r["block_reuse_rate"] <= 1.0 for r in rows)
    audit = measured.run.vllm_audit["trigger"]
    assert audit.invariant_violations == 0 and 0.9 < audit.prefix_cache_hit_rate < 1.0
    assert measured.run.recycled["trigger"]["vllm"] > 0
    assert measured.judge().verdict.value == "pass"


# --- the model-free detection matrix: every fault of the catalog, planted in-process --------
@needs_vllm
def test_the_model_free_matrix_catches_every_fault_and_passes_healthy(tmp_path):
    """`kvdiag detect` on the smoke suite: healthy vLLM passes (no false positive), and every
    fault of engines/vllm/catalog.py whose event the replay drives, planted into vLLM's own
    allocator, fails the audit. The faults living at an event it does not drive (chunked
    prefill, preemption, a failed admission) are rows that say so, inconclusive, never
    counted as caught; test_vllm_lifecycle.py shows each acting on a trace of its event."""
    from typer.testing import CliRunner

    from kvdiag.cli import app
    from kvdiag.engines.vllm.catalog import FAULTS

    reached = [n for n, f in FAULTS.items() if "audit" not in f.unreachable]
    unreached = [n for n in FAULTS if n not in reached]
    assert unreached  # the lifecycle faults at preemption, chunked prefill and backlog
    result = CliRunner().invoke(app, ["detect", "--out", str(tmp_path / "m"), "--json"])
    assert result.exit_code == 2, result.output  # inconclusive: proved nothing for those
    from tests.kvdiag.schema_util import assert_valid_summary

    summary = assert_valid_summary(tmp_path / "m", "matrix")
    rows = {r["fault"]: r for r in summary["matrix"]}
    assert set(rows) == {"healthy", *FAULTS}
    assert summary["reason"].startswith("proved nothing for: ")
    for name in unreached:
        assert rows[name]["verdict"] == "inconclusive" and not rows[name]["caught"], rows[name]
        assert rows[name]["reason"] == f"not reachable here: {FAULTS[name].unreachable['audit']}"
    assert rows["healthy"]["verdict"] == "pass" and rows["healthy"]["corrupted"] == 0
    for name in reached:
        assert rows[name]["verdict"] == "fail" and rows[name]["caught"], rows[name]
    # the faults that corrupt output in the trace itself are seen reading foreign slots
    for name in ("stale-hash", "double-free", "weak-hash", "partial-hash"):
        assert rows[name]["corrupted"] > 0 and rows[name]["first_round"] >= 1, rows[name]


@needs_vllm
def test_every_plant_undoes_itself(api):
    """Planting and undoing each fault leaves vLLM's allocator healthy: the same replay of
    the same trace gives the same hits before and after."""
    from kvdiag.commands.audit import planted_audit
    from kvdiag.engines.vllm.catalog import FAULTS
    from kvdiag.planning.scenarios import make_schedule
    from tests.sessions_util import answer_lengths

    trace = from_schedule(make_schedule("trigger", answer_lengths(4, 4), min_user=6,
                                        shared_prefix=64, boundary=256, start_range=(180, 240)))
    before = planted_audit(trace, None, None, api=api).section.prefix_cache_hits
    for name in FAULTS:
        planted_audit(trace, None, name, api=api)
    assert planted_audit(trace, None, None, api=api).section.prefix_cache_hits == before


def test_an_unknown_fault_exits_2_before_anything_runs(tmp_path):
    from typer.testing import CliRunner

    from kvdiag.cli import app

    for args in (["detect", "--faults", "no-such-fault"], ["audit-vllm", "--fault", "nope"]):
        result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "x")])
        assert result.exit_code == 2 and "unknown vLLM fault" in result.output, result.output
        assert not (tmp_path / "x").exists()


def test_a_fault_argument_is_parsed_in_one_place_and_a_bad_one_exits_2(tmp_path):
    from typer.testing import CliRunner

    from kvdiag.cli import app
    from kvdiag.engines.vllm.catalog import describe, parse

    assert parse("slot-omitted:9") == ("slot-omitted", {"slot": 9})
    assert parse("range-omitted:4-11") == ("range-omitted", {"first": 4, "last": 11})
    assert parse("slot-omitted") == ("slot-omitted", {}) and describe("slot-omitted:9").name == "slot-omitted"
    for spec in ("slot-omitted:x", "slot-omitted:-1", "range-omitted:5-4", "range-omitted:3",
                 "stale-hash:2"):
        with pytest.raises(KvdiagError, match=spec.split(":")[0]):
            parse(spec)
    result = CliRunner().invoke(app, ["audit-vllm", "--fault", "range-omitted:9-2", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "range-omitted:9-2" in result.output, result.output
    assert not (tmp_path / "x").exists()


# --- the key-coverage family: the differential phase against the over-hit oracle ------------
@pytest.fixture(scope="module")
def small_trace_path(tmp_path_factory):
    from kvdiag.planning.scenarios import make_schedule
    from tests.sessions_util import answer_lengths

    path = tmp_path_factory.mktemp("small") / "small.jsonl"
    write_trace(from_schedule(make_schedule("trigger", answer_lengths(4, 4), min_user=6, shared_prefix=64,
                                            boundary=256, start_range=(180, 240))), path)
    return path


def _audit(path, out, fault=None):
    """kvdiag audit-vllm on a recorded trace: (exit code, output, summary.json)."""
    import typer
    from typer.testing import CliRunner

    from kvdiag.cli.audit import audit_vllm
    from tests.kvdiag.schema_util import assert_valid_summary

    app = typer.Typer()
    app.command("audit-vllm")(audit_vllm)
    app.command("noop")(lambda: None)
    args = ["audit-vllm", "--trace", str(path), "--out", str(out), "--compare", "none"]
    result = CliRunner().invoke(app, args + (["--fault", fault] if fault else []))
    return result.exit_code, result.output, assert_valid_summary(out, "audit")


def _over_hits(summary) -> set[str]:
    from kvdiag.verdicts import over_hit

    rows = summary["vllm_audit"]["epilogue"]["differential"]["rows"]
    return {r["name"] for r in rows if over_hit(r["cached"], r["bound"])}


@needs_vllm
def test_healthy_vllm_has_no_over_hit_in_the_differential_phase(small_trace_path, tmp_path):
    code, output, summary = _audit(small_trace_path, tmp_path / "healthy")
    differential = summary["vllm_audit"]["epilogue"]["differential"]
    assert code == 0 and summary["verdict"] == "pass", output
    assert differential["skipped"] is None and differential["requests"] == len(differential["rows"]) > 0
    assert differential["over_hits"] == 0 and _over_hits(summary) == set()
    assert {r["family"] for r in differential["rows"]} >= {"slot", "range", "parent", "namespace"}


@needs_vllm
@pytest.mark.parametrize("fault, offsets", [
    ("slot-omitted", {0}), ("slot-omitted:9", {9}), ("range-omitted:4-11", set(range(4, 12))),
    ("range-omitted", set(range(2, 6))), ("partial-hash", {"last"}), ("parent-ignored", set())])
def test_key_coverage_faults_fail_the_audit_by_over_hits(small_trace_path, tmp_path, fault, offsets):
    """Each fault whose block key leaves out a slot, a range of slots or the parent chain
    fails the audit through the over-hit oracle: the differential requests that differ from
    the base request only where the key does not look are served the base's blocks."""
    from kvdiag.runners.replay.trace import read_trace

    code, output, summary = _audit(small_trace_path, tmp_path / "run", fault)
    assert code == 1 and summary["verdict"] == "fail", output
    assert "differential: " in summary["reason"]
    block = read_trace(small_trace_path).config.block_size
    wanted = {f"slot {block - 1 if o == 'last' else o}" for o in offsets}
    over = _over_hits(summary)
    assert summary["vllm_audit"]["epilogue"]["differential"]["over_hits"] == len(over) > 0
    if wanted:  # exactly the slots the key leaves out, and no other slot
        assert {n for n in over if n.startswith("slot ")} == wanted, over
    else:  # the parent chain: blocks found by content after another prefix or position
        assert over and not any(n.startswith("slot ") for n in over), over
        assert over <= {"permuted", "repeated", "spliced"}, over
