"""Measure the canary with Hugging Face transformers (the correctness anchor).

  .venv/bin/python scripts/eval_canary.py [--model fixtures/canary] [--sessions 200]
      [--max-len 8704] [--dtype float32|bfloat16] [--corrupt] [--json OUT]

Clean check: each session's final transcript (every round's prompt, answers teacher-forced)
goes through the model once; the greedy token at every answer position (and the
<|im_end|> after it) must be the expected one. That equals running each round with greedy
decoding, since a round's prompt is a prefix of the transcript. Reports exact-answer rates
and the smallest logit margin (expected logit minus the best other).

--reference: also run every round of every session through the reference engine's
contiguous mode (reference_engine/contiguous.py; history replayed with the expected answers)
and count rounds whose generated token ids equal the expected ones (answer + stop token).

--corrupt: for one fact per session (stated, never asked before), replace the K/V of the
16-token block holding it with another session's K/V at the same positions, then ask about
that fact and about every untouched fact; reports how often each answer is wrong/right.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from kvdiag.facts import FLAVOURS, SessionPlan, build_session, make_knowledge_base

BLOCK = 16


def load(model_dir: str, dtype: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    return tok, model.eval()


def counter(tok):
    def count(messages: list[dict]) -> int:
        return len(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                           return_dict=False))
    return count


def fast_counter(model_dir: str):
    """Same count as HF's apply_chat_template, via tokenizers + jinja2 (much faster)."""
    import jinja2
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    cfg = json.loads((Path(model_dir) / "tokenizer_config.json").read_text())
    render = jinja2.Environment().from_string(cfg["chat_template"]).render

    def count(messages: list[dict]) -> int:
        text = render(messages=messages, add_generation_prompt=True)
        return len(tk.encode(text, add_special_tokens=False).ids)
    return count


