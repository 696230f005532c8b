"""kvdiag sentinel FILE: a file written by the real ledger and log, read back as a verdict,
with its counters as a Prometheus textfile."""

from __future__ import annotations

import numpy as np
from typer.testing import CliRunner

from kvdiag.cli import app
from kvdiag.sentinel.facts import Scheduled
from kvdiag.sentinel.leakage import Leakage
from kvdiag.sentinel.ledger import Ledger
from kvdiag.sentinel.log import SentinelLog


def _file(path, bad: bool):
    log = SentinelLog(path, {"engine": "test", "block_size": 4, "attention": True}, every=0)
    led, leak = Ledger(4, log.finding), Leakage(log.leakage)
    led.step([Scheduled("a", [1], 0, 4, [1, 2, 3, 4])])
    led.step([Scheduled("b", [1, 2], 4, 1, [5, 5, 5, 5, 5] if bad else [1, 2, 3, 4, 5])])
    leak.token("b", led.bad_now.get("b"), np.array([0.1, 0.1, 0.2, 0.2, 0.4]))  # its sampled token
    leak.finish("b")
    log.counters(led.counters)
    return path


def test_bad_reads_fail_and_go_to_the_textfile(tmp_path):
    prom = tmp_path / "s.prom"
    result = CliRunner().invoke(app, ["sentinel", str(_file(tmp_path / "s.jsonl", bad=True)),
                                      "--prom", str(prom)])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("FAIL sentinel: 4 foreign") and "step 2 foreign" in result.output
    assert ("attention leakage: 1 requests attended to slots read wrong; the largest, per sampled "
            "token: 0.6000") in result.output  # positions 0-3 held a's K/V: 0.1 + 0.1 + 0.2 + 0.2
    text = prom.read_text()
    assert 'kvdiag_sentinel_bad_reads_total{engine="test",kind="foreign"} 4.0' in text
    assert 'kvdiag_sentinel_reads_total{engine="test"} 9.0' in text


def test_a_clean_file_passes_and_an_empty_one_proves_nothing(tmp_path):
    clean = CliRunner().invoke(app, ["sentinel", str(_file(tmp_path / "c.jsonl", bad=False))])
    assert clean.exit_code == 0 and clean.output.startswith("PASS sentinel: 2 steps, 2 requests")
    assert "attention leakage" not in clean.output  # nothing read wrong: nothing leaked
    (tmp_path / "e.jsonl").write_text('{"type":"start","engine":"test"}\n')
    empty = CliRunner().invoke(app, ["sentinel", str(tmp_path / "e.jsonl")])
    assert empty.exit_code == 2 and "checked no KV read" in empty.output
    missing = CliRunner().invoke(app, ["sentinel", str(tmp_path / "none.jsonl")])
    assert missing.exit_code == 2 and "no sentinel file" in missing.output
