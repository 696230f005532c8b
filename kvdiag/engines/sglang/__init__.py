"""SGLang as a real engine: the faults kvdiag plants into it (faults.py), planted by plugin.py
from plants_keys.py and plants_lifecycle.py."""
