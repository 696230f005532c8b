"""The over-hit oracle: the most prompt tokens a server may legitimately report cached for a
request, from what the client itself sent. Exact and model-free for the key-coverage family
(a block key that covers less than its K/V depends on: a slot, the parent chain, the
namespace), one-sided (a server that under-reports hides an over-hit, so it never proves a
pass alone).

A prefix cache can serve request X only tokens that some request Y of the same namespace
(cache_salt, model or adapter) computed first: Y sent no later than X finished, with no reset
between. So, with LCP the longest common prefix of token ids,

    bound(X) = unit * floor(min(max_Y reach(X, Y), len(X) - last) / unit)
    reach(X, Y) = len(Y) + out(Y)   where X's prompt extends all of Y's: Y's generated
                                    tokens, whose ids the client does not know, count as
                                    matching. The last of them is sampled, never fed back,
                                    yet a healthy SGLang was measured reporting it cached
                                    (len(Y) + out(Y), the stop token's position included),
                                    so the bound keeps it
                = LCP(X, Y)         otherwise

`unit` is the server's block (vLLM; its --prefix-match-unit where smaller) or 1 where unsure
(SGLang's pages, a proxy): rounding down only tightens a bound, and a wrongly served block
already reaches past the LCP, so 1 costs nothing but partial-block faults. `last` is 1 where
the engine never serves a prompt's last token from the cache (vLLM, SGLang, kvdiag serve: one
token must be computed for the logits), 0 where unsure. A reported count above the bound (verdicts.over_hit) means the cache
served a block whose tokens differ from the request's, or its accounting over-reports.

llama.cpp started with `--cache-reuse N` (a request's `n_cache_reuse`) also shifts chunks of
at least N tokens that the slot holds past the common prefix into place: a request's cached
count may run on past its LCP through chunks of the slot's tokens. Then (`reuse_chunk` N)

    bound(X) = m + run(X, m)    m: the LCP bound above; run: how many positions of X from m
                                on lie, one after another, in some window of N ids that an
                                earlier request of the namespace also holds, with as many
                                positions let through unmatched as the longest answer
                                generated before X finished, plus N - 1 (a slot holds one
                                request's prompt and answer, whose ids the client does not
                                know: a chunk may match the answer, and one chunk may straddle
                                the prompt's end into it)

Sound: every chunk llama.cpp shifts is a run of at least N equal ids, so each position it
covers lies in an N-window of the slot's tokens; the windows of every earlier request are a
superset of one slot's. A slot serves one task at a time, so the request whose tokens it
holds finished before X was admitted, and its answer's length is known by X's end.

The requests are held in a trie of full blocks per namespace, so each request costs its
length over the block size, not a comparison with every earlier request:

    node --(block of B ids)--> child        count: requests whose prompt passes the child
      \\-- ends: (tail ids < B, len, out, request)   requests whose prompt ends in that block
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class HitRule:
    """How an engine counts cached tokens: in units of `unit` tokens, never the last one."""

    unit: int = 1
    last_token_computed: bool = True
    reuse_chunk: int = 0  # llama.cpp's n_cache_reuse: chunks this long count past the LCP

    @classmethod
    def for_server(cls, server, reuse_chunk: int = 0) -> HitRule:
        """The unit vLLM's own /metrics implies (record.evidence.ServerCache.hit_unit: its
        block, or a smaller prefix_match_unit); 1 elsewhere."""
        return cls(server.hit_unit, True, reuse_chunk)

    def bound(self, reach: int, length: int) -> int:
        """The most a request of `length` prompt tokens may report cached, given the furthest
        any other request reaches into it: capped by the prompt (less its last token where
        that is always computed), rounded down to the unit."""
        cap = length - (1 if self.last_token_computed else 0)
        return max(0, min(reach, cap)) // self.unit * self.unit


@dataclass(frozen=True)
class Sent:
    """One request as the oracle needs it. `ids` None: not known to the client (placeholder
    ids from usage counts); `cached` None: the server reported no count."""

    key: object  # the request's identity in the caller's records
    namespace: tuple
    ids: tuple[int, ...] | None
    sent: float
    done: float
    cached: int | None
    out: int | None = 0  # tokens generated, as usage.completion_tokens counts them (ids
    # unknown); None: still generating, so any length


@dataclass
class _Node:
    children: dict[tuple[int, ...], _Node] = field(default_factory=dict)
    count: int = 0
    ends: list[list] = field(default_factory=list)  # [tail ids, len, out, key]


class PrefixTrie:
    """The requests of one namespace, for reach(); online use (kvdiag watch) inserts at send,
    sets the output length at completion (None until then: unbounded) and removes the oldest."""

    def __init__(self, block: int) -> None:
        self.block, self.root = block, _Node()

    def _path(self, ids: tuple[int, ...]) -> list[tuple[_Node, tuple[int, ...]]]:
        b, node, path = self.block, self.root, []
        for i in range(len(ids) // b):
            path.append((node, ids[i * b:(i + 1) * b]))
            node = node.children[path[-1][1]]
        return path

    def insert(self, req: Sent) -> None:
        node, ids, b = self.root, req.ids, self.block
        full = len(ids) // b
        for i in range(full):
            node = node.children.setdefault(ids[i * b:(i + 1) * b], _Node())
            node.count += 1
        node.ends.append([ids[full * b:], len(ids), req.out, req.key])

    def _ends(self, req: Sent) -> list[list]:
        path = self._path(req.ids)
        return path[-1][0].children[path[-1][1]].ends if path else self.root.ends

    def set_out(self, req: Sent, out: int) -> None:
        for end in self._ends(req):
            if end[3] == req.key:
                end[2] = out

    def remove(self, req: Sent) -> None:
        ends = self._ends(req)
        ends[:] = [e for e in ends if e[3] != req.key]
        for parent, block in self._path(req.ids):
            child = parent.children[block]
            child.count -= 1
            if child.count == 0:  # only this request passed here: its whole subtree goes
                del parent.children[block]
                break

    def reach(self, req: Sent) -> int:
        """max over the other requests held of reach(req, Y) (the module docstring)."""
        ids, b, node, depth, best = req.ids, self.block, self.root, 0, 0
        while True:
            rest = ids[depth * b:(depth + 1) * b]
            for tail, length, out, key in node.ends:  # other prompts ending in this block
                if key == req.key:
                    continue
                common = lcp(rest, tail)
                best = max(best, depth * b + common)
                if common == len(tail) and len(ids) > length:
                    best = max(best, length + (len(ids) if out is None else out))  # X extends Y: Y's output may match too
            child = node.children.get(rest) if len(rest) == b else None
            if child is not None and child.count >= 2:  # another request passes here too
                node, depth = child, depth + 1
                best = max(best, depth * b)
                continue
            for block_ids, other in node.children.items():  # the next block, partly shared
                if other is not child:  # (a child only this request passes is its own)
                    best = max(best, depth * b + lcp(rest, block_ids))
            return best


def lcp(a, b) -> int:
    """The length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def bounds(requests: Iterable[Sent], rule: HitRule, resets: Iterable[float] = (),
           block: int = 16) -> dict[object, int]:
    """The bound of every request with known ids, by key. `resets`: times the whole prefix
    cache was emptied (a reset succeeds only with nothing in flight). `block`: the trie's
    block, any size (a performance knob, not the server's)."""
    requests = [r for r in requests if r.ids is not None]
    # events in time order: a reset, then requests sent, then requests done, at equal times
    events = [(t, 0, None) for t in resets]
    events += [(r.sent, 1, r) for r in requests] + [(r.done, 2, r) for r in requests]
    events.sort(key=lambda e: (e[0], e[1]))
    tries: dict[tuple, PrefixTrie] = {}
    chunks: dict[tuple, _Windows] = {}
    out: dict[object, int] = {}
    for _, kind, req in events:
        if kind == 0:
            tries.clear()
            chunks.clear()
        elif kind == 1:
            tries.setdefault(req.namespace, PrefixTrie(block)).insert(req)
            if rule.reuse_chunk:
                chunks.setdefault(req.namespace, _Windows(rule.reuse_chunk)).add(req.key, req.ids)
        else:
            trie = tries.get(req.namespace)
            reach = trie.reach(req) if trie is not None else 0
            if rule.reuse_chunk and req.namespace in chunks:
                reach = chunks[req.namespace].run(req.key, req.ids, reach)
                chunks[req.namespace].finished(req.out)
            out[req.key] = rule.bound(reach, len(req.ids))
    return out


