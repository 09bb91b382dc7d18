"""A GGUF file read in one pass: its metadata and tensor infos parsed with `struct` from a
memory map of the file, each numeric array as one numpy view, each tensor's data a numpy view
of the map — what the loaders read of `gguf.GGUFReader` (fields, `contents()`, tensors with
their ggml type, shape, sizes and data laid out as it lays them out), without its numpy
slicing per value: the default model's tokenizer (49k tokens, 48k merges) took 4.9 s to
parse that way, 0.1 s here.

The layout (GGUF v2 / v3, little-endian): "GGUF", version u32, tensor count u64, metadata
count u64; each metadata entry a key (string: u64 length + UTF-8 bytes), a value type u32 and
the value (an array: its item type u32, its count u64, the items); each tensor info its name,
its dimension count u32, the dimensions u64 each (ggml order: the fastest-varying first), its
ggml type u32 and its offset u64 within the data section, which starts at the first multiple of
`general.alignment` (32 when absent) after the infos.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32


class ValueType(IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# a scalar value type → its little-endian numpy dtype
SCALARS: dict[ValueType, np.dtype] = {
    ValueType.UINT8: np.dtype("<u1"),
    ValueType.INT8: np.dtype("<i1"),
    ValueType.UINT16: np.dtype("<u2"),
    ValueType.INT16: np.dtype("<i2"),
    ValueType.UINT32: np.dtype("<u4"),
    ValueType.INT32: np.dtype("<i4"),
    ValueType.FLOAT32: np.dtype("<f4"),
    ValueType.BOOL: np.dtype("?"),
    ValueType.UINT64: np.dtype("<u8"),
    ValueType.INT64: np.dtype("<i8"),
    ValueType.FLOAT64: np.dtype("<f8"),
}

# ggml types whose data is a plain numpy array of their elements (the rest: raw block bytes)
PLAIN_TENSORS: dict[GGMLQuantizationType, np.dtype] = {
    GGMLQuantizationType.F16: np.dtype("<f2"),
    GGMLQuantizationType.F32: np.dtype("<f4"),
    GGMLQuantizationType.F64: np.dtype("<f8"),
    GGMLQuantizationType.I8: np.dtype("<i1"),
    GGMLQuantizationType.I16: np.dtype("<i2"),
    GGMLQuantizationType.I32: np.dtype("<i4"),
    GGMLQuantizationType.I64: np.dtype("<i8"),
}


@dataclass(frozen=True)
class Field:
    """One metadata entry: `types` [its type] or [ARRAY, the item type]; `value` a Python
    scalar, str, or list of them."""

    name: str
    types: tuple[ValueType, ...]
    value: Any

    def contents(self) -> Any:
        return self.value

    @property
    def data(self) -> list:
        """The items (an array's; a scalar's one)."""
        return self.value if isinstance(self.value, list) else [self.value]


@dataclass(frozen=True)
class Tensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: np.ndarray  # ggml order (the fastest-varying dimension first), uint64
    n_elements: int
    n_bytes: int
    data_offset: int  # from the start of the file
    data: np.ndarray  # a read-only view of the file: elements, or block bytes per row


class _Cursor:
    """Reads the header and metadata in order from the file's bytes."""

    def __init__(self, raw: mmap.mmap):
        self.raw, self.at = raw, 0

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.raw, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.take("<Q")
        end = self.at + length
        if end > len(self.raw):
            raise ValueError(f"a string of {length} bytes runs past the end of the file")
        text = self.raw[self.at : end].decode("utf-8")
        self.at = end
        return text

    def value(self, kind: ValueType) -> Any:
        if kind is ValueType.STRING:
            return self.string()
        if kind is ValueType.ARRAY:
            item, count = ValueType(self.take("<I")), self.take("<Q")
            if item is ValueType.STRING:
                return [self.string() for _ in range(count)]
            if item is ValueType.ARRAY:
                return [self.value(ValueType.ARRAY) for _ in range(count)]
            dtype = SCALARS[item]
            items = np.frombuffer(self.raw, dtype, count, self.at).tolist()
            self.at += dtype.itemsize * count
            return items
        dtype = SCALARS[kind]
        item = np.frombuffer(self.raw, dtype, 1, self.at)[0].item()
        self.at += dtype.itemsize
        return item

    def field(self) -> Field:
        name, kind = self.string(), ValueType(self.take("<I"))
        start = self.at
        value = self.value(kind)
        types = (kind,)
        if kind is ValueType.ARRAY:
            types += (ValueType(struct.unpack_from("<I", self.raw, start)[0]),)
        return Field(name, types, value)


class GGUFFile:
    """The parsed file: `fields` (key → Field, in file order) and `tensors` (in file order).
    ValueError / struct.error for a file that is not a complete GGUF v2 / v3."""

    def __init__(self, path: str | Path):
        with open(path, "rb") as handle:
            self._raw = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        cursor = _Cursor(self._raw)
        if self._raw[:4] != MAGIC:
            raise ValueError(f"magic {bytes(self._raw[:4])!r}, expected {MAGIC!r}")
        cursor.at = 4
        self.version = cursor.take("<I")
        if self.version not in VERSIONS:
            raise ValueError(f"GGUF version {self.version}, expected one of {VERSIONS}")
        tensor_count, field_count = cursor.take("<Q"), cursor.take("<Q")
        self.fields: dict[str, Field] = {}
        for _ in range(field_count):
            field = cursor.field()
            self.fields[field.name] = field
        infos = []
        for _ in range(tensor_count):
            name = cursor.string()
            dims = [cursor.take("<Q") for _ in range(cursor.take("<I"))]
            infos.append((name, dims, GGMLQuantizationType(cursor.take("<I")), cursor.take("<Q")))
        alignment = self.fields.get("general.alignment")
        align = int(alignment.value) if alignment is not None else DEFAULT_ALIGNMENT
        start = -(-cursor.at // align) * align
        self.tensors = [self._tensor(start, *info) for info in infos]

    def _tensor(self, start: int, name: str, dims: list[int], kind, offset: int) -> Tensor:
        elements = int(np.prod(dims, dtype=np.int64)) if dims else 1
        block, block_bytes = GGML_QUANT_SIZES[kind]
        n_bytes = elements * block_bytes // block
        at = start + offset
        if at + n_bytes > len(self._raw):
            raise ValueError(f"tensor {name!r}: its {n_bytes} bytes run past the end of the file")
        shape = tuple(reversed(dims))
        dtype = PLAIN_TENSORS.get(kind)
        if dtype is not None:
            data = np.frombuffer(self._raw, dtype, elements, at).reshape(shape)
        else:
            byte_shape = quant_shape_to_byte_shape(shape, kind)
            data = np.frombuffer(self._raw, np.uint8, n_bytes, at).reshape(byte_shape)
        return Tensor(name, kind, np.array(dims, dtype=np.uint64), elements, n_bytes, at, data)
