"""Runners measure; they never judge (kvdiag.verdicts does) and never import the CLI or the
command layer.

    reference/   the in-process reference engine under each allocator, and the contiguous
                 ground truth (cached on disk)
    live/        a live OpenAI-compatible server: endpoint client, probe phases, pressure,
                 isolation
    replay/      a case's traffic replayed model-free through vLLM's own KVCacheManager or
                 one of our allocators, with a shadow map of every slot
    suite.py     a suite's cases through reference/ (and replay/ for the `vllm` allocator)
    records.py   the row every runner emits: one per (case, allocator, session, round)
"""
