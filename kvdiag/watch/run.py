"""`kvdiag watch`'s process: its settings, checked before anything starts (a bad upstream, a
port in use, a rate outside [0, 1] exit 2 at once), then the proxy in uvicorn with the
checker as a task of its lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import time
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

import httpx

from kvdiag.errors import KvdiagError

DEFAULT_LISTEN = "127.0.0.1:8100"


@dataclass(frozen=True)
class WatchSettings:
    upstream: str
    host: str = "127.0.0.1"
    port: int = 8100
    file: str = "reports/watch/watch.jsonl"
    sample: float = 0.01  # share of completed requests that get twins
    budget: float = 1.0  # twin samples per second at most
    window: float = 300.0  # seconds per window
    warmup: float = 600.0  # seconds at least before a hit above the bound is a finding
    pool_tokens: int | None = None  # the upstream's pool, tokens (None: ask its /metrics)
    index_tokens: int = 2_000_000  # prompt tokens held per namespace
    isolation: str = "auto"  # salt | cache_prompt (llama.cpp) | auto: by the upstream
    seed: int | None = None
    tokenizer: str | None = None  # a model directory: prompts tokenized here, not at the upstream

    @classmethod
    def parse(cls, upstream: str, listen: str, **kw) -> WatchSettings:
        """Settings from the command line's words; KvdiagError names what is wrong."""
        parts = urlsplit(upstream)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise KvdiagError(f"--upstream {upstream!r}: give an http:// or https:// URL "
                              "(the OpenAI-compatible server's base, e.g. http://127.0.0.1:8000)")
        host, _, port = listen.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise KvdiagError(f"--listen {listen!r}: give HOST:PORT, e.g. {DEFAULT_LISTEN}")
        if not 0.0 <= kw.get("sample", 0.01) <= 1.0 or math.isnan(kw.get("sample", 0.01)):
            raise KvdiagError(f"--sample {kw['sample']}: a share of requests, in [0, 1]")
        if kw.get("isolation", "auto") not in ("auto", "salt", "cache_prompt"):
            raise KvdiagError(f"--isolation {kw['isolation']!r}: auto, salt or cache_prompt")
        base = upstream.rstrip("/").removesuffix("/v1")
        return cls(upstream=base, host=host, port=int(port), **kw)


def claim_port(host: str, port: int) -> socket.socket:
    """The listening socket, bound now so that a port in use is an error before anything else
    starts; uvicorn serves on it."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise KvdiagError(f"--listen {host}:{port}: cannot listen there ({e.strerror})") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def pool_tokens(upstream: str) -> int:
    """The upstream's KV pool in tokens, from vLLM's cache_config_info on /metrics; 0 when it
    does not say (warm-up is then by time alone)."""
    from kvdiag.runners.live.endpoint import Endpoint

    endpoint = Endpoint(upstream, "", timeout=2.0, retries=0)
    try:
        config = endpoint.cache_config()
        return int(float(config.get("num_gpu_blocks") or 0)) * int(float(config.get("block_size") or 0))
    except (KvdiagError, httpx.HTTPError, ValueError):
        return 0
    finally:
        endpoint.sync.close()


def serve(settings: WatchSettings, sock: socket.socket, say=print) -> None:
    """Run the proxy until interrupted."""
    import uvicorn

    from kvdiag.runners.live.endpoint import Endpoint
    from kvdiag.watch.checker import Checker
    from kvdiag.watch.index import PrefixIndex
    from kvdiag.watch.log import WatchLog
    from kvdiag.watch.metrics import WatchMetrics
    from kvdiag.watch.proxy import build_app
    from kvdiag.watch.tokens import PROTOCOLS, LocalTokenizer, detect
    from kvdiag.watch.twins import Sampler, Twins

    pool = settings.pool_tokens if settings.pool_tokens is not None else pool_tokens(settings.upstream)
    log = WatchLog(settings.file)
    started = time.time()
    # idle connections dropped before the upstream's own keep-alive timeout (5 s in uvicorn,
    # vLLM, SGLang and llama-server) can close them under a request (proxy.STALE)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=512, keepalive_expiry=2.0)
    upstream = httpx.AsyncClient(base_url=settings.upstream, timeout=httpx.Timeout(None, connect=10),
                                 limits=limits)
    tokenizer = httpx.AsyncClient(base_url=settings.upstream, timeout=60)
    local = LocalTokenizer(settings.tokenizer) if settings.tokenizer else None
    endpoint = Endpoint(settings.upstream, "", timeout=120.0, retries=1)
    twins = Twins(endpoint, "salt") if settings.sample > 0 else None
    checker = Checker(tokenizer, PrefixIndex(settings.index_tokens), twins,
                      Sampler(settings.sample, settings.budget, settings.seed), log, WatchMetrics(),
                      window=settings.window, warmup=settings.warmup, pool_tokens=pool, local=local)

    failures: dict[str, int] = {}

    def status() -> dict:
        idx = checker.index
        return {"upstream": settings.upstream, "since": started, "warming": checker.warming,
                "pool_tokens": pool, "computed_since_warm": checker.computed,
                "queue": checker.queue.qsize(), "dropped": checker.dropped,
                "unreachable": failures,  # 502s the proxy answered, by what failed
                "in_flight": len(idx.inflight), "twins_running": len(checker.tasks),
                "index": {"namespaces": len(idx.spaces), "tokens": idx.tokens,
                          "evicted": idx.evicted, "forgotten_entries": len(idx.lost)},
                "twins": None if twins is None else {
                    "samples": twins.samples, "errors": twins.errors,
                    "floor_pairs": twins.floor_pairs, "extra_prompt_tokens": twins.extra_prompt_tokens},
                "window": checker.windows.total.record()}

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        checker.shape = await detect(tokenizer)
        isolation = settings.isolation
        if isolation == "auto":
            isolation = "cache_prompt" if PROTOCOLS[checker.shape].isolation == "cache_prompt" else "salt"
        if twins is not None:
            twins.isolation = isolation
        log.write({"type": "start", "time": started, "pool_tokens": pool} | asdict(settings)
                  | {"shape": checker.shape, "isolation": isolation})
        task = asyncio.get_running_loop().create_task(checker.run())
        say(f"kvdiag watch: {settings.host}:{settings.port} -> {settings.upstream} ({checker.shape}, "
            f"twins isolated by {isolation}"
            + (f", prompts tokenized here by {local.path}" if local else "") + "); findings and "
            f"windows in {settings.file}; metrics at /kvdiag/metrics"
            + (f"; warming up for {settings.warmup:.0f} s and {pool} computed tokens" if pool
               else f"; warming up for {settings.warmup:.0f} s"))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            for t in list(checker.tasks):
                t.cancel()
            log.write(checker.windows.roll(time.time()))
            log.close()
            await upstream.aclose(), await tokenizer.aclose(), await endpoint.aclose()

    app = build_app(upstream, checker, status, failures)
    app.router.lifespan_context = lifespan
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=30)
    uvicorn.Server(config).run(sockets=[sock])

