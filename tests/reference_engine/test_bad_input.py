"""Bad input gives a typed exception with a one-line message, and exit 2 from the CLI."""

import json
import shutil

import pytest
from typer.testing import CliRunner

from kvdiag.cli import app
from reference_engine import errors
from reference_engine.config import EngineConfig
from reference_engine.engine import LLMEngine


def _one_line(exc) -> str:
    msg = str(exc.value)
    assert msg and "\n" not in msg
    return msg


@pytest.fixture()
def ckpt(tmp_path, tiny_ckpt):
    dst = tmp_path / "m"
    shutil.copytree(tiny_ckpt, dst)
    return dst


def test_unknown_architecture(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["architectures"] = ["MambaForCausalLM"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(errors.UnsupportedModelError) as e:
        LLMEngine(ckpt)
    assert "MambaForCausalLM" in _one_line(e)


def test_missing_weights(ckpt):
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(errors.MissingFileError) as e:
        LLMEngine(ckpt)
    assert "model.safetensors" in _one_line(e)


def test_shape_mismatch(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["intermediate_size"] += 1
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(errors.ShapeMismatchError) as e:
        LLMEngine(ckpt)
    assert "mlp" in _one_line(e)


def test_request_errors(tiny_ckpt):
    engine = LLMEngine(tiny_ckpt, EngineConfig(num_blocks=8, max_model_len=256))
    with pytest.raises(errors.PromptTooLongError) as e:
        engine.add_request([5] * 250, max_tokens=10)
    assert "max_model_len 256" in _one_line(e)
    with pytest.raises(errors.PoolTooSmallError) as e:
        engine.add_request([5] * 120, max_tokens=20)  # 140 tokens > 8 blocks x 16
    assert "8" in _one_line(e)
    with pytest.raises(errors.InvalidRequestError) as e:
        engine.add_request([], max_tokens=4)
    assert "empty" in _one_line(e)
    with pytest.raises(errors.InvalidRequestError):
        engine.add_request([5, 6], max_tokens=0)
    with pytest.raises(errors.InvalidRequestError):
        engine.add_request([5, 6000], max_tokens=1)
    with pytest.raises(errors.InvalidRequestError):
        engine.add_request([5, 6], max_tokens=1, cache_salt="")
    with pytest.raises(errors.UnknownAllocatorError):
        LLMEngine(tiny_ckpt, EngineConfig(allocator="no-such"))
    assert not engine.has_unfinished()  # nothing half-queued by a rejected request


def test_cli_exit_code_2(tmp_path, tiny_ckpt):
    runner = CliRunner()
    cases = [
        (["generate", "--model", str(tmp_path / "absent"), "--prompt-ids", "1,2"], "does not exist"),
        (["generate", "--model", str(tiny_ckpt), "--prompt-ids", ""], "empty"),
        (["generate", "--model", str(tiny_ckpt), "--prompt-ids", "5,6", "--max-tokens", "9000"], "max_model_len"),
        (["generate", "--model", str(tiny_ckpt), "--prompt-ids", "5,x"], "comma-separated"),
        (["generate", "--model", str(tiny_ckpt), "--prompt-ids", "5", "--allocator", "nope"], "unknown allocator"),
    ]
    for argv, text in cases:
        result = runner.invoke(app, argv)
        assert result.exit_code == 2, (argv, result.output)
        assert text in result.output and "Traceback" not in result.output


def test_cli_generate_json(tiny_ckpt):
    result = CliRunner().invoke(app, ["generate", "--model", str(tiny_ckpt), "--prompt-ids", "5,6,7",
                                      "--max-tokens", "4", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert len(data["token_ids"]) == 4 and isinstance(data["text"], str)
    engine = LLMEngine(tiny_ckpt)
    (seq,) = engine.generate([[5, 6, 7]], max_tokens=4)
    assert data["token_ids"] == seq.output_ids
