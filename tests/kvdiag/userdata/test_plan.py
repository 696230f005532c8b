"""A sessions file planned into a CasePlan: the file's own turns as history, one prompt for
shared and isolated alike, the suite's case as the scale, sessions over the context skipped
and counted (never cut), and a suite that names a file."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kvdiag.errors import KvdiagError
from kvdiag.planning.plan import plan_case
from kvdiag.planning.sessions import plan_sessions_file
from kvdiag.planning.suites import load_suite
from reference_engine.tokenizer import Tokenizer

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_dir("fixtures/canary")


def chat(n_rounds: int, tag: str, answers: bool = True) -> list[dict]:
    out = [{"role": "system", "content": f"Assistant {tag}."}]
    for r in range(n_rounds):
        out.append({"role": "user", "content": f"Question {r} of {tag}: what was booked on May {r + 1}, 2024?"})
        if answers:
            out.append({"role": "assistant", "content": f"{10 + r} units on May {r + 1}, 2024."})
    return out


def suite_for(tmp_path, chats, **case):
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats))
    suite = dataclasses.replace(load_suite("smoke"), sessions=str(path))
    return suite, dataclasses.replace(suite.cases[0], **case)


def test_rounds_replay_the_files_own_turns(tmp_path, tok):
    chats = [chat(5, "a"), chat(4, "b", answers=False), chat(6, "c")]
    suite, case = suite_for(tmp_path, chats, rounds=12)
    plan = plan_case(suite, case, tok)  # dispatched on suite.sessions
    assert plan.user["sessions"] == 3 and plan.case.sessions == 3
    assert plan.case.rounds == plan.user["rounds"] == 4  # the fewest any conversation has
    assert plan.user["replayed_fewer_rounds"] == 2 and plan.user["skipped_too_long"] == 0
    a = plan.sessions[0]
    assert a.messages(2) == chats[0][:6]  # system, (user, assistant) x 2, the third user turn
    assert [r.expected for r in a.rounds] == [m["content"] for m in chats[0][2:9:2]]
    b = plan.sessions[1]  # no assistant turns and no server to ask: nothing is invented
    assert [m["role"] for m in b.messages(3)] == ["system"] + ["user"] * 4
    assert plan.user["history"] == "the file's own turns; 3 missing answers left out (no server to answer them)"
    # the one prompt both phases send: plan.prompts are exactly what messages(r) encode to
    for s, session in enumerate(plan.sessions):
        assert plan.prompts[s] == [tok.encode_chat(session.messages(r)) for r in range(4)]
    assert plan.schedule.prompt_lengths[0] == tuple(len(p) for p in plan.prompts[0])
    assert plan.schedule.shared_prefix < len(plan.prompts[0][0])
    assert plan.style == "natural" and plan.case.pressure_round <= 3


def test_the_case_caps_sessions_and_rounds_and_reading_stops(tmp_path, tok):
    suite, case = suite_for(tmp_path, [chat(6, str(i)) for i in range(10)], sessions=4, rounds=3)
    plan = plan_sessions_file(suite, case, tok)
    assert (plan.user["sessions"], plan.user["conversations_read"], plan.case.rounds) == (4, 4, 3)
    assert plan.user["replayed_fewer_rounds"] == 4
    assert [s.session_id for s in plan.sessions] == ["L00001", "L00002", "L00003", "L00004"]


def test_sessions_over_the_context_are_skipped_and_counted_never_cut(tmp_path, tok):
    chats = [chat(3, "short"), chat(3, "long " * 60), chat(3, "short2")]
    suite, case = suite_for(tmp_path, chats, rounds=3)
    lengths = [len(tok.encode_chat(c[:-1])) for c in chats]  # each one's last prompt
    context = max(lengths[0], lengths[2]) + case.max_tokens
    assert lengths[1] + case.max_tokens > context
    plan = plan_sessions_file(suite, case, tok, context=context)
    assert plan.user["skipped_too_long"] == 1 and plan.user["sessions"] == 2
    assert plan.user["skipped"][0]["line"] == 2 and plan.user["context"] == context
    assert all(len(p) == 3 for p in plan.prompts)  # the kept ones whole
    with pytest.raises(KvdiagError, match="none of its first 3 conversations fits"):
        plan_sessions_file(suite, case, tok, context=20)


def test_a_suite_names_a_sessions_file_relative_to_itself(tmp_path, tok):
    (tmp_path / "s.jsonl").write_text(json.dumps({"conversations": [
        {"from": "human", "value": "On May 1, 2024 we sold 3 units."}, {"from": "gpt", "value": "Noted."},
        {"from": "human", "value": "How many?"}]}) + "\n")
    yaml = "name: mine\nstyle: natural\nsessions: s.jsonl\ncases:\n  - name: trigger\n    rounds: 2\n    pressure_round: 1\n"
    (tmp_path / "mine.yaml").write_text(yaml)
    suite = load_suite(tmp_path / "mine.yaml")
    assert suite.sessions == str(tmp_path / "s.jsonl")
    plan = plan_case(suite, suite.cases[0], tok)
    assert plan.user["format"] == "sharegpt" and plan.case.rounds == 2
    (tmp_path / "s.jsonl").write_text('{"conversations": [{"from": "human", "value": 1}]}\n')
    with pytest.raises(KvdiagError, match=r"s\.jsonl:1: conversations\[0\]\.value"):
        load_suite(tmp_path / "mine.yaml")  # validated on load, before any server starts


def test_missing_answers_are_the_servers_in_isolation(tmp_path):
    """A file without assistant turns, planned against a real `kvdiag serve`: each missing
    answer is what the server answers in isolation to the history before it, so the prompt of
    every round is known before anything is sent, and the same for the shared and isolated runs."""
    import asyncio
    import uuid

    from kvdiag.runners.live.endpoint import Endpoint
    from kvdiag.runners.live.tokenizer import RemoteTokenizer
    from tests.kvdiag.serving import served

    chats = [chat(3, "a", answers=False), chat(3, "b")]
    suite, case = suite_for(tmp_path, chats, rounds=3, max_tokens=12)
    with served("--allocator", "guarded", "--max-model-len", "2048") as (url, _):
        endpoint = Endpoint(url, "canary")
        plan = plan_case(suite, case, RemoteTokenizer(endpoint))
        a, b = plan.sessions
        assert plan.user["history"] == "the file's own turns; 2 missing answers filled by the server in isolation"
        assert b.messages(2) == chats[1][:6]  # a file with its answers is replayed as written
        msgs = a.messages(2)
        assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
        assert [m["content"] for m in msgs if m["role"] == "user"] == [
            m["content"] for m in chats[0] if m["role"] == "user"]

        async def ask(messages):
            try:
                return await endpoint.chat(messages, case.max_tokens, cache_salt=uuid.uuid4().hex)
            finally:
                await endpoint.new_loop()

        for r in (0, 1):  # each filled answer: the server's greedy answer to that round's prompt
            again = asyncio.run(ask(a.messages(r)))
            assert again.text == msgs[2 + 2 * r]["content"] != ""
            assert a.rounds[r].expected == again.text
        assert plan.prompts[0] == [endpoint.tokenize_chat(a.messages(r)) for r in range(3)]
