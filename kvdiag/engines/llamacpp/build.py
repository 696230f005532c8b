"""llama-server binaries: the stock build `make llamacpp-env` makes, and one per planted fault
or upstream fix, each a patch (patches/NAME.patch for a fault, fixes/NAME.patch for a fix)
applied to a copy of the sdist's tree and rebuilt incrementally into a binary of its own.
Every binary kvdiag builds carries kvdiag's sentinel (sentinel.patch, applied first: inert
unless KVDIAG_SENTINEL names a file); `sentinel` is the stock tree with the sentinel alone:

    .llamacpp/src/llama.cpp     the sdist's tree, never patched
    .llamacpp/build/bin/        the stock llama-server
    .llamacpp/fault-src/        a copy of the tree: a patch's files are restored from the
                                stock tree, the patch applied, the server rebuilt, restored
    .llamacpp/fault-build/      its build tree (cold once, about 10 min on 2 cores; a patch
                                then recompiles the files it touches)
    .llamacpp/faults/NAME/      llama-server, the shared libraries it was linked with (the
                                server's code lives in libllama-server-impl.so, which the
                                next fault's build overwrites: `library_path` is run with),
                                and its stamp: a sha256 of the patch and the build's flags,
                                so an edited patch is rebuilt

    server = stock_server()                  # KvdiagError naming `make llamacpp-env`
    installed()                              # the stock server, else the tree (a fault's)
    server = fault_server("prefix-overrun")  # built now if missing or stale
    server = fault_server(SENTINEL)          # the stock tree, the sentinel patched in

$KVDIAG_LLAMACPP_DIR moves the folder (default .llamacpp in the working directory or the
checkout); $KVDIAG_LLAMACPP_SERVER names a stock llama-server built elsewhere.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from kvdiag.errors import KvdiagError

PATCHES = Path(__file__).parent / "patches"
FIX_PATCHES = Path(__file__).parent / "fixes"
SENTINEL = "sentinel"  # the build of the stock tree with kvdiag's sentinel alone patched in
SENTINEL_PATCH = Path(__file__).parent / "sentinel.patch"
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
               "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF")
# the build's name as /props (build_info) and every log's header say it: llama.cpp takes it
# from the enclosing git checkout otherwise, which here is kvdiag's
BUILD_NUMBER = "11434"
# how a patched binary is built, in every stamp: raised when a change to it makes the binaries
# built before untrustworthy (2: restored files stamped now, see _restore; 3: the sentinel's
# patch first in every chain, files a patch adds removed on restore)
RULES = "rules-3"


def build_name(fault: str | None) -> str:
    """What a binary's build_info says: b11434-sdist (stock), b11434-fault-NAME (planted),
    b11434-fix-NAME (an upstream fix applied), b11434-sentinel (the stock tree and the sentinel)."""
    return f"b{BUILD_NUMBER}-" + (_commit(fault) if fault else "sdist")


def _commit(fault: str) -> str:
    """The name a patched build passes llama.cpp's cmake as its commit (fault-NAME, fix-NAME,
    sentinel)."""
    return fault if fault == SENTINEL else f"{_kind(fault)}-{fault}"


def _kind(name: str) -> str:
    from kvdiag.engines.llamacpp.faults import FIXES

    return "fix" if name in FIXES else SENTINEL if name == SENTINEL else "fault"


def root() -> Path:
    """The llama.cpp folder: $KVDIAG_LLAMACPP_DIR, else .llamacpp where it exists (the working
    directory first, then the checkout), else the checkout's."""
    from kvdiag.paths import REPO_ROOT

    given = os.environ.get("KVDIAG_LLAMACPP_DIR")
    if given:
        return Path(given).absolute()
    for base in (Path.cwd(), REPO_ROOT):
        if (base / ".llamacpp" / "src" / "llama.cpp").is_dir():
            return base / ".llamacpp"
    return REPO_ROOT / ".llamacpp"


def stock_server() -> Path:
    """The stock llama-server; KvdiagError (exit 2) naming the make target when there is none."""
    given = os.environ.get("KVDIAG_LLAMACPP_SERVER")
    path = Path(given) if given else root() / "build" / "bin" / "llama-server"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise KvdiagError(f"no llama-server at {path}: run `make llamacpp-env` (builds b11434 from "
                          "the pinned sdist, about 10 min on 2 cores) or set KVDIAG_LLAMACPP_SERVER")
    return path


def installed() -> Path:
    """What says llama.cpp is here: the stock llama-server, else the sdist's tree a patched
    binary is built from (`make llamacpp-src`: a run of planted faults needs no stock build);
    KvdiagError naming `make llamacpp-env` when neither is."""
    tree = root() / "src" / "llama.cpp"
    try:
        return stock_server()
    except KvdiagError:
        if (tree / "CMakeLists.txt").is_file():
            return tree
        raise


def patch_file(fault: str) -> Path:
    if fault == SENTINEL:
        return SENTINEL_PATCH
    return (FIX_PATCHES if _kind(fault) == "fix" else PATCHES) / f"{fault}.patch"


def patch_chain(fault: str) -> list[Path]:
    """The patches a build applies, in order: the sentinel's, then the fixes a fix or fault is
    written on, then its own."""
    from kvdiag.engines.llamacpp.faults import FAULTS, FIXES

    if fault == SENTINEL:
        return [SENTINEL_PATCH]
    found = FIXES.get(fault) or FAULTS.get(fault)
    return [SENTINEL_PATCH, *(patch_file(name) for name in (found.after if found else ())),
            patch_file(fault)]


