"""The in-process reference engine as a runner: the paged engine under each allocator, and the contiguous ground truth (cached on disk)."""
