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
# 4. Weight-only quantized linear (ops/linear_triton.py), every weight format compiled for the
#    GPU: equal to the reference (the CPU backends' weight read back bit for bit, products
#    within fp32 rounding; the GGUF formats skip, the image has no gguf package), then its
#    speed against torch F.linear in bf16 at decode / prefill token counts for the default
#    model's projection shapes (one log for both: $OUT holds at most 8 files).
TRITON_INTERPRET=0 timeout 120 python3 -m pytest -q -p no:cacheprovider \
    tests/ops/test_linear_triton.py 2>&1 | tee "$OUT/linear_triton.log" | tail -15 || status=1
TRITON_INTERPRET=0 timeout 150 python3 benchmarks/bench_linear_triton.py \
    --out "$OUT/linear_triton.jsonl" 2>&1 | tee -a "$OUT/linear_triton.log" || status=1
# 5. The compiler's Triton renderer (compiler/codegen_triton.py): every primitive and every
#    fused pointwise group of every architecture (where transformers is installed to build
#    them), compiled for the GPU, against the reference interpreter.
TRITON_INTERPRET=0 timeout 120 python3 -m pytest -q -p no:cacheprovider \
    tests/compiler/test_codegen_triton.py 2>&1 | tee "$OUT/compiler_triton.log" | tail -15 || status=1
# 6. Paged decode and varlen prefill attention in Triton (ops/paged_decode_triton.py,
#    ops/paged_prefill_triton.py): the grids against the float64 oracle (GQA ratios, head
#    dims, windows + sinks, splits, chunked prefill after prefix hits, soft-capping), the
#    row-wise Triton kernels (ops/pointwise_triton.py: add + RMSNorm, RoPE, SiLU-mul, bf16
#    too) and the sampling kernel (ops/sampling_triton.py: processed logits bit-identical,
#    tokens = the reference's, frequencies over every seed), and the compiled layers with the
#    Triton kernel set (compile="jit" / "eager", kernels="triton": fused groups as Triton
#    kernels, fp32, against the torch kernels on the CPU; skipped without transformers),
#    compiled for the GPU (appended to the compiler log: $OUT holds at most 8 files).
TRITON_INTERPRET=0 timeout 240 python3 -m pytest -q -p no:cacheprovider \
    tests/ops/test_paged_decode_triton.py tests/ops/test_paged_prefill_triton.py \
    tests/ops/test_pointwise_triton.py tests/ops/test_sampling_triton.py \
    tests/compiler/test_runtime_triton.py 2>&1 \
    | tee -a "$OUT/compiler_triton.log" | tail -15 || status=1
exit $status
