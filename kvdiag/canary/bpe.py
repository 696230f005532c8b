"""A Qwen2-style byte-level BPE in which every canary word is exactly one token.

transformers 5 loads any `model_type: qwen2` tokenizer as Qwen2Tokenizer, which rebuilds a
byte-level BPE from tokenizer.json's vocab and merges with Qwen2's own pre-tokenizer (a
regex that splits digits and punctuation off letters, then bytes -> printable chars, a
space becoming "Ġ"). So the canary's tokenizer is that BPE itself: words are letters only,
each is preceded by a space in canary text ("Ġacme"), and merges build each word from its
bytes without ever competing with each other:

    1. "Ġ-chains": ("Ġ","a") -> "Ġa", ("Ġa","c") -> "Ġac", ... (prefixes shared)
    2. bare chains for the role words of the chat template ("user") and for word parts
    3. joins of a Ġ-chained head with bare parts ("Ġacme" + "Rev" -> "ĠacmeRev")
Within a piece only one merge of the lowest group is ever possible at a time, so every
word tokenizes to itself; build() checks this with the real tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence

SPACE = "Ġ"


def byte_alphabet() -> list[str]:
    """GPT-2's bytes_to_unicode, as a list indexed by byte value."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def _chain(start: str, rest: str, merges: list[tuple[str, str]], tokens: dict[str, None]) -> str:
    cur = start
    for ch in rest:
        pair = (cur, ch)
        cur = cur + ch
        if cur not in tokens:
            tokens[cur] = None
            merges.append(pair)
    return cur


def build(spaced: Sequence[Sequence[str]], bare: Sequence[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Vocabulary (bytes first, then merge results) and ranked merges.

    spaced: words that follow a space, each as parts: ("acme", "Rev") is the word "acmeRev"
    made of a Ġ-chained head and one bare part. bare: words that follow no space.
    """
    alphabet = byte_alphabet()
    tokens: dict[str, None] = dict.fromkeys(alphabet)
    spaced_merges: list[tuple[str, str]] = []
    bare_merges: list[tuple[str, str]] = []
    join_merges: list[tuple[str, str]] = []
    for word in bare:
        _chain(word[0], word[1:], bare_merges, tokens)
    heads, parts = {}, {}
    for word in spaced:
        heads[word[0]] = _chain(SPACE, word[0], spaced_merges, tokens)
        for part in word[1:]:
            parts[part] = _chain(part[0], part[1:], bare_merges, tokens)
    for word in spaced:
        cur = heads[word[0]]
        for part in word[1:]:
            nxt = cur + part
            if nxt not in tokens:
                tokens[nxt] = None
                join_merges.append((cur, part))
            cur = nxt
    return list(tokens), spaced_merges + bare_merges + join_merges
