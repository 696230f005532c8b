"""llama.cpp as kvdiag's third engine, model-free: its faults are source patches, each tied to
its catalog entry and applied to a copy of the tree (a patch that no longer applies names the
fault and the file, before anything builds); a missing build names its make target; a file
that is not a GGUF is refused before a server starts; its counters read as the probe needs
them. The live side (a real llama-server) is in test_llamacpp_live.py."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kvdiag.engines.llamacpp import build
from kvdiag.engines.llamacpp.faults import FAULTS, FIXES, check_fault
from kvdiag.engines.llamacpp.protocol import LLAMACPP
from kvdiag.errors import KvdiagError

ROOT = Path(__file__).resolve().parents[3]


def _gguf_or_skip() -> Path:
    from kvdiag.models.gguf_import import packaged_gguf

    try:
        return packaged_gguf()
    except KvdiagError as e:
        pytest.skip(f"{e} (make real-model)")


def test_every_fault_is_one_patch_and_every_patch_a_fault():
    patches = {p.stem for p in build.PATCHES.glob("*.patch")}
    assert patches == set(FAULTS)
    for name in FAULTS:
        text = build.patch_file(name).read_text()
        files = build.patched_files(build.patch_file(name))
        assert files and all(f.startswith(("tools/", "src/", "common/")) for f in files), files
        # the change says which fault it is, in the source it lands in
        assert re.search(rf"^\+.*kvdiag fault {re.escape(name)}:", text, re.M), name
        assert FAULTS[name].reports and FAULTS[name].plant_point.split(":")[0] in files


def test_every_fix_is_one_patch_of_its_own_folder_and_builds_under_its_own_name():
    assert {p.stem for p in build.FIX_PATCHES.glob("*.patch")} == set(FIXES) and not set(FIXES) & set(FAULTS)
    for name, fix in FIXES.items():
        assert build.patch_file(name).parent == build.FIX_PATCHES and fix.reports and fix.written_from
        assert re.search(rf"^\+.*kvdiag fix {re.escape(name)}:", build.patch_file(name).read_text(), re.M)
        assert build.build_name(name) == f"b{build.BUILD_NUMBER}-fix-{name}"
        assert check_fault(name) == name  # llamacpp-local:NAME builds it
    assert build.build_name("prefix-overrun").endswith("-fault-prefix-overrun")


@pytest.mark.skipif(not (build.root() / "src" / "llama.cpp" / "CMakeLists.txt").is_file(),
                    reason="no llama.cpp tree: make llamacpp-env")
@pytest.mark.parametrize("name", [*FAULTS, *FIXES, build.SENTINEL])
def test_every_patch_applies_to_the_sdists_tree(name, tmp_path):
    """Each in the order its build applies them: the sentinel's first (every binary kvdiag
    builds carries it), a fix written on other fixes after theirs."""
    tree = build.root() / "src" / "llama.cpp"
    chain = build.patch_chain(name)
    assert chain[0] == build.SENTINEL_PATCH and chain[-1] == build.patch_file(name)
    for f in {f for p in chain for f in build.patched_files(p)}:
        if (tree / f).is_file():  # else a file the patch adds
            (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(tree / f, tmp_path / f)
    for patch in chain:
        run = subprocess.run(["patch", "-p1", "--batch", "-i", str(patch)], cwd=tmp_path,
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stdout + run.stderr


def test_a_patch_that_no_longer_applies_names_the_fault_and_the_file(tmp_path, monkeypatch):
    """A tree whose file moved on: refused before any build (no cmake runs: the tree has none)."""
    name = next(iter(FAULTS))
    stock = tmp_path / "src" / "llama.cpp"
    for f in build.patched_files(build.patch_file(name)):
        (stock / f).parent.mkdir(parents=True, exist_ok=True)
        (stock / f).write_text("// another version of this file\n")
    (stock / "CMakeLists.txt").write_text("")
    monkeypatch.setenv("KVDIAG_LLAMACPP_DIR", str(tmp_path))
    with pytest.raises(KvdiagError) as e:
        build.fault_server(name, log=lambda _m: None)
    message = str(e.value)
    assert f"fault {name}" in message and "no longer applies" in message
    assert all(f in message for f in build.patched_files(build.patch_file(name)))
    assert not (tmp_path / "faults" / name).exists() and not (tmp_path / "fault-build").exists()
    # the copy is left as the stock tree has it
    for f in build.patched_files(build.patch_file(name)):
        assert (tmp_path / "fault-src" / f).read_text() == (stock / f).read_text()


def test_a_file_put_back_after_a_patch_is_newer_than_what_the_patch_built(tmp_path):
    """The incremental build decides by times: a stock file put back with the stock tree's
    old time left the patched object in the next binary (a later build with a fix in it ran
    state-tail-dropped's serializer, and its probe failed with 43 corrupted requests)."""
    import os
    import time

    stock, tree = tmp_path / "stock", tmp_path / "tree"
    for d in (stock, tree):
        (d / "src").mkdir(parents=True)
    (stock / "src" / "kv.cpp").write_text("stock\n")
    os.utime(stock / "src" / "kv.cpp", (1_000_000, 1_000_000))  # the sdist's time
    (tree / "src" / "kv.cpp").write_text("patched\n")
    built = tmp_path / "kv.cpp.o"
    built.write_text("object of the patched file\n")
    os.utime(built, (time.time() - 5, time.time() - 5))
    (tree / "src" / "added.h").write_text("a file a patch added\n")
    build._restore(stock, tree, ["src/kv.cpp", "src/added.h"])
    assert (tree / "src" / "kv.cpp").read_text() == "stock\n"
    assert (tree / "src" / "kv.cpp").stat().st_mtime > built.stat().st_mtime
    assert not (tree / "src" / "added.h").exists()  # the stock tree has none


def test_the_tree_alone_is_enough_for_a_planted_fault_and_not_for_the_stock_target(tmp_path, monkeypatch):
    """A run of planted faults builds each binary from the sdist's tree (make llamacpp-src),
    so the engine counts as there with the tree; the stock target still asks for its build."""
    from kvdiag.engines.llamacpp.launcher import LlamacppLocal

    monkeypatch.setenv("KVDIAG_LLAMACPP_DIR", str(tmp_path))
    monkeypatch.setenv("KVDIAG_LLAMACPP_SERVER", str(tmp_path / "build" / "bin" / "llama-server"))
    with pytest.raises(KvdiagError, match="make llamacpp-env"):
        build.installed()
    tree = tmp_path / "src" / "llama.cpp"
    tree.mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text("project(llama.cpp)\n")
    assert build.installed() == tree and LlamacppLocal.find_python() == str(tree)
    with pytest.raises(KvdiagError, match="make llamacpp-env"):
        LlamacppLocal(tmp_path / "m.gguf")
    server = tmp_path / "build" / "bin" / "llama-server"
    server.parent.mkdir(parents=True)
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    assert build.installed() == server  # the stock build first, where there is one


@pytest.mark.e2e  # a CLI subprocess
def test_no_build_names_the_make_target_and_exits_2(tmp_path):
    env = {"KVDIAG_LLAMACPP_SERVER": str(tmp_path / "llama-server"), "PATH": "/usr/bin:/bin",
           "KVDIAG_LLAMACPP_DIR": str(tmp_path / "none")}
    run = subprocess.run([sys.executable, "-m", "kvdiag", "probe", "--target", "llamacpp-local",
                          "--suite", "natural", "--out", str(tmp_path / "p")],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert run.returncode == 2, run.stderr[-800:]
    assert "make llamacpp-env" in run.stderr and "llama-server" in run.stderr


def test_a_file_that_is_not_a_gguf_is_refused_before_a_server_starts(tmp_path):
    from kvdiag.engines.llamacpp.launcher import LlamacppLocal

    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(KvdiagError, match="not a GGUF file"):
        LlamacppLocal.check_model(bad)
    with pytest.raises(KvdiagError, match="no .gguf file in it"):
        LlamacppLocal.check_model(tmp_path / "..")  # a folder without one
    (tmp_path / "m").mkdir()
    good = tmp_path / "m" / "x.gguf"
    good.write_bytes(b"GGUF" + bytes(16))
    assert LlamacppLocal.check_model(tmp_path / "m") == good.resolve()


def test_its_counters_read_as_tokens_looked_up_and_tokens_served():
    """llama.cpp counts prompt tokens without the cached ones: looked up = both."""
    from kvdiag.engines.spec import ENGINES

    got = LLAMACPP.counters({"llamacpp:prompt_tokens_total": 30.0,
                             "llamacpp:prompt_tokens_cached_total": 70.0})
    queries, hits = ENGINES["llamacpp"].counters.names
    assert (got[queries], got[hits]) == (100.0, 70.0)
    assert LLAMACPP.counters({}) == {}  # a server without --metrics: nothing made up


def test_isolation_keeps_a_request_off_the_cache_and_salts_are_not_sent():
    body = {"prompt": [1, 2, 3]}
    LLAMACPP.isolate(body)
    assert body == {"prompt": [1, 2, 3], "cache_prompt": False}
    LLAMACPP.namespace(body, "kvdiag-run-1")
    assert "cache_salt" not in body and not LLAMACPP.namespaces


def _row(store, phase, session, ids, sent, cached, salt=None):
    from kvdiag.runners.live.endpoint import ChatResult

    result = ChatResult(text="", tokens=[], top=[], logprobs=[], prompt_tokens=len(ids),
                        cached_tokens=cached, finish_reason="length", sent=sent, done=sent + 0.5)
    store.add(phase, session, 0, result, ids=list(ids), salt=salt, name=f"{phase} {session}",
              family="slot", model=None)


@pytest.mark.parametrize("namespaces", [True, False])
def test_one_namespace_and_isolated_sources_where_the_engine_has_no_namespaces(tmp_path, namespaces):
    """The bound on an engine keyed by tokens only (llama.cpp): a salt keeps nothing apart,
    and an isolated twin (cache_prompt: false) still leaves its tokens in a slot, so a later
    request may hit either. Where salts are namespaces (vLLM) the same hits are over-hits."""
    from kvdiag.runners.live.coverage import key_coverage
    from kvdiag.runners.live.differential import DIFF, DIFF_ISOLATED
    from kvdiag.runners.live.pressure import ServerCache
    from kvdiag.runners.live.store import RoundStore
    from kvdiag.verdicts.live import over_hit

    a, b = list(range(100, 140)), list(range(100, 120)) + list(range(500, 520))
    store = RoundStore(tmp_path / "rounds.jsonl")
    _row(store, DIFF, 0, a, 0.0, 0, salt="run")
    _row(store, DIFF_ISOLATED, 0, b, 1.0, 0)  # the isolated twin of something with b's tokens
    _row(store, DIFF, 1, b, 2.0, 39, salt="run")  # hits all of b but its last token: the twin's
    _row(store, DIFF, 2, a, 3.0, 39, salt="other")  # all of a under another salt
    store.close()
    server = ServerCache(block_size=16, num_blocks=512, source="props")
    got = key_coverage(None, store, [], server, {}, True, namespaces=namespaces)
    oracle = got.oracle
    over = {h.what: over_hit(h.cached, h.bound) for h in oracle.hits}
    assert oracle.checked == 3 and oracle.unreported == 0  # the twin is a source, not judged
    assert over == {"differential pair 'diff 0' (slot)": False,
                    "differential pair 'diff 1' (slot)": namespaces,
                    "differential pair 'diff 2' (slot)": namespaces}


def test_an_engine_flag_for_a_server_kvdiag_does_not_start_is_refused(tmp_path):
    from kvdiag.commands.probe import probe
    from kvdiag.commands.probe_args import ProbeArgs

    with pytest.raises(KvdiagError, match="--engine-arg is for a server kvdiag starts"):
        probe(ProbeArgs(suite="natural", base_url="http://127.0.0.1:9", model="m",
                        out_dir=tmp_path / "p", engine_args=("-np 2",)))
    assert not (tmp_path / "p").exists()  # refused before a run directory was made


def test_chunk_reuse_is_pinned_per_request_and_read_from_the_servers_flags():
    """Every request carries n_cache_reuse (the server's --cache-reuse cannot be read from
    /props), the N kvdiag started llamacpp-local with, 0 otherwise; a bad N is exit 2."""
    from kvdiag.engines.llamacpp.launcher import llama_args, reuse_chunk
    from kvdiag.engines.protocol import OpenAIProtocol

    body = {"prompt": [1, 2, 3]}
    LLAMACPP.pin_reuse(body, 256)
    assert body["n_cache_reuse"] == 256
    other = {"prompt": [1]}
    OpenAIProtocol().pin_reuse(other, 256)
    assert other == {"prompt": [1]}  # vLLM and SGLang take no such field
    assert reuse_chunk(("-np", "2")) == 0
    assert reuse_chunk(("--cache-reuse", "256")) == reuse_chunk(("--cache-reuse=256",)) == 256
    with pytest.raises(KvdiagError, match="whole number"):
        reuse_chunk(("--cache-reuse", "lots"))
    # llama-server b11434 refuses --cache-reuse=256 (detect's own chunk-reuse row once did):
    # the word is split for it, a value holding '=' is left whole
    assert llama_args(("--cache-reuse=256", "--override-kv", "a=int:1")) == \
        ["--cache-reuse", "256", "--override-kv", "a=int:1"]


def test_a_chunk_shifted_past_the_common_prefix_is_within_the_bound_only_with_the_rule(tmp_path):
    """On a server run with --cache-reuse 4 (every request pinned to it), a request whose history
    dropped a turn hits the later turns as a shifted chunk: within the bound; the same count
    on a server without chunk reuse is an over-hit."""
    from kvdiag.runners.live.coverage import key_coverage
    from kvdiag.runners.live.differential import DIFF
    from kvdiag.runners.live.pressure import ServerCache
    from kvdiag.runners.live.store import RoundStore
    from kvdiag.verdicts.live import over_hit

    turns = [list(range(100 + 10 * k, 110 + 10 * k)) for k in range(4)]
    full, trimmed = [i for t in turns for i in t], turns[0] + turns[2] + turns[3] + [7]
    store = RoundStore(tmp_path / "rounds.jsonl")
    _row(store, DIFF, 0, full, 0.0, 0)
    _row(store, DIFF, 1, trimmed, 2.0, 30)  # turn 0, then turns 2 and 3 shifted into place
    store.close()
    over = {}
    for reuse in (4, 0):
        server = ServerCache(block_size=16, num_blocks=512, source="props")
        got = key_coverage(None, store, [], server, {}, True, namespaces=False, reuse_chunk=reuse)
        over[reuse] = [over_hit(h.cached, h.bound) for h in got.oracle.hits]
        assert got.oracle.reuse_chunk == reuse and got.oracle.chunk_hits == (1 if reuse else 0)
    assert over == {4: [False, False], 0: [False, True]}


def test_a_completions_logprobs_in_llamacpps_chat_shape_are_read_as_its_tokens():
    """llama-server answers a /v1/completions request's logprobs in the chat shape
    (choices[0].logprobs.content); read as the legacy shape they would be no tokens at all,
    and every completion (the differential and lifecycle phases') would match its twin
    vacuously. Both shapes of one answer read the same."""
    from kvdiag.runners.live.replies import completion_result as _completion_result

    def top(tok, lp):
        return {"id": 1, "token": tok, "bytes": list(tok.encode()), "logprob": lp}

    usage = {"prompt_tokens": 9, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 4}}
    chat_shape = {"choices": [{"text": " Paris.", "index": 0, "finish_reason": "length", "logprobs": {
        "content": [top(" Paris", -0.1) | {"top_logprobs": [top(" Paris", -0.1), top(" Lyon", -2.5)]},
                    top(".", -0.3) | {"top_logprobs": [top(".", -0.3), top("!", -1.9)]}]}}], "usage": usage}
    legacy = {"choices": [{"text": " Paris.", "index": 0, "finish_reason": "length", "logprobs": {
        "tokens": [" Paris", "."], "token_logprobs": [-0.1, -0.3],
        "top_logprobs": [{" Paris": -0.1, " Lyon": -2.5}, {".": -0.3, "!": -1.9}]}}], "usage": usage}
    a, b = _completion_result(chat_shape), _completion_result(legacy)
    assert a.tokens == b.tokens == [" Paris", "."] and a.logprobs == b.logprobs == [-0.1, -0.3]
    assert a.top == b.top and a.top[0] == [(" Paris", -0.1), (" Lyon", -2.5)]
    assert a.cached_tokens == 4 and a.text == " Paris."


def test_the_slot_phase_is_bounded_and_its_under_hits_counted_per_group(tmp_path):
    """The slot lifecycle phase (one request at a time) joins the oracle: a returning
    conversation restored whole is at its bound; one pinned to an empty slot that never looks
    its RAM cache up (#28139's shape) reports nothing, an under-hit the accounting table
    counts, never an over-hit; a count past what was sent is an over-hit there too. A paged
    engine's lifecycle rows stay out of the oracle (their answers judge them)."""
    from kvdiag.runners.live.coverage import key_coverage
    from kvdiag.runners.live.endpoint import ChatResult
    from kvdiag.runners.live.lifeplan import LIFE, LIFE_ISOLATED, LifePlan, LifeRequest
    from kvdiag.runners.live.pressure import ServerCache
    from kvdiag.runners.live.store import RoundStore
    from kvdiag.verdicts.live import over_hit

    first, longer = list(range(100, 140)), list(range(100, 140)) + list(range(600, 620))
    plan = LifePlan((LifeRequest(0, "rotate", tuple(first), 16, "c-0"),
                     LifeRequest(1, "rotate", tuple(longer), 16, "c-0", of=0),
                     LifeRequest(2, "pinned", tuple(longer), 16, "c-0", of=0),
                     LifeRequest(3, "restore", tuple(longer + [7]), 16, "c-1")),
                    {}, {"slots": 2}, kind="slots")
    store = RoundStore(tmp_path / "rounds.jsonl")
    for j, cached, t in ((0, 0, 0.0), (1, 39, 1.0), (2, 0, 2.0), (3, 61, 3.0)):
        q = plan.requests[j]
        result = ChatResult(text="", tokens=[], top=[], logprobs=[], prompt_tokens=len(q.ids),
                            cached_tokens=cached, finish_reason="length", sent=t, done=t + 0.5)
        store.add(LIFE, j, 0, result, group=q.group, salt=q.salt)
    for j, q in enumerate(plan.requests):  # the twins, after the phase: sources, never judged
        store.add(LIFE_ISOLATED, j, 0, ChatResult(
            text="", tokens=[], top=[], logprobs=[], prompt_tokens=len(q.ids), cached_tokens=0,
            finish_reason="length", sent=10.0 + j, done=10.5 + j))
    store.close()
    server = ServerCache(block_size=16, num_blocks=512, source="props")
    got = key_coverage(None, store, [], server, {}, True, namespaces=False, life=plan)
    oracle = got.oracle
    bounds = {h.what: (h.cached, h.bound) for h in oracle.hits}
    assert bounds == {"lifecycle rotate request 0": (0, 0), "lifecycle rotate request 1": (39, 40),
                      "lifecycle pinned request 2": (0, 59), "lifecycle restore request 3": (61, 60)}
    assert [over_hit(c, b) for c, b in bounds.values()] == [False, False, False, True]
    table = {a.group: (a.requests, a.possible, a.reported, a.short, a.none) for a in oracle.accounting}
    assert table == {"lifecycle rotate": (2, 40, 39, 1, 0), "lifecycle pinned": (1, 59, 0, 1, 1),
                     "lifecycle restore": (1, 60, 61, 0, 0)}
    paged = LifePlan(plan.requests, {}, {}, kind="blocks")
    assert not key_coverage(None, store, [], server, {}, True, namespaces=True, life=paged).oracle.hits


def test_the_adapter_negates_its_rows_and_leaves_the_rest():
    """kvdiag-lora, made from SmolLM2's GGUF: W + (alpha / rank) B @ A negates the chosen rows
    of every layer's K (KV head 0) and Q (the heads reading it), and nothing else: within the
    adapter q.k is the base model's; across models those pairs' share of the score flips."""
    import numpy as np

    from kvdiag.engines.llamacpp.lora import PAIRS, build

    model = _gguf_or_skip()
    gguf = pytest.importorskip("gguf", reason="gguf ships with the real model (make real-model)")
    with tempfile.TemporaryDirectory() as tmp:
        out = build(model, Path(tmp) / "a.gguf")
        adapter = gguf.GGUFReader(out)
        base = {t.name: t for t in gguf.GGUFReader(model).tensors}
        lora = {t.name: t for t in adapter.tensors}
        kind = bytes(adapter.fields["general.type"].parts[-1]).decode()
        alpha = float(adapter.fields["adapter.lora.alpha"].parts[-1][0])
        assert kind == "adapter" and len(lora) == 2 * 2 * 30  # A and B, for K and Q, 30 layers
        for layer in (0, 29):
            for name, heads in (("attn_k", 1), ("attn_q", 3)):
                t = base[f"blk.{layer}.{name}.weight"]
                w = gguf.quants.dequantize(t.data, t.tensor_type).reshape(int(t.shape[1]), int(t.shape[0]))
                a = np.array(lora[f"blk.{layer}.{name}.weight.lora_a"].data)
                b = np.array(lora[f"blk.{layer}.{name}.weight.lora_b"].data)
                rank = a.shape[0]
                assert rank == heads * 2 * PAIRS and b.shape == (w.shape[0], rank)
                got = w + alpha / rank * (b @ a)
                flipped = np.abs(got + w).max(axis=1) < 1e-4  # rows now -W
                assert flipped.sum() == rank and np.allclose(got[~flipped], w[~flipped])
                assert all(r % 64 >= 64 - 2 * PAIRS for r in np.flatnonzero(flipped))  # low-frequency pairs


def test_an_adapter_is_asked_for_by_its_field_and_a_base_request_names_none(monkeypatch):
    """llama.cpp serves adapters beside its model (/lora-adapters, by id): a request under
    kvdiag-lora carries "lora" [{id, scale 1}] and the served model's name; a base request no
    field at all (as a user's would: the path #26207 left open). vLLM's adapters are models."""
    import asyncio

    import httpx

    from kvdiag.engines.protocol import OPENAI
    from kvdiag.runners.live.endpoint import Endpoint

    listed = [{"id": 0, "path": "/cache/kvdiag-lora.gguf", "scale": 0.0}, {"id": 1, "path": "x/other.gguf"}]
    call = lambda method, path, **kw: httpx.Response(200, json=listed)  # noqa: E731
    assert LLAMACPP.adapters(call) == {"kvdiag-lora": {"lora": [{"id": 0, "scale": 1.0}]},
                                       "other": {"lora": [{"id": 1, "scale": 1.0}]}}
    assert LLAMACPP.adapters(lambda *a, **kw: httpx.Response(404)) == {} and OPENAI.adapters(call) == {}
    ep = Endpoint("http://127.0.0.1:9", "smollm2")
    ep.__dict__.update(protocol=LLAMACPP, adapters=LLAMACPP.adapters(call), _identity=("llamacpp", "b1"))
    sent = []

    async def answer(method, path, json=None, headers=None):
        sent.append(json)
        return httpx.Response(200, json={"choices": [{"text": "x", "finish_reason": "length"}],
                                         "usage": {"prompt_tokens": 2, "completion_tokens": 1}})

    monkeypatch.setattr(ep, "_async", answer)
    asyncio.run(ep.complete([1, 2], 1, model="kvdiag-lora"))
    asyncio.run(ep.complete([1, 2], 1))
    assert sent[0]["lora"] == [{"id": 0, "scale": 1.0}] and sent[0]["model"] == "smollm2"
    assert "lora" not in sent[1] and sent[1]["model"] == "smollm2"


def test_the_differential_phase_sends_new_tokens_under_the_adapter_then_the_base_model():
    from kvdiag.runners.live.differential import pairs

    material = list(range(1000, 1400))
    names = {p.name: p for p in pairs(material, 16, "kvdiag-lora")}
    first, after, other = names["adapter first"], names["base after adapter"], names["other"]
    assert first.model == "kvdiag-lora" and after.model is None and first.ids == after.ids
    assert first.ids[0] != other.ids[0] and first.ids[1:] == other.ids[1:]  # no base request's prefix
    assert not {"adapter first", "base after adapter"} & {p.name for p in pairs(material, 16, None)}


def _slot_file(cells: int = 3, layers: int = 2, row: int = 8, seq_ids: int = 1) -> tuple[bytes, int]:
    """A slot file in b11434's layout (llama-context.cpp state_seq_save_file), and where its
    first value layer begins: header and 5 tokens, one stream of `cells` cells, then each
    layer's keys and each layer's values (f16, `row` bytes a row)."""
    import struct

    out = struct.pack("<III", 0x67677371, 2, 5) + struct.pack("<5i", *range(5))
    out += struct.pack("<II", 1, cells)
    for p in range(cells):
        out += struct.pack("<iI", p, seq_ids) + struct.pack(f"<{seq_ids}i", *range(seq_ids))
    out += struct.pack("<IIII", 0, layers, 64, 0)
    for layer in range(layers):
        out += struct.pack("<iQ", 1, row) + bytes([layer + 1]) * (cells * row)
    first = len(out)
    for layer in range(layers):
        out += struct.pack("<iQ", 1, row) + bytes([layer + 9]) * (cells * row)
    return out, first


def test_a_slot_file_is_broken_only_where_its_layout_walks_out_exactly():
    """The failed-restore event's file: the first value layer's type made one no cache has,
    every key and value byte kept; a file cut short, or a cell of two sequences, is left
    alone (None: the event is said not driven)."""
    import struct

    from kvdiag.engines.llamacpp.slotfile import NO_TYPE, break_values

    data, first = _slot_file()
    broken = break_values(data)
    assert broken is not None and len(broken) == len(data)
    assert struct.unpack_from("<i", broken, first)[0] == NO_TYPE
    assert broken[:first] == data[:first] and broken[first + 4:] == data[first + 4:]
    assert LLAMACPP.broken_slot_file(data) == broken
    assert break_values(data[:-1]) is None and break_values(data[:first]) is None
    assert break_values(data + b"\0") is None and break_values(b"") is None
    assert break_values(_slot_file(seq_ids=2)[0]) is None
