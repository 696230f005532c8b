"""vLLM's LoRA on a CPU: the stock bug kvdiag's probe found there, and what kvdiag's plugin
changes so `vllm-local --adapter` tests the prefix cache rather than that bug.

vLLM 0.32's CPU LoRA runs the pure-torch punica ops (vllm.lora.ops.torch_ops.lora_ops). A
token of a base-model request carries LoRA index -1 ("no adapter"); the Triton kernels skip
such tokens, but `bgmv_shrink`, `bgmv_expand` and `bgmv_expand_slice` gather
`lora_weights[indices]`, and index -1 selects the last adapter slot. In any step that
batches a base request beside an adapter request, the base request's tokens get that
adapter's delta. Nothing errs. Open upstream as vLLM PR #48421.

kvdiag's canary adapter makes the effect visible: within the adapter, q.k is the base
model's, so a base request wholly computed under the adapter answers as the base does, but
one whose keys were written in a mixed step and whose queries run in a base-only step (or
the reverse) attends wrongly. Measured on stock vLLM 0.32, `probe --target vllm-local
--adapter canary-lora`: FAIL in 10 of 10 runs, every departed request a base-model one,
while the sentinel saw 0 foreign reads of 26-45M (docs/sentinel.md).

So, armed by $KVDIAG_VLLM_CPU_LORA=1 (the launcher sets it for a CPU server with adapters
unless the caller's environment says 0), in each vLLM process the three ops leave every
output row of a -1 token as it was, as the Triton kernels do; rows of real adapter indices
are computed by vLLM's own code, unchanged. The sgmv prefill ops delegate to these three.
"""

from __future__ import annotations

import functools

ENV = "KVDIAG_VLLM_CPU_LORA"
OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
MODULES = ("vllm.lora.ops.torch_ops.lora_ops", "vllm.lora.ops.torch_ops",
           "vllm.lora.punica_wrapper.punica_cpu")  # every namespace that holds the three by name


def skipping_base_tokens(op):
    """`op` (inputs, weights, output, indices, ...) with a -1 token's output row left as it
    was: the op runs on indices clamped to a real slot, and those rows are put back."""
    if getattr(op, "kvdiag_skips_base", False):
        return op

    @functools.wraps(op)
    def skips(inputs, weights, output, indices, *args, **kwargs):
        base = indices < 0
        if not bool(base.any()) or output.shape[0] != indices.shape[0]:
            return op(inputs, weights, output, indices, *args, **kwargs)
        kept = output[base].clone()
        result = op(inputs, weights, output, indices.clamp_min(0), *args, **kwargs)
        output[base] = kept
        return result

    skips.kvdiag_skips_base = True
    return skips


def install() -> None:
    """Wrap the three ops in every module that holds them (vLLM's CPU punica wrapper
    imported them by name)."""
    import importlib

    for name in MODULES:
        module = importlib.import_module(name)
        for op in OPS:
            if hasattr(module, op):
                setattr(module, op, skipping_base_tokens(getattr(module, op)))
