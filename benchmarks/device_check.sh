#!/usr/bin/env bash
# GPU checks for when a device machine is lent (see README "Benchmarks"). Runs on that
# machine's own python3 (PyTorch, Triton, numpy preinstalled; nothing is installed) with the
# project on PYTHONPATH, in well under 8 minutes. Results go to $OUT (or benchmarks/results).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-benchmarks/results}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
status=0

# 1. Every Triton kernel (and the public quantize / dequantize API on CUDA tensors, and the
#    torch reference codec on the GPU) bit-identical to the CPU reference, compiled for the
#    GPU (no interpreter).
TRITON_INTERPRET=0 timeout 300 python3 -m pytest -q -p no:cacheprovider \
    tests/formats/test_triton.py 2>&1 | tee "$OUT/device_tests.log" | tail -15 || status=1

# 2. Quantize / dequantize GB/s of fp32 input: Triton vs the torch-eager codec on the same
#    GPU, vs device copy and HBM peak.
TRITON_INTERPRET=0 timeout 200 python3 benchmarks/bench_formats_gpu.py \
    --out "$OUT/formats_gpu.jsonl" 2>&1 | tee "$OUT/formats_gpu.log" || status=1
# 3. Performance model: calibrate the GPU's row from GEMM / copy / attention / launch
#    microbenchmarks; the JSON line sets the measured efficiencies beside the table row's.
timeout 120 python3 benchmarks/calibrate_gpu.py --out "$OUT" 2>&1 | tee "$OUT/calibrate_gpu.log" || status=1
exit $status
