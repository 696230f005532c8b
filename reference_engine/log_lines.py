"""The engine's start-up log lines, as constants: gates (kvdiag verify --expect-guard) and
tests look for them verbatim, so they are written once, here, in a module without torch."""

PAGED_ATTENTION_LINE = "PagedAttention enabled with block size {block_size}."
GUARD_LOG_LINE = "Using SequenceGuard for block allocation."
