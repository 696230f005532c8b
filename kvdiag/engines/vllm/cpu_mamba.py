"""vLLM's Mamba2 prefix caching on a CPU: the two pieces vLLM 0.32 lacks there, which kvdiag's
plugin supplies so a hybrid model serves partial-block hits (and their copy-on-write) on a CPU.

With prefix caching on, vLLM runs a Mamba2 layer in "align" mode: a prefill stores the SSM
state at block ends (a checkpoint) so a later request can resume from it. On a CPU:
- the chunk scan (`ops/cpu/mamba_ssm.py`) ignores `return_intermediate_states` and returns
  one state per sequence, where the mixer indexes the states at every chunk's end (IndexError
  "index 3 is out of bounds for dimension 0 with size 1" on the first prefill of 4 chunks);
- `store_prefill_checkpoint` (`ops/ssd_checkpoint.py`) is a Triton kernel only.
So, armed by $KVDIAG_VLLM_CPU_MAMBA=1, in each vLLM process:

    the chunk scan       asked for intermediate states, runs vLLM's own CPU op chunk by
                         chunk, each from the state the last ended with, and returns the
                         state at every chunk's end (else vLLM's function, unchanged)
    the checkpoint       the Triton kernel's stores, in torch: the conv window before the
                         checkpoint and the SSM state of its chunk, into the row's block

Nothing of the scheduler or the KV cache manager changes: which blocks a hit shares, and what
it copies, are vLLM's.
"""

from __future__ import annotations

ENV = "KVDIAG_VLLM_CPU_MAMBA"


def chunk_scan(fwd):
    """vLLM's CPU chunk scan `fwd`, returning the state at every chunk's end when asked."""

    def scan(x, dt, A, B, C, chunk_size, out, *args, return_intermediate_states=False,
             cu_chunk_seqlens=None, seq_idx=None, initial_states=None, cu_seqlens=None, **kwargs):
        if not return_intermediate_states or cu_chunk_seqlens is None:
            return fwd(x, dt, A, B, C, chunk_size, out, *args, initial_states=initial_states,
                       cu_seqlens=cu_seqlens, cu_chunk_seqlens=cu_chunk_seqlens, seq_idx=seq_idx,
                       return_intermediate_states=return_intermediate_states, **kwargs)
        import torch

        bounds = cu_chunk_seqlens.tolist()
        owner = seq_idx.tolist() if seq_idx is not None else [0] * (len(bounds) - 1)
        last: dict[int, torch.Tensor] = {}
        states = []
        for c, (a, b) in enumerate(zip(bounds, bounds[1:])):
            s = owner[c]
            start = last.get(s)
            if start is None and initial_states is not None:
                start = initial_states[s:s + 1]
            state = fwd(x[a:b], dt[a:b], A, B[a:b], C[a:b], chunk_size, out[a:b], *args,
                        initial_states=start, cu_seqlens=torch.tensor([0, b - a], dtype=cu_seqlens.dtype),
                        cu_chunk_seqlens=None, seq_idx=None, return_intermediate_states=False, **kwargs)
            last[s] = state
            states.append(state[0])
        return torch.stack(states)

    scan.kvdiag_chunked = True
    return scan


def store_prefill_checkpoint(checkpoint, chunk_idx, x, conv_state, chunk_states, ssm_state,
                             query_start_loc, *, state_len: int) -> None:
    """The Triton kernel's stores, row by row: for a row whose checkpoint offset is positive,
    its block gets the `state_len` pre-conv inputs before the checkpoint and the SSM state at
    the end of the chunk `chunk_idx` names."""
    offsets = checkpoint.checkpoint_offsets.tolist()
    blocks = checkpoint.state_indices.tolist()
    starts = query_start_loc.tolist()
    chunks = chunk_idx.tolist()
    for row, offset in enumerate(offsets[:len(chunks)]):
        if offset <= 0:
            continue
        dst, end = int(blocks[row]), starts[row] + offset
        conv_state[dst, :, :state_len] = x[:, end - state_len:end].to(conv_state.dtype)
        ssm_state[dst].view(-1)[:chunk_states[0].numel()] = chunk_states[chunks[row]].reshape(-1).to(ssm_state.dtype)


def install() -> None:
    """The chunk scan wrapped where the mixer's path reads it, the checkpoint's store
    replaced where the mixer imported it."""
    from vllm.model_executor.layers.mamba import mamba_mixer2
    from vllm.model_executor.layers.mamba.ops import ssd_combined

    if not getattr(ssd_combined._mamba_chunk_scan_combined_fwd, "kvdiag_chunked", False):
        ssd_combined._mamba_chunk_scan_combined_fwd = chunk_scan(ssd_combined._mamba_chunk_scan_combined_fwd)
    mamba_mixer2.store_prefill_checkpoint = store_prefill_checkpoint
