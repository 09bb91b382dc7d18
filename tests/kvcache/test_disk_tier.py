"""The disk tier of the KV hierarchy: bit-exact round trips, persistence across instances,
fingerprints, corrupt / truncated / half-written files, the byte budget with leaf-first LRU
eviction (a property test over random chains), and write faults (read-only, disk full)."""

from __future__ import annotations

import errno
import os
import tempfile
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from infergen.errors import ConfigError
from infergen.kvcache.prefix import block_hash
from infergen.kvcache.tiers.disk import VERSION, DiskTier

FP = "tiny-llama|fp8_e4m3|block16"


def _chmod_binds(tmp_path: Path) -> bool:
    """False where directory permissions do not bind (root with CAP_DAC_OVERRIDE)."""
    locked = tmp_path / "permission-probe"
    locked.mkdir(mode=0o500)
    return not os.access(locked, os.W_OK)


def _key(i: int) -> bytes:
    return block_hash(None, [i])


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _block(i: int, numel: int = 35, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    gen = torch.Generator().manual_seed(i)
    return torch.randn(numel, generator=gen).to(dtype)


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix == ".kv")


def _tensors() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 7, generator=gen) * 100
    x[0, 0, :3] = torch.tensor([float("nan"), float("inf"), -0.0])
    return [
        x,  # fp32 with NaN, inf, -0
        x.to(torch.bfloat16)[:, 1:4],  # non-contiguous slice
        x.clamp(-448, 448).to(torch.float8_e4m3fn).reshape(7, 15),
        torch.randint(0, 256, (1, 13, 1), dtype=torch.uint8, generator=gen),
        torch.tensor(2.5, dtype=torch.float16),  # 0-d
        torch.empty(0, 4, dtype=torch.float32),  # empty
    ]


def test_round_trip_is_bit_exact_for_every_dtype(tmp_path):
    tier = DiskTier(tmp_path / "kv", 1 << 20, FP)
    tensors = _tensors()
    for i, t in enumerate(tensors):
        assert tier.put(_key(i), _key(i - 1) if i else None, t)
    assert tier.stats["puts"] == len(tensors)
    assert tier.nbytes == sum(p.stat().st_size for p in _files(tmp_path / "kv"))
    assert tier.stats["bytes_written"] == tier.nbytes
    for i, t in enumerate(tensors):
        assert _key(i) in tier
        got = tier.get(_key(i))
        assert got is not None and got.dtype == t.dtype and got.shape == t.shape
        assert torch.equal(_bits(got), _bits(t))
    assert tier.get(_key(99)) is None and _key(99) not in tier
    assert tier.stats["hits"] == len(tensors) and tier.stats["misses"] == 1
    # the tier holds a copy: changing the caller's tensor afterwards changes nothing
    t = torch.ones(4)
    tier.put(_key(50), None, t)
    t.add_(1)
    assert torch.equal(tier.get(_key(50)), torch.ones(4))


