"""SGLang as a real engine: the faults kvdiag plants into its radix cache (faults.py, plugin.py)."""
