"""The fleet's wall time: N endpoint-bound targets run serially (a loop of `kvdiag regress`,
what a weekly job without Ray does) vs as one `kvdiag fleet run` on a local Ray, at N = 2, 4, 8.

Endpoint-bound means the client waits on the endpoint, as it does on a remote GPU server.
On one loopback machine each target is a `kvdiag serve --allocator guarded` behind a proxy
(in this process) that holds every request `--latency` seconds before forwarding it: the
remote GPU's time. Both forms run the same suite against the same servers; the fleet's time
includes starting and stopping Ray. Prints wall seconds of each form, their ratio (goal:
the fleet at least 2x faster at 4 targets) and seconds per target.

    python benchmarks/fleet_vs_serial.py [--targets 2,4,8] [--latency 0.5] [--suite tiny]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TINY = """name: tiny
style: canary
allocators: [guarded]
facts_per_session: 12
defaults: {sessions: 4, rounds: 3, shared_prefix: 64, boundary: 256, start_range: [180, 240],
           pressure_round: 1, max_think: 4, recite_every: 0, max_tokens: 16, new_facts: [1]}
cases:
  - name: trigger
"""


def start_proxy(backends: list[str], latency: float) -> tuple[str, object]:
    """http://127.0.0.1:PORT/t<i>/... -> backends[i]/..., each request held `latency` s."""
    import httpx
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    from tests.kvdiag.serving import free_port

    client = httpx.AsyncClient(timeout=600)

    async def forward(request):
        i, rest = int(request.path_params["i"]), request.path_params["rest"]
        await asyncio.sleep(latency)
        up = await client.request(request.method, f"{backends[i]}/{rest}", content=await request.body(),
                                  headers={"content-type": request.headers.get("content-type", "")},
                                  params=dict(request.query_params))
        return Response(up.content, up.status_code, media_type=up.headers.get("content-type"))

    app = Starlette(routes=[Route("/t{i:int}/{rest:path}", forward, methods=["GET", "POST"])])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server


def serial(urls: list[str], suite: Path, d: Path) -> float:
    from kvdiag.regress import history as H

    H.connect(d / "serial.sqlite").close()  # as the fleet's driver does before its first cell
    start = time.perf_counter()
    for i, url in enumerate(urls):
        run = subprocess.run([sys.executable, "-m", "kvdiag", "regress", "--suite", str(suite),
                              "--target", url, "--model", "canary", "--history", str(d / "serial.sqlite"),
                              "--baseline", str(d / "b.json"), "--out", str(d / f"serial-{i}")],
                             capture_output=True, text=True, cwd=ROOT)
        if run.returncode != 0:
            raise SystemExit(f"kvdiag regress {url}: exit {run.returncode}: {run.stderr[-800:]}")
    return time.perf_counter() - start


def fleet(urls: list[str], suite: Path, d: Path, cpus: int) -> float:
    spec = {"history": str(d / "fleet.sqlite"), "baseline": str(d / "b.json"), "time_limit": 1800,
            "targets": [{"name": f"t{i}", "target": u, "model": "canary", "suites": [str(suite)]}
                        for i, u in enumerate(urls)]}
    (d / "fleet.yaml").write_text(json.dumps(spec))
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "kvdiag", "fleet", "run", str(d / "fleet.yaml"),
                          "--num-cpus", str(cpus), "--out", str(d / "fleet"), "--json"],
                         capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - start
    cells = json.loads(run.stdout)["cells"] if run.stdout.strip() else []
    if run.returncode != 0 or any(c["status"] != "PASS" for c in cells):
        raise SystemExit(f"kvdiag fleet run: exit {run.returncode}: {cells} {run.stderr[-800:]}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="2,4,8")
    ap.add_argument("--latency", type=float, default=0.5, help="seconds each request waits (the remote GPU)")
    ap.add_argument("--suite", default="tiny", help="tiny (built in) or a suite file")
    ap.add_argument("--num-cpus", type=int, default=2)
    args = ap.parse_args()
    from tests.kvdiag.serving import served

    sizes = [int(n) for n in args.targets.split(",")]
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        d = Path(tmp)
        suite = d / "tiny.yaml" if args.suite == "tiny" else Path(args.suite).resolve()
        if args.suite == "tiny":
            suite.write_text(TINY)
        backends = [stack.enter_context(served("--allocator", "guarded", "--max-model-len", "2048"))[0]
                    for _ in range(max(sizes))]
        base, server = start_proxy(backends, args.latency)
        print(f"latency {args.latency} s per request, suite {args.suite}, local Ray with "
              f"{args.num_cpus} CPUs; loopback servers share this machine's cores")
        print(f"{'targets':>7} {'serial s':>9} {'fleet s':>8} {'ratio':>6} {'serial s/target':>16} {'fleet s/target':>15}")
        for n in sizes:
            urls = [f"{base}/t{i}" for i in range(n)]
            cell = d / f"n{n}"
            cell.mkdir()
            s = serial(urls, suite, cell)
            f = fleet(urls, suite, cell, args.num_cpus)
            print(f"{n:>7} {s:>9.1f} {f:>8.1f} {s / f:>6.2f} {s / n:>16.1f} {f / n:>15.1f}", flush=True)
        server.should_exit = True


if __name__ == "__main__":
    main()
