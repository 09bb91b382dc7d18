"""Compile a C kernel source shipped with infergen into a shared library, once, and load it.

The library is cached under `cache_dir()/kernels/<name>-<hash>.so`, the hash covering the
source, the compiler command and the CPU flags it targets, so a changed source or machine
rebuilds. Compilation needs a C compiler (`cc`); without one the caller falls back to torch
and says so once.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from infergen.profiling import native  # (the profiler's labels live below kernels/)

_HERE = Path(__file__).parent


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "infergen"


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _cpu_vendor() -> str:
    """/proc/cpuinfo's vendor_id ("GenuineIntel", "AuthenticAMD"; "" unknown)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


# How the one-pass decode GEMVs prefetch the weights they stream (common.h STREAM_PREFETCH):
# (hint, bytes ahead) per CPU vendor, as measured. AMD EPYC Zen 4 (2026-12-06): non-temporal,
# 2 KB ahead — ordinary prefetches evicted the caches the torch ops between kernels use. Intel
# Xeon with AMX (2026-12-07): the W8A8 decode GEMV over 106 MB of weights read 11.5-12.7 GB/s
# with that hint and 19-31 GB/s with _MM_HINT_T2 8 KB ahead (20 rounds in turns, twice);
# INFERGEN_STREAM_PREFETCH=nta|t2 overrides.
STREAM_PREFETCH = {"nta": (0, 2048), "t2": (1, 8192)}  # (_MM_HINT_NTA 0, _MM_HINT_T2 1)


def _stream_prefetch() -> str:
    chosen = os.environ.get("INFERGEN_STREAM_PREFETCH")
    if chosen is not None and chosen not in STREAM_PREFETCH:
        raise ValueError(f"INFERGEN_STREAM_PREFETCH={chosen!r}: expected one of "
                         f"{sorted(STREAM_PREFETCH)}")  # fmt: skip
    return chosen or ("t2" if _cpu_vendor() == "GenuineIntel" else "nta")


def _compile_flags(name: str = "") -> list[str]:
    flags = ["-O3", "-fPIC", "-shared", "-fopenmp", "-ffp-contract=fast", f"-I{_HERE}"]
    stream = _stream_prefetch()
    if stream != "nta":  # (common.h's default: no flags, so the libraries' keys are unchanged)
        hint, ahead = STREAM_PREFETCH[stream]
        flags += [f"-DSTREAM_HINT={hint}", f"-DSTREAM_AHEAD={ahead}"]
    cpu = _cpu_flags()
    # INFERGEN_KERNEL_ISA (tests): "generic" the portable scalar paths, "avx2" no AVX-512,
    # "avx512vnni" no VBMI (and no BF16), "avx512" every AVX-512 extension the CPU has but no
    # AMX tiles; unset: everything the CPU has
    isa = os.environ.get("INFERGEN_KERNEL_ISA")
    if isa == "generic":  # the portable scalar paths (tests)
        return flags
    if {"avx2", "fma", "f16c"} <= cpu:
        flags += ["-mavx2", "-mfma", "-mf16c"]
        # AVX-512VL's two-table permute decodes an FP4 code, sign included, in one op
        # (gemm_packed_g_f32.c); INFERGEN_KERNEL_ISA=avx2 leaves it out
        if isa != "avx2" and {"avx512f", "avx512vl"} <= cpu:
            flags += ["-mavx512f", "-mavx512vl"]
            if name in INTEGER_SOURCES and {"avx512bw", "avx512_vnni"} <= cpu:
                flags += ["-mavx512bw", "-mavx512vnni"]  # u8 x s8 dot products (vpdpbusd)
                if "avx512vbmi" in cpu and isa != "avx512vnni":  # byte permutes (vpermt2b)
                    flags += ["-mavx512vbmi"]
                if isa is None and {"amx_tile", "amx_int8"} <= cpu:
                    flags += ["-mamx-tile", "-mamx-int8"]  # u8 x s8 tile products (amx.h)
            if name in BF16_SOURCES and isa in (None, "avx512") and "avx512_bf16" in cpu:
                flags += ["-mavx512bf16"]  # bf16 pair dot products (vdpbf16ps)
                if isa is None and {"amx_tile", "amx_bf16"} <= cpu:
                    flags += ["-mamx-tile", "-mamx-bf16"]  # bf16 tile products (kernels/amx.h)
    return list(dict.fromkeys(flags))  # (a source in both sets asks for -mamx-tile twice)


# kernels with integer dot-product paths: built with AVX-512 VNNI where the CPU has it (only
# these, so the other kernels' builds and cache keys do not change)
INTEGER_SOURCES = frozenset({"gemm_w8a8_i8", "gemm_w4a8_i8", "decode_layers_f32", "layer_kernels"})
# kernels with bf16 dot products: built with AVX-512 BF16 where the CPU has it (the fused decode
# step includes gemm_bf16.c)
BF16_SOURCES = frozenset({"gemm_bf16", "decode_layers_f32", "layer_kernels"})
# libraries the generated layer programs link against (compiler/program.py), built per set of
# macros when a program needs them, not by build_all; -Bsymbolic: their calls between their
# own functions bind inside them (another library's same-named kernel never interposes)
PROGRAM_LIBRARIES = frozenset({"layer_kernels"})


