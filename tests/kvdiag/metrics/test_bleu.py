"""BLEU-4 against sacrebleu's own command line on the same text."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvdiag.metrics.bleu import Bleu4, bleu_signature, corpus_bleu

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser

CLI = Path(sys.executable).parent / "sacrebleu"
HYPS = ["the cat sat on a mat today", "hello world how are they", "paged attention keeps "
        "its KV cache in fixed size blocks", "", "a b c d e f"]
REFS = ["the cat sat on the mat today", "hello world how are you", "paged attention keeps "
        "its KV cache in blocks of sixteen slots", "one two three four", "a b c d e f"]


def cli_bleu(hyps: list[str], refs: list[str], tmp: Path) -> dict:
    exe = str(CLI) if CLI.exists() else shutil.which("sacrebleu")
    if exe is None:
        pytest.skip("sacrebleu command not found")
    (tmp / "hyp.txt").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    (tmp / "ref.txt").write_text("\n".join(refs) + "\n", encoding="utf-8")
    out = subprocess.run([exe, str(tmp / "ref.txt"), "-i", str(tmp / "hyp.txt"), "-m", "bleu",
                          "-f", "json", "-w", "6"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("sl", [slice(0, 5), slice(0, 2), slice(2, 3), slice(3, 5)])
def test_matches_cli(sl: slice, tmp_path: Path) -> None:
    expected = cli_bleu(HYPS[sl], REFS[sl], tmp_path)
    plain = corpus_bleu(HYPS[sl], REFS[sl], effective_order=False)
    assert plain.score == pytest.approx(expected["score"], abs=1e-5)
    assert plain.signature == expected["signature"]
    # Every slice holds a segment of >= 4 tokens: effective order changes nothing but "eff".
    default = corpus_bleu(HYPS[sl], REFS[sl])
    assert default.score == pytest.approx(expected["score"], abs=1e-5)
    assert default.signature == expected["signature"].replace("eff:no", "eff:yes")


def test_short_answers_use_effective_order() -> None:
    refs = ["4.2 bn", "0.8 bn", "17 %", "30 days"]
    assert corpus_bleu(refs, refs).score == 100.0
    assert corpus_bleu(refs, refs, effective_order=False).score == 100.0  # identical
    one_wrong = corpus_bleu(["4.2 bn", "0.9 bn", "17 %", "30 days"], refs)
    assert 0.0 < one_wrong.score < 100.0
    assert corpus_bleu(["4.2 bn", "0.9 bn"], refs[:2], effective_order=False).score == 0.0


def test_empty_edge_cases() -> None:
    assert corpus_bleu(["", ""], ["", ""]).score == 100.0  # identical, nothing to count
    assert corpus_bleu(["", ""], ["a b c d", "e f g h"]).score == 0.0
    assert corpus_bleu(["a b c d", None], ["a b c d", ""]).score == 100.0
    assert corpus_bleu(["x y z w"], [""]).score == 0.0
    empty = corpus_bleu([], [])
    assert math.isnan(empty.score) and empty.signature == bleu_signature()
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        corpus_bleu(["a", "b"], ["a"])


def test_score_is_clamped_and_metric_reads_columns() -> None:
    import pandas as pd

    text = "the quick brown fox jumps over the lazy dog"
    assert corpus_bleu([text], [text]).score == 100.0
    rows = pd.DataFrame({"output_text": [text, "a b c d e"], "reference_text": [text, "a b c d"]})
    assert 0 < Bleu4().compute(rows) <= 100
