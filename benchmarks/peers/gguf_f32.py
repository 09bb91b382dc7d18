"""Write an all-F32 copy of a GGUF file: the same weights at infergen's precision, for llama.cpp.

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


def write_f32_gguf(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
    """Dequantize `src` into `dst` (F32). Returns dst. Writes to a temp file, then renames."""
    import gguf

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
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for tensor in reader.tensors:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        data = np.ascontiguousarray(data, dtype=np.float32)
        # numpy shape is the GGUF shape reversed; add_tensor reverses it back.
        writer.add_tensor(tensor.name, data, raw_dtype=gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(dst)
    return dst


def cached_f32_gguf(src: pathlib.Path, cache_dir: pathlib.Path) -> pathlib.Path:
    """The F32 copy of `src` in `cache_dir`, written if missing or older than `src`."""
    dst = cache_dir / (src.stem + ".F32.gguf")
    if not dst.is_file() or dst.stat().st_mtime < src.stat().st_mtime:
        write_f32_gguf(src, dst)
    return dst


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(write_f32_gguf(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])))
