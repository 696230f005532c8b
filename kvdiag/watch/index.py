"""The over-hit oracle online: every request a proxy forwarded, per namespace, held in a
prefix trie (kvdiag.runners.live.oracle) in the order the upstream received them, so a
completed request's bound is the most any request it could have shared with had computed.

Memory is bounded. A namespace keeps at most `max_tokens` prompt tokens, oldest request first
out, and at most `max_namespaces` namespaces live, the least recently used out. What leaves is
not forgotten outright: each evicted request leaves, at every full block of its prompt, the
chain hash of the prefix so far and the furthest it reached (prompt + output), in `lost`:

    lost[hash(namespace, h_j)] = max reach of evicted requests whose first j blocks hash h_j
    h_j = hash((h_{j-1}, ids[(j-1)B : jB]))      h_0 = 0, B = BLOCK

A reported count above the bound is then a finding only if no evicted request could explain
it: none whose first j blocks equal the request's (for some j >= 1) with reach >= the count,
and, for a count under one block, none evicted from the namespace at all. Otherwise it is
`unjudged`. `lost` is bounded too (`max_lost` entries): past that it is emptied and the index
says so (`overflowed`), and the caller re-warms (kvdiag.watch.checker), since what it forgot
could explain any hit until the upstream's pool has turned over."""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from kvdiag.runners.live.oracle import PrefixTrie, Sent

BLOCK = 16  # the trie's and the chain hashes' block: a performance knob, not the server's


def chain_hashes(ids: tuple[int, ...], block: int = BLOCK) -> list[int]:
    """h_1 .. h_k over the prompt's k full blocks."""
    out, h = [], 0
    for j in range(len(ids) // block):
        h = hash((h, ids[j * block:(j + 1) * block]))
        out.append(h)
    return out


@dataclass
class _Space:
    trie: PrefixTrie
    held: deque = field(default_factory=deque)  # Sent, oldest first
    outs: dict = field(default_factory=dict)  # key -> tokens generated, once done
    tokens: int = 0
    lost_any: int = -1  # the furthest reach of any request evicted from it (-1: none)


class PrefixIndex:
    """`sent`, then `done` (which answers the bound), per request, in the upstream's order."""

    def __init__(self, max_tokens: int = 2_000_000, max_namespaces: int = 1024,
                 max_lost: int = 2_000_000) -> None:
        self.max_tokens, self.max_namespaces, self.max_lost = max_tokens, max_namespaces, max_lost
        self.spaces: OrderedDict[tuple, _Space] = OrderedDict()
        self.lost: dict[int, int] = {}
        self.lost_spaces: dict[tuple, int] = {}  # whole namespaces evicted: furthest reach
        self.evicted = self.overflowed = 0
        self.inflight: dict[object, Sent] = {}

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.spaces.values())

    def clear(self) -> None:
        """The upstream's whole prefix cache was reset: nothing before counts, lost or not."""
        self.spaces.clear(), self.lost.clear(), self.lost_spaces.clear()
        for req in list(self.inflight.values()):  # in flight across it: computed after it
            self.sent(req)

    def sent(self, req: Sent) -> None:
        space = self._space(req.namespace)
        space.trie.insert(req)
        space.held.append(req)
        space.tokens += len(req.ids)
        self.inflight[req.key] = req

    def done(self, req: Sent, out: int) -> int:
        """The request finished with `out` tokens generated: its bound (before rounding to the
        server's unit), then it stays held for later requests."""
        space = self._space(req.namespace)
        self.inflight.pop(req.key, None)
        space.trie.set_out(req, out)
        space.outs[req.key] = out
        bound = space.trie.reach(req)
        self._trim(req.namespace, space)
        return bound

    def explained(self, req: Sent, cached: int) -> bool:
        """Could a request this index forgot have given `req` `cached` tokens?"""
        lost = max(self.lost_spaces.get(req.namespace, -1),
                   self.spaces[req.namespace].lost_any if req.namespace in self.spaces else -1)
        if lost < 0:
            return False
        if cached < BLOCK:
            return lost >= cached
        return any(self.lost.get(hash((req.namespace, h)), -1) >= cached
                   for h in chain_hashes(req.ids))

    def _space(self, namespace: tuple) -> _Space:
        space = self.spaces.get(namespace)
        if space is None:
            space = self.spaces[namespace] = _Space(PrefixTrie(BLOCK))
            while len(self.spaces) > self.max_namespaces:
                old_ns, old = next(iter(self.spaces.items()))
                if any(r.key in self.inflight for r in old.held):
                    break  # never drop a namespace with a request in flight
                self.spaces.popitem(last=False)
                reach = max((len(r.ids) + old.outs.get(r.key, 0) for r in old.held), default=0)
                self.lost_spaces[old_ns] = max(self.lost_spaces.get(old_ns, -1), reach,
                                               old.lost_any)
        self.spaces.move_to_end(namespace)
        return space

    def _trim(self, namespace: tuple, space: _Space) -> None:
        while space.tokens > self.max_tokens and space.held:
            old = space.held[0]
            if old.key in self.inflight:
                break  # the oldest is still generating: it stays until it is done
            space.held.popleft()
            space.trie.remove(old)
            space.tokens -= len(old.ids)
            self.evicted += 1
            reach = len(old.ids) + space.outs.pop(old.key, 0)
            space.lost_any = max(space.lost_any, reach)
            for h in chain_hashes(old.ids):
                key = hash((namespace, h))
                self.lost[key] = max(self.lost.get(key, -1), reach)
            if len(self.lost) > self.max_lost:
                self.lost.clear()
                self.overflowed += 1
