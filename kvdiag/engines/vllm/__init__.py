"""A real vLLM for kvdiag: the launcher that starts and stops one (launcher.py), and the vLLM
general plugin that plants a named fault into it as a positive control (plugin.py)."""