def test_persistence_across_instances_and_fingerprints(tmp_path):
    first = DiskTier(tmp_path, 1 << 20, FP)
    other = DiskTier(tmp_path, 1 << 20, FP + "|other-model")
    for i in range(4):
        assert first.put(_key(i), _key(i - 1) if i else None, _block(i))
    assert other.put(_key(0), None, _block(100))  # same key, another model: its own file
    assert len(_files(tmp_path)) == 5

    again = DiskTier(tmp_path, 1 << 20, FP)
    assert again.nbytes == first.nbytes
    for i in range(4):
        assert _key(i) in again and torch.equal(_bits(again.get(_key(i))), _bits(_block(i)))
    assert torch.equal(_bits(DiskTier(tmp_path, 1 << 20, FP + "|other-model").get(_key(0))),
                       _bits(_block(100)))  # fmt: skip
    unknown = DiskTier(tmp_path, 1 << 20, "another fingerprint")
    assert _key(0) not in unknown and unknown.nbytes == 0 and unknown.get(_key(0)) is None
    # a smaller budget evicts at start (least recently written leaves first), never another
    # fingerprint's files
    for i in range(4):
        os.utime(first._path(_key(i)), ns=(i * 10**9, i * 10**9))  # key 0 the oldest
    small = DiskTier(tmp_path, again.nbytes // 2, FP)
    assert small.nbytes <= small.budget_bytes and small.stats["evictions"] > 0
    assert _key(0) in small  # the chain's start stays (leaves go first)
    assert DiskTier(tmp_path, 1 << 20, FP + "|other-model").get(_key(0)) is not None
    # a file of another format version (a newer infergen's): skipped, not deleted
    future = small._path(_key(7))
    raw = bytearray(small._path(_key(0)).read_bytes())
    raw[4] = VERSION + 1
    future.write_bytes(bytes(raw))
    assert _key(7) not in DiskTier(tmp_path, 1 << 20, FP) and future.exists()


def test_flipped_byte_and_truncated_file_are_corrupt(tmp_path):
    tier = DiskTier(tmp_path, 1 << 20, FP)
    for i in range(3):
        tier.put(_key(i), None, _block(i, 64, torch.float32))
    flipped, truncated, header_hit = (tier._path(_key(i)) for i in range(3))
    raw = bytearray(flipped.read_bytes())
    raw[-10] ^= 0x01  # one bit of the payload
    flipped.write_bytes(bytes(raw))
    truncated.write_bytes(truncated.read_bytes()[:-1])
    raw = bytearray(header_hit.read_bytes())
    raw[12] ^= 0xFF  # a byte of the key in the header
    header_hit.write_bytes(bytes(raw))

    for i, path in enumerate((flipped, truncated, header_hit)):
        assert tier.get(_key(i)) is None
        assert not path.exists() and _key(i) not in tier
    assert tier.stats["corrupt"] == 3 and tier.stats["hits"] == 0 and tier.nbytes == 0
    # a file removed behind the tier's back: a miss, not corrupt
    tier.put(_key(3), None, _block(3))
    tier._path(_key(3)).unlink()
    assert tier.get(_key(3)) is None and _key(3) not in tier and tier.stats["corrupt"] == 3

    # corrupt files found at start (headers only: a truncated one) are deleted and counted
    tier.put(_key(5), None, _block(5))
    path = tier._path(_key(5))
    path.write_bytes(path.read_bytes()[:-3])
    again = DiskTier(tmp_path, 1 << 20, FP)
    assert _key(5) not in again and not path.exists() and again.stats["corrupt"] == 1


def test_leftover_temp_files_are_ignored_and_removed(tmp_path):
    tier = DiskTier(tmp_path, 1 << 20, FP)
    assert tier.put(_key(0), None, _block(0))
    final = tier._path(_key(0))
    # a writer killed mid-write: a partial temp file of block 1 (pid not running), and an
    # old one of block 2 (stale by age whatever its pid)
    dead = final.with_name(f".{tier._path(_key(1)).name}.{2**31 - 1}.abcd1234.tmp")
    dead.write_bytes(final.read_bytes()[:20])
    stale = final.with_name(f".{tier._path(_key(2)).name}.{os.getpid()}.abcd1234.tmp")
    stale.write_bytes(final.read_bytes())
    old = time.time() - 3600
    os.utime(stale, (old, old))
    live = final.with_name(f".{tier._path(_key(3)).name}.{os.getpid()}.beef0000.tmp")
    live.write_bytes(b"being written")  # a running writer's temp file is left alone
    foreign = tmp_path / f".{_key(4).hex()}-0123456789abcdef.kv.{2**31 - 1}.x.tmp"
    foreign.write_bytes(b"")  # another fingerprint's: its own tier cleans it

    again = DiskTier(tmp_path, 1 << 20, FP)
    assert not dead.exists() and not stale.exists() and live.exists() and foreign.exists()
    assert _key(1) not in again and _key(2) not in again and _key(0) in again
    assert again.nbytes == final.stat().st_size


# a writer process: blocks 0, 1, … (chains of 4) of 256 Ki fp32 values into a DiskTier, each
# stored one logged to the progress file (after `put` returned)
_WRITER = """
import sys

import torch

from infergen.kvcache.tiers.disk import DiskTier
from tests.kvcache.test_disk_tier import FP, _block, _chain_parent, _key

tier = DiskTier(sys.argv[1], 1 << 30, FP)
with open(sys.argv[2], "a") as log:
    for i in range(int(sys.argv[3])):
        stored = tier.put(_key(i), _chain_parent(i), _block(i, 1 << 18, torch.float32))
        log.write(f"{i} {int(stored)}\\n")
        log.flush()
"""


def _chain_parent(i: int) -> bytes | None:
    return _key(i - 1) if i % 4 else None


def _block_temps(directory: Path) -> list[Path]:
    """A block's temp files: `.<name>.kv.<pid>.<random>.tmp` (not the start's probe file)."""
    return [p for p in directory.iterdir() if p.name.endswith(".tmp") and ".kv." in p.name]


def test_a_writer_killed_mid_write_leaves_only_complete_blocks(tmp_path):
    """A real process writing blocks in a loop, stopped (SIGSTOP) while a block's temp file
    exists — checked with the process frozen, else it runs on — then killed with SIGKILL: a
    new tier on the directory indexes every block the writer had logged as stored and
    nothing else but possibly the block in flight had its rename happened (never a partial
    file), removes the dead writer's temp file, and reads every indexed block back bit for
    bit (with its parent)."""
    import signal
    import subprocess
    import sys

    directory, progress, blocks = tmp_path / "kv", tmp_path / "progress", 200
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(directory), str(progress), str(blocks)],
        env=env, cwd=root,
    )  # fmt: skip
    caught: list[Path] = []
    deadline = time.monotonic() + 120
    try:
        while not caught:
            assert writer.poll() is None, "the writer finished (or failed) before a mid-write kill"
            assert time.monotonic() < deadline, "no mid-write moment caught in 120 s"
            started = progress.exists() and progress.read_text().count("\n") >= 2
            if not (started and _block_temps(directory)):
                time.sleep(1e-4)
                continue
            os.kill(writer.pid, signal.SIGSTOP)
            os.waitpid(writer.pid, os.WUNTRACED)  # frozen now: the listing below stays true
            caught = _block_temps(directory)
            os.kill(writer.pid, signal.SIGKILL if caught else signal.SIGCONT)
    finally:
        if writer.poll() is None:
            writer.kill()
        writer.wait()  # reaped: its pid no longer runs
    assert writer.returncode == -signal.SIGKILL
    assert all(path.exists() for path in caught)  # the half-written block's temp file

    logged = [line.split() for line in progress.read_text().splitlines()]
    stored = {int(i) for i, ok in logged if ok == "1"}
    assert len(stored) == len(logged) >= 2
    in_flight = len(logged)  # the block being written when it was killed
    tier = DiskTier(directory, 1 << 30, FP)
    indexed = {i for i in range(blocks) if _key(i) in tier}
    assert stored <= indexed <= stored | {in_flight}
    assert not _block_temps(directory) and not any(p.suffix == ".tmp" for p in directory.iterdir())
    assert len(_files(directory)) == len(indexed)
    for i in sorted(indexed):
        got = tier.get(_key(i))
        assert got is not None and torch.equal(_bits(got), _bits(_block(i, 1 << 18, torch.float32)))
    assert tier.stats["corrupt"] == 0 and tier.stats["hits"] == len(indexed)
    if stored:  # parents came back with the blocks: a chain's leaf is evicted before its parent
        assert tier._order.parent_of(_key(max(stored))) == _chain_parent(max(stored))


