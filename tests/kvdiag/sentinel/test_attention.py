"""Attention leakage inside live vLLM and SGLang, without either: each engine's measurement
(kvdiag.engines.{vllm,sglang}.attention) held against torch's own scaled-dot-product attention
over the same cache, and the sentinels' weighing of it (each step's results, each batch), down
to the probe's rows. The live runs are in tests/kvdiag/engines/test_vllm_live.py and
test_sglang_live.py."""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace as NS

import pytest
import torch

from kvdiag.engines.vllm import attention
from kvdiag.engines.vllm.sentinel import VllmSentinel
from kvdiag.runners.live.sentinel import observe
from kvdiag.sentinel.log import read_report
from tests.kvdiag.sentinel.test_vllm_adapter import Scheduler, output, request

pytestmark = pytest.mark.unit


def _writer(packing: torch.Tensor | None = None):
    """vLLM's CPU cache write as a test sees it (key, value [tokens, kv_heads, dim] into the K
    and V halves of [blocks, kv_heads, 2 * bs, dim] at `slots`): plain, or each block's storage
    then shuffled by `packing` (a permutation, as the AMX and vec kernels pack their blocks)."""

    def write(key, value, key_cache, value_cache, slots):
        bs, per_block = key_cache.shape[2], key_cache[0].numel() * 2
        flat = torch.tensor([], dtype=key_cache.dtype).set_(key_cache.untyped_storage())
        plain = torch.arange(per_block).reshape(key_cache.shape[1], 2 * bs, -1)
        where = plain if packing is None else packing[plain]
        for t, slot in enumerate(slots.tolist()):
            block, i = divmod(slot, bs)
            flat[block * per_block + where[:, i].reshape(-1)] = key[t].reshape(-1)
            flat[block * per_block + where[:, bs + i].reshape(-1)] = value[t].reshape(-1)
    return write


