"""Real llama.cpp in the loop: llama-server b11434 built from the pinned sdist (`make
llamacpp-env`) serving SmolLM2-135M-Instruct's GGUF (`make real-model`), probed in natural
style by `--target llamacpp-local[:FIX]`:

- the stock build in its default configuration passes: its isolated twins (cache_prompt:
  false) report 0 cached tokens, the over-hit oracle holds every reported hit within what
  the requests before it allow (one namespace: llama.cpp keys its cache by tokens only), and
  no decisive answer changed; so does it with two slots, and without the RAM prompt cache;
- its coverage table's rows (slots handed over, the RAM prompt cache, slot save, restore and
  erase, n > 1 children) are all reached by the default probe;
- the chunk bound of --cache-reuse holds on the healthy server before it is trusted;
- the LoRA row (`--adapter kvdiag-lora`, an adapter made from the model): the stock build
  fails, a request naming no adapter served the K/V an adapter request left in its slot
  (#26207's exposure left open), found by the over-hit oracle and by the answers;
- a GGUF that does not load is exit 2 with llama.cpp's own error line.

The fixes are in test_llamacpp_fixes_live.py, the planted faults in
test_llamacpp_plants_live.py. Skipped without the build or the package; a CI rotation slot of
its own (make test-llamacpp-live-core)."""

from __future__ import annotations

import json

import pytest

from kvdiag.vocab import FAILED_RESTORE, SLOT_EVENTS
from tests.kvdiag.engines.llamacpp_live import MARKS, gguf_or_skip, probe

pytestmark = MARKS


@pytest.fixture(scope="module")
def gguf():
    return gguf_or_skip()


def test_the_stock_build_passes_in_its_default_configuration(gguf, tmp_path):
    """With every row of its coverage table reached (--require all): slots handed over, prompts
    back from the RAM cache, a slot saved, restored and erased between rounds, a restore of a
    cut slot file refused (the server kvdiag started: it writes into its slot folder)."""
    run, summary = probe("llamacpp-local", tmp_path / "p", "--require", "all")
    assert run.returncode == 0 and summary is not None, run.stderr[-3000:]
    assert summary["verdict"] == "pass" and summary["isolation"] == "cache_prompt", summary["reason"]
    assert summary["corrupted_requests"] == 0
    events = {r["event"]: r for r in summary["events"]}
    assert set(events) == {"recycle", *SLOT_EVENTS, FAILED_RESTORE}, events
    assert all(r["reached"] for r in events.values()) and events["slot-restore"]["server"]["restores"] == 2
    print("LLAMACPP-STOCK", json.dumps(events["ram-cache"]["server"] | events[FAILED_RESTORE]["server"]))
    oracle = summary["key_coverage"]["oracle"]
    # every shared request checked against its bound, none above it
    assert oracle["available"] and oracle["unknown_ids"] == 0 and oracle["over_hits"] == 0, oracle
    # #28139 in the hit accounting, not the verdict: A, asked again after its slot was erased,
    # is in the RAM cache, and its request (pinned to the emptied slot) never looks it up
    account = {a["group"]: a for a in oracle["accounting"]}
    assert account["lifecycle erase"]["none"] == 1 and account["lifecycle erase"]["possible"] > 0, account
    assert summary["server"]["version"]  # llama.cpp's build_info
    assert (tmp_path / "p" / "llama-server.log").is_file()


@pytest.mark.parametrize("row", ["-np 2", "--cache-ram 0"])
def test_the_stock_build_passes_in_other_configuration_rows(gguf, tmp_path, row):
    """Two slots (each conversation's prompt moves through fewer slots), and no RAM prompt
    cache (a hit only from a slot's own tokens): the row is recorded with the run."""
    run, summary = probe("llamacpp-local", tmp_path / "p", f"--engine-arg={row}")
    assert run.returncode == 0 and summary is not None, run.stderr[-3000:]
    assert summary["verdict"] == "pass", summary["reason"]
    assert summary["server"]["engine_args"] == row.split()
    assert summary["key_coverage"]["oracle"]["over_hits"] == 0
    if row == "-np 2":  # the server says what it runs with, and its slots changed hands
        assert summary["server"]["flags"]["total_slots"] == 2
        assert summary["recycling"]["observed"] and summary["recycling"]["slot_handovers"] > 0