def test_leaves_are_evicted_first_and_parents_kept(tmp_path):
    one = DiskTier(tmp_path / "probe", 1 << 20, FP)
    one.put(_key(0), None, _block(0))
    size = one.nbytes
    tier = DiskTier(tmp_path / "kv", 3 * size + 48, FP)  # 3 blocks (a parent key: +16 B)
    a, b, c, d = (_key(i) for i in range(4))
    assert tier.put(a, None, _block(0)) and tier.put(b, a, _block(1)) and tier.put(c, b, _block(2))
    tier.get(c)  # c is the most recently used, a the least: still only c is a leaf
    assert tier.put(d, None, _block(3))
    assert [k in tier for k in (a, b, c, d)] == [True, True, False, True]
    # storing a child of b: b is kept (no leaf while its child is stored)
    assert tier.put(_key(4), b, _block(4))
    assert _key(4) in tier and a in tier and b in tier and d not in tier
    # a block bigger than the budget, or no leaf to give room: refused
    assert not tier.put(_key(9), None, torch.zeros(4 * size, dtype=torch.uint8))
    assert tier.nbytes <= tier.budget_bytes
    # a child stored before its parent: the parent, once stored, is not a leaf
    tier2 = DiskTier(tmp_path / "kv2", 2 * size + 32, FP)
    assert tier2.put(b, a, _block(1)) and tier2.put(a, None, _block(0))
    tier2.get(b)  # a is the least recently used, but b depends on it
    assert tier2.put(c, None, _block(2))
    assert [k in tier2 for k in (a, b, c)] == [True, False, True]


