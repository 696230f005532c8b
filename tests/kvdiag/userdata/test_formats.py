"""Sessions files: both formats parsed alike, and every kind of bad input one KvdiagError
naming the line and the field (through the CLI: exit 2, one line, before any server)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvdiag.cli import app
from kvdiag.errors import KvdiagError
from kvdiag.userdata import jsonarray
from kvdiag.userdata.formats import check_file, read_conversations

CHAT = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "On May 3, 2024 we sold 12 units."},
        {"role": "assistant", "content": "Noted: 12 units on May 3, 2024."}, {"role": "user", "content": "How many?"}]
NAMES = {"system": "system", "user": "human", "assistant": "gpt"}


def write(tmp_path, *lines, name="s.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return str(path)


def sharegpt(chat):
    return {"conversations": [{"from": NAMES[m["role"]], "value": m["content"]} for m in chat]}


def test_both_formats_read_the_same_conversation(tmp_path):
    a = list(read_conversations(write(tmp_path, {"messages": CHAT}, {"messages": CHAT[1:2]})))
    b = list(read_conversations(write(tmp_path, sharegpt(CHAT), "", sharegpt(CHAT[1:2]), name="g.jsonl")))
    assert [c.messages for c in a] == [c.messages for c in b] and a[0].messages == tuple(CHAT)
    assert [c.format for c in a + b] == ["openai"] * 2 + ["sharegpt"] * 2
    assert [c.line for c in b] == [1, 3] and a[0].user_turns == [1, 3]
    found = check_file(write(tmp_path, {"messages": CHAT}, {"messages": CHAT[1:2]}))
    assert (found.format, found.conversations, found.fewest_rounds, found.most_rounds) == ("openai", 2, 1, 2)


@pytest.mark.parametrize("lines, fmt, message", [
    ([{"messages": CHAT}, '{"messages": [}'], None, r"s\.jsonl:2: not valid JSON"),
    ([{"messages": CHAT}, {"messages": [{"role": "user", "content": 3}]}], None,
     r":2: messages\[0\]\.content: Input should be a valid string \(got int\)"),
    ([{"messages": [{"role": "system", "content": "x"}, {"role": "assistant", "content": "y"}]}], None,
     r":1: messages: no user turn"),
    ([{"messages": [{"role": "tool", "content": "x"}]}], None, r":1: messages\[0\]\.role: unknown role 'tool'"),
    ([{"conversations": [{"from": "human", "value": "x"}, {"from": "bot", "value": "y"}]}], None,
     r":1: conversations\[1\]\.from: unknown role 'bot'"),
    ([{"messages": [{"role": "user", "content": "x", "extra": 1}]}], None, r"messages\[0\]\.extra: Extra inputs"),
    ([{"messages": CHAT}, {"conversations": []}], None, r":2: messages: required \(the file is in openai format\)"),
    ([{"messages": CHAT}], "sharegpt", r":1: conversations: required"),
    ([{"chat": []}], None, r":1: neither 'messages'"),
    (["[1, 2]"], None, r":item 1 \(line 1\): expected a JSON object, got int"),
    ([{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}], None,
     r":1: messages\[0\]\.content\[0\]\.type: only text parts are replayed \(got 'image_url'\)"),
    (["", "  "], None, r"empty file"),
])
def test_bad_input_names_line_and_field(tmp_path, lines, fmt, message):
    path = write(tmp_path, *lines)
    with pytest.raises(KvdiagError, match=message):
        check_file(path, fmt)


def test_an_empty_file_and_a_missing_one(tmp_path):
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(KvdiagError, match="empty file"):
        check_file(tmp_path / "e.jsonl")
    with pytest.raises(KvdiagError, match="cannot read the sessions file"):
        check_file(tmp_path / "absent.jsonl")


@pytest.mark.parametrize("lines, message", [
    ([{"messages": CHAT}, "{oops"], ":2: not valid JSON"),
    ([{"messages": [{"role": "assistant", "content": "hi"}]}], ":1: messages: no user turn"),
    ([], "empty file"),
    ([{"conversations": [{"from": "robot", "value": "x"}]}], ":1: conversations[0].from: unknown role 'robot'"),
])
def test_the_cli_exits_2_with_one_line_before_any_server(tmp_path, lines, message):
    """No server at that port: the file is refused before the probe would find that out."""
    path = write(tmp_path, *lines)
    result = CliRunner().invoke(app, ["probe", "--base-url", "http://127.0.0.1:9", "--model", "m",
                                      "--sessions", path, "--out", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())  # the console wraps long lines
    assert message in text and "Traceback" not in result.output
    assert "127.0.0.1:9" not in text  # the server was never asked
    assert not (tmp_path / "run").exists() and not list(tmp_path.glob("run*"))


def test_a_byte_order_mark_is_not_part_of_the_first_conversation(tmp_path):
    for text in (json.dumps({"messages": CHAT}) + "\n", json.dumps([{"messages": CHAT}])):
        (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + text.encode())
        assert [c.messages for c in read_conversations(tmp_path / "bom.json")] == [tuple(CHAT)]


def test_content_given_as_text_parts_is_sent_as_one_string(tmp_path):
    parts = [{"type": "text", "text": "On May 3, 2024"}, {"type": "text", "text": "we sold 12 units."}]
    (conv,) = read_conversations(write(tmp_path, {"messages": [{"role": "user", "content": parts}]}))
    assert conv.messages == ({"role": "user", "content": "On May 3, 2024\nwe sold 12 units."},)
    (conv,) = read_conversations(write(tmp_path, {"messages": [{"role": "developer", "content": "Be exact."},
                                                               CHAT[1]]}))
    assert conv.messages == tuple(CHAT[:2])  # OpenAI's developer role is sent as the system prompt


@pytest.mark.parametrize("chunk", [jsonarray.CHUNK, 5])
def test_a_json_array_reads_as_its_items_would_as_lines(tmp_path, monkeypatch, chunk):
    """ShareGPT's own dataset is one JSON array: read an item at a time, pretty-printed or not,
    whichever chunk boundary an item or a string straddles."""
    monkeypatch.setattr(jsonarray, "CHUNK", chunk)
    convs = [sharegpt(CHAT), sharegpt(CHAT[1:2]), {"id": "x", **sharegpt(CHAT[:2])}]
    lines = [c.messages for c in read_conversations(write(tmp_path, *convs))]
    for text in (json.dumps(convs, indent=2), "\n " + json.dumps(convs) + "\n"):
        (tmp_path / "a.json").write_text(text)
        got = list(read_conversations(tmp_path / "a.json"))
        assert [c.messages for c in got] == lines and [c.line for c in got] == [1, 2, 3]
        assert {c.format for c in got} == {"sharegpt"}
    assert check_file(tmp_path / "a.json").conversations == 3


@pytest.mark.parametrize("text, message", [
    ('[\n{"messages": [{"role": "user", "content": "x"}]},\n{"messages": [', r"item 2 \(line 3\): not valid JSON"),
    ('[{"messages": [{"role": "user", "content": "x"}]} junk', r"item 1 \(line 1\): expected ',' or ']'"),
    ('[{"messages": [{"role": "user", "content": "x"}]}', r"item 1 \(line 1\): expected ',' or ']' .*end of the file"),
    ('[{"messages": [{"role": "user", "content": "x"}]}]\n]', r"text after the array's closing"),
    ('[{"messages": [{"role": "user", "content": "x"}]},]', r"item 2 \(line 1\): not valid JSON"),
    ('[\n\n{"messages": [{"role": "tool", "content": "x"}]}]', r"item 1 \(line 3\): messages\[0\]\.role: unknown role"),
    ("[", r"item 1 \(line 1\): the array is not closed"),
    (" [ ] ", r"empty file"),
])
def test_a_bad_json_array_names_the_item_and_its_line(tmp_path, text, message):
    (tmp_path / "a.json").write_text(text)
    with pytest.raises(KvdiagError, match=message):
        check_file(tmp_path / "a.json")