def patched_files(patch: Path) -> list[str]:
    """The tree-relative paths a patch changes or adds (its +++ lines, b/ stripped)."""
    return [m.group(1) for m in re.finditer(r"^\+\+\+ b/(\S+)", patch.read_text(), re.M)]


def every_patched_file() -> list[str]:
    """Every tree path some fault's, fix's or the sentinel's patch changes or adds."""
    patches = [*PATCHES.glob("*.patch"), *FIX_PATCHES.glob("*.patch"), SENTINEL_PATCH]
    return sorted({f for p in patches for f in patched_files(p)})


def fault_server(fault: str, log=lambda m: print(m, file=sys.stderr)) -> Path:
    """The llama-server with `fault`'s patch in, built now when missing or built from another
    version of the patch. KvdiagError (exit 2): no stock tree, a patch that no longer
    applies (naming the fault and the file), a build that fails (its last line)."""
    chain = patch_chain(fault)
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in chain)
                            + " ".join(CMAKE_FLAGS + (build_name(fault), RULES)).encode()).hexdigest()
    out = root() / "faults" / fault
    binary, stamp = out / "llama-server", out / "patch.sha256"
    if binary.is_file() and stamp.is_file() and stamp.read_text().strip() == digest:
        return binary
    base = root()
    stock = base / "src" / "llama.cpp"
    if not (stock / "CMakeLists.txt").is_file():
        raise KvdiagError(f"no llama.cpp tree at {stock}: run `make llamacpp-env` first")
    tree, build = base / "fault-src", base / "fault-build"
    if not (tree / "CMakeLists.txt").is_file():
        log(f"copying the llama.cpp tree to {tree} (once) ...")
        shutil.copytree(stock, tree, symlinks=True, dirs_exist_ok=True)
    files = sorted({f for p in chain for f in patched_files(p)})
    rules = build / "kvdiag-rules"
    if not rules.is_file() or rules.read_text().strip() != RULES:
        # a build tree made under other rules may hold any patch's objects: every file a
        # patch touches is put back (stamped now), so each is compiled again from stock
        _restore(stock, tree, every_patched_file())
    _restore(stock, tree, files)
    for patch in chain:
        run = subprocess.run(["patch", "-p1", "--forward", "--batch", "-i", str(patch.resolve())],
                             cwd=tree, capture_output=True, text=True)
        if run.returncode != 0:
            _restore(stock, tree, files)
            said = (run.stdout + run.stderr).strip().splitlines()
            raise KvdiagError(f"{_kind(fault)} {fault}: {patch.name} no longer applies to llama.cpp's "
                              f"tree ({', '.join(patched_files(patch))}): "
                              f"{said[-1] if said else 'patch failed'}")
    try:
        if not (build / "CMakeCache.txt").is_file():
            log(f"configuring {build} (once; the first build takes about 10 min on 2 cores) ...")
        # configured again for each fault: its name goes into the binary's build_info
        _run(["cmake", "-S", str(tree), "-B", str(build), *CMAKE_FLAGS,
              f"-DLLAMA_BUILD_NUMBER={BUILD_NUMBER}", f"-DLLAMA_BUILD_COMMIT={_commit(fault)}"], fault)
        log(f"building llama-server with {_kind(fault)} {fault} ({', '.join(files)}) ...")
        _run(["cmake", "--build", str(build), "--target", "llama-server", "-j", str(os.cpu_count() or 2)],
             fault)
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for lib in (build / "bin").glob("*.so*"):  # the binary finds them first (its RUNPATH
            shutil.copy2(lib, out / lib.name, follow_symlinks=True)  # yields to LD_LIBRARY_PATH)
        shutil.copy2(build / "bin" / "llama-server", binary)
        stamp.write_text(digest + "\n")
        rules.write_text(RULES + "\n")
    finally:
        _restore(stock, tree, files)
    return binary


def library_path(server: Path) -> dict[str, str]:
    """The environment a fault's binary runs with: its own copies of the shared libraries
    first ({} for the stock build, whose libraries sit beside it)."""
    if (server.parent / "patch.sha256").is_file():
        return {"LD_LIBRARY_PATH": str(server.parent)}
    return {}


def _restore(stock: Path, tree: Path, files: list[str]) -> None:
    """Put the stock files back, stamped now: the incremental build compares times, and a
    file put back with the stock tree's older time (copy2) left the last patch's object in
    every later binary (the first upstream-fixes build ran state-tail-dropped's serializer).
    A file a patch added (none in the stock tree) is removed."""
    for f in files:
        if not (stock / f).is_file():
            (tree / f).unlink(missing_ok=True)
            continue
        shutil.copyfile(stock / f, tree / f)
        os.utime(tree / f)


def _run(argv: list[str], fault: str) -> None:
    run = subprocess.run(argv, capture_output=True, text=True)
    if run.returncode != 0:
        lines = (run.stdout + run.stderr).strip().splitlines()
        error = next((x for x in reversed(lines) if "error" in x.lower()), lines[-1] if lines else "")
        raise KvdiagError(f"{_kind(fault)} {fault}: building llama-server failed: {error.strip()}")
