"""A prefix-cache reset, as the sentinel follows it: once the engine reports its cache emptied,
K/V that no live request maps may never be served again, so a later read of it is
`unwritten`, its writer named as written before the reset. A reset that says it emptied the
cache and did not (`reset-noop`, vllm-omni #6739) is then a finding on the next hit; a real
reset is none, because the next request computes its K/V again before reading it. In-process:
the ledger alone, then the real reference engine with the sentinel attached."""

from __future__ import annotations

from kvdiag.sentinel.facts import Scheduled
from kvdiag.sentinel.ledger import Ledger
from kvdiag.sentinel.reference import ReferenceSentinel
from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine

STALE = "written before a prefix-cache reset"


def test_a_read_across_a_reset_is_unwritten_and_names_its_writer():
    """Everything written before is forgotten, including a request whose finish the engine
    tells only at its next step (vLLM: finished_req_ids), as a reset comes when it is idle."""
    found = []
    led = Ledger(4, found.append)
    tokens = list(range(9))
    led.step([Scheduled("w", [1, 2], 0, 8, tokens)])
    led.reset()  # w's finish not told yet
    led.finish("w")
    assert led.resets == 1
    led.step([Scheduled("r", [1, 2, 3], 8, 1, tokens)])  # a hit on w's blocks, served anyway
    (f,) = found
    assert (f.kind, f.request, f.positions, f.writers, f.writer_context) == (
        "unwritten", "r", [(0, 8)], ["w"], [STALE])
    led.step([Scheduled("again", [1, 2], 0, 8, tokens)])  # computed again: written, then read
    assert len(found) == 1
    led.zero(1)  # a zeroed block has no writer to name: unwritten, as before any write
    led.step([Scheduled("z", [1, 3], 4, 1, tokens[:5])])
    assert (found[-1].request, found[-1].writers, found[-1].writer_context) == ("z", [], [])


def _run(engine: LLMEngine, prompt: list[int]):
    seq = engine.add_request(prompt, max_tokens=4, stop_ids=())
    while engine.has_unfinished():
        engine.step()
    return seq


def test_the_reference_engines_reset_is_followed_and_a_lying_one_is_caught(tiny_ckpt):
    prompt = list(range(2, 42))
    for lies in (False, True):
        engine = LLMEngine(tiny_ckpt, EngineConfig(num_blocks=64, max_num_batched_tokens=64))
        found = []
        sentinel = ReferenceSentinel(engine, report=found.append)
        _run(engine, prompt)
        if lies:  # the plant: success reported, every hash kept
            engine.allocator.reset_prefix_cache = lambda: True
        assert engine.reset_prefix_cache()
        again = _run(engine, prompt)
        assert sentinel.ledger.resets == 1
        if not lies:
            assert again.stats.cached_tokens == 0 and found == []
            continue
        assert again.stats.cached_tokens > 0  # served from before the reset
        assert found and {f.kind for f in found} == {"unwritten"}
        assert sum(f.count for f in found) == again.stats.cached_tokens
        assert found[0].writer_context == [STALE]
