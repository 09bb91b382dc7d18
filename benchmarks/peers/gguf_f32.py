"""Write an all-F32 copy of a GGUF file: the same weights at infergen's precision, for llama.cpp
(or a Q8_0 copy: the same weights in llama.cpp's own 8-bit blocks, the peer of int8 weights).

Every metadata field (tokenizer, chat template, hyper-parameters) is copied as is, except
`general.file_type`, which becomes ALL_F32. Every tensor is dequantized to F32 with
`gguf.quants.dequantize` and written under its own name in the GGUF layout — Q/K rows stay in
llama.cpp's permuted rotary order, exactly as llama.cpp expects them.

The result is cached next to the peer virtualenv and regenerated only if missing (or if the
source file is newer).

Usage: python benchmarks/peers/gguf_f32.py SRC.gguf DST.gguf
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np


def write_f32_gguf(src: pathlib.Path, dst: pathlib.Path, qtype: str = "F32") -> pathlib.Path:
    """Dequantize `src` into `dst` (F32), or re-quantize its matrices to `qtype` ("Q8_0":
    llama.cpp's 8-bit blocks of 32, through `gguf.quants.quantize`; vectors stay F32).
    Returns dst. Writes to a temp file, then renames."""
    import gguf

    target = gguf.GGMLQuantizationType[qtype]
    file_type = {"F32": gguf.LlamaFileType.ALL_F32, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[qtype]

    reader = gguf.GGUFReader(str(src))
    arch_field = reader.fields[gguf.Keys.General.ARCHITECTURE]
    arch = arch_field.contents()
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_suffix(".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        # GGUF.* are virtual fields of the reader; the writer adds architecture itself.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name == gguf.Keys.General.FILE_TYPE:
            continue
        val_type = field.types[0]
        sub_type = field.types[-1] if val_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), val_type, sub_type=sub_type)
    writer.add_file_type(file_type)
    for tensor in reader.tensors:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        data = np.ascontiguousarray(data, dtype=np.float32)
        # numpy shape is the GGUF shape reversed; add_tensor reverses it back.
        if target == gguf.GGMLQuantizationType.F32 or data.ndim < 2:
            writer.add_tensor(tensor.name, data, raw_dtype=gguf.GGMLQuantizationType.F32)
        else:
            blocks = gguf.quants.quantize(data, target)
            writer.add_tensor(tensor.name, blocks, raw_dtype=target)  # shape from the bytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(dst)
    return dst


def cached_f32_gguf(src: pathlib.Path, cache_dir: pathlib.Path, qtype: str = "F32") -> pathlib.Path:
    """The F32 (or `qtype`) copy of `src` in `cache_dir`, written if missing or older."""
    dst = cache_dir / f"{src.stem}.{qtype}.gguf"
    if not dst.is_file() or dst.stat().st_mtime < src.stat().st_mtime:
        write_f32_gguf(src, dst, qtype)
    return dst


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(write_f32_gguf(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])))
