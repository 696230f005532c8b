"""Fingerprints, the provenance the paged backend checks every read against: a property test
that the whole-prompt scan equals token-by-token appends, that a fingerprint depends on its
prefix only, and that namespaces (adapters, weight versions) never collide."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_engine.provenance import UNWRITTEN, Fingerprints

TOKENS = st.lists(st.integers(0, 2**17), min_size=1, max_size=300)
NAMESPACE = st.integers(0, 2**64 - 1)


@settings(max_examples=200, deadline=None)
@given(TOKENS, st.data(), NAMESPACE)
def test_scan_equals_incremental_append(tokens, data, namespace):
    split = data.draw(st.integers(0, len(tokens)))
    grown = Fingerprints(tokens[:split], namespace)
    for t in tokens[split:]:
        grown.append(t)
    scanned = Fingerprints(tokens, namespace)
    assert len(grown) == len(scanned) == len(tokens)
    assert np.array_equal(grown.values(), scanned.values())
    assert (scanned.values() != UNWRITTEN).all()  # a fingerprint never reads as unwritten


@settings(max_examples=100, deadline=None)
@given(TOKENS, TOKENS)
def test_a_fingerprint_depends_on_its_prefix_only(head, tail):
    alone, joined = Fingerprints(head), Fingerprints(head + tail)
    assert np.array_equal(joined.values(0, len(head)), alone.values())


@settings(max_examples=100, deadline=None)
@given(TOKENS, NAMESPACE, NAMESPACE)
def test_namespaces_separate_equal_tokens(tokens, a, b):
    if a == b:
        return
    fa, fb = Fingerprints(tokens, a).values(), Fingerprints(tokens, b).values()
    assert not (fa == fb).any()  # 64-bit values: a collision would be a 2**-64 event


def test_one_changed_token_changes_every_later_fingerprint():
    tokens = list(range(1, 200))
    changed = tokens.copy()
    changed[50] += 1
    a, b = Fingerprints(tokens).values(), Fingerprints(changed).values()
    assert np.array_equal(a[:50], b[:50]) and not (a[50:] == b[50:]).any()
