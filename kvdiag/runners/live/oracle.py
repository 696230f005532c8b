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

`unit` is the server's block (vLLM) or 1 where unsure (SGLang's pages, a proxy): rounding
down only tightens a bound, and a wrongly served block already reaches past the LCP, so 1
costs nothing but partial-block faults. `last` is 1 where the engine never serves a prompt's
last token from the cache (vLLM, SGLang, kvdiag serve: one token must be computed for the
logits), 0 where unsure. A reported count above the bound (verdicts.over_hit) means the cache
served a block whose tokens differ from the request's, or its accounting over-reports.

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

    @classmethod
    def for_server(cls, block_size: int, source: str) -> HitRule:
        """vLLM's block where its own /metrics said it (cache_config_info); 1 elsewhere."""
        return cls(block_size if source == "cache_config_info" else 1, True)

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
                common = _lcp(rest, tail)
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
                    best = max(best, depth * b + _lcp(rest, block_ids))
            return best


def _lcp(a, b) -> int:
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
    out: dict[object, int] = {}
    for _, kind, req in events:
        if kind == 0:
            tries.clear()
        elif kind == 1:
            tries.setdefault(req.namespace, PrefixTrie(block)).insert(req)
        else:
            trie = tries.get(req.namespace)
            reach = trie.reach(req) if trie is not None else 0
            out[req.key] = rule.bound(reach, len(req.ids))
    return out


def check(requests: list[Sent], rule: HitRule, resets: Iterable[float] = ()) -> dict:
    """Raw evidence for the judge: every request's bound beside its reported count. `checked`:
    requests with both; `available`: any could be checked; `rows`: (key, cached, bound) of
    every checked request (verdicts.over_hit decides which over-hit)."""
    found = bounds(requests, rule, resets)
    rows = [(r.key, r.cached, found[r.key]) for r in requests
            if r.cached is not None and r.key in found]
    return {"available": bool(rows), "checked": len(rows), "unit": rule.unit,
            "last_token_computed": rule.last_token_computed,
            "unknown_ids": sum(r.ids is None for r in requests),
            "unreported": sum(r.cached is None for r in requests), "rows": rows}
