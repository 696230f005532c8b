"""Reading a trace (pydantic, strict): a trace written and read back is the same bytes; each
bad line is one KvdiagError naming the file, the line and the key. No vLLM needed."""

from __future__ import annotations

import json

import pytest

from kvdiag.errors import KvdiagError
from kvdiag.runners.replay.trace import Trace, TraceConfig, TraceRequest, read_trace, write_trace


def _trace() -> Trace:
    config = TraceConfig("t", "c", 4, 8, 2, model="canary")
    return Trace(config, [TraceRequest("s0", 1, [1, 2, 3], [4, 5], cache_salt="salt"),
                          TraceRequest("s0", 2, [1, 2, 3, 4, 5, 6], [7], think_steps=2,
                                       fact_check_pass=1.0, kind="recite"),
                          TraceRequest("t~s0", 1, [1, 2, 3], [4], prompt_logprobs=True)])


def test_a_trace_reads_back_to_the_same_bytes(tmp_path):
    write_trace(_trace(), tmp_path / "a.jsonl")
    back = read_trace(tmp_path / "a.jsonl")
    assert back.config == _trace().config and back.requests[1] == _trace().requests[1]
    write_trace(back, tmp_path / "b.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


@pytest.mark.parametrize("line, change, message", [
    (1, {"block_size": 0}, ":1: header: 'block_size': Input should be greater than 0 (got 0)"),
    (1, {"num_blocks": True}, ":1: header: 'num_blocks': Input should be a valid integer"),
    (1, {"num_blocks": None}, ":1: header: 'num_blocks': Input should be a valid integer"),
    (1, {"kvdiag_trace": 2}, ":1: first line must be the header"),
    (2, {"round": 0}, ":2: 'round': Input should be greater than 0"),
    (2, {"prompt_ids": [1, -1]}, ":2: 'prompt_ids'[1]: Input should be greater than or equal to 0"),
    (2, {"output_ids": []}, ":2: 'output_ids': List should have at least 1 item"),
    (2, {"cache_salt": ""}, ":2: 'cache_salt': String should have at least 1 character"),
    (2, {"think_steps": -1}, ":2: 'think_steps': Input should be greater than or equal to 0"),
    (2, {"zz": 1}, ":2: unknown key 'zz'"),
    (2, {"session": None}, ":2: missing key 'session'"),
    (3, {"round": 1}, ":3: duplicate request s0 round 1"),
    (3, {"round": 3}, ": session s0: rounds must be 1..n without gaps"),
    (3, {"prompt_ids": list(range(40))}, ": a request of 41 tokens needs more than the 8 blocks"),
])
def test_a_bad_line_names_the_file_line_and_key(tmp_path, line, change, message):
    write_trace(_trace(), tmp_path / "t.jsonl")
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    row = json.loads(lines[line - 1]) | change
    lines[line - 1] = json.dumps({k: v for k, v in row.items() if v is not None or k != "session"})
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(KvdiagError) as e:
        read_trace(tmp_path / "bad.jsonl")
    assert str(e.value).startswith(f"{tmp_path / 'bad.jsonl'}{message}"), str(e.value)


def test_a_line_that_is_not_a_json_object(tmp_path):
    write_trace(_trace(), tmp_path / "t.jsonl")
    head = (tmp_path / "t.jsonl").read_text().splitlines()[0]
    for text, message in (("{oops", ":2: not JSON ("), ("[1]", ":2: expected a JSON object")):
        (tmp_path / "bad.jsonl").write_text(f"{head}\n{text}\n")
        with pytest.raises(KvdiagError, match="bad.jsonl" + message.replace("(", r"\(")):
            read_trace(tmp_path / "bad.jsonl")
