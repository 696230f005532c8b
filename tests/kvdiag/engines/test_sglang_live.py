"""kvdiag against a real SGLang (0.5.23 on CPU, started by kvdiag.engines.sglang.SglangLocal):
the probe passes a healthy SGLang with recycling observed and fails one with `stale-node`
planted (naming rounds and first divergent tokens); the differential phase alone passes a
healthy SGLang with no over-hit and fails one whose prefix match runs past the divergence
(`match-overrun`, `page-overrun`) by over-hit; LoRA pairs under canary-lora hit nothing of the
base model's, and over-hit with `salt-ignored`; the isolation audit sees `salt-ignored` leak
across salts; regress completes against sglang-local; a probe whose server dies mid-run
exits 2 and resumes against a new one. Slow; skipped without the env (`make sglang-cpu-env`;
`make test-sglang-live` builds it and runs these). Bad input needs no env and runs always."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvdiag.engines.sglang import plugin
from kvdiag.engines.sglang.faults import PAGE_OVERRUN_SIZE
from kvdiag.engines.sglang.launcher import SglangLocal, sglang_available
from kvdiag.errors import KvdiagError
from kvdiag.paths import CANARY
from tests.kvdiag.serving import assert_died_and_kept, probe_until_server_dies, resumed_keys

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser

needs_sglang = pytest.mark.skipif(not sglang_available(), reason="no SGLang env: make sglang-cpu-env")
live = [pytest.mark.slow, pytest.mark.sglang_live, needs_sglang]
POOL = 11000  # tokens: the smoke suite's sessions recycle in it (the stale-node fault needs it)


def _kvdiag(*args: str, timeout: float = 2400) -> tuple[int, dict, str]:
    run = subprocess.run([sys.executable, "-m", "kvdiag", *args, "--json"], capture_output=True,
                         text=True, timeout=timeout)
    return run.returncode, (json.loads(run.stdout) if run.stdout.strip() else {}), run.stderr


@pytest.mark.parametrize("args, message", [
    (["probe", "--target", "sglang-local:no-such-fault", "--suite", "smoke"], "unknown SGLang fault"),
    (["regress", "--target", "sglang-local:nope", "--suite", "smoke"], "unknown SGLang fault"),
])
def test_an_unknown_fault_exits_2_before_anything_starts(args, message, tmp_path):
    code, _, err = _kvdiag(*args, "--out", str(tmp_path / "never"), timeout=120)
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "never").exists()


def test_no_sglang_env_exits_2_naming_the_make_target(tmp_path, monkeypatch):
    monkeypatch.setenv("KVDIAG_SGLANG_PYTHON", str(tmp_path / "no-such-python"))
    code, _, err = _kvdiag("probe", "--target", "sglang-local", "--suite", "smoke", "--out",
                           str(tmp_path / "p"), timeout=120)
    assert code == 2 and "make sglang-cpu-env" in err and "Traceback" not in err


@pytest.mark.parametrize("fault", [None, "stale-node"])
@pytest.mark.slow
@pytest.mark.sglang_live
@needs_sglang
def test_probe_of_sglang_local(fault, tmp_path, monkeypatch):
    monkeypatch.setenv("KVDIAG_SENTINEL_ATTENTION", "1")  # leakage weighed (opt-in: it costs)
    target = "sglang-local" + (f":{fault}" if fault else "")
    code, summary, err = _kvdiag("probe", "--target", target, "--suite", "smoke", "--out",
                                 str(tmp_path / "p"))
    log = (tmp_path / "p" / "sglang.log").read_text()
    assert summary["server"]["engine"] == "sglang" and summary["server"]["source"] == "server_info"
    assert summary["ground_truth"]["contaminated"] == 0  # salts isolate on SGLang
    sentinel = summary["sentinel"]  # on by default for sglang-local
    bad = sentinel["foreign"] + sentinel["unwritten"] + sentinel["overwrite"]
    assert sentinel["engine"] == "sglang" and sentinel["reads"] > 0, sentinel
    assert sentinel["attention"]  # the attention each sampled token paid to wrong slots, weighed
    shared = {r["round"]: r["attention_leakage"] for r in summary["rounds"] if r["allocator"] == "shared"}
    leaked = {r["round"] for r in sentinel["rounds"]}  # rounds whose shared requests read wrong
    print("LEAKAGE", fault, shared, sorted(leaked))
    assert all(shared[n] == 0.0 for n in shared if n not in leaked), shared
    if fault is None:
        assert bad == 0, sentinel["findings"][:3]
        assert code == 0, err[-2000:]
        assert summary["verdict"] == "pass" and summary["corrupted_requests"] == 0
        assert summary["recycling"]["observed"], summary["recycling"]
        assert "PLANTED FAULT" not in log
        # every event of a block's life, preemption included: the flood asks SGLang for its
        # long decodes by min_tokens, so SGLang admits it as it admits chat traffic, at its
        # new-token ratio, and retracts when they outgrow the pool (engines/sglang/protocol.py)
        missing = [r["event"] for r in summary["events"] if not r["reached"]]
        assert missing == [], summary["events"]
        assert "Retract requests" in log  # SGLang's own word for it
        cancel = {r["event"]: r for r in summary["events"]}["cancel-prefill"]
        assert "abort API" in cancel["evidence"]  # SGLang aborted by rid, not at its 1 s poll
        return
    assert "PLANTED FAULT stale-node" in log
    assert code == 1, err[-2000:]
    assert summary["verdict"] == "fail" and summary["corruption_rounds"]
    assert bad > 0 and summary["reason"].startswith("sentinel: ")
    assert leaked and all(shared[n] > 0 for n in leaked), shared  # the reference engine's metric, live
    first = summary["first_divergences"][0]
    assert first["round"] in summary["corruption_rounds"]
    assert first["shared_token"] != first["isolated_token"]


@pytest.mark.parametrize("fault", ["dedup-no-remap", "abort-publish", "retract-frees-prefix"])
@pytest.mark.slow
@pytest.mark.sglang_live
@needs_sglang
def test_the_default_probe_reaches_each_lifecycle_plants_event(fault, tmp_path):
    """The black box against SGLang's lifecycle plants: the default probe reaches the event each
    lives at (abort-publish: cancels aborted by rid mid-prefill), SGLang silent, and the
    sentinel inside it (on by default) fails the run on the wrong reads; whether the answers
    alone would have is a measured rate (docs/faults.md), printed."""
    from kvdiag.engines.sglang.faults import FAULTS

    code, summary, err = _kvdiag("probe", "--target", f"sglang-local:{fault}", "--suite", "smoke",
                                 "--out", str(tmp_path / "p"))
    sentinel = summary.get("sentinel") or {}
    bad = sum(sentinel.get(k, 0) for k in ("foreign", "unwritten", "overwrite"))
    print("LIFECYCLE-PROBE", json.dumps({"fault": fault, "exit": code, "verdict": summary.get("verdict"),
                                         "corrupted": summary.get("corrupted_requests"),
                                         "sentinel_bad": bad}))
    assert {r["event"]: r["reached"] for r in summary["events"]}[FAULTS[fault].event], summary["events"]
    assert code == 1, err[-3000:]
    assert summary["verdict"] == "fail" and bad > 0 and summary["reason"].startswith("sentinel: ")
    log = (tmp_path / "p" / "sglang.log").read_text(errors="replace")
    assert f"PLANTED FAULT {fault}" in log and "Traceback" not in log


@pytest.mark.parametrize("fault", [None, "match-overrun", "page-overrun"])
@pytest.mark.slow
@pytest.mark.sglang_live
@needs_sglang
def test_the_differential_phase_of_sglang_local(fault, tmp_path):
    """Pairs of prompts that part at one token, one at a time: a healthy SGLang reports no
    request above what its namespace could have cached; a match that runs past the token where
    a pair parts (one token at SGLang's page size 1; or, at page size 16, to the end of the
    page they part in) over-hits, and the count tells which; the sentinel inside the server
    sees the same wrong hits read, exactly, and its finding leads the reason."""
    target = "sglang-local" + (f":{fault}" if fault else "")
    code, summary, err = _kvdiag("probe", "--target", target, "--suite", "smoke", "--differential-only",
                                 "--out", str(tmp_path / "p"))
    log = (tmp_path / "p" / "sglang.log").read_text()
    oracle, pairs = summary["key_coverage"]["oracle"], summary["key_coverage"]["differential"]
    assert oracle["available"] and oracle["checked"] == sum(p["cached"] is not None for p in pairs)
    assert summary["ground_truth"]["contaminated"] == 0  # the plants leave fresh salts alone
    slots = [p for p in pairs if p["family"] == "slot"]
    assert slots and all(p["bound"] is not None for p in slots)
    if fault is None:
        assert code == 0, err[-2000:]
        assert summary["verdict"] == "pass" and oracle["over_hits"] == 0
        assert all(p["cached"] == p["bound"] for p in slots)  # token-granular: all it could
        assert "PLANTED FAULT" not in log
        return
    assert f"PLANTED FAULT {fault}" in log
    assert code == 1, err[-2000:]
    assert summary["verdict"] == "fail" and "over-hit: " in summary["reason"]
    # the sentinel (on for sglang-local) saw the wrongly served positions read, and leads
    sentinel = summary["sentinel"]
    assert sentinel["foreign"] + sentinel["unwritten"] > 0, sentinel
    assert summary["reason"].startswith("sentinel: ")
    assert oracle["over_hits"] and all(e["cached"] > e["bound"] for e in oracle["examples"])
    if fault == "match-overrun":  # one token past where each pair parts from the base
        assert all(p["cached"] == p["bound"] + 1 for p in slots), slots
        return
    page = summary["server"]["block_size"]
    assert page == PAGE_OVERRUN_SIZE  # the plant set SGLang's page size; the probe planned for it
    # rounded up to the page they part in: over where they part inside one, not on its edge
    assert all(p["cached"] == -(-p["bound"] // page) * page for p in slots), slots
    assert {p["bound"] % page == 0 for p in slots} == {True, False}  # both cases were sent


@pytest.mark.parametrize("fault", [None, "salt-ignored"])
@pytest.mark.slow
@pytest.mark.sglang_live
@needs_sglang
def test_lora_pairs_of_sglang_local_on_a_cpu(fault, tmp_path):
    """`--adapter canary-lora` on sglang-local: SGLang serves it on a CPU (its torch_native
    LoRA backend, pinned memory made plain: kvdiag.engines.sglang.cpu_lora), and the probe
    names it by `lora_path` (a request whose model is the adapter's name gets the base model
    from SGLang). Healthy, the adapter's pairs hit nothing of the base model's; with the
    radix key's namespace dropped (`salt-ignored`: extra_key, which carries the adapter's
    lora_id), they over-hit, and the sentinel sees the adapter's requests read base K/V."""
    target = "sglang-local" + (f":{fault}" if fault else "")
    code, summary, err = _kvdiag("probe", "--target", target, "--suite", "smoke", "--differential-only",
                                 "--adapter", "canary-lora", "--out", str(tmp_path / "p"))
    log = (tmp_path / "p" / "sglang.log").read_text()
    assert "torch_native as backend of LoRA" in log, log[-2000:]
    pairs = {p["name"]: p for p in summary["key_coverage"]["differential"]}
    adapter = [pairs[name] for name in ("adapter", "base after adapter")]
    assert all(p["bound"] == 0 for p in adapter), adapter  # no request of their model sent them
    sentinel = summary["sentinel"]
    if fault is None:
        assert code == 0, err[-2000:]
        assert summary["verdict"] == "pass" and all(p["cached"] == 0 for p in adapter), adapter
        assert sentinel["reads"] > 0 and sentinel["foreign"] == 0, sentinel
        return
    assert code == 1, err[-2000:]
    assert all(p["cached"] > 0 for p in adapter), adapter
    assert summary["verdict"] == "fail" and sentinel["foreign"] > 0, sentinel


