"""`DiskTier`: KV blocks in files on a local disk within a byte budget (issue 23, items 1, 4).

One file per block in `directory`, named `<key hex>-<tag>.kv`, where `tag` is the first 8 bytes
of BLAKE2b(fingerprint) in hex: the key (a chained block hash, kvcache/prefix.py) covers only
token ids, so two models sharing the directory would otherwise write the same name.

File format, version 2 (all integers little-endian):

    offset  size        field
    0       4           magic b"IGKV"
    4       2           u16 version (2)
    6       4           u32 header_len: bytes from offset 0 to the payload (the header checksum
                        too)
    10      1 + k       u8 key length, key bytes (16, or 20 for a cache group's key)
    …       1 + p       u8 parent length (0: a chain's first block), parent bytes
    …       2 + f       u16 fingerprint length, fingerprint (UTF-8)
    …       1 + d       u8 dtype name length, dtype name (ASCII, e.g. "float8_e4m3fn")
    …       1 + 8·n     u8 ndim, n × u64 shape
    …       8           u64 payload_len (= numel × element size)
    …       8           u64 XXH3-64 of the payload
    …       8           u64 XXH3-64 of the header bytes before it
    header_len          payload_len bytes: the tensor's bytes (contiguous, viewed as uint8)

Checksum: XXH3-64 (the xxhash package), ~47 GB/s on one core here against zlib's CRC32 at
4.7 GB/s: 0.016 ms instead of 0.16 ms per 737 KB block, paid on every write and every read
(version 1 used CRC32; its files are another version's: skipped). A flipped bit, a truncated or
a foreign payload changes it (a 64-bit hash: a random corruption passes with probability 2^-64).

Atomicity: a block is written to `.<name>.<pid>.<random>.tmp` in the same directory (one
writev), then `os.replace`d onto its name, so a final name always holds a complete file. A
process killed mid-write leaves only a temp file; a later start removes the temp files of its
fingerprint whose writer is no longer running (or that are older than STALE_TEMP_S). No
fsync: what a process wrote survives the process (the kernel writes it back), and a cache
needs no durability beyond that — a machine crash may leave a final name with lost contents,
which the payload's checksum catches (the block is recomputed). An fsync cost 0.8–1.3 ms per 737 KB
block here, on the engine thread, for every block written through.

Persistence: a new tier on the same directory with the same fingerprint indexes the existing
files at start (headers only; recency = the files' write times). Files of another fingerprint
are skipped and never deleted: another model's cache may share the directory.

Eviction: `nbytes` (header + payload of every file) never exceeds `budget_bytes`. The least
recently used LEAF goes first: an entry that is the parent of a stored entry is not evicted
while that child remains, so no prefix is lost while a longer entry depending on it remains;
the parent of the block being stored is kept too. When nothing can be evicted, `put` is False.
Putting a key the tier holds only refreshes its recency (a key names its contents).

I/O faults (never an exception, never wrong data): a write that fails (disk full, directory made
read-only at run time, …) makes `put` False, counts `write_errors`, warns once, and disables
puts for good (`get` still serves what the tier holds). A payload whose checksum does not match, a
truncated file or a malformed header makes `get` None; the file is deleted and counted in
`corrupt`. A file that cannot be read, or of another format version, is a miss and leaves
the index (the file stays). A tier of one directory and fingerprint per process: two would
keep separate budgets.

Threads: the engine thread puts, the KV tiers' background loader (tiers/loader.py) gets. The
index, the eviction order and the counters change under one lock; a get reads and checks its
file outside it (the slow part), so a put never waits for a read, and a put writes its file
outside it too (room made and its bytes reserved first; the key is in the index once the file
is complete), so a get never waits for a write (the write-through worker, writer.py, puts while
the loader reads). A file evicted while it is
being read is a miss; a read whose entry was replaced meanwhile leaves the new entry alone.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import math
import os
import secrets
import struct
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import xxhash

from infergen.errors import ConfigError
from infergen.kvcache.tiers.leaf_lru import LeafLRU

MAGIC = b"IGKV"
VERSION = 2
SUFFIX = ".kv"
TEMP_SUFFIX = ".tmp"
STALE_TEMP_S = 600.0  # a temp file this old is a dead writer's, whatever its pid says
MAX_KEY_BYTES = 64
MAX_FINGERPRINT_BYTES = 4096
_PREFIX = struct.Struct("<4sHI")  # magic, version, header_len
_MAX_HEADER = 1 << 16


_checksum = xxhash.xxh3_64_intdigest  # of a bytes-like object; releases the GIL
_SUM = struct.Struct("<Q")


class CorruptFile(Exception):
    """A block file whose header or payload does not check out."""


class ForeignFile(Exception):
    """A block file of another format version or fingerprint: not read, never deleted."""


@dataclass(slots=True)
class _Entry:
    parent: bytes | None
    size: int  # file bytes: header + payload


@dataclass(frozen=True, slots=True)
class Header:
    key: bytes
    parent: bytes | None
    fingerprint: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    payload_len: int
    payload_sum: int
    header_len: int


def encode_header(
    key: bytes, parent: bytes | None, fingerprint: str, data: torch.Tensor, payload_sum: int
) -> bytes:
    dtype = str(data.dtype).removeprefix("torch.").encode("ascii")
    fp = fingerprint.encode()
    parent = parent or b""
    body = b"".join(
        [
            struct.pack("<B", len(key)) + key,
            struct.pack("<B", len(parent)) + parent,
            struct.pack("<H", len(fp)) + fp,
            struct.pack("<B", len(dtype)) + dtype,
            struct.pack(f"<B{data.dim()}Q", data.dim(), *data.shape),
            struct.pack("<QQ", data.numel() * data.element_size(), payload_sum),
        ]
    )
    head = _PREFIX.pack(MAGIC, VERSION, _PREFIX.size + len(body) + _SUM.size) + body
    return head + _SUM.pack(_checksum(head))


def read_header(f) -> Header:
    """Parse the header at the start of open file `f` (left at the payload's start)."""
    prefix = f.read(_PREFIX.size)
    if len(prefix) < _PREFIX.size:
        raise CorruptFile("truncated header")
    magic, version, header_len = _PREFIX.unpack(prefix)
    if magic == MAGIC and version != VERSION:
        raise ForeignFile(f"IGKV version {version}")
    if magic != MAGIC or not _PREFIX.size + _SUM.size < header_len <= _MAX_HEADER:
        raise CorruptFile("not an IGKV file")
    rest = f.read(header_len - _PREFIX.size)
    if len(rest) < header_len - _PREFIX.size:
        raise CorruptFile("truncated header")
    body, (check,) = rest[: -_SUM.size], _SUM.unpack(rest[-_SUM.size :])
    if _checksum(prefix + body) != check:
        raise CorruptFile("header checksum mismatch")
    pos = 0

    def take(fmt: str) -> tuple:
        nonlocal pos
        values = struct.unpack_from(fmt, body, pos)
        pos += struct.calcsize(fmt)
        return values

    def take_bytes(n: int) -> bytes:
        nonlocal pos
        pos += n
        return bytes(body[pos - n : pos])

    try:
        key = take_bytes(*take("<B"))
        parent = take_bytes(*take("<B")) or None
        fingerprint = take_bytes(*take("<H")).decode()
        dtype = getattr(torch, take_bytes(*take("<B")).decode("ascii"), None)
        (ndim,) = take("<B")
        shape = take(f"<{ndim}Q")
        payload_len, payload_sum = take("<QQ")
    except (struct.error, UnicodeDecodeError) as err:
        raise CorruptFile(f"malformed header: {err}") from err
    if pos != len(body) or not isinstance(dtype, torch.dtype):
        raise CorruptFile("malformed header")
    if math.prod(shape) * dtype.itemsize != payload_len:
        raise CorruptFile("payload length does not match dtype and shape")
    return Header(key, parent, fingerprint, dtype, shape, payload_len, payload_sum, header_len)


class DiskTier:
    name = "disk"
    in_memory = False  # a load is file I/O + a checksum: in the background (tiers/loader.py)

    def __init__(self, directory: str | Path, budget_bytes: int, fingerprint: str):
        if budget_bytes < 0:
            raise ConfigError("the disk tier's budget must be >= 0 bytes", found=budget_bytes)
        if len(fingerprint.encode()) > MAX_FINGERPRINT_BYTES:
            raise ConfigError(
                f"the KV fingerprint is longer than {MAX_FINGERPRINT_BYTES} bytes",
                found=fingerprint[:80] + "…",
            )
        self.directory = Path(directory)
        self.budget_bytes = budget_bytes
        self.fingerprint = fingerprint
        self.tag = hashlib.blake2b(fingerprint.encode(), digest_size=8).hexdigest()
        self.stats = dict(hits=0, misses=0, puts=0, evictions=0, corrupt=0, bytes_read=0,
                          bytes_written=0, write_errors=0)  # fmt: skip
        self.disabled = False  # set by the first write error: puts stop, gets go on
        self._index: dict[bytes, _Entry] = {}
        self._order = LeafLRU()  # least recently used leaves first (leaf_lru.py)
        self._nbytes = 0  # the stored files' bytes and those being written (reserved)
        self._writing: set[bytes] = set()  # keys whose file a put writes (outside the lock)
        self._lock = threading.Lock()  # the index, the order, the counters (see Threads)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            probe = self.directory / f".probe-{os.getpid()}-{secrets.token_hex(4)}{TEMP_SUFFIX}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as err:
            raise ConfigError(
                f"cannot write the KV offload directory {str(self.directory)!r}",
                where="kv_offload_dir",
                found=f"{type(err).__name__}: {err}",
                expected="a writable directory (created if missing)",
            ) from err
        self._scan()

    # --- the tier interface -----------------------------------------------------------------

    def __contains__(self, key: bytes) -> bool:
        return key in self._index

    @property
    def nbytes(self) -> int:
        """Bytes of the stored files (headers included)."""
        return self._nbytes

    def put(self, key: bytes, parent: bytes | None, data: torch.Tensor) -> bool:
        """Store a copy of `data` (any dtype and shape) under `key`, after `parent` in its
        chain; False when it cannot be stored (over the budget, tier disabled, write error)."""
        _check_key(key, "key")
        if parent is not None:
            _check_key(parent, "parent")
        if parent == key:
            parent = None
        with self._lock:
            if self.disabled:
                return False
            if key in self._index:
                self._order.touch(key)
                return True
        flat = data.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
        header = encode_header(key, parent, self.fingerprint, data, _checksum(flat))
        size = len(header) + flat.nbytes
        with self._lock:
            if not self._reserve(key, parent, size):
                return key in self._index or key in self._writing
            self._writing.add(key)
        try:  # the file is written outside the lock: gets and other puts go on meanwhile
            self._write(key, header, flat)
        except OSError as err:
            with self._lock:
                self._writing.discard(key)
                self._nbytes -= size
                self._order.unlink(key, parent)
                self._fault(err)
            return False
        with self._lock:
            self._writing.discard(key)
            self._index[key] = _Entry(parent, size)
            self._order.add(key, parent)
            self.stats["puts"] += 1
            self.stats["bytes_written"] += size
        return True

    def _reserve(self, key: bytes, parent: bytes | None, size: int) -> bool:
        """Under the lock: make room for `size` more bytes (least recently used leaves first)
        and count them, `key` linked under `parent`; False (nothing reserved) when the tier
        holds or writes `key` already (then refreshed), is disabled, or has no room."""
        if key in self._index:
            self._order.touch(key)
            return False
        if key in self._writing or self.disabled or size > self.budget_bytes:
            return False
        self._order.link(key, parent)  # the parent is no leaf now: never evicted for `key`
        try:
            while self._nbytes + size > self.budget_bytes:
                victim = self._order.victim()
                if victim is None:
                    self._order.unlink(key, parent)
                    return False
                self._evict(victim)
        except OSError as err:
            self._order.unlink(key, parent)
            self._fault(err)
            return False
        self._nbytes += size  # reserved: the file is written next, outside the lock
        return True

    def get(self, key: bytes) -> torch.Tensor | None:
        """The stored tensor (same dtype and shape), or None: absent, corrupt (the file is
        deleted), truncated, of another fingerprint, or unreadable."""
        with self._lock:
            entry = self._index.get(key)
            if entry is None:
                self.stats["misses"] += 1
                return None
        path = self._path(key)
        corrupt = False
        try:  # outside the lock: the read and its checksum are the slow part
            header, payload = self._read(path, key, entry.parent)
        except CorruptFile:
            corrupt, payload = True, None
        except (OSError, ForeignFile):  # unreadable, gone (evicted meanwhile), or not ours
            payload = None
        with self._lock:
            current = self._index.get(key) is entry  # not evicted or replaced meanwhile
            if payload is None:
                if current:
                    if corrupt:
                        with contextlib.suppress(OSError):
                            path.unlink()
                    self._drop(key)
                self.stats["corrupt"] += corrupt
                self.stats["misses"] += 1
                return None
            if current:
                self._order.touch(key)
            self.stats["hits"] += 1
            self.stats["bytes_read"] += header.header_len + header.payload_len
        if not payload:
            return torch.empty(header.shape, dtype=header.dtype)
        raw = torch.frombuffer(payload, dtype=torch.uint8)
        return raw.view(header.dtype).reshape(header.shape)

    def touch(self, key: bytes) -> None:
        """`key` is about to be read: the most recently used entry (not evicted first)."""
        with self._lock:
            if key in self._order:
                self._order.touch(key)

    def discard(self, key: bytes) -> None:
        """Forget `key` (its file removed): a one-time entry that was used (a swapped-out
        sequence's partial block)."""
        with self._lock:
            if key in self._index:
                with contextlib.suppress(FileNotFoundError):
                    self._path(key).unlink()
                self._drop(key)

    # --- files ------------------------------------------------------------------------------

    def _path(self, key: bytes) -> Path:
        return self.directory / f"{key.hex()}-{self.tag}{SUFFIX}"

    def _read(self, path: Path, key: bytes, parent: bytes | None) -> tuple[Header, bytearray]:
        with open(path, "rb") as f:
            header = read_header(f)
            if header.fingerprint != self.fingerprint:
                raise ForeignFile("another fingerprint")  # a tag collision
            if header.key != key or header.parent != parent:
                raise CorruptFile("the header names another block")
            payload = bytearray(header.payload_len)
            if f.readinto(payload) != header.payload_len or f.read(1):
                raise CorruptFile("the payload's length does not match the header")
        if _checksum(payload) != header.payload_sum:
            raise CorruptFile("payload checksum mismatch")
        return header, payload

    def _write(self, key: bytes, header: bytes, payload) -> None:
        final = self._path(key)
        temp = final.with_name(f".{final.name}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                _write_all(fd, [memoryview(header), memoryview(payload).cast("B")])
            finally:
                os.close(fd)
            os.replace(temp, final)
        except OSError:
            with contextlib.suppress(OSError):
                temp.unlink()
            raise

    def _fault(self, err: OSError) -> None:
        self.stats["write_errors"] += 1
        if not self.disabled:
            self.disabled = True
            reason = "the disk is full" if err.errno == errno.ENOSPC else f"{err}"
            warnings.warn(
                f"KV disk tier {str(self.directory)!r}: a write failed ({reason}); no more "
                "blocks are stored there (those it holds are still served)",
                RuntimeWarning,
                stacklevel=4,
            )

    def _scan(self) -> None:
        """Index this fingerprint's files (headers only); remove dead writers' temp files."""
        found: list[tuple[int, bytes, Header, int]] = []
        ours = f"-{self.tag}{SUFFIX}"
        for path in self.directory.iterdir():
            name = path.name
            if name.endswith(TEMP_SUFFIX) and ours in name:
                self._remove_stale_temp(path)
                continue
            if not name.endswith(ours) or name.startswith("."):
                continue
            try:
                key = bytes.fromhex(name[: -len(ours)])
                with open(path, "rb") as f:
                    stat = os.fstat(f.fileno())
                    header = read_header(f)
            except (ValueError, ForeignFile):
                continue  # not a name this tier writes, or another version's file
            except CorruptFile:
                self._delete_corrupt(path)
                continue
            except OSError:
                continue
            if header.fingerprint != self.fingerprint:
                continue  # another model's block (a tag collision): not ours to delete
            if header.key != key or stat.st_size != header.header_len + header.payload_len:
                self._delete_corrupt(path)
                continue
            found.append((stat.st_mtime_ns, key, header, stat.st_size))
        for _, key, header, size in sorted(found, key=lambda item: item[0]):
            self._order.link(key, header.parent)
            self._index[key] = _Entry(header.parent, size)
            self._order.add(key, header.parent)  # oldest write first: the least recently used
            self._nbytes += size
        try:
            while self._nbytes > self.budget_bytes and (victim := self._order.victim()) is not None:
                self._evict(victim)
        except OSError as err:
            self._fault(err)

    def _remove_stale_temp(self, path: Path) -> None:
        try:
            pid = int(path.name.rsplit(".", 3)[-3])
        except (ValueError, IndexError):
            pid = None
        with contextlib.suppress(OSError):
            old = time.time() - path.stat().st_mtime > STALE_TEMP_S
            if old or pid is None or not _running(pid):
                path.unlink()

    def _delete_corrupt(self, path: Path) -> None:
        with contextlib.suppress(OSError):
            path.unlink()
        self.stats["corrupt"] += 1

    def _drop(self, key: bytes) -> None:
        entry = self._index.pop(key)
        self._nbytes -= entry.size
        self._order.remove(key)

    def _evict(self, key: bytes) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()  # any other OSError: a write fault, the entry stays
        self._drop(key)
        self.stats["evictions"] += 1


def _write_all(fd: int, buffers: list[memoryview]) -> None:
    """Write every byte of `buffers` to `fd` (writev until done; a short write goes on)."""
    while buffers:
        written = os.writev(fd, buffers)
        while buffers and written >= len(buffers[0]):
            written -= len(buffers[0])
            buffers.pop(0)
        if buffers:
            buffers[0] = buffers[0][written:]


def _check_key(key: object, what: str) -> None:
    if not isinstance(key, bytes) or not 0 < len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"the disk tier's {what} must be 1 to {MAX_KEY_BYTES} bytes: {key!r}")


def _running(pid: int) -> bool:
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError, ValueError):
        return False
    except PermissionError:
        return True  # another user's process
    return True
