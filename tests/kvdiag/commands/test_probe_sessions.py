"""kvdiag probe --sessions FILE --no-text against `kvdiag serve`: the user's conversations
replayed through every phase, judged, and not one sentence of the file anywhere in the run
directory; the page says the text was withheld and shows the per-round figures."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pandas as pd
import pytest

from tests.kvdiag.serving import served

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser

PEOPLE = (("Ada Lovelace", "Lisbon"), ("Grace Hopper", "Osaka"), ("Alan Turing", "Toronto"))


def conversations() -> list[list[dict]]:
    out = []
    for i, (who, city) in enumerate(PEOPLE):
        out.append([
            {"role": "system", "content": f"You assist {who} with exact figures."},
            {"role": "user", "content": f"On March {i + 3}, 2024, the {city} office booked ${40 + i}.5 million in revenue."},
            {"role": "assistant", "content": f"Noted: ${40 + i}.5 million for {city} on March {i + 3}, 2024."},
            {"role": "user", "content": f"Write a function called margin_{i} that divides two numbers."},
            {"role": "assistant", "content": f"Here it is.\n```python\ndef margin_{i}(a, b):\n    return a / b\n```"},
            {"role": "user", "content": f"Who wrote \"The Quiet Ledger {i}\" and when was it published?"},
            {"role": "assistant", "content": f"It was published on May {i + 9}, 2019 by {who}."},
            {"role": "user", "content": f"What is {17 + i} percent of ${40 + i}.5 million, rounded to one decimal?"}])
    return out


def sentences(chats) -> set[str]:
    """Every sentence (3+ words) and code line of the file's messages."""
    found = set()
    for chat in chats:
        for m in chat:
            for part in re.split(r"(?<=[.?!])\s+|\n", m["content"]):
                if len(part.split()) >= 3 or "def " in part:
                    found.add(part.strip())
    return found


def run_text(run_dir) -> str:
    """Everything the run directory holds, as text: every file's bytes, and every cell of
    results.parquet (compressed on disk)."""
    texts = [p.read_bytes().decode("utf-8", "replace") for p in run_dir.rglob("*") if p.is_file()]
    frame = pd.read_parquet(run_dir / "results.parquet")
    texts.append(" ".join(map(str, frame.astype(str).to_numpy().ravel())))
    return "\n".join(texts)


@pytest.mark.slow  # 18-28 s on 2 cores: make test stays near 400 s
def test_no_text_probe_keeps_no_sentence_of_the_file(tmp_path):
    chats = conversations()
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats))
    out = tmp_path / "run"
    args = ["--allocator", "guarded", "--num-blocks", "120", "--max-num-seqs", "16", "--max-model-len", "2048"]
    with served(*args) as (url, _):
        run = subprocess.run([sys.executable, "-m", "kvdiag", "probe", "--base-url", url, "--model", "canary",
                              "--suite", "smoke", "--sessions", str(path), "--no-text", "--out", str(out),
                              "--json"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]  # the guarded server, its pool recycling
    summary = json.loads(run.stdout)
    assert summary["verdict"] == "pass" and summary["recycling"]["observed"]
    assert summary["text"] == "withheld", summary
    user = summary["sessions_file"]
    assert (user["sessions"], user["rounds"], user["skipped_too_long"], user["context"]) == (3, 4, 0, 2048)
    assert "rule-based" in user["fact_check"]["pipeline"] or "trained" in user["fact_check"]["pipeline"]
    shared = [r for r in summary["rounds"] if r["allocator"] == "shared"]
    assert [r["round"] for r in shared] == [1, 2, 3, 4] and all(r["bleu4"] is not None for r in shared)
    # every phase ran on the file's conversations
    frame = pd.read_parquet(out / "results.parquet")
    assert set(frame["kind"]) == {"chat"} and frame["prompt_tokens"].min() > 0
    assert summary["ground_truth"]["isolated"] > 0 and summary["traffic"]["twin_requests"] > 0
    everything = run_text(out)
    said = sentences(chats)
    assert len(said) >= 20 and not [s for s in said if s in everything]
    assert not [w for w in ("Lovelace", "Hopper", "margin_1", "Quiet Ledger") if w in everything]
    # the rows are the file's rounds: the expected texts are the hashes of its assistant turns
    from kvdiag.userdata.privacy import digest

    assert digest(chats[0][2]["content"]) in set(frame["expected_text"])
    page = (out / "report.html").read_text()
    assert 'id="text-withheld"' in page and "mine.jsonl (openai): 3 conversations x 4 rounds" in page


def test_regress_takes_a_sessions_file_and_refuses_bad_ones_before_any_server(tmp_path):
    from typer.testing import CliRunner

    from kvdiag.cli import app

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "x"}]}\n{"messages": [{"role": "bot"}]}\n')
    result = CliRunner().invoke(app, ["regress", "--target", "http://127.0.0.1:9", "--model", "m",
                                      "--sessions", str(bad), "--history", str(tmp_path / "h.sqlite")])
    assert result.exit_code == 2 and ":2: messages[0].role: unknown role 'bot'" in " ".join(result.output.split())
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"messages": conversations()[0]}) + "\n")
    result = CliRunner().invoke(app, ["regress", "--target", "reference:guarded", "--sessions", str(good),
                                      "--history", str(tmp_path / "h.sqlite")])
    assert result.exit_code == 2 and "replayed against a live server" in " ".join(result.output.split())


def test_the_baseline_key_follows_the_files_contents(tmp_path):
    from kvdiag.userdata.command import sessions_digest

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps({"messages": conversations()[0]}) + "\n")
    b.write_text(json.dumps({"messages": conversations()[1]}) + "\n")
    assert sessions_digest(str(a)) != sessions_digest(str(b)) and len(sessions_digest(str(a))) == 16