def _paged(lens, heads=4, kv_heads=2, dim=8, bs=4, seed=0, write=None):
    """A cache in the CPU backend's shape ([blocks, kv_heads, bs, 2 * dim]) filled by `write`,
    requests' tables over shuffled blocks, and each request's K and last query, contiguous."""
    g = torch.Generator().manual_seed(seed)
    write = write or _writer()
    need = [-(-n // bs) for n in lens]
    order = torch.randperm(sum(need) + 3, generator=g)
    k_all, v_all = (torch.randn(len(order) * bs, kv_heads, dim, generator=g) for _ in range(2))
    cache = torch.zeros(len(order), kv_heads, bs, 2 * dim)
    write(k_all, v_all, *cache.view(len(order), kv_heads, 2 * bs, dim).chunk(2, dim=2),
          torch.arange(len(order) * bs))
    tables, at = torch.zeros(len(lens), max(need), dtype=torch.int32), 0
    for b, n in enumerate(need):
        tables[b, :n] = order[at:at + n]
        at += n
    slots = [(tables[b, :n].long()[:, None] * bs + torch.arange(bs)).reshape(-1)[:lens[b]]
             for b, n in enumerate(need)]
    keys, values = ([x[s].transpose(0, 1) for s in slots] for x in (k_all, v_all))
    chunks = [1 if b % 2 else 3 for b in range(len(lens))]  # decode rows and prefill rows
    starts = [0]
    for c in chunks:
        starts.append(starts[-1] + c)
    query = torch.randn(starts[-1], heads, dim, generator=g)
    output = torch.zeros(starts[-1], heads * dim)  # the kernel's, at each row's last token (SDPA)
    for b, s in enumerate(starts[1:]):
        k, v = (x[b].repeat_interleave(heads // kv_heads, dim=0) for x in (keys, values))
        output[s - 1] = torch.nn.functional.scaled_dot_product_attention(
            query[s - 1][:, None, :], k, v, scale=dim ** -0.5)[:, 0].reshape(-1)
    meta = NS(num_actual_tokens=starts[-1], query_start_loc=torch.tensor(starts),
              seq_lens=torch.tensor(lens), block_table=tables, causal=True)
    impl = NS(num_heads=heads, head_size=dim, scale=dim ** -0.5, sliding_window=None,
              alibi_slopes=None, logits_soft_cap=None, sinks=None)
    return impl, query, cache, meta, keys, [query[s - 1] for s in starts[1:]], output, write


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    """Each test a fresh weigher (its checks and its off switch are per process)."""
    from kvdiag.engines.sglang import attention as sg
    from kvdiag.engines.weights import Weigher

    monkeypatch.setattr(attention, "WEIGH", Weigher("vLLM"))
    monkeypatch.setattr(attention, "_layouts", {})
    monkeypatch.setattr(sg, "WEIGH", Weigher("SGLang"))
    attention._rows.clear()
    sg.weights.clear()


def test_the_weights_are_torch_sdpa_attention_of_each_rows_last_token():
    """torch's SDPA with one-hot values returns the attention probabilities themselves: the
    anchor for what the worker measures, mean over two layers and every head; the weights
    give back the kernel's output (SDPA's, with the real V), so the weigher stays on."""
    lens = [5, 9, 16, 13]
    layers = [_paged(lens, seed=s) for s in (1, 2)]
    for impl, query, cache, meta, *_, out, write in layers:
        attention._measure(impl, NS(isa="plain"), query, cache, meta, out, write)
    assert attention.WEIGH.off is None and attention.WEIGH.checked == 8
    for b, n in enumerate(lens):
        want = torch.zeros(n)
        for impl, _, _, _, keys, last, _, _ in layers:
            k = keys[b].repeat_interleave(2, dim=0)  # 4 heads over 2 kv heads
            probs = torch.nn.functional.scaled_dot_product_attention(
                last[b][:, None, :], k, torch.eye(n).expand(4, n, n), scale=impl.scale)
            want += probs[:, 0].mean(0) / len(layers)
        w, count = attention._rows[b]
        assert count == 2 and torch.allclose(w / count, want, atol=1e-5)


def test_a_packed_cache_is_read_through_the_layout_learned_from_the_write_op():
    """vLLM's AMX and vec kernels pack each block; the layout is learned from the write op
    itself, so a packed cache (here a random permutation of each block's storage) weighs the
    same as a plain one."""
    lens = [5, 9, 16, 13]
    packing = torch.randperm(2 * 2 * 4 * 8, generator=torch.Generator().manual_seed(7))
    plain, packed = _paged(lens, seed=5), _paged(lens, seed=5, write=_writer(packing))
    assert not torch.equal(plain[2], packed[2])  # the same K/V, elsewhere in memory
    got = []
    for impl, query, cache, meta, *_, out, write in (plain, packed):
        attention._measure(impl, NS(isa=id(write)), query, cache, meta, out, write)
        got.append({b: w.clone() for b, (w, _) in attention._rows.items()})
        attention._rows.clear()
    assert attention.WEIGH.off is None and len(got[1]) == len(lens)
    assert all(torch.allclose(got[0][b], got[1][b]) for b in got[0])


def _tiled(kv_heads=2, bs=4, dim=8):
    """A block packed as vLLM's AMX kernel packs it: per KV head, tiles of 2 slots, in each the
    dims in pairs side by side (VNNI), K of every head first, then V plain."""
    packing = torch.empty(kv_heads * 2 * bs * dim, dtype=torch.long)
    for h in range(kv_heads):
        for s in range(bs):
            for d in range(dim):
                packing[(h * 2 * bs + s) * dim + d] = (h * bs * dim + s // 2 * 2 * dim + d // 2 * 4
                                                       + s % 2 * 2 + d % 2)
                packing[(h * 2 * bs + bs + s) * dim + d] = kv_heads * bs * dim + (h * bs + s) * dim + d
    return packing


def test_a_tiled_cache_is_read_as_a_strided_view_and_weighs_as_a_plain_one():
    """A layout that is a strided view of each block (AMX tiles, dims in pairs) is gathered by
    spans and viewed, pairs moved as one wider integer; a shuffled one element by element.
    Both weigh what a plain cache weighs."""
    lens = [5, 9, 16, 13, 1]
    shuffled = torch.randperm(2 * 2 * 4 * 8, generator=torch.Generator().manual_seed(9))
    got = []
    for packing in (None, _tiled(), shuffled):
        impl, query, cache, meta, *_, out, write = _paged(lens, seed=5, write=_writer(packing))
        attention._measure(impl, NS(isa=str(packing)), query, cache, meta, out, write)
        got.append({b: w.clone() for b, (w, _) in attention._rows.items()})
        attention._rows.clear()
    views = [layout[2] for layout in attention._layouts.values()]
    assert views[0][4] == 1 and views[1][2:] == ([2, 2, 2, 4, 2], [32, 16, 2, 4, 1], 2) and views[2] is None
    assert attention.WEIGH.off is None and all(len(g) == len(lens) for g in got)
    assert all(torch.allclose(got[0][b], g[b]) for g in got[1:] for b in got[0])


def test_rows_are_weighed_in_groups_that_bound_the_gathered_keys(monkeypatch):
    from kvdiag.engines import weights

    monkeypatch.setattr(weights, "ELEMENTS", 100)
    assert weights.groups([10, 10, 40, 5, 200, 3], 1) == [range(0, 2), range(2, 4), range(4, 5), range(5, 6)]
    assert weights.groups([], 8) == []
    lens = [5, 9, 16, 13]
    monkeypatch.setattr(weights, "ELEMENTS", 2 * 16 * 8)  # two rows of 16 at most
    impl, query, cache, meta, *_, out, write = _paged(lens, seed=5)
    attention._measure(impl, NS(isa="plain"), query, cache, meta, out, write)
    grouped = {b: w.clone() for b, (w, _) in attention._rows.items()}
    attention._rows.clear()
    monkeypatch.setattr(weights, "ELEMENTS", 1 << 23)
    attention._measure(impl, NS(isa="plain"), query, cache, meta, out, write)
    assert all(torch.allclose(grouped[b], attention._rows[b][0]) for b in range(len(lens)))


def test_a_cache_read_in_the_wrong_layout_turns_the_weighing_off():
    """A layout that reads wrong (the write op below lies about where it put K and V) no
    longer gives back the kernel's output, so nothing is weighed: leakage is unmeasured,
    never wrong."""
    impl, query, cache, meta, *_, out, _ = _paged([5, 9, 16, 13], seed=4)
    packing = torch.randperm(2 * 2 * 4 * 8, generator=torch.Generator().manual_seed(8))
    attention._measure(impl, NS(isa="liar"), query, cache, meta, out, _writer(packing))
    assert attention.WEIGH.off and not attention._rows
    assert getattr(attention._attach(NS(input_batch=NS(req_ids=["r"])), _Out(["r"])),
                   attention.ATTR) == {}


def test_leakage_is_the_attention_sampled_tokens_paid_to_slots_read_wrong(tmp_path):
    """b reads a's block under another prefix: each of its sampled tokens leaks the weight it
    put there; a request that read nothing wrong leaks 0; a token with no weights is unmeasured."""
    a, b = request("a", range(8)), request("b", [*range(4), 7, 7, 7, 7, 5])
    c = request("c", [3] * 8)
    sched = Scheduler(a, b, c)
    path = tmp_path / "s.jsonl"
    s = VllmSentinel(str(path))
    even = {"a": torch.full((8,), 1 / 8).numpy()}
    _step(s, sched, output(new=[("a", [1, 2], 0, 8)]), even)
    # b maps a's blocks 1 and 2 (a key that left its tokens out): positions 4..7 are foreign
    w = torch.tensor([0.05] * 4 + [0.1] * 4 + [0.4]).numpy()
    _step(s, sched, output(new=[("b", [1, 2, 3], 8, 1), ("c", [5, 6], 0, 8)], finished=["a"]),
          {"b": w, "c": torch.full((8,), 1 / 8).numpy()})
    b.all_token_ids.append(6)
    _step(s, sched, output(cached=[("b", [], 9, 1, False)]), {})  # its weights missing: unmeasured
    _step(s, sched, output(finished=["b", "c"]), {})
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["attention"] is True
    leak = [x for x in lines if x["type"] == "leakage"][-1]  # the last line of a request holds
    assert leak["request"] == "b" and leak["tokens"] == 2 and leak["unmeasured"] == 1
    assert math.isclose(leak["mass"], 0.4, rel_tol=1e-6)  # float32 weights
    assert read_report(path).leakage == {"b": leak}


def test_a_request_still_running_when_the_file_is_read_is_in_it(tmp_path):
    """vLLM tells the sentinel a request finished only at its next step: an idle server never
    does. Its running totals go out with the counters, so its leak is not read as 0."""
    a, b = request("a", range(8)), request("b", [*range(4), 7, 7, 7, 7, 5])
    sched = Scheduler(a, b)
    path = tmp_path / "s.jsonl"
    s = VllmSentinel(str(path))
    _step(s, sched, output(new=[("a", [1, 2], 0, 8)]), {"a": torch.full((8,), 1 / 8).numpy()})
    s.log._last = 0.0  # the next counters line is due
    _step(s, sched, output(new=[("b", [1, 2, 3], 8, 1)]), {"b": torch.full((9,), 0.1).numpy()})
    (row,) = read_report(path).leakage.values()
    assert row["request"] == "b" and row["tokens"] == 1 and math.isclose(row["mass"], 0.4, rel_tol=1e-6)


def test_the_probe_rows_get_0_where_nothing_was_read_wrong_and_nan_in_a_run_not_all_weighed(tmp_path):
    path = tmp_path / "s.jsonl"
    tag = {k: f"kvdiag-{k:016x}" for k in (1, 2, 3)}
    path.write_text("\n".join(json.dumps(x) for x in [
        {"type": "start", "engine": "vllm", "attention": True},
        {"type": "leakage", "request": f"cmpl-{tag[1]}-0", "tokens": 4, "mass": 0.5, "unmeasured": 0},
        {"type": "leakage", "request": f"cmpl-{tag[2]}-0", "tokens": 4, "mass": 0.5, "unmeasured": 1},
        {"type": "counters", "steps": 3, "reads": 10}]) + "\n")
    store = NS(done={("shared", k, 0): {"request_id": tag[k], "index": k} for k in tag})
    block, rows = observe(path, store=store, wait=0)  # request 2's wrong read was not weighed
    assert not block.attention and block.leaked == 2 and block.leakage_unweighed == 1
    assert block.leakage_largest == 0.125 and not any("attention_leakage" in r for r in rows.values())
    path.write_text(path.read_text().replace('"unmeasured": 1', '"unmeasured": 0'))
    block, rows = observe(path, store=store, wait=0)
    assert block.attention and block.leaked == 2 and block.leakage_unweighed == 0
    assert rows[("shared", 1, 0)]["attention_leakage"] == rows[("shared", 2, 0)]["attention_leakage"] == 0.125
    assert rows[("shared", 3, 0)]["attention_leakage"] == 0.0
    path.write_text(path.read_text().replace('"attention": true', '"attention": false'))
    block, rows = observe(path, store=store, wait=0)  # not weighed: no row claims 0
    assert not block.attention and not any("attention_leakage" in r for r in rows.values())


def test_bad_reads_are_counted_by_the_phase_that_read_them(tmp_path):
    path = tmp_path / "s.jsonl"
    tag = {k: f"kvdiag-{k:016x}" for k in (1, 2, 3)}
    finding = dict(type="finding", kind="foreign", step=4, positions=[[0, 8]], context_len=20,
                   writers=[], context=[], writer_context=[])
    path.write_text("\n".join(json.dumps(x) for x in [
        {"type": "start", "engine": "sglang"},
        finding | {"request": tag[1], "count": 8}, finding | {"request": tag[2], "count": 5},
        finding | {"request": tag[3], "count": 3}, finding | {"request": "elsewhere", "count": 2},
        finding | {"request": tag[1], "count": 1, "kind": "overwrite"},
        {"type": "counters", "steps": 5, "reads": 100, "foreign": 18, "overwrite": 1}]) + "\n")
    store = NS(done={("floor", 1, 0): {"request_id": tag[1]}, ("shared", 2, 0): {"request_id": tag[2]},
                     ("life-isolated", 3, 0): {"request_id": tag[3]}})
    block, _ = observe(path, store=store, wait=0)
    assert block.by_phase == {"floor": 8, "shared": 5, "life-isolated": 3, "unnamed": 2}
    assert block.isolated_bad == 11 and list(block.by_phase)[0] == "floor"


def _step(sentinel, scheduler, out, weights, seconds=None):
    sentinel.scheduled(scheduler, out)
    said = {} if seconds is None else {attention.SECONDS: seconds}
    sentinel.step(scheduler, out, NS(**{attention.ATTR: weights}, **said))


def test_the_workers_seconds_weighing_go_into_the_counters(tmp_path):
    """The weighing's cost, counted where it runs (vLLM's worker: the seconds so far come with
    each step's output) and kept in the sentinel's counters until the worker says more."""
    import time

    from kvdiag.engines.weights import Weigher

    weigh = Weigher("test")
    with weigh.timed():
        time.sleep(0.02)
    assert 0.02 <= weigh.seconds < 1
    a = request("a", range(8))
    sched = Scheduler(a)
    path = tmp_path / "s.jsonl"
    s = VllmSentinel(str(path))
    _step(s, sched, output(new=[("a", [1, 2], 0, 8)]), {}, seconds=weigh.seconds)
    s.log._last = 0.0  # the next counters line is due
    _step(s, sched, output(finished=["a"]), {})  # an output that says nothing keeps the last
    assert read_report(path).counters.weighing == weigh.seconds


def test_sglang_weights_are_torch_sdpa_attention_of_each_requests_last_token():
    """SGLang's measure (kvdiag.engines.sglang.attention), over a token-granular pool and its
    req_to_token rows, against the same anchor, for an extend batch and a decode batch."""
    from kvdiag.engines.sglang import attention as sg

    g = torch.Generator().manual_seed(3)
    k_cache, v_cache = torch.randn(64, 2, 8, generator=g), torch.randn(64, 2, 8, generator=g)
    rows = torch.zeros(4, 32, dtype=torch.int64)
    lens, pool = [7, 12], [2, 0]
    perm = torch.randperm(64, generator=g)
    rows[2, :7], rows[0, :12] = perm[:7], perm[7:19]
    extend = torch.tensor([3, 5])  # the last 3 and 5 positions computed this step
    query = torch.randn(8, 4, 8, generator=g)

    def backend(q, last):  # what SGLang's backend writes at each request's last token (SDPA)
        out = torch.zeros(len(q), 4, 8)
        for b, (idx, n) in enumerate(zip(pool, lens)):
            k, v = (c[rows[idx, :n]].transpose(0, 1).repeat_interleave(2, dim=0) for c in (k_cache, v_cache))
            out[last[b]] = torch.nn.functional.scaled_dot_product_attention(
                q[last[b]][:, None, :], k, v, scale=0.3)[:, 0]
        return out

    args = (k_cache, v_cache, rows, torch.tensor(pool), torch.tensor(lens))
    sg._measure(query, backend(query, [2, 7]), *args, [2, 7], 0.3)
    sg._measure(query[:2], backend(query[:2], [0, 1]), *args, [0, 1], 0.3)
    assert sg.WEIGH.off is None
    for b, (idx, n) in enumerate(zip(pool, lens)):
        k = k_cache[rows[idx, :n]].transpose(0, 1).repeat_interleave(2, dim=0)
        want = sum(torch.nn.functional.scaled_dot_product_attention(
            q[:, None, :], k, torch.eye(n).expand(4, n, n), scale=0.3)[:, 0].mean(0)
            for q in (query[int(extend[:b + 1].sum()) - 1], query[b])) / 2
        assert torch.allclose(torch.from_numpy(sg.take(idx, n)), want, atol=1e-5)
    assert sg.take(2, 7) is None and not sg.weights  # taken once


def test_sglang_weighs_the_tokens_a_batch_sampled(tmp_path):
    """A request served another request's slots as its prefix leaks what its sampled token
    paid them; a prefill chunk short of its prompt samples nothing."""
    from kvdiag.engines.sglang import attention as sg
    from kvdiag.engines.sglang.sentinel import SglangSentinel
    from tests.kvdiag.sentinel.test_sglang_adapter import batch, req

    pool = torch.zeros((4, 64), dtype=torch.int64)
    scheduler = NS(req_to_token_pool=NS(req_to_token=pool))
    path = tmp_path / "s.jsonl"
    s = SglangSentinel(str(path), weigh=True)
    a, b = req("a", range(10)), req("b", [*range(5), 9, 9, 9, 9, 9])
    pool[0, :10] = torch.arange(100, 110)
    s.launched(scheduler, batch([a], [0], [6], prefix=[0], extend=[6]))  # chunk 1 of a
    s.processed()
    s.launched(scheduler, batch([a], [0], [10], prefix=[6], extend=[4]))
    s.processed()
    pool[1, :10] = torch.arange(100, 110)  # b told a's 8 slots are its prefix: 5..7 foreign
    sg.weights[(1, 10)] = [torch.full((10,), 0.2), 2]
    s.launched(scheduler, batch([b], [1], [10], prefix=[8], extend=[2]))
    s.processed()
    a.finished = b.finished = lambda: True
    s.left()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["attention"] is True
    leak = [x for x in lines if x["type"] == "leakage"][-1]  # the last line of a request holds
    assert leak["request"] == "b" and leak["tokens"] == 1 and leak["unmeasured"] == 0
    assert math.isclose(leak["mass"], 0.3, rel_tol=1e-6)  # 3 positions x 0.2 / 2 layers


@dataclasses.dataclass
class _Out:
    """A step's output as vLLM's ModelRunnerOutput is, for _attach (a dataclass)."""

    req_ids: list


def test_a_write_op_that_places_nothing_one_to_one_leaves_nothing_weighed():
    impl, query, cache, meta, *_, out, _ = _paged([5, 9], seed=6)
    assert attention.learn_layout(cache, lambda *args: None) is None  # wrote nothing it can read
    attention._measure(impl, NS(isa="none"), query, cache, meta, out, lambda *args: None)
    assert attention.WEIGH.off and "no layout" in attention.WEIGH.off and not attention._rows
