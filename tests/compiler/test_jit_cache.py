"""The JIT cache (compiler/jit_cache.py) survives what happens to files on disk: a truncated
library, a garbled or missing record, and two processes compiling the same key at once."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import torch

from infergen.compiler.ir import TOKENS, Graph, Node, Op, Value
from infergen.compiler.jit_cache import JitCache
from infergen.compiler.kernel import compile_group

F32 = torch.float32


def _graph() -> Graph:
    x, w = Value("x", (TOKENS, 5), F32, "input"), Value("w", (5,), F32, "weight")
    y = Value("y", (TOKENS, 5), F32)
    return Graph("g", [x, w], [Node(Op.MUL, (x, w), (y,))], [y])


def _check(kernel) -> None:
    x, w = torch.randn(3, 5), torch.randn(5)
    assert torch.equal(kernel(x, w)[0], x * w)


def test_truncated_library_is_rebuilt(tmp_path):
    first = compile_group(_graph(), JitCache(tmp_path))
    library = first.built.path
    # a copy cut short (a full disk, a crash mid-copy) put in its place: a new file, as this
    # process keeps the old one mapped
    damaged = library.with_suffix(".damaged")
    damaged.write_bytes(library.read_bytes()[:100])
    damaged.replace(library)
    again = compile_group(_graph(), JitCache(tmp_path))
    assert not again.built.cached  # detected (checksum) and compiled anew
    _check(again)
    assert compile_group(_graph(), JitCache(tmp_path)).built.cached


def test_garbled_or_missing_record_is_rebuilt(tmp_path):
    built = compile_group(_graph(), JitCache(tmp_path)).built
    record = tmp_path / f"{built.key}.json"
    record.write_text("{not json")
    again = compile_group(_graph(), JitCache(tmp_path))
    assert not again.built.cached
    _check(again)
    record.unlink()  # library without its record: a builder died before finishing
    third = compile_group(_graph(), JitCache(tmp_path))
    assert not third.built.cached
    assert json.loads(record.read_text())["sha256"]


def test_two_processes_compile_one_key(tmp_path):
    script = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(tmp_path.parent)!r})
        from infergen.compiler.jit_cache import JitCache
        from infergen.compiler.kernel import compile_group
        from tests.compiler.test_jit_cache import _graph
        kernel = compile_group(_graph(), JitCache({str(tmp_path)!r}))
        x, w = torch.randn(4, 5), torch.randn(5)
        assert torch.equal(kernel(x, w)[0], x * w)
        print("cached" if kernel.built.cached else "built")
    """)
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(outputs) == ["built", "cached"]  # the lock made the second one wait
    assert len(JitCache(tmp_path).entries()) == 1


def _library(path, value: int):
    """A shared library whose `answer()` returns `value` (an entry links against it)."""
    path.parent.mkdir(exist_ok=True)
    source = path.with_suffix(".c")
    source.write_text(f"int answer(void) {{ return {value}; }}\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(path), str(source)], check=True)
    return path


_LINKED = """
import ctypes, pathlib, sys
from infergen.compiler.jit_cache import JitCache
root, library = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
source = "int answer(void);\\nint twice(void) { return 2 * answer(); }\\n"
built = JitCache(root).get("k", "twice", lambda: source, link=lambda: [library])
built.fn.restype = ctypes.c_int
print(built.cached, built.fn())
"""


def test_an_entry_whose_linked_library_is_gone_is_rebuilt(tmp_path):
    def run(library) -> str:  # a fresh process each time (one that loaded it keeps it mapped)
        args = [sys.executable, "-c", _LINKED, str(tmp_path / "jit"), str(library)]
        return subprocess.run(args, check=True, capture_output=True, text=True).stdout.split()

    first = _library(tmp_path / "lib" / "first.so", 20)
    assert run(first) == ["False", "40"]
    assert run(first) == ["True", "40"]
    first.unlink()  # (a cleared kernel cache): the entry cannot load, so it is built anew
    assert run(_library(tmp_path / "lib" / "second.so", 21)) == ["False", "42"]