def test_page_overrun_sets_the_page_size_before_sglang_resolves_its_arguments():
    class ServerArgs:  # SGLang's: resolved once, in the process that builds it
        def __init__(self, page_size: int) -> None:
            self.page_size, self.seen = page_size, None

        def resolve_once(self) -> None:
            if getattr(self, "_resolution_finished", False):
                return
            self.seen, self._resolution_finished = self.page_size, True

    plugin._wrap_resolve(type("server_args", (), {"ServerArgs": ServerArgs}), {"page_size": 16})
    fresh, resolved = ServerArgs(1), ServerArgs(1)
    resolved._resolution_finished = True  # a spawned process's copy: left as it came
    fresh.resolve_once()
    resolved.resolve_once()
    assert (fresh.seen, fresh.page_size) == (16, 16) and resolved.page_size == 1


@pytest.mark.slow
@pytest.mark.sglang_live
@needs_sglang
@pytest.mark.parametrize("fault", [None, "salt-ignored"])
def test_salt_ignored_leaks_across_salts(tmp_path, fault):
    """The isolation audit with the sentinel inside SGLang (on by default): healthy, no leak and
    no wrong read; with the salt dropped from the radix key, the other tenant's prefix is
    served (a per-tenant leak) and read (foreign, by the namespace the salt names)."""
    target = "sglang-local" + (f":{fault}" if fault else "")
    code, summary, err = _kvdiag("isolation", "--target", target, "--trials", "4",
                                 "--lengths", "64,256", "--out", str(tmp_path / "iso"))
    sentinel = summary["sentinel"]
    assert sentinel["engine"] == "sglang" and sentinel["reads"] > 0, err[-2000:]
    if fault is None:
        assert code == 0 and summary["verdict"] == "pass", summary["reason"]
        assert sentinel["foreign"] == sentinel["unwritten"] == 0
        return
    assert code == 1, err[-2000:]
    assert summary["verdict"] == "fail" and summary["leaks"]
    assert {leak["config"] for leak in summary["leaks"]} == {"per-tenant"}
    assert sentinel["foreign"] > 0 and "; sentinel: " in summary["reason"]


