"""The free-text figures per round (BLEU-4 and the entity fact check, SQDR from it) and
--no-text's withholding of every text from the records, the summary and rounds.jsonl."""

from __future__ import annotations

import json

import pandas as pd

from kvdiag.metrics.decay import summarize
from kvdiag.runners.records import Record
from kvdiag.userdata.privacy import digest, withhold_fields, withhold_frame, withhold_rounds
from kvdiag.userdata.score import score_free_text

ISO = "Revenue was $4.2 million on May 3, 2024, says Ada Lovelace."


def frame(shared_by_round: dict[int, list[str]]):
    rows = []
    for rnd, answers in shared_by_round.items():
        for s, answer in enumerate(answers):
            for phase, text in (("isolated", ISO), ("shared", answer)):
                rows.append(Record(case="trigger", target="http://x", allocator=phase, session=f"L{s}",
                                   round=rnd, kind="chat", output_text=text, reference_text=ISO,
                                   expected_text="Noted, $4.2 million.").as_dict())
    return pd.DataFrame(rows, columns=Record.columns())


def test_rounds_get_bleu_and_fact_check_and_sqdr():
    df = frame({1: [ISO, ISO], 2: [ISO, ISO.replace("4.2", "4.8")], 3: [ISO.replace("May 3", "May 8"), "unknown"]})
    described = score_free_text(df, None)
    assert "rule-based" in described["pipeline"] and described["rows_checked"] == 12
    shared = df[df["allocator"] == "shared"]
    assert list(shared["fact_check_pass"]) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert "number $4.8" not in shared["fact_check_reason"].iloc[3] and "$4.2" in shared["fact_check_reason"].iloc[3]
    summary = summarize(df, baseline=None)
    rates = {r["round"]: (r["fact_check_pass_rate"], r["bleu4"]) for r in summary.rounds if r["allocator"] == "shared"}
    assert [rates[r][0] for r in (1, 2, 3)] == [1.0, 0.5, 0.0]
    assert rates[1][1] == 100.0 and rates[1][1] > rates[2][1] > rates[3][1]
    assert summary.sqdr["http://x"] == (1.0 - 0.0) / 3 and "nrefs:1" in summary.bleu_signature


def test_generated_sessions_rows_are_left_alone():
    df = frame({1: [ISO]})
    df["kind"] = "question"
    score_free_text(df, None)
    assert df["fact_check_pass"].isna().all()


def test_no_text_withholds_every_text(tmp_path):
    df = frame({1: ["An answer about Lisbon."]})
    df["output_token_ids"] = [[1, 2, 3]] * len(df)
    out = withhold_frame(df)
    assert set(out["reference_text"]) == {digest(ISO)} and digest(ISO).startswith("sha256:")
    cells = " ".join(map(str, out.astype(str).to_numpy().ravel()))
    assert "Lisbon" not in cells and "Lovelace" not in cells and "Noted" not in cells
    assert out["output_token_ids"].map(len).sum() == 0 and list(out["prompt_tokens"]) == list(df["prompt_tokens"])
    assert "Lisbon" in df["output_text"].iloc[1]  # the measured frame itself is not touched
    fields = withhold_fields({"first_divergences": [{"round": 2, "shared_token": "Lis", "isolated_token": "Por"}],
                              "prompt_logprobs": {"examples": [{"shared": ["Lis", -1.0], "isolated": ["P", -2.0]}]}})
    dumped = json.dumps([f.model_dump() for f in fields["first_divergences"]]
                        + [fields["prompt_logprobs"].model_dump()])
    assert "Lis" not in dumped and "-2.0" not in dumped and fields["first_divergences"][0].round == 2
    rows = [{"phase": "shared", "text": "Lisbon", "tokens": ["Lis"], "top": [[["Lis", -0.1]]], "ids": [5],
             "prompt_tokens": 9, "completion_tokens": 2}]
    (tmp_path / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"cut')
    withhold_rounds(tmp_path)
    kept = [json.loads(ln) for ln in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert kept == [{"phase": "shared", "text": digest("Lisbon"), "tokens": [], "top": [], "ids": [],
                     "prompt_tokens": 9, "completion_tokens": 2}]
