"""Faults planted into real llama.cpp by source patches (kvdiag.engines.llamacpp.faults),
each built as its own binary from the pinned sdist's tree (the first about 10 min cold, then
a recompile of the files it touches), probed in natural style on SmolLM2's GGUF by `--target
llamacpp-local:FAULT`: each FAILs, exit 1, and the verdict names its binary's fault; the
key-coverage plant by over-hits, each lifecycle plant at its event, by kvdiag's sentinel
inside the server (every binary kvdiag builds carries it: sentinel.patch) and by its answers.
The stock tree with the sentinel alone, the plant written on the fixes
(adapter-switch-keeps), and the two chunk-reuse plants (reuse-match-overrun, which checks how
the sentinel judges moved cells beside the stock row it must pass, and reuse-keeps-span,
moved there at commit 243 to keep this slot under 45 minutes) are in
test_llamacpp_fixes_live.py.

Skipped without the build or the package; a CI rotation slot of its own (make
test-llamacpp-live-plants)."""

from __future__ import annotations

import json

import pytest

from tests.kvdiag.engines.llamacpp_live import PLANT_MARKS, gguf_or_skip, probe

pytestmark = PLANT_MARKS


@pytest.fixture(scope="module")
def gguf():
    return gguf_or_skip()


def test_a_prefix_match_one_token_too_long_fails_by_over_hits(gguf, tmp_path):
    run, summary = probe("llamacpp-local:prefix-overrun", tmp_path / "p")
    assert run.returncode == 1 and summary is not None, run.stderr[-3000:]
    assert summary["verdict"] == "fail"
    assert summary["key_coverage"]["oracle"]["over_hits"] > 0, summary["key_coverage"]["oracle"]
    assert "b11434-fault-prefix-overrun@llamacpp-local:prefix-overrun" in summary["signature"]
    # the wrong hit was served: the cell past the common prefix held the slot's last prompt
    assert summary["sentinel"]["foreign"] > 0, summary["sentinel"]


# where each event's corruption shows: the slot phase's group that drives it (slotlife.py),
# or, for a slot's recycling, the suite's own rounds
WHERE_OF = {"slot-restore": "lifecycle restore", "ram-cache": "lifecycle rotate", "recycle": "rounds",
            "n-children": "lifecycle children", "failed-restore": "lifecycle failed-restore"}
PHASE_OF = {"slot-restore": "life", "ram-cache": "life", "recycle": "shared", "n-children": "life",
            "failed-restore": "life"}


@pytest.mark.parametrize("fault", ["restore-keeps-tokens", "state-tail-dropped", "seq-rm-keeps-cells",
                                   "child-keeps-cells", "failed-load-keeps-slot"])
def test_a_lifecycle_plant_fails_by_the_sentinel_at_its_event(gguf, tmp_path, fault):
    """The right key over the wrong bytes: every hit stays within the over-hit bound (the
    tokens were sent before), so from outside only the answers against their isolated twins
    show it, some of the time; the sentinel sees every cell read wrong, at the event the plant
    lives at, which the run reached."""
    from kvdiag.engines.llamacpp.faults import FAULTS

    run, summary = probe(f"llamacpp-local:{fault}", tmp_path / "p")
    assert summary is not None, run.stderr[-3000:]
    event = FAULTS[fault].event
    assert {r["event"]: r["reached"] for r in summary["events"]}[event], summary["events"]
    where = summary.get("corruption_where") or ""
    sentinel = summary["sentinel"]
    print("LLAMACPP-LIFECYCLE", json.dumps({"fault": fault, "exit": run.returncode, "where": where,
                                            "corrupted": summary["corrupted_requests"],
                                            "sentinel": sentinel["foreign"] + sentinel["unwritten"]}))
    assert run.returncode == 1 and summary["verdict"] == "fail", summary["reason"]
    assert summary["key_coverage"]["oracle"]["over_hits"] == 0
    assert sentinel["foreign"] + sentinel["unwritten"] > 0 and summary["reason"].startswith("sentinel:")
    # caught where the plant's event is driven (the answers, where they departed, too)
    assert PHASE_OF[event] in sentinel["by_phase"], sentinel["by_phase"]
    assert not summary["corrupted_requests"] or WHERE_OF[event] in where, where
    assert f"b11434-fault-{fault}@llamacpp-local:{fault}" in summary["signature"]
