"""kvdiag: find, measure and gate silent output corruption caused by KV-cache block reuse.

Nothing heavy is imported here (torch, pandas, spaCy, matplotlib load inside the functions
that need them), so `kvdiag --help` answers at once.
"""

__version__ = "0.1.0"
