"""The probe's evidence blocks (kvdiag.record.evidence): a summary.json that a live probe
wrote before they were typed (real vLLM, a planted lifecycle fault, kvdiag at commit 1d8c4e8;
tests/fixtures/summaries/) loads, reads by attribute what its JSON says, and writes back the
same blocks; a summary older still, without some blocks, loads with their defaults; and what
only the judge reads (every bounded hit, every top-k shift) never reaches the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvdiag.record.evidence import BoundedHit, KeyCoverage, Oracle, TopK
from kvdiag.record.kinds import parse_summary
from kvdiag.record.summary import ProbeSummary

pytestmark = pytest.mark.unit

OLD = Path(__file__).resolve().parents[2] / "fixtures" / "summaries" / "probe-vllm-ref-undercount-1d8c4e8.json"
BLOCKS = ("noise_floor", "server", "recycling", "first_divergences", "ground_truth", "traffic",
          "prompt_logprobs", "key_coverage", "lifecycle", "topk")


def test_a_summary_written_before_the_types_loads_and_reads_by_attribute():
    data = json.loads(OLD.read_text())
    s = parse_summary(data)
    assert type(s) is ProbeSummary and s.verdict.value == data["verdict"]
    assert s.key_coverage.oracle.checked == data["key_coverage"]["oracle"]["checked"]
    assert s.first_divergences[0].shared_token == data["first_divergences"][0]["shared_token"]
    assert s.server.engine == data["server"]["engine"] and s.server.flags == data["server"]["flags"]
    assert s.lifecycle.missing == data["lifecycle"]["missing"] and s.topk.compared == data["topk"]["compared"]
    assert s.recycling.observed is data["recycling"]["observed"]
    written = json.loads(s.to_json())
    for block in BLOCKS:  # nothing it held is lost or changed on the way back
        assert _held(data[block], written[block]), block


def test_a_summary_without_some_blocks_loads_with_their_defaults():
    data = json.loads(OLD.read_text())
    for block in ("topk", "lifecycle", "key_coverage", "traffic", "prompt_logprobs"):
        del data[block]
    data["server"] |= {"vllm_version": "0.9.0"}  # a key an older kvdiag wrote, since dropped
    s = parse_summary(data)
    assert s.topk.compared == 0 and s.lifecycle.requests == 0 and not s.key_coverage.oracle.available
    assert s.traffic.require == [] and s.prompt_logprobs.checked == 0


def test_the_judges_inputs_stay_out_of_the_file():
    hit = BoundedHit(what="round 2 s01", cached=64, bound=16)
    kc = KeyCoverage(oracle=Oracle(available=True, checked=1, hits=[hit], over_hits=1, examples=[hit]))
    topk = TopK(positions=4, shifts=[("round 2", 0.3)], floor_shifts=[0.1], compared=1, floor=0.1)
    assert "hits" not in kc.model_dump()["oracle"] and kc.model_dump()["oracle"]["examples"][0]["cached"] == 64
    assert set(topk.model_dump()) == {"positions", "compared", "floor", "threshold", "departed", "largest"}


def _held(old, new) -> bool:
    """Whether everything `old` holds is in `new` with the same value (a typed block may add
    keys an older kvdiag did not write, at their defaults)."""
    if isinstance(old, dict):
        return isinstance(new, dict) and all(k in new and _held(v, new[k]) for k, v in old.items())
    if isinstance(old, list):
        return isinstance(new, list) and len(old) == len(new) and all(map(_held, old, new))
    return old == new


def test_a_fail_outside_the_numbered_rounds_says_where_the_judge_found_it():
    """The console names where the judge found the corruption (the summary's corruption_where),
    never an empty list of rounds: here the fixture's FAIL as if only its lifecycle phase departed."""
    import pandas as pd

    from kvdiag.record.results import RunResult
    from kvdiag.report.terminal_runs import render_probe
    from kvdiag.runners.records import Record

    s = parse_summary(json.loads(OLD.read_text()))
    frame = pd.DataFrame([], columns=Record.columns())
    line = "\n".join(x for x in render_probe(RunResult("probe", frame, s)) if isinstance(x, str))
    assert "corruption in rounds 4, 5 (4 requests" in line  # written before the field: its rounds
    s = s.model_copy(update={"corruption_rounds": [], "corruption_where": "lifecycle flood, preempt"})
    line = "\n".join(x for x in render_probe(RunResult("probe", frame, s)) if isinstance(x, str))
    assert "corruption in lifecycle flood, preempt (4 requests" in line and "[]" not in line
    assert json.loads(s.to_json())["corruption_where"] == "lifecycle flood, preempt"


def test_the_console_says_what_the_sentinel_checked_or_saw():
    """A probe read with a sentinel prints its reading beside the oracle's: what a pass checked,
    or the first bad read, in the verdict module's words."""
    import pandas as pd

    from kvdiag.record.results import RunResult
    from kvdiag.record.sentinel import SentinelBlock, SentinelFinding
    from kvdiag.report.terminal_runs import render_probe
    from kvdiag.runners.records import Record

    frame = pd.DataFrame([], columns=Record.columns())
    clean = SentinelBlock(source="sentinel.jsonl", engine="sglang", starts=1, steps=4212, requests=812,
                          reads=24121396, writes=498850, unchecked=0, foreign=0, unwritten=0, overwrite=0)
    s = parse_summary(json.loads(OLD.read_text())).model_copy(update={"sentinel": clean})
    lines = [x for x in render_probe(RunResult("probe", frame, s)) if isinstance(x, str)]
    assert any(x.startswith("sentinel: 4212 steps, 812 requests, 24121396 KV slot reads checked, "
                            "0 foreign, 0 unwritten") for x in lines)
    bad = clean.model_copy(update={"foreign": 3, "findings_total": 1, "findings": [SentinelFinding(
        kind="foreign", step=7, request="r1", where="lifecycle flood 2", positions=[[16, 19]], count=3,
        context_len=40, writers=["r0"], context=["after retraction"])]})
    s = s.model_copy(update={"sentinel": bad})
    lines = [x for x in render_probe(RunResult("probe", frame, s)) if isinstance(x, str)]
    assert any(x.startswith("sentinel: 3 foreign KV slot reads") and "lifecycle flood 2 read positions "
               "16-18 foreign" in x and "(after retraction)" in x for x in lines)
    s = s.model_copy(update={"sentinel": clean.model_copy(update={"reads": 0})})
    lines = [x for x in render_probe(RunResult("probe", frame, s)) if isinstance(x, str)]
    assert any(x.startswith("sentinel: the sentinel (sentinel.jsonl) checked no KV read") for x in lines)


def test_the_probe_table_shows_leakage_only_where_a_sentinel_weighed_it():
    import pandas as pd
    from rich.console import Console

    from kvdiag.record.results import RunResult
    from kvdiag.report.terminal_runs import render_probe
    from kvdiag.runners.records import Record

    frame = pd.DataFrame([], columns=Record.columns())
    s = parse_summary(json.loads(OLD.read_text()))

    def table(summary) -> str:
        console = Console(record=True, width=200)
        console.print(render_probe(RunResult("probe", frame, summary))[0])
        return console.export_text()

    shared = [r.model_copy(update={"allocator": "shared"}) for r in s.rounds]  # the file kept only isolated
    assert "leakage" not in table(s.model_copy(update={"rounds": s.rounds + shared}))  # no column of dashes
    weighed = [r.model_copy(update={"attention_leakage": 0.1703 if r.round == 2 else 0.0}) for r in shared]
    text = table(s.model_copy(update={"rounds": s.rounds + weighed}))
    assert "leakage" in text and "0.1703" in text
