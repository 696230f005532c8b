"""kvdiag watch's parts in process: what an exchange reads from the bytes relayed, the
labels (verdicts/watch.py), the window's rates and intervals, the page."""

import json
import math

from kvdiag.verdicts import Verdict
from kvdiag.verdicts.watch import judge_watch, over_hit_kind, twin_departed
from kvdiag.watch.exchange import Exchange
from kvdiag.watch.log import read_watch
from kvdiag.watch.page import render
from kvdiag.watch.stats import Tally, namespace_label, wilson


def _chat(**extra) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "system", "content": "s"},
                                                  {"role": "user", "content": "a"},
                                                  {"role": "assistant", "content": "b"},
                                                  {"role": "user", "content": "c"}]} | extra).encode()


def test_an_exchange_reads_usage_from_json_and_from_server_sent_events():
    ex = Exchange.of("/v1/chat/completions", _chat(cache_salt="t1"), {"x-request-id": "r1"}, 1.0)
    assert ex.namespace == ("m", "t1", None) and ex.rounds == 2 and ex.request_id == "r1"
    ex.feed(json.dumps({"id": "x", "usage": {"prompt_tokens": 40, "completion_tokens": 3,
                                             "prompt_tokens_details": {"cached_tokens": 32}}}).encode())
    ex.finish(200, 2.0, complete=True)
    assert (ex.prompt_tokens, ex.completion_tokens, ex.cached) == (40, 3, 32)

    streamed = Exchange.of("/v1/chat/completions", _chat(stream=True), {}, 1.0)
    events = [{"id": "chat-9", "choices": [{"delta": {"content": "hi"}}]},
              {"id": "chat-9", "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 1,
                                                       "prompt_tokens_details": {"cached_tokens": 0}}}]
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    for i in range(0, len(body), 7):  # relayed in arbitrary pieces
        streamed.feed(body[i:i + 7].encode())
    streamed.finish(200, 2.0, complete=True)
    assert (streamed.cached, streamed.request_id) == (0, "chat-9")


def test_what_is_not_one_well_formed_generation_is_relayed_unread():
    assert Exchange.of("/v1/models", b"", {}, 0.0) is None
    assert Exchange.of("/v1/chat/completions", b"{not json", {}, 0.0) is None
    assert Exchange.of("/v1/chat/completions", _chat(n=2), {}, 0.0) is None
    cut = Exchange.of("/v1/completions", b'{"model": "m", "prompt": [1, 2, 3]}', {}, 0.0)
    cut.feed(b'{"usage": {"prompt_tokens": 3')
    cut.finish(200, 1.0, complete=False)  # the client or the upstream cut it
    assert not cut.complete and cut.cached is None


def test_the_labels():
    assert over_hit_kind(16, 16, warming=False, explained=False) == "ok"
    assert over_hit_kind(None, 0, warming=False, explained=False) == "ok"
    assert over_hit_kind(32, 16, warming=True, explained=False) == "warmup"
    assert over_hit_kind(32, 16, warming=False, explained=True) == "unjudged"
    assert over_hit_kind(32, 16, warming=False, explained=False) == "over_hit"
    assert twin_departed(math.nan, 0.01, [], [0.02]) == "match"
    assert twin_departed(math.nan, 3.0, [], [0.02]) == "corruption"  # the top-k moved
    assert twin_departed(0.2, None, [], []) == "numerics"  # a near-tie flipped
    assert twin_departed(5.0, None, [], []) == "corruption"
    assert twin_departed(5.0, None, [6.0], []) == "numerics"  # isolated pairs differ by more
    assert judge_watch(0, 0, 0, 0).verdict is Verdict.INCONCLUSIVE
    assert judge_watch(0, 0, 3, 10).verdict is Verdict.PASS
    assert judge_watch(1, 0, 3, 10).verdict is Verdict.FAIL


