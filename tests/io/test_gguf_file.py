"""infergen's GGUF parser (io/gguf_file.py) against the gguf package's GGUFReader: every
metadata field (value and types), every tensor (name, ggml type, shape, sizes, offset, data)
equal — on the default model's GGUF and on a file written with every value type, plain and
block-quantized tensors and a non-default alignment; truncated and foreign files refused."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from infergen.errors import CheckpointError
from infergen.io.gguf import open_gguf
from infergen.io.gguf_file import GGUFFile

Q = gguf.GGMLQuantizationType


def _assert_same_as_reader(path) -> GGUFFile:
    ours, reader = GGUFFile(path), gguf.GGUFReader(str(path))
    # (the reader adds the header's counts as pseudo-fields "GGUF.*")
    keys = [key for key in reader.fields if not key.startswith("GGUF.")]
    assert list(ours.fields) == keys
    for key in keys:
        theirs = reader.fields[key]
        assert ours.fields[key].contents() == theirs.contents(), key
        assert [int(t) for t in ours.fields[key].types] == [int(t) for t in theirs.types], key
        assert len(ours.fields[key].data) == len(theirs.data), key
    assert ours.version == reader.fields["GGUF.version"].contents()
    assert len(ours.tensors) == len(reader.tensors)
    for a, b in zip(ours.tensors, reader.tensors, strict=True):
        assert (a.name, a.tensor_type, a.n_elements, a.n_bytes, a.data_offset) == (
            b.name, b.tensor_type, b.n_elements, b.n_bytes, b.data_offset
        )  # fmt: skip
        assert list(a.shape) == list(b.shape)
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(a.data, b.data), a.name
    return ours


def test_the_default_model_equals_the_reader(default_model_path):
    ours = _assert_same_as_reader(default_model_path)
    assert len(ours.fields["tokenizer.ggml.tokens"].contents()) > 1000


def _written(path, alignment: int | None = None):
    writer = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_uint8("t.u8", 200)
    writer.add_int8("t.i8", -100)
    writer.add_uint16("t.u16", 60000)
    writer.add_int16("t.i16", -30000)
    writer.add_uint32("t.u32", 4_000_000_000)
    writer.add_int32("t.i32", -2_000_000_000)
    writer.add_float32("t.f32", 0.1)
    writer.add_bool("t.bool", True)
    writer.add_string("t.str", "héllo ▁wörld")
    writer.add_uint64("t.u64", 2**63 + 5)
    writer.add_int64("t.i64", -(2**62))
    writer.add_float64("t.f64", 1e-300)
    writer.add_array("t.ints", [1, -2, 3])
    writer.add_array("t.floats", [0.5, -1.25])
    writer.add_array("t.strings", ["a", "", "ẞ", "tokens"])
    writer.add_array("t.bools", [True, False, True])
    writer.add_array("t.empty", [])
    rng = np.random.default_rng(0)
    writer.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    writer.add_tensor("f16", rng.standard_normal((7,)).astype(np.float16))
    writer.add_tensor("i32", np.arange(6, dtype=np.int32).reshape(2, 3))
    for qtype in (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.BF16):
        raw = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), qtype)
        writer.add_tensor(qtype.name.lower(), raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("alignment", [None, 64])
def test_every_value_type_and_tensor_kind(tmp_path, alignment):
    path = tmp_path / "all.gguf"
    _written(path, alignment)
    ours = _assert_same_as_reader(path)
    assert ours.fields["t.strings"].contents() == ["a", "", "ẞ", "tokens"]
    assert ours.fields["t.u64"].contents() == 2**63 + 5
    start = min(t.data_offset for t in ours.tensors)
    assert start % (alignment or 32) == 0
    q8 = next(t for t in ours.tensors if t.name == "q8_0")
    values = gguf.quants.dequantize(q8.data, q8.tensor_type)
    assert values.shape == (4, 64)


def test_truncated_and_foreign_files_are_refused(tmp_path):
    path = tmp_path / "all.gguf"
    _written(path)
    data = path.read_bytes()
    for cut in (3, 10, 30, len(data) // 2, len(data) - 1):
        broken = tmp_path / f"cut{cut}.gguf"
        broken.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match="not a readable GGUF"):
            open_gguf(broken)
    foreign = tmp_path / "foreign.gguf"
    foreign.write_bytes(b"PK\x03\x04" + data[4:])
    with pytest.raises(ValueError, match="magic"):
        GGUFFile(foreign)
