"""Real models from outside the repo: import a GGUF file into an HF-format directory."""