def test_rates_and_their_intervals():
    p, lo, hi = wilson(0, 20)
    assert p == 0 and lo == 0 and 0.1 < hi < 0.2  # no departures in 20 is not a rate of 0
    p, lo, hi = wilson(5, 10)
    assert lo < 0.5 < hi
    t = Tally(reached=20, departures=4)
    t.by_round.update({1: 10, 5: 10})
    t.departed_by_round.update({5: 4})
    rates = t.rates()
    assert rates["sqdr"] == (1.0 - 0.6) / 5 and rates["sqdr_low"] < rates["sqdr"] < rates["sqdr_high"]
    assert math.isnan(Tally().rates()["divergence_rate"])
    assert namespace_label(("m", None, None)) == "m"
    assert namespace_label(("m", "tenant-a", None)).startswith("m#") and "tenant" not in \
        namespace_label(("m", "tenant-a", None))  # a salt can name a tenant: never shown


def test_the_page_shows_every_kind_of_finding(tmp_path):
    path = tmp_path / "w.jsonl"
    t = Tally(requests=5, judged=5, over_hits=1, twins=1, reached=1, departures=1).record()
    rows = [{"type": "start", "upstream": "http://u", "sample": 0.01, "budget": 1, "window": 60,
             "warmup": 0, "pool_tokens": 0, "isolation": "salt"},
            {"type": "finding", "kind": "over_hit", "time": 1.0, "request": "r1",
             "namespace": "m", "prompt_tokens": 40, "cached": 32, "bound": 16},
            {"type": "finding", "kind": "departure", "time": 2.0, "lag": 7.25, "request": "r2", "round": 3,
             "namespace": "m", "margin": 4.5, "distance": None},
            {"type": "window", "start": 0.0, "end": 60.0, "all": t, "namespaces": {"m": t}}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{cut by a kil")
    html = render(read_watch(path))
    assert "r1" in html and "r2" in html and "4.500" in html and "FAIL" in html
    assert "7.2 s" in html  # how long after its request a finding was written (an older file: -)


def test_a_long_stream_is_read_in_bounded_memory():
    from kvdiag.watch.exchange import HEAD, TAIL

    ex = Exchange.of("/v1/chat/completions", _chat(stream=True), {}, 0.0)
    event = f"data: {json.dumps({'id': 'c1', 'choices': [{'delta': {'content': 'word ' * 5}}]})}\n\n"
    usage = {"prompt_tokens": 9, "completion_tokens": 20000, "prompt_tokens_details": {"cached_tokens": 4}}
    for _ in range(20000):
        ex.feed(event.encode())
        assert len(ex._buf) <= HEAD + 2 * TAIL + len(event)
    ex.feed(f"data: {json.dumps({'id': 'c1', 'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
    ex.finish(200, 1.0, complete=True)
    assert (ex.request_id, ex.completion_tokens, ex.cached) == ("c1", 20000, 4)


def test_a_local_tokenizer_makes_the_ids_a_server_would_and_never_raises():
    from transformers import AutoTokenizer

    from kvdiag.watch.tokens import LocalTokenizer

    local, tok = LocalTokenizer("fixtures/canary"), AutoTokenizer.from_pretrained("fixtures/canary")
    messages = [{"role": "user", "content": "river stone"}]
    chat = Exchange.of("/v1/chat/completions", _chat(), {}, 0.0)
    want = tok.apply_chat_template(chat.prompt["messages"], add_generation_prompt=True, tokenize=True,
                                   return_dict=False)
    assert local.ids(chat) == tuple(want) and len(want) > 3
    text = Exchange.of("/v1/completions", json.dumps({"model": "m", "prompt": "river stone"}).encode(), {}, 0.0)
    assert local.ids(text) == tuple(tok.encode("river stone"))
    ids = Exchange.of("/v1/completions", json.dumps({"model": "m", "prompt": [5, 6, 7]}).encode(), {}, 0.0)
    assert local.ids(ids) == (5, 6, 7)
    bad = Exchange.of("/v1/chat/completions", json.dumps(
        {"model": "m", "messages": messages, "chat_template": "{{ raise_exception('no') }}"}).encode(), {}, 0.0)
    assert local.ids(bad) is None  # unjudged, not a crash of the checker