class _Windows:
    """The N-windows of every request sent in one namespace (by hash: a collision only
    widens the bound), and the longest answer finished so far, for llama.cpp's chunk reuse."""

    def __init__(self, n: int) -> None:
        self.n, self.seen, self.added, self.longest_out = n, {}, set(), 0

    def _hashes(self, ids: tuple[int, ...]) -> list[int]:
        return [hash(ids[i:i + self.n]) for i in range(len(ids) - self.n + 1)]

    def add(self, key: object, ids: tuple[int, ...]) -> None:
        self.added.add(key)
        for h in self._hashes(ids):
            self.seen[h] = self.seen.get(h, 0) + 1

    def finished(self, out: int | None) -> None:
        self.longest_out = max(self.longest_out, out or 0)

    def run(self, key: object, ids: tuple[int, ...], start: int) -> int:
        """`start` plus the run of positions of request `key`'s `ids` from it that windows of
        the other requests cover, with the skips the module docstring allows."""
        hashes, mine = self._hashes(ids), {}
        if key in self.added:  # its own windows are not a source of its hits
            for h in hashes:
                mine[h] = mine.get(h, 0) + 1
        covered = [False] * len(ids)
        for i, h in enumerate(hashes):
            if self.seen.get(h, 0) > mine.get(h, 0):  # another request holds this window
                covered[i:i + self.n] = [True] * self.n
        skips = self.longest_out + self.n - 1 if self.longest_out else 0
        end = start
        while end < len(ids) and (covered[end] or skips > 0):
            skips -= not covered[end]
            end += 1
        return end


def check(requests: list[Sent], rule: HitRule, resets: Iterable[float] = ()) -> dict:
    """Raw evidence for the judge: every request's bound beside its reported count. `checked`:
    requests with both; `available`: any could be checked; `rows`: (key, cached, bound) of
    every checked request (verdicts.over_hit decides which over-hit); `chunk_hits`: with
    chunk reuse, the checked requests whose count only the chunks explain."""
    found = bounds(requests, rule, resets)
    rows = [(r.key, r.cached, found[r.key]) for r in requests
            if r.cached is not None and r.key in found]
    chunk_hits = 0
    if rule.reuse_chunk:  # the counts only chunks explain: the row reached chunk reuse
        plain = bounds(requests, HitRule(rule.unit, rule.last_token_computed), resets)
        chunk_hits = sum(plain[key] < cached <= bound for key, cached, bound in rows)
    return {"available": bool(rows), "checked": len(rows), "unit": rule.unit,
            "last_token_computed": rule.last_token_computed,
            "reuse_chunk": rule.reuse_chunk, "chunk_hits": chunk_hits,
            "unknown_ids": sum(r.ids is None for r in requests),
            "unreported": sum(r.cached is None for r in requests), "rows": rows}
