"""An import-only stand-in for `sgl_kernel`, for SGLang 0.5.23 on a CPU without AMX
(`make sglang-cpu-env` copies this package into .venv-sglang-cpu's site-packages).

SGLang's kernel package (`sglang-kernel`, imported as `sgl_kernel`) has no CPU build on
PyPI, and its CUDA wheel fails to load here (libnvrtc.so.12 missing). SGLang's CPU path
imports a few names from it at module level (`from sgl_kernel import X`) but, on a CPU where
`cpu_has_amx_support()` is False, runs plain-torch norm, RoPE and attention and never calls
them. The contract: any name imports, nothing runs. Calling a stubbed kernel raises a
RuntimeError naming it, so a code path that does need a real kernel fails loudly instead of
computing something else. `torch.ops.sgl_kernel` stays empty, so SGLang's own probe
(`hasattr(torch.ops.sgl_kernel, "convert_weight_packed")`) sees no AMX backend.
"""

from __future__ import annotations

STAND_IN = True  # lets a check tell this stand-in from a real sgl_kernel


class StubKernelError(RuntimeError):
    """A stubbed sgl_kernel function was called: this environment has no real kernel."""


def _stub(qualname: str):
    def kernel(*args, **kwargs):
        raise StubKernelError(
            f"sgl_kernel.{qualname} was called, but this venv holds kvdiag's import-only "
            "stand-in (requirements/sglang-cpu-shims/sgl_kernel): SGLang took a code path "
            "that needs a real sgl_kernel build")

    kernel.__name__ = kernel.__qualname__ = qualname
    return kernel


def __getattr__(name: str):
    # dunders and private names stay AttributeError: import machinery, pickling and
    # hasattr() probes must see an ordinary module, not a kernel
    if name.startswith("_"):
        raise AttributeError(name)
    return _stub(name)
