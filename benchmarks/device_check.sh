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

# 0. The engine on the GPU (issue 22): the default model in bf16 (Triton kernels, CUDA graphs)
#    vs the CPU fp32 path (top-1 >= 99 %), the tiny-model grid in fp32 vs the native CPU path
#    (graphs on and off); then the engine against plain torch (eager and torch.compile) on a
#    model with Llama-3.1-8B's shapes: decode at batch 1/8/32/128 with % of the HBM roofline,
#    prefill, paged attention GB/s, graphs on/off, FP8 W8A8 vs bf16 projections.
TRITON_INTERPRET=0 timeout 170 python3 -m pytest -q -p no:cacheprovider \
    tests/engine/test_gpu_engine.py 2>&1 | tee "$OUT/gpu_engine.log" | tail -15 || status=1
TRITON_INTERPRET=0 timeout 240 python3 benchmarks/bench_gpu.py \
    --out "$OUT/gpu_engine.jsonl" 2>&1 | tee -a "$OUT/gpu_engine.log" | tail -30 || status=1

# 1. Every Triton kernel (and the public quantize / dequantize API on CUDA tensors, and the
#    torch reference codec on the GPU) bit-identical to the CPU reference, compiled for the
#    GPU (no interpreter).
TRITON_INTERPRET=0 timeout 300 python3 -m pytest -q -p no:cacheprovider \
    tests/formats/test_triton.py 2>&1 | tee "$OUT/device_tests.log" | tail -15 || status=1

# 2. Quantize / dequantize GB/s of fp32 input at 64M and 256M values (~30 s): Triton vs
#    device copy and HBM peak, and vs the torch-eager codec on the same GPU at 64M.
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
#    With them, the engine's rows of those kernels (ops/linear_triton_rows.py: products and
#    rows against the CPU rows, the load-time fallback, W8A8 FP8) and W8A8 FP8 through
#    torch._scaled_mm (ops/linear_fp8.py) on the GPU against the float64 product.
TRITON_INTERPRET=0 timeout 150 python3 -m pytest -q -p no:cacheprovider \
    tests/ops/test_linear_triton.py tests/ops/test_linear_triton_rows.py \
    tests/ops/test_linear_fp8.py 2>&1 | tee "$OUT/linear_triton.log" | tail -15 || status=1
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
#    row-wise Triton kernels (ops/pointwise_triton.py: add + RMSNorm, RoPE, SiLU-mul,
#    GELU-mul, bf16 too), RoPE + KV store (ops/rope_kv_store_triton.py: engine-dtype caches,
#    FP8 E4M3 codes bit for bit) and the sampling kernel (ops/sampling_triton.py: processed
#    logits bit-identical, tokens = the reference's, frequencies over every seed), compiled
#    for the GPU (appended to the compiler log: $OUT holds at most 8 files).
TRITON_INTERPRET=0 timeout 180 python3 -m pytest -q -p no:cacheprovider \
    tests/ops/test_paged_decode_triton.py tests/ops/test_paged_prefill_triton.py \
    tests/ops/test_pointwise_triton.py tests/ops/test_rope_kv_store_triton.py \
    tests/ops/test_sampling_triton.py 2>&1 \
    | tee -a "$OUT/compiler_triton.log" | tail -15 || status=1
exit $status
