"""The servers a run starts for its target, as one context manager: a local engine
(`vllm-local[:FAULT]`, `sglang-local[:FAULT]`) on the case the run measures, its pool sized
so the suite's sessions recycle freed blocks; or, for runs that only talk HTTP (isolation),
the reference engine behind `kvdiag serve`. URL targets pass through.

    with running(target, suite, case, model, log_dir, info) as served:
        served.url, served.model, served.model_label
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvdiag.errors import KvdiagError
from kvdiag.planning.pool import server_pool

if TYPE_CHECKING:  # engines sit below targets, which check fault names against their catalogs
    from kvdiag.targets import Target


@dataclass(frozen=True)
class Served:
    """A target while its server answers: `url`, the `model` name it serves, and
    `model_label`: the model directory's digest when kvdiag started the server itself (None
    for a URL somebody else runs: the probe asks the server)."""

    target: Target
    url: str
    model: str | None
    model_label: str | None = None
    prefill_chunk: int | None = None  # the prefill chunk kvdiag started it with (vLLM does not report it)
    reuse_chunk: int = 0  # llama.cpp's --cache-reuse it was started with (its /props does not say)
    slot_files: str | None = None  # the folder it saves slots in (llama.cpp; the failed-restore event)


def adapter_dirs(adapter: str | None, model_dir: Path, engine: str | None = None) -> dict[str, Path]:
    """The LoRA adapters a local engine serves for a run that names `adapter`: kvdiag builds
    one for the canary (`canary-lora`, kvdiag.canary.lora), and one for a llama-architecture
    GGUF that llama.cpp serves (`kvdiag-lora`, kvdiag.engines.llamacpp.lora); KvdiagError
    otherwise."""
    if adapter is None:
        return {}
    if engine == "llamacpp":
        from kvdiag.engines.llamacpp.launcher import LlamacppLocal
        from kvdiag.engines.llamacpp.lora import NAME, ensure_adapter

        if adapter != NAME:
            raise KvdiagError(f"--adapter {adapter}: llamacpp-local serves one adapter, {NAME}, "
                              "made from the model; start llama-server yourself for others")
        return {adapter: ensure_adapter(LlamacppLocal.check_model(Path(model_dir)))}
    from kvdiag.canary.lora import ensure_lora
    from kvdiag.paths import CANARY
    from reference_engine.loader import model_hash

    if adapter != "canary-lora" or model_hash(model_dir) != model_hash(CANARY):
        raise KvdiagError(f"--adapter {adapter}: a server kvdiag starts itself serves one adapter, "
                          "canary-lora, on the canary; start the server yourself for others")
    return {adapter: ensure_lora(model_dir)}


@contextmanager
def running(target: Target, suite, case, model: str | None, log_dir: Path,
            info: Callable[[str], None] = lambda _: None, adapter: str | None = None,
            sentinel: Path | None = None, engine_args: tuple[str, ...] = ()) -> Iterator[Served]:
    """The target while the run talks to it: a local engine is started on `model` (a
    directory; default: the suite's, else the canary), serving `adapter` too, its log in
    log_dir, its sentinel (if any) writing to `sentinel`, and stopped on exit; a URL target
    serves `model`."""
    if not target.is_local:
        yield Served(target, target.url, model)
        return
    launcher = target.engine.launcher()
    launcher.find_python()  # the engine installed, before its default model is sought
    model_dir = Path(model or suite.model or launcher.default_model())
    adapters = adapter_dirs(adapter, model_dir, target.engine.name)
    info(f"starting {target.spec} (log: {Path(log_dir) / target.engine.log_name}) ...")
    with live(target, suite, case, model_dir, log_dir, adapters=adapters, sentinel=sentinel,
              engine_args=engine_args) as served:
        yield served


@contextmanager
def live(target: Target, suite, case, model_dir: Path, log_dir: Path,
         serve_reference: bool = False, serve_args: tuple[str, ...] = (),
         adapters: dict[str, Path] | None = None, sentinel: Path | None = None,
         engine_args: tuple[str, ...] = ()) -> Iterator[Served]:
    """Start a local engine's server (log kept in log_dir; its pool sized from `suite` and
    `case`, or the engine's default without them; its sentinel, if any, writing to
    `sentinel`). With `serve_reference`, a reference:ALLOCATOR target is served the same way
    by `kvdiag serve` (for runs that only talk HTTP: isolation); other targets pass through."""
    from kvdiag.record.results import model_label

    if serve_reference and target.is_reference:
        from kvdiag.engines.reference import ReferenceServer

        if sentinel is not None:
            serve_args = (*serve_args, "--sentinel", str(sentinel))
        with ReferenceServer(target.allocator, model_dir, Path(log_dir) / "serve.log",
                             serve_args) as server:
            yield Served(dataclasses.replace(target, url=server.base_url), server.base_url,
                         Path(model_dir).name, model_label(model_dir))
        return
    if not target.is_local:
        yield Served(target, target.url, None)
        return
    cls = target.engine.launcher()
    kw = server_pool(suite, case, model_dir, cls.BLOCK_SIZE) if suite is not None and cls.SIZED else {}
    if adapters:
        kw["adapters"] = adapters
    if sentinel is not None:
        kw["sentinel"] = sentinel
    if engine_args:
        kw["extra_args"] = tuple(engine_args)  # appended to the engine's command line
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    with cls(model_dir, fault=target.fault, log_path=Path(log_dir) / target.engine.log_name, **kw) as server:
        yield Served(dataclasses.replace(target, url=server.base_url), server.base_url,
                     server.served_model, model_label(model_dir), getattr(server, "prefill_chunk", None),
                     getattr(server, "reuse_chunk", 0), getattr(server, "slot_files", None))
