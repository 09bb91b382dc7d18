"""The persistent JIT cache: compiled kernels on disk, keyed by what determines the binary.

    key = sha256(canonical graph text, specialization, target, compiler version, C compiler)

An entry is `<key>.so` (the shared library), `<key>.c` (the generated source, for reading)
and `<key>.json` (written last: the key's parts and the library's sha256). A lookup trusts
an entry only if its .json parses and names the library's current checksum; anything else —
a truncated library, a missing or garbled .json, a library that does not load — is a corrupt
entry: removed and rebuilt. Builders of one key take an exclusive file lock, so two processes
compiling the same kernel at once build it once; the library is written to a temporary file
and renamed into place (atomic), the .json after it. The Triton renderer's sources
(codegen_triton.py) live under `<root>/triton/`, keyed by the Triton version instead of the C
target and compiler (Triton keeps its own binaries in its cache).
"""

from __future__ import annotations

import ctypes
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infergen.kernels.build import _HERE as KERNELS_DIR
from infergen.kernels.build import KernelUnavailable, _compile_flags, cache_dir

COMPILER_VERSION = "3"  # bump when generated code or its flags change for the same graph
# on top of the shipped kernels' flags: sqrtf without errno, so 1/sqrtf loops vectorise
JIT_FLAGS = ["-fno-math-errno"]


def default_root() -> Path:
    return cache_dir() / "jit"


def _compiler() -> str:
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise KernelUnavailable("no C compiler (cc/gcc) on PATH")
    return compiler


def target_name(flags: list[str] | None = None) -> str:
    """The code-generation target: the C renderer with the ISA flags it compiles with (and
    the macros the kernel build sets for this CPU, e.g. its stream prefetch)."""
    flags = _compile_flags() if flags is None else flags
    isa = [f.removeprefix("-m").removeprefix("-D") for f in flags if f.startswith(("-m", "-D"))]
    return "c-" + ("+".join(isa) or "generic")


@dataclass
class Built:
    fn: Callable[..., None]
    key: str
    path: Path
    seconds: float  # compile time (0 when loaded from the cache)
    cached: bool  # True: found on disk, not compiled


class NotBuilt(LookupError):
    """An entry not in the cache, asked of a cache that may not build (build_missing False)."""


class JitCache:
    def __init__(self, root: Path | None = None, build_missing: bool = True):
        self.root = Path(root) if root is not None else default_root()
        self._loaded: dict[str, Built] = {}
        # False: `get` only loads; a missing entry raises NotBuilt (an engine whose startup
        # budget chose what to build runs the rest op by op)
        self.build_missing = build_missing

    def loading_only(self) -> JitCache:
        """The same cache, whose `get` loads and never builds (NotBuilt for what is missing)."""
        return JitCache(self.root, build_missing=False)

    def key(
        self, canonical: str, specialization: str, target: str | None = None, kernel: str = ""
    ) -> str:
        """The entry key: the C target (ISA flags, C compiler) unless `target` names another
        (e.g. "triton-3.6.0": the Triton renderer's sources need no C compiler). `kernel`: the
        shipped kernel whose build flags the entry compiles with (kernels/build.py: e.g. the
        integer and bf16 dot products of layer_kernels, which a layer program links against);
        give `get` the same."""
        flags = _compile_flags(kernel)
        toolchain = [target_name(flags), _compiler()] if target is None else [target]
        parts = [canonical, specialization, *toolchain[:1], COMPILER_VERSION, *toolchain[1:]]
        return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:24]

    def get(
        self,
        key: str,
        function: str,
        render: Callable[[], str],
        kernel: str = "",
        link: Callable[[], list[Path]] | None = None,
    ) -> Built:
        """The kernel `function` of entry `key`: loaded from memory, from disk, or built from
        `render()` (called only when it has to be compiled) with `kernel`'s flags (`key`),
        linked against the shared libraries `link()` returns (built by then; the entry loads
        them by their paths, and is rebuilt if one is gone)."""
        if key in self._loaded:  # built or loaded earlier: nothing compiled now
            return dataclasses.replace(self._loaded[key], seconds=0.0, cached=True)
        self.root.mkdir(parents=True, exist_ok=True)
        # (unlocked: an entry half-written by another builder is left alone, not evicted —
        # its .so already in place before its .json: evicting it there took the library from
        # under the builder about to load it, two layer kinds sharing one program key)
        built = self._load(key, function, evict=False)
        if built is None and not self.build_missing:
            raise NotBuilt(f"{function}: not in the JIT cache {self.root}")
        if built is None:
            with open(self.root / f"{key}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # one builder per key across processes
                built = self._load(key, function) or self._build(
                    key, function, render(), kernel, link() if link else []
                )
        self._loaded[key] = built
        return built

    def _files(self, key: str) -> tuple[Path, Path, Path]:
        return self.root / f"{key}.so", self.root / f"{key}.c", self.root / f"{key}.json"

    def _load(self, key: str, function: str, evict: bool = True) -> Built | None:
        """The entry from disk, or None; `evict`: a corrupt or incomplete one is deleted (only
        under the key's lock, where no other builder is writing it)."""
        library, _, meta = self._files(key)
        if not library.exists() and not meta.exists():
            return None
        try:
            record = json.loads(meta.read_text())
            if record["sha256"] != _sha256(library) or record["function"] != function:
                raise ValueError("checksum or function differs")
            fn = getattr(ctypes.CDLL(str(library)), function)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            if evict:
                self.evict(key)  # corrupt or half-written: rebuild
            return None
        return Built(fn, key, library, 0.0, True)

    def _build(
        self, key: str, function: str, source: str, kernel: str = "", link: list[Path] = ()
    ) -> Built:
        library, source_path, meta = self._files(key)
        started = time.perf_counter()
        flags = _compile_flags(kernel) + JIT_FLAGS
        with tempfile.TemporaryDirectory(dir=self.root) as tmp:
            src, out = Path(tmp) / f"{key}.c", Path(tmp) / f"{key}.so"
            src.write_text(source)
            cmd = [_compiler(), *flags, f"-I{KERNELS_DIR}", "-o", str(out), str(src)]
            cmd += [str(Path(library).resolve()) for library in link]
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode != 0:
                raise KernelUnavailable(f"compiling generated {function} failed:\n"
                                        f"{result.stderr}\n--- source ---\n{source}")  # fmt: skip
            os.replace(src, source_path)
            os.replace(out, library)
        record = {"function": function, "sha256": _sha256(library), "key": key,
                  "target": target_name(flags), "compiler_version": COMPILER_VERSION}  # fmt: skip
        tmp_meta = meta.with_suffix(".json.tmp")
        tmp_meta.write_text(json.dumps(record, indent=1))
        os.replace(tmp_meta, meta)  # last: marks the entry complete
        fn = getattr(ctypes.CDLL(str(library)), function)
        return Built(fn, key, library, time.perf_counter() - started, False)

    def evict(self, key: str) -> None:
        for path in self._files(key):
            path.unlink(missing_ok=True)
        self._loaded.pop(key, None)

    def entries(self) -> list[dict]:
        """The complete entries on disk (their .json records)."""
        found = []
        for meta in sorted(self.root.glob("*.json")):
            try:
                record = json.loads(meta.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(record, dict) and meta.stem == record.get("key"):
                found.append(record)  # (tuning.json lives here too: not an entry)
        return found


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
