"""rounds.jsonl's store: a probe measured in one process and judged in another (a fleet
cell's, on a Ray worker) travels by pickle with its rows and without its open file."""

from __future__ import annotations

import pickle

from kvdiag.runners.live.endpoint import ChatResult
from kvdiag.runners.live.store import RoundStore


def test_a_closed_store_pickles_with_its_rows_and_a_resumed_one_reads_them(tmp_path):
    store = RoundStore(tmp_path / "rounds.jsonl")
    store.add("shared", 0, 0, ChatResult("hi", ["hi"], [], [-0.1], 12, 8, "stop"))
    store.add("isolated", 0, 0, ChatResult("hi", ["hi"], [], [-0.1], 12, 0, "stop"))
    store.close()
    copy = pickle.loads(pickle.dumps(store))
    assert copy.done == store.done and copy.done[("shared", 0, 0)]["cached_tokens"] == 8
    resumed = RoundStore(tmp_path / "rounds.jsonl")  # the file on disk is the same record
    assert resumed.done == store.done
    resumed.close()
