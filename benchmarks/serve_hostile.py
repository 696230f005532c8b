"""Hostile load: a burst of mixed valid and hostile requests against `kvdiag serve` (canary).

Starts its own server on loopback, fires --requests requests at --concurrency: valid chats
and completions, 20 MB bodies, lone surrogates (raw bytes and JSON escapes) on the three
text endpoints, invalid UTF-8, deep JSON nesting, and long streams cut after their first
event. Meanwhile it polls /health and samples the server's RSS. Then it prints: the 5xx
count (must be 0), /health p99 during the burst (goal < 1 s), how many cut streams the
server aborted and how long an abort takes (goal <= 1 s), KV usage before and after, and
RSS at start, peak and idle with the idle/start ratio. Linux only (RSS from /proc).

    python benchmarks/serve_hostile.py [--requests 300] [--concurrency 32] [--huge-mb 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FACT = "acmeREV usd four point two billion . bado kefu ask acmeREV"
CHAT, CMPL, TOK = "/v1/chat/completions", "/v1/completions", "/tokenize"
SURROGATES = [b'"a\\ud800b"', b'"a\xed\xa0\x80b"']  # a JSON escape and raw CESU bytes


def _body(path: str, text: bytes) -> bytes:
    if path == CHAT:
        return b'{"model":"canary","max_tokens":4,"messages":[{"role":"user","content":' + text + b"}]}"
    return b'{"model":"canary","max_tokens":4,"prompt":' + text + b"}"


def requests_for(n: int, huge_mb: float, seed: int = 0) -> list[tuple[str, str, bytes]]:
    """n (kind, path, body) triples, a fixed mix shuffled by seed; kind "cut" is a stream
    the client closes after its first event."""
    huge = _body(CMPL, json.dumps("bado " * int(huge_mb * (1 << 20) / 5)).encode())
    deep = b'{"model":"canary","prompt":' + b"[" * 5000 + b"]" * 5000 + b"}"
    # the canary repeats "kefu" after this prompt until max_tokens: a stream of minutes
    cut = json.dumps({"model": "canary", "stream": True, "max_tokens": 1500, "prompt": "bado kefu"}).encode()
    chat = json.dumps({"model": "canary", "max_tokens": 16,
                       "messages": [{"role": "user", "content": FACT}]}).encode()
    long_chat = json.dumps({"model": "canary", "max_tokens": 16, "messages": [
        {"role": "user", "content": " ".join(["bado kefu"] * 700) + " " + FACT}]}).encode()
    big = _body(CMPL, json.dumps("bado " * (900 * 1024 // 5)).encode())  # under the 1 MiB limit
    mix = [("valid", CHAT, chat), ("valid", CMPL, _body(CMPL, json.dumps(FACT).encode())),
           ("valid", CHAT, long_chat), ("big", CMPL, big),
           ("cut", CMPL, cut), ("huge", CMPL, huge), ("deep", CMPL, deep),
           ("bad_utf8", CHAT, _body(CHAT, b'"a\xff\xfeb"'))]
    mix += [("surrogate", p, _body(p, s)) for p in (CHAT, CMPL, TOK) for s in SURROGATES]
    out = [mix[i % len(mix)] for i in range(n)]
    random.Random(seed).shuffle(out)
    return out


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


async def metric(client, name: str) -> float:
    text = (await client.get("/metrics")).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


async def _send(client, kind: str, path: str, body: bytes) -> int:
    headers = {"content-type": "application/json"}
    if kind != "cut":
        return (await client.post(path, content=body, headers=headers)).status_code
    async with client.stream("POST", path, content=body, headers=headers) as r:
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                break  # leaving the block closes the connection: the client is gone
        return r.status_code


async def _until_idle(client, timeout: float) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if await metric(client, "vllm:num_requests_running") + await metric(client, "vllm:num_requests_waiting") == 0:
            return time.perf_counter() - t0
        await asyncio.sleep(0.02)
    return float("inf")


async def hostile(url: str, pid: int, n: int, concurrency: int, huge_mb: float, cuts_after: int = 5) -> dict:
    """Run the burst against url (server process pid) and return the figures."""
    import httpx

    reqs = requests_for(n, huge_mb)
    statuses, health, rss = Counter(), [], [rss_bytes(pid)]
    sem, done = asyncio.Semaphore(concurrency), threading.Event()
    async with httpx.AsyncClient(base_url=url, timeout=120) as client, \
            httpx.AsyncClient(base_url=url, timeout=60) as probe:
        idle_health = []  # the same poll on the idle server: the machine's own latency
        for _ in range(20):
            t0 = time.perf_counter()
            await probe.get("/health")
            idle_health.append(time.perf_counter() - t0)
        usage_before = await metric(probe, "vllm:kv_cache_usage_perc")
        aborted_before = await metric(probe, "kvdiag_requests_aborted_total")

        async def one(kind, path, body):
            async with sem:
                try:
                    statuses[await _send(client, kind, path, body)] += 1
                except httpx.HTTPError as e:
                    statuses[type(e).__name__] += 1

        def watch():  # a thread of its own, so the burst's client work does not delay it
            with httpx.Client(base_url=url, timeout=60) as c:
                while not done.is_set():
                    t0 = time.perf_counter()
                    try:
                        c.get("/health")
                        health.append(time.perf_counter() - t0)
                    except httpx.HTTPError:
                        health.append(float("inf"))
                    rss.append(rss_bytes(pid))
                    done.wait(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        t0 = time.perf_counter()
        await asyncio.gather(*(one(*r) for r in reqs))
        wall = time.perf_counter() - t0
        done.set()
        watcher.join()
        drain_s = await _until_idle(probe, 120)
        await asyncio.sleep(2)
        usage_after = await metric(probe, "vllm:kv_cache_usage_perc")
        aborted = await metric(probe, "kvdiag_requests_aborted_total") - aborted_before
        abort_s = []  # one cut at a time, now that the server is idle
        for _ in range(cuts_after):
            before = await metric(probe, "kvdiag_requests_aborted_total")
            await _send(client, "cut", *next((p, b) for k, p, b in reqs if k == "cut"))
            t_cut = time.perf_counter()
            while await metric(probe, "kvdiag_requests_aborted_total") == before and time.perf_counter() - t_cut < 30:
                await asyncio.sleep(0.01)
            abort_s.append(time.perf_counter() - t_cut)
        await _until_idle(probe, 30)
        rss_idle = rss_bytes(pid)
    health.sort()
    return {"requests": n, "wall_s": wall, "statuses": dict(statuses),
            "n_5xx": sum(v for k, v in statuses.items() if isinstance(k, int) and k >= 500),
            "n_transport_errors": sum(v for k, v in statuses.items() if not isinstance(k, int)),
            "health_n": len(health), "health_p99_s": health[min(len(health) - 1, int(0.99 * len(health)))],
            "health_max_s": health[-1], "health_idle_p50_s": sorted(idle_health)[10], "cut_streams": sum(k == "cut" for k, _, _ in reqs),
            "aborted": aborted, "drain_s": drain_s, "abort_s": abort_s,
            "kv_usage_before": usage_before, "kv_usage_after": usage_after,
            "rss_start": rss[0], "rss_peak": max(rss), "rss_idle": rss_idle}


def report(r: dict) -> list[str]:
    mb = 1 << 20
    return [
        f"{r['requests']} requests in {r['wall_s']:.1f} s; statuses {r['statuses']}",
        f"5xx: {r['n_5xx']}  transport errors: {r['n_transport_errors']}",
        f"/health during the burst: {r['health_n']} polls, p99 {r['health_p99_s']:.3f} s, max {r['health_max_s']:.3f} s "
        f"(goal p99 < 1 s); idle median {r['health_idle_p50_s']:.4f} s, burst p99 / idle median "
        f"{r['health_p99_s'] / r['health_idle_p50_s']:.0f}x",
        f"cut streams: {r['cut_streams']}, aborted by the server: {r['aborted']:.0f}; idle {r['drain_s']:.2f} s after the burst",
        f"abort after a cut (idle server, {len(r['abort_s'])} tries): max {max(r['abort_s'], default=0):.3f} s (goal <= 1 s)",
        f"KV usage before {r['kv_usage_before']:.4f}, after {r['kv_usage_after']:.4f}",
        f"RSS start {r['rss_start'] / mb:.0f} MiB, peak {r['rss_peak'] / mb:.0f} MiB, idle {r['rss_idle'] / mb:.0f} MiB, "
        f"idle/start {r['rss_idle'] / r['rss_start']:.2f} (goal <= 1.5)",
    ]


def main() -> int:
    from tests.kvdiag.serving import served

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--huge-mb", type=float, default=20.0)
    ap.add_argument("--max-num-seqs", type=int, default=32)
    args = ap.parse_args()
    with served("--max-num-seqs", str(args.max_num_seqs), "--max-model-len", "2048") as (url, proc):
        result = asyncio.run(hostile(url, proc.pid, args.requests, args.concurrency, args.huge_mb))
    print("\n".join(report(result)))
    ok = (result["n_5xx"] == 0 and result["aborted"] >= result["cut_streams"]
          and result["kv_usage_after"] <= result["kv_usage_before"])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