@pytest.mark.slow
@pytest.mark.sglang_live
@needs_sglang
def test_regress_against_sglang_local_completes(tmp_path):
    code, data, err = _kvdiag("regress", "--target", "sglang-local", "--suite", "smoke",
                              "--history", str(tmp_path / "h.sqlite"), "--baseline",
                              str(tmp_path / "b.json"), "--out", str(tmp_path / "r"))
    assert code == 0, err[-2000:]
    assert data["verdict"] == "pass" and data["key"]["engine"] == "sglang"
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["kind"] == "regress" and summary["target_spec"] == "sglang-local"
    assert "model:canary-" in summary["signature"]  # the directory's digest, not a served name


@pytest.mark.slow
@pytest.mark.sglang_live
@needs_sglang
def test_a_server_that_dies_mid_run_exits_2_and_the_probe_resumes(tmp_path):
    out = tmp_path / "p"

    def server():
        return SglangLocal(CANARY, num_blocks=POOL, max_model_len=2048, served_model="canary",
                           log_path=tmp_path / "sglang.log")

    def cmd(url: str) -> list[str]:
        return [sys.executable, "-m", "kvdiag", "probe", "--base-url", url, "--model", "canary",
                "--suite", "smoke", "--out", str(out)]

    with server() as s:
        code, err, kept = probe_until_server_dies(cmd(s.base_url), out, s.kill)
        url = s.base_url
    assert_died_and_kept(code, err, url, kept, out)
    with server() as s:
        run = subprocess.run(cmd(s.base_url) + ["--resume", str(out), "--json"], capture_output=True,
                             text=True, timeout=2400)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout)["verdict"] == "pass"
    resumed_keys(out, kept)


def test_unknown_fault_is_refused_by_the_launcher(tmp_path):
    with pytest.raises(KvdiagError, match="unknown SGLang fault"):
        SglangLocal(CANARY, fault="no-such-fault", python=sys.executable, log_path=tmp_path / "x.log")
    assert not (tmp_path / "x.log").exists()
