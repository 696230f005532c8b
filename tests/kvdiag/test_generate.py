"""kvdiag generate (and serve) with every registered allocator, on a model directory
without a tokenizer, and with the engine's start-up lines on stderr."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from kvdiag.cli import app
from reference_engine import allocators
from tests.kvdiag.serving import served

pytestmark = pytest.mark.e2e  # starts a server, a CLI subprocess or a browser

CANARY = Path(__file__).resolve().parents[2] / "fixtures" / "canary"
ALL = allocators.available() + ["guarded:stale-bytes"]


def _generate(*args: str):
    return CliRunner().invoke(app, ["generate", "--model", str(CANARY), *args])


@pytest.fixture(scope="module")
def clean_ids():
    r = _generate("--prompt", "hello", "--max-tokens", "6", "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["token_ids"]


@pytest.mark.parametrize("name", ALL)
def test_generate_runs_every_registered_allocator(name, clean_ids):
    r = _generate("--prompt", "hello", "--max-tokens", "6", "--allocator", name, "--json")
    assert r.exit_code == 0, r.output
    # one short request on a fresh pool recycles nothing: every allocator answers as the
    # correct one does (stale-bytes included: its fault needs recycled blocks)
    assert json.loads(r.stdout)["token_ids"] == clean_ids


def test_generate_prints_the_engine_lines_on_stderr():
    r = _generate("--prompt", "hello", "--max-tokens", "2", "--allocator", "guarded")
    assert r.exit_code == 0, r.output
    assert "PagedAttention enabled with block size 16." in r.stderr
    assert "Using SequenceGuard for block allocation." in r.stderr
    assert "PagedAttention" not in r.stdout
    plain = _generate("--prompt", "hello", "--max-tokens", "2", "--allocator", "prefix-cache")
    assert "PagedAttention enabled" in plain.stderr and "SequenceGuard" not in plain.stderr


def test_prompt_ids_need_no_tokenizer(tmp_path):
    model = tmp_path / "no-tokenizer"
    model.mkdir()
    for f in CANARY.iterdir():
        if not f.name.startswith("tokenizer"):
            shutil.copy(f, model / f.name)
    with_tok = CliRunner().invoke(app, ["generate", "--model", str(CANARY), "--prompt-ids",
                                        "5,6,7,8", "--max-tokens", "4", "--json"])
    without = CliRunner().invoke(app, ["generate", "--model", str(model), "--prompt-ids",
                                       "5,6,7,8", "--max-tokens", "4", "--json"])
    assert without.exit_code == 0, without.output
    got = json.loads(without.stdout)
    assert got["text"] is None
    assert got["token_ids"] == json.loads(with_tok.stdout)["token_ids"]
    text = CliRunner().invoke(app, ["generate", "--model", str(model), "--prompt", "hello"])
    assert text.exit_code == 2 and "tokenizer.json" in text.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", ["stale-bytes", "guarded:stale-bytes", "unchained-hash"])
def test_serve_runs_the_allocator(name):
    args = ("--allocator", name, "--num-blocks", "64", "--max-model-len", "512")
    with served(*args, timeout=600) as (url, _):  # start-up is slow on a loaded machine
        r = httpx.post(url + "/v1/completions", timeout=60,
                       json={"model": "canary", "prompt": [5, 6, 7, 8], "max_tokens": 4})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