def test_reads_from_another_thread_see_whole_blocks_or_misses(tmp_path):
    """The KV tiers' background loader gets while the engine thread puts and evicts (a budget
    of 4 of 12 blocks, put over and over): every get is a stored block's exact contents or a
    miss, and afterwards the index, the files and the byte count agree; `discard` forgets."""
    probe = DiskTier(tmp_path / "probe", 1 << 20, FP)
    probe.put(_key(0), None, _block(0))
    tier = DiskTier(tmp_path / "kv", 4 * probe.nbytes, FP)
    wrong: list[int] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            for i in range(12):
                got = tier.get(_key(i))
                if got is not None and not torch.equal(_bits(got), _bits(_block(i))):
                    wrong.append(i)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for _ in range(20):
            for i in range(12):
                tier.put(_key(i), None, _block(i))
    finally:
        stop.set()
        thread.join()
    assert not wrong and tier.stats["hits"] > 0
    held = [i for i in range(12) if _key(i) in tier]
    assert (
        tier.nbytes == sum(p.stat().st_size for p in _files(tmp_path / "kv")) <= tier.budget_bytes
    )
    assert len(_files(tmp_path / "kv")) == len(held) > 0
    tier.discard(_key(held[0]))
    assert _key(held[0]) not in tier and len(_files(tmp_path / "kv")) == len(held) - 1


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["put", "put", "put", "get", "reput"]),
            st.integers(0, 10**6),  # which parent / which key
            st.integers(1, 200),  # block elements
            st.sampled_from([torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.uint8]),
        ),
        min_size=1,
        max_size=40,
    ),
    st.integers(300, 3000),
)
def test_budget_and_prefix_invariants_hold(ops, budget):
    with tempfile.TemporaryDirectory() as directory:
        tier = DiskTier(directory, budget, FP)
        parent_of: dict[bytes, bytes | None] = {}
        data: dict[bytes, torch.Tensor] = {}
        for n, (op, pick, numel, dtype) in enumerate(ops):
            stored = [k for k in parent_of if k in tier]
            if op == "put":
                key = _key(n)
                parent = stored[pick % len(stored)] if stored and pick % 4 else None
                block = _block(n, numel, torch.float32).clamp(-400, 400).to(dtype)
                ok = tier.put(key, parent, block)
                assert ok == (key in tier)
                if ok:
                    parent_of[key], data[key] = parent, block
                    if parent is not None:
                        assert parent in tier  # never evicted to make room for its child
            elif stored and op == "reput":
                key = stored[pick % len(stored)]
                assert tier.put(key, parent_of[key], data[key])
            elif parent_of:
                key = list(parent_of)[pick % len(parent_of)]
                held = key in tier
                got = tier.get(key)
                assert (got is not None) == held
                if got is not None:
                    assert torch.equal(_bits(got), _bits(data[key]))
            on_disk = [p for p in Path(directory).iterdir()]
            assert all(p.suffix == ".kv" for p in on_disk)  # no temp file left behind
            assert tier.nbytes == sum(p.stat().st_size for p in on_disk) <= budget
            for key in (k for k in parent_of if k in tier):
                walk = parent_of[key]
                while walk is not None:  # every ancestor of a stored entry is stored
                    assert walk in tier
                    walk = parent_of[walk]
        again = DiskTier(directory, budget, FP)
        assert again.nbytes == tier.nbytes
        assert all((k in again) == (k in tier) for k in parent_of)
        assert tier.stats["corrupt"] == again.stats["corrupt"] == 0


def _assert_disabled_after_one_warning(tier, kept: bytes) -> str:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not tier.put(_key(10), None, _block(10))
        assert not tier.put(_key(11), None, _block(11))
    assert len(caught) == 1 and issubclass(caught[0].category, RuntimeWarning)
    assert str(tier.directory) in str(caught[0].message)
    assert tier.stats["write_errors"] == 1 and tier.disabled  # the second put did not try
    assert torch.equal(_bits(tier.get(kept)), _bits(_block(0)))  # still served
    assert _key(10) not in tier and _key(11) not in tier
    return str(caught[0].message)


