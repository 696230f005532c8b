"""Check the SGLang-on-CPU venv that `make sglang-cpu-env` built; run with that venv's python.

One check per workaround, then the imports the launcher and the fault plugin need:
  1. torch is the CPU build the Makefile installed first (a CUDA torch would mean pip
     replaced it);
  2. sgl_kernel is kvdiag's import-only stand-in, and calling any of its names raises;
  3. torchvision imports (patch_torchvision.py applied) although its C++ ops do not load;
  4. with SGLANG_USE_CPU_ENGINE=1 (which every CPU server start must set), the modules
     `python -m sglang.launch_server` imports load;
  5. kvdiag's fault plugin imports and kvdiag_sglang_faults.pth is in site-packages.
Exits 1 naming the first check that fails.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path


def fail(message: str) -> None:
    print(f"sglang-cpu-env check failed: {message}", file=sys.stderr)
    sys.exit(1)


def main() -> None:
    import torch

    if not torch.__version__.startswith("2.13.0") or torch.version.cuda is not None:
        fail(f"torch {torch.__version__} (cuda {torch.version.cuda}); want 2.13.0, CPU build")

    import sgl_kernel

    if not getattr(sgl_kernel, "STAND_IN", False):
        fail(f"sgl_kernel at {sgl_kernel.__file__} is not kvdiag's stand-in")
    try:
        sgl_kernel.rmsnorm()
    except sgl_kernel.StubKernelError:
        pass
    else:
        fail("calling a stubbed sgl_kernel function did not raise")

    # unpatched, this raises "operator torchvision::nms does not exist"
    import torchvision.transforms  # noqa: F401

    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
    import sglang
    import sglang.launch_server  # noqa: F401
    import sglang.srt.entrypoints.http_server  # noqa: F401

    import kvdiag.engines.sglang.plugin  # noqa: F401

    pth = Path(sysconfig.get_paths()["purelib"]) / "kvdiag_sglang_faults.pth"
    if not pth.is_file():
        fail(f"{pth} is missing: SGLang's processes would not load kvdiag's fault plugin")
    print(f"sglang-cpu-env ok: sglang {sglang.__version__}, torch {torch.__version__}, "
          f"torchvision {torchvision.__version__} (ops: {torchvision.extension._has_ops()}), "
          f"sgl_kernel stand-in, fault plugin armed by {pth.name}")


if __name__ == "__main__":
    main()
