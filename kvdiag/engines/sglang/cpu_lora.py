"""SGLang's LoRA on a CPU: what kvdiag's plugin changes so `sglang-local --adapter` runs there.

SGLang 0.5.23 ships a torch_native LoRA backend that computes on any device, but its LoRA
layers, adapter loader and that backend ask for pinned host memory unconditionally
(`torch.tensor(..., pin_memory=True)`, `t.pin_memory()`), and with no accelerator torch
raises "pin_memory=True requires a CUDA or other accelerator backend". Pinning only speeds
host-to-device copies; on a CPU there is no copy to speed up. So, armed by $KVDIAG_SGLANG_CPU_LORA
(set by the launcher for a CPU server with adapters), in each SGLang process:

    Tensor.pin_memory()                     -> the tensor itself
    torch.<factory>(..., pin_memory=True)   -> the same call without it, in the three
                                               modules that ask (MODULES), nowhere else

Nothing else in SGLang changes: which K/V its radix cache keys under an adapter (lora_id,
concatenated into the request's extra_key) is SGLang's own.
"""

from __future__ import annotations

import functools

ENV = "KVDIAG_SGLANG_CPU_LORA"
MODULES = ("sglang.srt.lora.layers", "sglang.srt.lora.lora", "sglang.srt.lora.backend.torch_backend")
_FACTORIES = frozenset({"tensor", "zeros", "ones", "empty", "arange", "full", "as_tensor"})


class _Unpinned:
    """The torch module as one SGLang module sees it: every attribute torch's own, the
    factories without their pin_memory argument."""

    def __init__(self, torch) -> None:
        self._torch = torch

    def __getattr__(self, name: str):
        value = getattr(self._torch, name)
        if name not in _FACTORIES:
            return value

        @functools.wraps(value)
        def factory(*args, **kwargs):
            kwargs.pop("pin_memory", None)
            return value(*args, **kwargs)
        return factory


def unpin(module) -> None:
    """Called right after `module` (one of MODULES) is imported: its `torch` unpinned, and
    Tensor.pin_memory made the identity where torch sees no accelerator."""
    import torch

    if not torch.cuda.is_available():
        torch.Tensor.pin_memory = lambda self, *args, **kwargs: self
        module.torch = _Unpinned(torch)