def test_chunks_shifted_past_a_trimmed_history_hold_against_the_chunk_bound(gguf, tmp_path):
    """The bound proved on the healthy server before it is trusted (--cache-reuse 16): each
    example conversation, then a copy of it that dropped its second exchange (a client
    trimming its context), one request at a time. The copy hits past its common prefix
    through the later turns llama-server shifts into place: within the chunk bound
    (chunk_hits > 0, 0 over-hits), above the common-prefix bound (over-hits there), and
    sent with n_cache_reuse 0 it hits its common prefix only."""
    import asyncio

    from kvdiag.engines.llamacpp.launcher import LlamacppLocal
    from kvdiag.paths import REPO_ROOT
    from kvdiag.runners.live.endpoint import Endpoint
    from kvdiag.runners.live.oracle import HitRule, Sent, check
    from kvdiag.verdicts.live import over_hit

    pairs = []
    for line in (REPO_ROOT / "examples" / "sessions.jsonl").read_text().splitlines()[:3]:
        messages = json.loads(line)["messages"]
        pairs.append((messages[:6], messages[:3] + messages[5:6]))  # ...u2 a2 u3, and without u2 a2
    def send(reuse: int) -> list[Sent]:
        """The pairs, one request at a time, to a fresh server, sent with n_cache_reuse `reuse`."""
        with LlamacppLocal(gguf, extra_args=("--cache-reuse", "16"),
                           log_path=tmp_path / f"llama-server-{reuse}.log") as server:
            endpoint, sent = Endpoint(server.base_url, server.served_model), []
            endpoint.reuse_chunk = reuse

            async def go() -> None:
                for full, trimmed in pairs:
                    for messages in (full, trimmed):
                        res = await endpoint.chat(messages, 8)
                        ids = tuple(endpoint.tokenize_chat(messages))
                        assert len(ids) == res.prompt_tokens
                        sent.append(Sent(len(sent), (None,), ids, res.sent, res.done,
                                         res.cached_tokens, res.completion_tokens))
                await endpoint.aclose()

            asyncio.run(go())
        return sent

    reused, pinned = send(16), send(0)
    with_chunks = check(reused, HitRule(1, True, 16))
    print("kvdiag-chunks (request, cached, chunk bound):", with_chunks["rows"],
          "pinned to 0 (request, cached, prefix bound):", check(pinned, HitRule(1, True))["rows"])
    assert with_chunks["chunk_hits"] > 0, with_chunks
    assert not [r for r in with_chunks["rows"] if over_hit(r[1], r[2])], with_chunks["rows"]
    plain = check(reused, HitRule(1, True))
    assert [r for r in plain["rows"] if over_hit(r[1], r[2])]  # the LCP bound alone is exceeded
    off = check(pinned, HitRule(1, True))
    assert not [r for r in off["rows"] if over_hit(r[1], r[2])], off["rows"]


def test_the_stock_build_fails_the_lora_row(gguf, tmp_path):
    """A request that names no adapter, after one that did on its slot, reads the adapter's
    K/V: the differential pair 'base after adapter' over-hits (its bound is 0: no base request
    sent its tokens), and shared rounds under the base model after adapter rounds depart."""
    run, summary = probe("llamacpp-local", tmp_path / "p", "--adapter", "kvdiag-lora")
    assert run.returncode == 1 and summary is not None, run.stderr[-3000:]
    assert summary["verdict"] == "fail" and summary["corrupted_requests"] > 0, summary["reason"]
    pairs = {p["name"]: p for p in summary["key_coverage"]["differential"]}
    after = pairs["base after adapter"]
    print("LLAMACPP-LORA-STOCK", after, summary["key_coverage"]["oracle"]["over_hits"])
    assert after["bound"] == 0 and after["cached"] > 0, after
    assert pairs["adapter first"]["cached"] == 0  # an explicit switch clears: that path was fixed
    examples = summary["key_coverage"]["oracle"]["examples"]
    assert any("base after adapter" in e["what"] for e in examples), examples


def test_a_gguf_that_does_not_load_is_exit_2_with_llamacpps_error(gguf, tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(gguf.read_bytes()[:4096])  # the header, cut short
    run, _ = probe("llamacpp-local", tmp_path / "p", "--model", str(bad))
    assert run.returncode == 2, run.stderr[-2000:]
    assert "llama.cpp exited" in run.stderr and ("error" in run.stderr.lower() or "failed" in run.stderr.lower())
