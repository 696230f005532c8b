"""The fixes to real llama.cpp and the plant written on them, each a binary built from the
pinned sdist's tree alone (no stock build: the tree's first build about 10 min cold, then a
recompile of the files each patch chain touches), probed in natural style on SmolLM2's GGUF:

- the fixes (`adapter-keyed`: the upstream fixes and kvdiag's adapter fix) pass the LoRA row
  with every event reached, their pinned requests restored from the RAM cache;
- `adapter-switch-keeps`, planted into that fixed build, fails by the adapter pair's
  over-hit, and by kvdiag's sentinel (every binary kvdiag builds carries it), which reads
  nothing wrong in the fixed build's LoRA row;
- the stock tree with the sentinel alone (`--sentinel on`) reads nothing wrong with every
  event reached, chunk reuse included, and `reuse-match-overrun` (a chunk matched one token
  past where the prompts agree) fails by it: the cells a chunk reuse moves are judged by the
  token each holds (the sentinel's own check, beside the stock row it must pass);
- `reuse-keeps-span` (#12160's shape: the span a chunk is shifted over stays visible) fails by
  the sentinel (here, not with the other plants, since commit 243: that slot measured 2,260 s
  alone on 2 cores).

The stock build's LoRA row (a FAIL) is in test_llamacpp_live.py. Skipped without the tree or
the package; a CI rotation slot of its own (make test-llamacpp-live-fixes)."""

from __future__ import annotations

import json

import pytest

from kvdiag.runners.live.slotlife import REUSE_CHUNK
from tests.kvdiag.engines.llamacpp_live import PLANT_MARKS, gguf_or_skip, probe

pytestmark = PLANT_MARKS


@pytest.fixture(scope="module")
def gguf():
    return gguf_or_skip()


def test_the_fixes_pass_the_lora_row_and_their_pinned_requests_hit_the_ram_cache(gguf, tmp_path):
    """adapter-keyed: PR #27624 and PR #28992 written into b11434 (fixes/upstream-fixes.patch),
    then the adapter fix (fixes/adapter-keyed.patch). With the LoRA adapter and every row
    reached: PASS, the base request after the adapter's hits nothing, and a request pinned to
    a slot that idle-slot caching emptied now looks the RAM prompt cache up (the stock build
    divides 0 by 0 there and skips it: #28139, an under-hit, which no verdict calls
    corruption)."""
    run, summary = probe("llamacpp-local:adapter-keyed", tmp_path / "p", "--adapter", "kvdiag-lora",
                         "--require", "all")
    assert run.returncode == 0 and summary is not None, run.stderr[-3000:]
    assert summary["verdict"] == "pass" and summary["key_coverage"]["oracle"]["over_hits"] == 0
    pairs = {p["name"]: p for p in summary["key_coverage"]["differential"]}
    assert pairs["base after adapter"]["cached"] == 0, pairs["base after adapter"]
    ram = {r["event"]: r for r in summary["events"]}["ram-cache"]
    print("LLAMACPP-FIXED", json.dumps(ram["server"]))
    assert ram["server"]["restored_pinned"] > 0, ram
    account = {a["group"]: a for a in summary["key_coverage"]["oracle"]["accounting"]}
    assert account["lifecycle erase"]["none"] == account["lifecycle pinned"]["none"] == 0, account
    assert "b11434-fix-adapter-keyed@llamacpp-local:adapter-keyed" in summary["signature"]
    sentinel = summary["sentinel"]  # each adapter's cells held against its own requests
    assert sentinel["reads"] > 0 and sentinel["foreign"] == sentinel["unwritten"] == 0, sentinel



def test_an_adapter_switch_that_keeps_the_slot_fails_by_the_adapter_pairs_over_hit(gguf, tmp_path):
    """Planted into the fixed build (adapter-keyed), whose LoRA row passes: the tokens asked
    under the base model, then under the adapter, are served the base model's K/V."""
    run, summary = probe("llamacpp-local:adapter-switch-keeps", tmp_path / "p", "--adapter", "kvdiag-lora")
    assert run.returncode == 1 and summary is not None, run.stderr[-3000:]
    pairs = {p["name"]: p for p in summary["key_coverage"]["differential"]}
    print("LLAMACPP-ADAPTER-PLANT", pairs["adapter"], summary["corrupted_requests"])
    assert summary["verdict"] == "fail" and pairs["adapter"]["cached"] > pairs["adapter"]["bound"] == 0
    assert pairs["base after adapter"]["cached"] == 0  # the fix under the plant still holds
    assert summary["sentinel"]["foreign"] > 0  # the base model's cells read under the adapter
    assert "b11434-fault-adapter-switch-keeps@llamacpp-local:adapter-switch-keeps" in summary["signature"]


