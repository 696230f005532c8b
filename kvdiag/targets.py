"""What a run measures, named by one string everywhere (CLI, suites, fleet files, history):

    reference:ALLOCATOR     the in-process reference engine with that allocator
    vllm-local[:FAULT]      a real vLLM that kvdiag starts, stops, and may plant FAULT into
                            (kvdiag.engines.vllm: `make vllm-cpu-env`, or any env with vLLM)
    sglang-local[:FAULT]    a real SGLang, likewise (kvdiag.engines.sglang: `make sglang-cpu-env`)
    llamacpp-local[:FAULT]  llama.cpp's llama-server on a GGUF, FAULT a source patch built into
                            a binary of its own (kvdiag.engines.llamacpp: `make llamacpp-env`)
    http(s)://HOST:PORT     a live OpenAI-compatible server somebody else runs

A local engine's target becomes a URL target while its server runs (kvdiag.engines.local);
its spec stays the name runs are recorded under, so a weekly trend never depends on a
random port. Parsing checks every name (allocator, engine, fault) before any work.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvdiag.engines.spec import ENGINES, EngineSpec
from kvdiag.errors import KvdiagError


@dataclass(frozen=True)
class Target:
    spec: str
    url: str | None = None  # a live server's (a local engine's once started)
    allocator: str | None = None  # reference targets
    engine: EngineSpec | None = None  # local engines: the one kvdiag starts (engines/spec.py)
    fault: str | None = None  # local engines: the fault planted, or None

    @property
    def is_reference(self) -> bool:
        return self.allocator is not None

    @property
    def is_local(self) -> bool:
        """A real engine kvdiag starts and stops itself."""
        return self.engine is not None

    @property
    def sentinel_default(self) -> bool:
        """Whether kvdiag's sentinel runs in the server kvdiag starts for this target unless
        told otherwise: a local engine whose kvdiag plugin has one; on llama.cpp, where it is
        a source patch, the builds kvdiag makes (a fault, a fix), not the stock build."""
        e = self.engine
        return e is not None and e.sentinel and (self.fault is not None or e.sentinel_stock)

    @property
    def kind(self) -> str:
        """url, reference or its engine's `<engine>-local`, kept once that server runs and the
        target has its URL (a fleet places a local engine's cells by it)."""
        if self.engine is not None:
            return self.engine.target_kind
        return "reference" if self.is_reference else "url"


def parse_target(spec: str) -> Target:
    """A target string, checked (allocator and fault names included) before any work."""
    if spec.startswith(("http://", "https://")):
        return Target(spec.rstrip("/"), url=spec.rstrip("/"))
    kind, _, rest = spec.partition(":")
    if kind == "reference":
        name = rest or "guarded"
        check_allocator(name, f"--target {spec}")
        return Target(f"reference:{name}", allocator=name)
    engine = ENGINES.get(kind.removesuffix("-local")) if kind.endswith("-local") else None
    if engine is not None:
        fault = engine.check_fault(rest or None)
        return Target(kind + (f":{fault}" if fault else ""), engine=engine, fault=fault)
    locals_ = ", ".join(f"{e.target_kind}[:FAULT]" for e in ENGINES.values())
    raise KvdiagError(f"--target {spec!r}: expected reference:ALLOCATOR, {locals_} or an "
                      "http(s):// URL")


def check_allocator(name: str, option: str | None = None) -> str:
    """The registry's name for allocator `name`, checked before any work (the registry
    imports no torch); KvdiagError names `option` (default: --allocator NAME)."""
    from reference_engine.allocators import canonical_name
    from reference_engine.errors import UnknownAllocatorError

    try:
        return canonical_name(name)
    except UnknownAllocatorError as e:
        raise KvdiagError(f"{option or f'--allocator {name}'}: {e}") from None


def endpoint_target(base_url: str | None, target: str | None, model: str | None) -> Target:
    """What a probe talks to: --base-url URL with --model NAME, or --target <engine>-local[:FAULT]."""
    spec = parse_target(target) if target else None
    if (spec is None) == (base_url is None) or (spec is not None and not spec.is_local):
        raise KvdiagError("give --base-url URL --model NAME, or --target "
                          + " / ".join(f"{e.target_kind}[:FAULT]" for e in ENGINES.values()))
    if spec is None and not model:
        raise KvdiagError("--base-url needs --model NAME (as the server serves it)")
    if spec is None:
        check_url(base_url, "--base-url")
    return spec or Target(base_url, url=base_url)


def check_url(url: str, option: str) -> str:
    """An endpoint URL, refused at once unless http:// or https:// with a host."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise KvdiagError(f"{option} {url!r}: the scheme must be http or https, not "
                          f"{parts.scheme or 'none'}")
    if not parts.netloc:
        raise KvdiagError(f"{option} {url!r}: no host")
    return url
