"""The lifecycle phase's plan (pure: a resumed probe plans the same requests), sized from
what the server reports: its pool, its context, its prefill chunk. The groups, what each
sends and the events it drives, are lifecycle.py's to send and events.py's to read."""

from __future__ import annotations

from dataclasses import dataclass

from reference_engine.util import cdiv

LIFE, LIFE_ISOLATED = "life", "life-isolated"
OVERCOMMIT = 1.25  # the flood's prompts hold this many pools' worth of tokens
MAX_FLOOD = 48  # at most this many flood requests: a pool that needs more is not flooded
MAX_PROMPT = 8192  # no lifecycle prompt is longer (prefill on a CPU costs)
ANSWER = 16  # tokens every non-flood request generates
# cancels before the first token, each aborted (where the server aborts by rid) a further
# eighth of the measured prefill in: a chunk of prefill lasts tens of ms on a CPU, so one
# offset alone misses it as often as not
CANCEL_PREFILLS = 6
COPY_DELAYS = (0.0, 0.005, 0.01, 0.015, 0.02)  # seconds before each of a chunked prefill's copies


@dataclass(frozen=True)
class LifeRequest:
    """One request of the phase: `ids` under salt `<run salt>-<salt>`, in `group`."""

    j: int
    group: str
    ids: tuple[int, ...]
    max_tokens: int
    salt: str
    ignore_eos: bool = False
    of: int | None = None  # a follower's or revisit's earlier request (revisits go newest first)
    # False where no answer computed from scratch is its ground truth (llama.cpp's chunk reuse
    # is approximate by design): no isolated twin; the sentinel judges what it read
    twinned: bool = True


@dataclass(frozen=True)
class LifePlan:
    requests: tuple[LifeRequest, ...]
    skipped: dict  # group -> why it is not sent on this server
    sizing: dict  # the figures the plan was sized from
    kind: str = "blocks"  # a paged engine's block events, or "slots" (slotlife.py: llama.cpp)

    def group(self, name: str) -> list[LifeRequest]:
        return [q for q in self.requests if q.group == name]