def test_the_stock_tree_with_the_sentinel_reads_nothing_wrong(gguf, tmp_path):
    """No false positive: every event of the slot phase reached (RAM-cache restores, slot
    save, restore and erase, n > 1 children, cancels, a restore that fails partway, and
    chunk reuse: the server started with --cache-reuse), every cell read checked (a cell a
    chunk reuse moved by its token), none bad: the stock server clears what a failed restore
    placed."""
    run, summary = probe("llamacpp-local", tmp_path / "p", "--sentinel", "on", "--require", "all",
                         f"--engine-arg=--cache-reuse {REUSE_CHUNK}")
    assert summary is not None, run.stderr[-3000:]
    sentinel = summary["sentinel"]
    print("LLAMACPP-SENTINEL-HEALTHY", json.dumps({k: sentinel[k] for k in (
        "steps", "requests", "reads", "writes", "unchecked", "shifted", "foreign", "unwritten")}))
    assert run.returncode == 0 and summary["verdict"] == "pass", summary["reason"]
    events = {r["event"]: r for r in summary["events"]}
    assert "chunk-reuse" in events and "failed-restore" in events
    print("LLAMACPP-FAILED-RESTORE", events["failed-restore"]["evidence"])
    assert sentinel["reads"] > 0 and sentinel["shifted"] > 0 and sentinel["foreign"] == sentinel["unwritten"] == 0
    assert sentinel["version"] == "b11434-sentinel" and "KV slot reads checked" in summary["reason"]


def test_a_chunk_matched_one_token_too_long_fails_by_the_sentinel(gguf, tmp_path):
    """Key coverage in chunk reuse: the chunk runs one cell past where the two prompts agree,
    its token moved into the slot's list with it. The moved cell holds the slot's token, not
    the prompt's, which is how the sentinel judges a moved cell (its K/V, computed after other
    tokens, are approximate by design); the stock row above passes the same check."""
    run, summary = probe("llamacpp-local:reuse-match-overrun", tmp_path / "p",
                         f"--engine-arg=--cache-reuse {REUSE_CHUNK}")
    assert summary is not None, run.stderr[-3000:]
    assert {r["event"]: r["reached"] for r in summary["events"]}["chunk-reuse"], summary["events"]
    sentinel = summary["sentinel"]
    print("LLAMACPP-REUSE-OVERRUN", json.dumps({**{k: sentinel[k] for k in ("foreign", "unwritten", "shifted", "by_phase")},
                                                "over_hits": summary["key_coverage"]["oracle"]["over_hits"]}))
    assert run.returncode == 1 and summary["verdict"] == "fail", summary["reason"]
    assert sentinel["foreign"] > 0 and "life" in sentinel["by_phase"] and sentinel["shifted"] > 0
    assert "b11434-fault-reuse-match-overrun@llamacpp-local:reuse-match-overrun" in summary["signature"]


def test_a_chunk_reuse_that_leaves_the_span_fails_by_the_sentinel(gguf, tmp_path):
    """#12160's shape: the span a chunk is shifted over stays visible. The answers cannot
    judge chunk reuse (the stock build's own depart from a twin computed from scratch), so its
    requests have no twin; the sentinel sees the span's cells read at the chunk's positions."""
    run, summary = probe("llamacpp-local:reuse-keeps-span", tmp_path / "p",
                         f"--engine-arg=--cache-reuse {REUSE_CHUNK}")
    assert summary is not None, run.stderr[-3000:]
    assert {r["event"]: r["reached"] for r in summary["events"]}["chunk-reuse"], summary["events"]
    sentinel = summary["sentinel"]
    print("LLAMACPP-REUSE", json.dumps({k: sentinel[k] for k in ("foreign", "unwritten", "shifted", "by_phase")}))
    assert run.returncode == 1 and summary["verdict"] == "fail", summary["reason"]
    assert sentinel["foreign"] > 0 and "life" in sentinel["by_phase"]
    assert summary["key_coverage"]["oracle"]["over_hits"] == 0
