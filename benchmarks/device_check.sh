#!/usr/bin/env bash
# GPU checks for when a device machine is lent (see README "Benchmarks"). Runs on that
# machine's own python3 (PyTorch, Triton, numpy preinstalled; nothing is installed) with the
# project on PYTHONPATH, in well under 8 minutes. Results go to $OUT (or benchmarks/results).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-benchmarks/results}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true

# 1. Triton MX kernels on the GPU, bit-identical to the CPU reference (no interpreter).
TRITON_INTERPRET=0 timeout 240 python3 -m pytest -q -p no:cacheprovider \
    tests/formats/test_triton.py 2>&1 | tail -5 || echo "triton tests failed"

# 2. Quantize / dequantize GB/s of fp32 input against the HBM bandwidth (H200: 4.8 TB/s).
TRITON_INTERPRET=0 timeout 180 python3 - "$OUT/formats_gpu.jsonl" <<'PY'
import json, sys, torch, triton
from infergen.formats import FORMATS
from infergen.formats import triton_kernels as tk
x = torch.randn(8192, 8192, device="cuda")
blocks = x.view(-1, 32)
lines = []
for fmt in [n for n in FORMATS if FORMATS.get(n).scaling == "e8m0"]:
    et = FORMATS.get(fmt).element_type
    ms_q = triton.testing.do_bench(lambda: tk.mx_quantize(blocks, et, "floor"))
    codes, scales = tk.mx_quantize(blocks, et, "floor")
    ms_d = triton.testing.do_bench(lambda: tk.mx_dequantize(codes, scales, et))
    for op, ms in (("quantize", ms_q), ("dequantize", ms_d)):
        gbs = x.numel() * 4 / ms / 1e6
        line = {"bench": "formats_gpu", "kind": "result", "metric": f"{op}_gb_s_{fmt}",
                "engine": "infergen-triton", "value": gbs, "unit": "GB/s",
                "fraction_of_hbm": gbs / 4800.0, "device": torch.cuda.get_device_name()}
        lines.append(line)
        print(f"{fmt:<12} {op:<10} {gbs:8.0f} GB/s  {100 * gbs / 4800:5.1f}% of HBM")
g = x.abs().max() / 2688.0
ms = triton.testing.do_bench(lambda: tk.nvfp4_quantize(x.view(-1, 16), g))
gbs = x.numel() * 4 / ms / 1e6
lines.append({"bench": "formats_gpu", "kind": "result", "metric": "quantize_gb_s_nvfp4",
              "engine": "infergen-triton", "value": gbs, "unit": "GB/s",
              "fraction_of_hbm": gbs / 4800.0, "device": torch.cuda.get_device_name()})
print(f"{'nvfp4':<12} {'quantize':<10} {gbs:8.0f} GB/s  {100 * gbs / 4800:5.1f}% of HBM")
open(sys.argv[1], "w").write("".join(json.dumps(l) + "\n" for l in lines))
PY
