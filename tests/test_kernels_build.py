"""Every shipped C kernel compiles here (a compile error would otherwise only show as a quiet
fallback to the torch path and a slow engine)."""

from __future__ import annotations

import shutil

import pytest

from infergen.kernels.build import build_all


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no cc")
def test_every_kernel_compiles():
    assert build_all() == []


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no cc")
def test_a_library_per_set_of_macros(tmp_path, monkeypatch):
    import ctypes

    from infergen.kernels.build import library, library_built

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # (an empty kernel cache)
    chunk = (("DECODE_ATTN_CHUNK", 64),)
    assert not library_built("rms_norm_f32", chunk)
    path = library("rms_norm_f32", chunk)
    assert library_built("rms_norm_f32", chunk) and not library_built("rms_norm_f32")
    assert path.parent == tmp_path / "infergen" / "kernels"
    assert library("rms_norm_f32", chunk) == path  # cached: the same file
    assert library("rms_norm_f32") != path  # other macros: another library
    ctypes.CDLL(str(path)).rms_norm_f32  # noqa: B018  (it exports the kernel)


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no cc")
def test_a_library_asked_for_at_once_is_compiled_once(tmp_path, monkeypatch):
    """Threads that build kernels side by side (compiler/concurrent_builds.py) asking for one
    library: one compiles it, the others wait for it and take the same file."""
    import subprocess
    import threading

    from infergen.kernels import build

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # (an empty kernel cache)
    compiles, run = [], subprocess.run

    def counted(cmd, *args, **kwargs):
        compiles.append(cmd)
        return run(cmd, *args, **kwargs)

    monkeypatch.setattr(build.subprocess, "run", counted)
    barrier, paths = threading.Barrier(3), []

    def ask():
        barrier.wait()
        paths.append(build.library("rms_norm_f32", (("DECODE_ATTN_CHUNK", 64),)))

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(compiles) == 1 and len(set(paths)) == 1 and len(paths) == 3
    assert paths[0].exists()


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no cc")
def test_a_first_start_builds_each_kernel_once_side_by_side(tmp_path, monkeypatch):
    """build_all on an empty cache (three small kernels standing for the shipped set): each
    compiled once, all loadable; a second call compiles nothing."""
    import subprocess

    from infergen.kernels import build

    sources = tmp_path / "src"
    sources.mkdir()
    for name in ("rms_norm_f32.c", "rope_f32.c", "silu_mul_f32.c", "common.h"):
        (sources / name).write_bytes((build._HERE / name).read_bytes())
    monkeypatch.setattr(build, "_HERE", sources)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    build.try_load.cache_clear()
    build.load.cache_clear()
    compiles, run = [], subprocess.run

    def counted(cmd, *args, **kwargs):
        compiles.append(cmd[-1])
        return run(cmd, *args, **kwargs)

    monkeypatch.setattr(build.subprocess, "run", counted)
    try:
        assert build.build_all() == []
        kernels = ("rms_norm_f32.c", "rope_f32.c", "silu_mul_f32.c")
        assert sorted(compiles) == sorted(str(sources / name) for name in kernels)
        assert build.build_all() == [] and len(compiles) == 3
    finally:
        build.try_load.cache_clear()  # (the engine's loads come from the real cache again)
        build.load.cache_clear()


def test_stream_prefetch_is_chosen_per_cpu_vendor_and_can_be_overridden(monkeypatch):
    """(Dispatch, not numbers: the prefetch hint changes no result.) Intel's build prefetches
    the streamed weights with _MM_HINT_T2 8 KB ahead, others keep common.h's non-temporal
    default (no extra flags); INFERGEN_STREAM_PREFETCH overrides and a bad value is named."""
    from infergen.kernels import build

    monkeypatch.delenv("INFERGEN_STREAM_PREFETCH", raising=False)
    for vendor, defines in (("GenuineIntel", True), ("AuthenticAMD", False), ("", False)):
        monkeypatch.setattr(build, "_cpu_vendor", lambda vendor=vendor: vendor)
        flags = build._compile_flags("gemm_w8a8_i8")
        assert ("-DSTREAM_HINT=1" in flags and "-DSTREAM_AHEAD=8192" in flags) == defines
    monkeypatch.setenv("INFERGEN_STREAM_PREFETCH", "t2")
    assert "-DSTREAM_HINT=1" in build._compile_flags("gemm_w8a8_i8")
    monkeypatch.setenv("INFERGEN_STREAM_PREFETCH", "t0")
    with pytest.raises(ValueError, match="INFERGEN_STREAM_PREFETCH='t0'.*nta"):
        build._compile_flags("gemm_w8a8_i8")


def test_a_source_in_both_the_integer_and_bf16_sets_asks_for_each_flag_once():
    from infergen.kernels.build import _compile_flags

    flags = _compile_flags("layer_kernels")
    assert len(flags) == len(set(flags))
