"""Make PyPI's torchvision 0.28.0 importable beside the CPU torch (`make sglang-cpu-env`).

PyPI's torchvision wheel is built against CUDA torch: its `_C` ops library fails to load
beside torch 2.13.0+cpu, which torchvision tolerates (`extension._has_ops()` is False),
except that `_meta_registrations.py` registers fake kernels for `torchvision::nms` and
`torchvision::qnms` unconditionally, and `import torchvision` then raises
"operator torchvision::nms does not exist". SGLang imports torchvision.transforms (pure
Python) at config import time even for a text model, so it needs the package importable;
it never needs its C++ ops on this path.

This script guards those two registrations with `_has_ops()`, as torchvision already does
for every other op in that file. It is idempotent (a marker line), and it refuses to touch a
file whose text it does not recognise. Run with the venv's python: it edits that venv.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

MARKER = "# kvdiag: guarded fake registrations (requirements/sglang-cpu-shims)"
ANCHOR = "import torchvision.extension  # noqa: F401\n"
DECORATOR = '@torch.library.register_fake("torchvision::'
GUARD = f'''{MARKER}
def _register_fake_if_ops(name):
    if torchvision.extension._has_ops():
        return torch.library.register_fake(name)
    return lambda fn: fn
'''


def main() -> int:
    spec = importlib.util.find_spec("torchvision")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        print("patch_torchvision: torchvision is not installed in this venv", file=sys.stderr)
        return 1
    path = Path(next(iter(spec.submodule_search_locations))) / "_meta_registrations.py"
    text = path.read_text()
    if MARKER in text:
        print(f"patch_torchvision: {path} already patched")
        return 0
    if text.count(ANCHOR) != 1 or text.count(DECORATOR) != 2:
        print(f"patch_torchvision: {path} is not the torchvision 0.28.0 file this patch knows",
              file=sys.stderr)
        return 1
    text = text.replace(ANCHOR, ANCHOR + "\n\n" + GUARD)
    text = text.replace(DECORATOR, '@_register_fake_if_ops("torchvision::')
    path.write_text(text)
    print(f"patch_torchvision: patched {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
