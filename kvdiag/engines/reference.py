"""The reference engine served over HTTP by `kvdiag serve --allocator ALLOCATOR`, on a free
loopback port, for runs that only talk HTTP (the isolation audit against reference:ALLOCATOR)."""

from __future__ import annotations

import sys
from pathlib import Path

from kvdiag.engines.process import ServerProcess


class ReferenceServer(ServerProcess):
    def __init__(self, allocator: str, model_dir: Path, log_path: Path,
                 args: tuple[str, ...] = (), timeout: float = 300.0) -> None:
        import os

        def argv(port: int) -> list[str]:
            return [sys.executable, "-m", "kvdiag", "serve", "--port", str(port),
                    "--allocator", allocator, "--model", str(model_dir), *args]

        super().__init__(f"kvdiag serve --allocator {allocator}", argv, dict(os.environ),
                         log_path, timeout=timeout, poll=0.3)