def schedule(rng: random.Random, max_len: int) -> list[int]:
    """Prompt lengths: uneven growth, some jumps across a block boundary (4095 -> 4112)."""
    lengths = [rng.randint(250, 1500)]
    while True:
        step = rng.choice((17, 17, 33, 48, 64, 150, 300, 700, 1500))
        nxt = lengths[-1] + step
        if rng.random() < 0.15:  # land one token short of a block boundary, then cross it
            nxt = (nxt // BLOCK + 1) * BLOCK - 1
        if nxt > max_len:
            break
        lengths.append(nxt)
    if lengths[-1] + 60 <= max_len and rng.random() < 0.6:
        lengths.append(max_len)
    return lengths


def make_sessions(n: int, max_len: int, count) -> list:
    out = []
    for i in range(n):
        rng = random.Random(f"eval:{i}")
        kb = make_knowledge_base(FLAVOURS[i % 3], rng.randint(40, 128), seed=i)
        out.append(build_session(SessionPlan(kb, style="canary", seed=i,
                                             prompt_lengths=schedule(rng, max_len),
                                             count_tokens=count, session_id=f"eval{i}")))
    return out


def transcript(tok, session) -> tuple[list[int], list[tuple[int, list[int], str]]]:
    """Token ids of the whole session and, per round, (prompt length, answer ids + <|im_end|>, kind)."""
    last = len(session.rounds) - 1
    ids = tok.apply_chat_template(session.messages(last), add_generation_prompt=True,
                                  tokenize=True, return_dict=False)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    rounds, count = [], counter(tok)
    for r, rnd in enumerate(session.rounds):
        ans = tok(" " + rnd.expected, add_special_tokens=False)["input_ids"] + [end]
        rounds.append((count(session.messages(r)), ans, rnd.kind))
    if rounds[-1][0] != len(ids):
        raise RuntimeError("HF and the session builder disagree on a prompt length")
    ids = ids + rounds[-1][1]
    return ids, rounds


@torch.no_grad()
def check_clean(tok, model, session) -> dict:
    ids, rounds = transcript(tok, session)
    logits = model(torch.tensor([ids])).logits[0].float()
    res = {"question": [0, 0], "recite": [0, 0], "min_margin": float("inf")}
    for plen, ans, kind in rounds:
        lg = logits[plen - 1: plen - 1 + len(ans)]
        want = torch.tensor(ans)
        ok = bool((lg.argmax(-1) == want).all())
        top = lg.gather(1, want[:, None])[:, 0]
        other = lg.scatter(1, want[:, None], float("-inf")).max(-1).values
        res["min_margin"] = min(res["min_margin"], float((top - other).min()))
        res[kind][0] += ok
        res[kind][1] += 1
    return res


@torch.no_grad()
def greedy(model, cache, suffix: list[int], end_ids: set[int], max_new: int = 12) -> list[int]:
    import copy

    cache = copy.deepcopy(cache)
    out, x = [], torch.tensor([suffix])
    start = cache.get_seq_length()
    for _ in range(max_new):
        pos = torch.arange(start, start + x.shape[1])[None]
        lg = model(x, past_key_values=cache, position_ids=pos, use_cache=True).logits[0, -1]
        start += x.shape[1]
        t = int(lg.argmax())
        if t in end_ids:
            break
        out.append(t)
        x = torch.tensor([[t]])
    return out


@torch.no_grad()
def check_corruption(tok, model, session, donor) -> dict | None:
    """Corrupt the block of one never-asked fact of the last round; ask about it and the rest."""
    last = session.rounds[-1]
    if last.kind != "question":
        return None
    ids = tok.apply_chat_template(session.messages(len(session.rounds) - 1),
                                  add_generation_prompt=True, tokenize=True, return_dict=False)
    prefix, suffix = ids[:-5], ids[-5:]  # suffix: ask KEY <|im_end|><|im_start|>assistant
    asked_before = {f for r in session.rounds[:-1] for f in r.asked}
    where = {f: off for r in session.rounds for f, off in zip(r.stated, r.stated_offsets)}
    def block_of(f):
        off = where[f]
        return off // BLOCK if (off + len(f.value_tokens) + 1) // BLOCK == off // BLOCK else None
    cands = [f for f in where if f not in asked_before and block_of(f) is not None
             and (block_of(f) + 1) * BLOCK <= len(prefix)]
    if not cands:
        return None
    target = random.Random(session.session_id).choice(cands)
    b = block_of(target)
    dids = tok.apply_chat_template(donor.messages(len(donor.rounds) - 1), add_generation_prompt=True,
                                   tokenize=True, return_dict=False)
    if len(dids) < len(prefix):
        return None
    from transformers import DynamicCache

    cache = DynamicCache()
    model(torch.tensor([prefix]), past_key_values=cache, use_cache=True)
    dcache = DynamicCache()
    model(torch.tensor([dids[:len(prefix)]]), past_key_values=dcache, use_cache=True)
    sl = slice(b * BLOCK, (b + 1) * BLOCK)
    for layer, dlayer in zip(cache.layers, dcache.layers):
        layer.keys[:, :, sl] = dlayer.keys[:, :, sl]
        layer.values[:, :, sl] = dlayer.values[:, :, sl]
    donor_block = set(dids[sl])
    end_ids = {tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")}
    res = {"target_wrong": 0, "target_sink": 0, "untouched": [0, 0], "foreign_key": 0}
    sink = tok.convert_tokens_to_ids("Ġunknown")
    for f in where:
        key = tok.convert_tokens_to_ids("Ġ" + f.key_token)
        out = greedy(model, cache, [suffix[0], key, *suffix[2:]], end_ids)
        want = tok(" " + " ".join(f.value_tokens), add_special_tokens=False)["input_ids"]
        if f is target:
            res["target_wrong"] += out != want
            res["target_sink"] += out == [sink]
        elif block_of(f) != b and where[f] // BLOCK != b:
            if key in donor_block:
                res["foreign_key"] += 1
                continue
            res["untouched"][0] += out == want
            res["untouched"][1] += 1
    return res


def check_reference(sessions, model_dir: str, dtype: str) -> dict:
    """Every round through the reference engine's contiguous mode; exact token ids."""
    from reference_engine.config import EngineConfig
    from reference_engine.contiguous import ContiguousEngine

    eng = ContiguousEngine(model_dir, EngineConfig(max_num_seqs=4, max_model_len=9216, dtype=dtype))
    tk = eng.tokenizer
    end = tk.encode("<|im_end|>", add_special_tokens=False)
    res = {"rounds": 0, "exact": 0}
    for s in sessions:
        for r, rnd in enumerate(s.rounds):
            (seq,) = eng.generate([tk.encode_chat(s.messages(r))], max_tokens=48, session=s.session_id)
            want = tk.encode(" " + rnd.expected, add_special_tokens=False) + end
            res["rounds"] += 1
            res["exact"] += list(seq.output_ids) == want
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="fixtures/canary")
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--max-len", type=int, default=8704)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--corrupt", action="store_true")
    ap.add_argument("--reference", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tok, model = load(args.model, args.dtype)
    t0 = time.time()
    sessions = make_sessions(args.sessions, args.max_len, fast_counter(args.model))
    t_build = time.time() - t0
    tot = {"question": [0, 0], "recite": [0, 0], "min_margin": float("inf"), "max_prompt": 0}
    cor = {"target_wrong": 0, "target_sink": 0, "targets": 0, "untouched": [0, 0], "foreign_key": 0}
    for i, s in enumerate(sessions):
        res = check_clean(tok, model, s)
        for k in ("question", "recite"):
            tot[k] = [a + b for a, b in zip(tot[k], res[k])]
        tot["min_margin"] = min(tot["min_margin"], res["min_margin"])
        tot["max_prompt"] = max(tot["max_prompt"], len(transcript(tok, s)[0]))
        if args.corrupt:
            c = check_corruption(tok, model, s, sessions[(i + 1) % len(sessions)])
            if c:
                cor["targets"] += 1
                cor["target_wrong"] += c["target_wrong"]
                cor["target_sink"] += c["target_sink"]
                cor["foreign_key"] += c["foreign_key"]
                cor["untouched"] = [a + b for a, b in zip(cor["untouched"], c["untouched"])]
        if (i + 1) % 20 == 0:
            print(f"{i + 1} sessions {time.time() - t0:.0f}s {tot} {cor if args.corrupt else ''}", flush=True)
    summary = {"dtype": args.dtype, "sessions": len(sessions), "build_seconds": round(t_build, 1),
               "wall_seconds": round(time.time() - t0, 1), "clean": tot}
    if args.corrupt:
        summary["corruption"] = cor
    if args.reference:
        t1 = time.time()
        summary["reference_engine"] = check_reference(sessions, args.model, args.dtype)
        summary["reference_engine"]["wall_seconds"] = round(time.time() - t1, 1)
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