def test_full_disk_disables_puts_with_one_warning(tmp_path, monkeypatch):
    tier = DiskTier(tmp_path, 1 << 20, FP)
    assert tier.put(_key(0), None, _block(0))

    def no_space(fd, buffers):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "writev", no_space)
    assert "disk is full" in _assert_disabled_after_one_warning(tier, _key(0))
    assert [p.name for p in tmp_path.iterdir()] == [tier._path(_key(0)).name]  # temp removed


def test_read_only_directory_at_run_time(tmp_path):
    if not _chmod_binds(tmp_path):
        pytest.skip("directory permissions do not bind here (root)")
    tier = DiskTier(tmp_path / "kv", 1 << 20, FP)
    assert tier.put(_key(0), None, _block(0))
    os.chmod(tmp_path / "kv", 0o500)
    try:
        assert not os.access(tmp_path / "kv", os.W_OK)
        _assert_disabled_after_one_warning(tier, _key(0))
    finally:
        os.chmod(tmp_path / "kv", 0o700)


def test_directory_gone_at_run_time(tmp_path):
    """Works as root too: the directory is replaced by a regular file (ENOTDIR on write)."""
    tier = DiskTier(tmp_path / "kv", 1 << 20, FP)
    for path in (tmp_path / "kv").iterdir():
        path.unlink()
    (tmp_path / "kv").rmdir()
    (tmp_path / "kv").write_bytes(b"not a directory")
    with pytest.warns(RuntimeWarning, match="write failed"):
        assert not tier.put(_key(1), None, _block(1))
    assert tier.stats["write_errors"] == 1 and not tier.put(_key(2), None, _block(2))


def test_unwritable_directory_at_construction(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    directories = [blocker / "kv"]  # NotADirectoryError, root or not
    if _chmod_binds(tmp_path):
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        directories.append(locked / "kv")
    for directory in directories:
        with pytest.raises(ConfigError, match="kv_offload_dir") as err:
            DiskTier(directory, 1 << 20, FP)
        assert str(directory) in str(err.value)
    with pytest.raises(ConfigError):
        DiskTier(tmp_path / "ok", -1, FP)


def test_short_writes_still_write_whole_files(tmp_path, monkeypatch):
    """writev may write less than asked (a signal, a pipe-like filesystem): the rest is
    written on, and the block reads back whole."""
    real = os.writev

    def short(fd, buffers):
        return real(fd, [bytes(buffers[0][:1000])])  # at most 1000 bytes a call

    monkeypatch.setattr(os, "writev", short)
    tier = DiskTier(tmp_path, 1 << 20, FP)
    assert tier.put(_key(0), None, _block(0, numel=5000))  # 10000 bytes + the header
    monkeypatch.undo()
    again = DiskTier(tmp_path, 1 << 20, FP)  # (read from the file, not a cache)
    assert torch.equal(_bits(again.get(_key(0))), _bits(_block(0, numel=5000)))


def test_a_get_does_not_wait_for_a_put_writing_its_file(tmp_path, monkeypatch):
    """A put writes its file outside the tier's lock (its bytes reserved first): a get of
    another block returns while the write is held at a gate; the new key appears once its
    file is complete."""
    tier = DiskTier(tmp_path, 1 << 20, FP)
    assert tier.put(_key(0), None, _block(0))
    held = tier.nbytes
    gate, entered, real = threading.Event(), threading.Event(), tier._write

    def gated(key, header, payload):
        entered.set()
        if not gate.wait(60):
            raise OSError("the test never opened the gate")
        real(key, header, payload)

    monkeypatch.setattr(tier, "_write", gated)
    writer = threading.Thread(target=tier.put, args=(_key(1), _key(0), _block(1)))
    writer.start()
    assert entered.wait(60)
    got: list = []
    reader = threading.Thread(target=lambda: got.append(tier.get(_key(0))))
    reader.start()
    reader.join(timeout=10)
    finished = not reader.is_alive()
    gate.set()
    writer.join()
    reader.join()
    assert finished  # the get did not wait for the write
    assert torch.equal(_bits(got[0]), _bits(_block(0)))
    assert _key(1) in tier and tier.nbytes > held