class KernelUnavailable(RuntimeError):
    """No C compiler, or the compile failed: the torch path is used instead."""


def _source_bytes(filename: str, seen: set[str] | None = None) -> bytes:
    """The file and, recursively, every kernels-local file it #includes (the cache key: a
    change to an included kernel rebuilds the files that include it)."""
    seen = set() if seen is None else seen
    if filename in seen:
        return b""
    seen.add(filename)
    text = (_HERE / filename).read_bytes()
    parts = [text]
    for match in re.finditer(rb'^#include "([^"]+)"', text, re.MULTILINE):
        parts.append(_source_bytes(match.group(1).decode(), seen))
    return b"".join(parts)


def _library_build(name: str, defines: tuple[tuple[str, int], ...]) -> tuple[Path, list[str]]:
    """Where `name` built with `defines` is cached, and the compile command that builds it."""
    source = _source_bytes(f"{name}.c")
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise KernelUnavailable("no C compiler (cc/gcc) on PATH")
    flags = _compile_flags(name) + [f"-D{macro}={value}" for macro, value in defines]
    if name in PROGRAM_LIBRARIES:
        flags.append("-Wl,-Bsymbolic")
    key = hashlib.sha256(source + " ".join([compiler, *flags]).encode()).hexdigest()[:16]
    return cache_dir() / "kernels" / f"{name}-{key}.so", [compiler, *flags]


def library_built(name: str, defines: tuple[tuple[str, int], ...] = ()) -> bool:
    """Whether `library(name, defines)` is cached (False where it cannot be built here)."""
    try:
        return _library_build(name, defines)[0].exists()
    except KernelUnavailable:
        return False


def library(name: str, defines: tuple[tuple[str, int], ...] = ()) -> Path:
    """The shared library of `infergen/kernels/<name>.c` compiled with the C macros `defines`
    ((macro, value) pairs): built if not cached, its path returned (not loaded)."""
    target, command = _library_build(name, defines)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # one builder per library: threads building kernels side by side (compiler/
    # concurrent_builds.py) and other processes wait for it instead of compiling it again
    with open(target.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return target
        print(f"infergen: compiling native kernel {name} (once, cached)", file=sys.stderr)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            out = Path(tmp) / target.name
            cmd = [*command, "-o", str(out), str(_HERE / f"{name}.c")]
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode != 0:
                raise KernelUnavailable(f"compiling {name}.c failed:\n{result.stderr}")
            os.replace(out, target)  # atomic: a reader sees the whole library or none
    return target


@functools.cache
def load(name: str) -> ctypes.CDLL:
    """Compile (if not cached) and load `infergen/kernels/<name>.c`."""
    return ctypes.CDLL(str(library(name)))


# at most this many compiler processes at once (each is one core's work; more only queue)
MAX_COMPILE_WORKERS = 8


def compile_workers() -> int:
    """Compiler processes at once: the cores this process may run on (at most
    MAX_COMPILE_WORKERS); build_all's and compiler/concurrent_builds.py's."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # (platforms without affinity)
        cores = os.cpu_count() or 1
    return max(1, min(MAX_COMPILE_WORKERS, cores))


def build_all() -> list[str]:
    """Compile every shipped kernel now (engine start-up), so that the first request does not
    pay for compilation; those not built yet side by side, one compiler process per core (a
    first start on a machine: 16 kernels). Returns the names that are unavailable."""
    names = [p.stem for p in sorted(_HERE.glob("*.c")) if p.stem not in PROGRAM_LIBRARIES]
    missing = [name for name in names if not library_built(name)]
    if len(missing) > 1:
        with ThreadPoolExecutor(max_workers=min(len(missing), compile_workers())) as pool:
            list(pool.map(try_load, missing))  # (each loads its own; errors said once)
    return [name for name in names if try_load(name) is None]


@functools.cache
def try_load(name: str) -> ctypes.CDLL | None:
    """`load`, or None (said once) when the kernel cannot be built here."""
    try:
        return load(name)
    except KernelUnavailable as exc:
        print(f"infergen: native kernel {name} unavailable, using torch ({exc})", file=sys.stderr)
        return None


# C argument kinds of the kernel signatures: pointers, C long, int, float.
P, L, I, F = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_float


@functools.cache
def kernel(
    name: str, *argtypes: type, source: str | None = None, restype: type | None = None
) -> Callable[..., object] | None:
    """The function `name` of `kernels/<source or name>.c` with its ctypes signature (returns
    `restype`, None: void), or None when native kernels cannot be built here (callers then use
    their torch path). A plain callable, not the ctypes function: while a torch profiler
    records, each call is the region "native::<name>" (infergen/profiling.py)."""
    lib = try_load(source or name)
    if lib is None:
        return None
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return native(fn, name)