def plan_lifecycle(material: list[int], block_size: int, num_blocks: int | None,
                   max_model_len: int | None, chunk: int | None, concurrency: int,
                   ends: tuple[int, ...] = ()) -> LifePlan:
    """The phase's requests for a server with this pool, context and prefill chunk. Pure: a
    resumed probe plans the same requests. `material`: token ids (the suite's prompts, one
    after another), `ends`: where in it each prompt ends. The long prompts (flood, chunk,
    cancel) end where a prompt of the suite ends, on its last question: an answer that reads
    the conversation, where a window cut anywhere is often answered from its last few tokens
    alone (the canary's `unknown`), and wrong bytes elsewhere in it never show."""
    longest = min(MAX_PROMPT, (max_model_len or MAX_PROMPT) - 4 * block_size - ANSWER)
    requests: list[LifeRequest] = []
    skipped: dict[str, str] = {}
    cut = _Cutter(material, ends)

    def add(group: str, ids, max_tokens: int = ANSWER, salt: str | None = None, eos: bool = False,
            of: int | None = None):
        requests.append(LifeRequest(len(requests), group, tuple(ids), max_tokens,
                                    salt or f"{group}-{len(requests)}", eos, of))

    warm = [cut.take(min(longest, 12 * block_size) - 3 * k) for k in range(max(4, concurrency // 2))]
    for ids in warm:
        add("warm", ids, 8)
    pool_tokens = num_blocks * block_size if num_blocks else None
    flood = 0
    if pool_tokens is None:
        skipped["flood"] = "the server's pool is unknown (no vllm:cache_config_info or /server_info)"
    else:
        length = min(longest * 2 // 3, max(8 * block_size, cdiv(int(OVERCOMMIT * pool_tokens), concurrency)))
        flood = cdiv(int(OVERCOMMIT * pool_tokens), length)
        if flood > MAX_FLOOD:
            skipped["flood"] = (f"the pool ({num_blocks} blocks of {block_size}) needs {flood} "
                                f"prompts of {length} tokens to overcommit (at most {MAX_FLOOD})")
            flood = 0
        # the admitted prompts leave less than one prompt's blocks free, and each grows by half
        # its prompt: together half a pool more than the pool, so the server must preempt even
        # when only half of them are in it at once. Growth of one prompt's worth in all (about
        # 2 * length^2 / pool tokens each) preempted vLLM in 2 of 5 probes on 2 CPU cores: its
        # API server hands a flood of long prompts to the engine staggered, and the first
        # finish before the last are admitted
        decode = min(longest - length, max(4 * block_size, length // 2))
        for _ in range(flood):
            add("flood", cut.ending(length), decode, eos=True)
        # the flood again under fresh salts, sent only where the first preempted nothing
        for q in [q for q in requests if q.group == "flood"]:
            add("reflood", q.ids, decode, eos=True)
    for q in [q for q in requests if q.group == "warm"]:
        add("return", q.ids + tuple(cut.take(block_size + 5)), salt=q.salt)
    # a fault at one event leaves wrong bytes under a correct key; the event's own request may
    # not show it (a long decode past its answer), a later hit on those blocks does: each flood
    # prompt is looked up again while the flood runs (follow) and after it (revisit)
    for q in [q for q in requests if q.group == "flood"]:
        add("follow", q.ids + tuple(cut.take(block_size + 5)), salt=q.salt, of=q.j)
    for q in [q for q in requests if q.group in ("warm", "return", "flood")]:
        add("revisit", q.ids, salt=q.salt, of=q.j)
    # two bursts, each small enough to be admitted as one batch: one with the flood (queued
    # behind it), one behind the chunk group's long prefill (beside one of its chunks)
    for burst in ("dedup-flood", "dedup-chunk"):
        prefix = cut.take(min(longest, 4 * block_size + 3))
        for _ in range(4):
            add("dedup", prefix + cut.take(5), 8 * block_size, salt=burst, eos=True)
    want = min(longest, 8 * chunk + block_size // 2) if chunk else longest
    if chunk and want <= 2 * chunk:  # a copy must be able to arrive with two chunks to go
        skipped["chunk"] = (f"the server's prefill chunk ({chunk} tokens) is over half the "
                            f"longest prompt its context allows here ({longest})")
    else:
        ids = cut.ending(want)
        for _ in range(1 + len(COPY_DELAYS)):  # the first streamed as traffic, its copies judged
            add("chunk", ids, salt="chunk")
    for when, count in (("prefill", CANCEL_PREFILLS), ("decode", 2)):
        for _ in range(count):
            add(f"cancel-{when}", cut.ending(min(longest, 96 * block_size)))
    return LifePlan(tuple(requests), skipped, {"pool_tokens": pool_tokens, "flood_requests": flood,
                                               "longest_prompt": longest, "prefill_chunk": chunk})


class _Cutter:
    """Consecutive windows of the material, wrapping around, each shifted by one token from
    the last so no two windows are equal."""

    def __init__(self, material: list[int], ends: tuple[int, ...] = ()) -> None:
        self.material, self.at = material or [1], 0
        self.ends, self.used = [e for e in ends if 0 < e <= len(self.material)], 0

    def ending(self, n: int) -> list[int]:
        """n tokens ending where the next prompt of the material ends (cycling through them;
        each lap one token shorter, so no two are equal); a plain window without ends."""
        if not self.ends:
            return self.take(n)
        end = self.ends[self.used % len(self.ends)]
        n = max(1, n - self.used // len(self.ends))
        self.used += 1
        return [self.material[(end - n + i) % len(self.material)] for i in range(n)]

    def take(self, n: int) -> list[int]:
        n = max(1, n)
        out = [self.material[(self.at + i) % len(self.material)] for i in range(n)]
        self.at = (self.at + n + 1) % len(self.material)
        return out
