#!/usr/bin/env bash
# GPU checks for when a device machine is lent (see README "Benchmarks"). Runs on that
# machine's own python3 (PyTorch, Triton, numpy preinstalled; nothing is installed: no
# transformers, no gguf, no default model there) with the project on PYTHONPATH, within 8
# minutes: the steps run most valuable first, and a step that would start after DEADLINE
# seconds is skipped (said in the log). Results go to $OUT (or benchmarks/results), at most
# 8 files.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
OUT="${OUT:-benchmarks/results}"
DEADLINE="${DEADLINE:-420}"
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
status=0
start=$SECONDS

# step LIMIT LOG COMMAND...: run COMMAND under `timeout LIMIT`, appending to $OUT/LOG,
# unless the deadline has passed
step() {
    local limit=$1 log=$2
    shift 2
    if (( SECONDS - start > DEADLINE )); then
        echo "SKIPPED (deadline ${DEADLINE}s passed): $*" | tee -a "$OUT/$log"
        return
    fi
    echo "== $* (limit ${limit}s, at $((SECONDS - start))s)" | tee -a "$OUT/$log"
    timeout "$limit" "$@" 2>&1 | tee -a "$OUT/$log" | tail -25 || status=1
}
pytest_q=(python3 -m pytest -q -p no:cacheprovider -x)

# 1. The engine on the GPU (issue 22): the default model (or, where its file is absent, a
#    random model of its shapes) in bf16 with the Triton kernels and CUDA graphs against the
#    CPU fp32 path (top-1 >= 99 %); tiny random models of llama / qwen2 / qwen3 / mistral /
#    gemma3 in fp32 on the GPU against the native CPU path (graphs on and off).
step 150 gpu_engine.log "${pytest_q[@]}" tests/engine/test_gpu_engine.py
# 1b. The KV host tier of a GPU pool (issue 23): pinned host copies on a side stream, ordered
#     against the compute stream by events (spins make a missing wait visible), compact FP8
#     blocks encoded on the GPU equal to the CPU's, a tiny engine's prefix hits via the tier.
step 90 gpu_engine.log "${pytest_q[@]}" tests/kvcache/test_kv_tiers_cuda.py
# 2. The engine against plain torch on the same GPU (eager SDPA loop, torch.compile
#    reduce-overhead) on a model with Llama-3.1-8B's shapes: decode at batch 1/8/32/128 with %
#    of the HBM roofline, graphs on/off, prefill, paged attention GB/s, FP8 W8A8 vs bf16.
step 200 gpu_engine.log python3 benchmarks/bench_gpu.py --out "$OUT/gpu_engine.jsonl"
# 3. Every Triton kernel compiled for the GPU against its reference: the formats' quantize /
#    dequantize (bit for bit), the weight-only quantized linear and the engine's rows of it,
#    W8A8 FP8 through torch._scaled_mm, paged decode and varlen prefill attention, the
#    row-wise kernels (add + RMSNorm, RoPE, SiLU / GELU-mul), RoPE + KV store (FP8 codes bit
#    for bit), sampling, the compiler's Triton renderer and its groups in the engine (the
#    tests that build transformers models skip: the image has none).
step 200 kernels.log "${pytest_q[@]}" tests/formats/test_triton.py \
    tests/ops/test_linear_triton.py tests/ops/test_linear_triton_rows.py \
    tests/ops/test_linear_fp8.py tests/ops/test_paged_decode_triton.py \
    tests/ops/test_paged_prefill_triton.py tests/ops/test_pointwise_triton.py \
    tests/ops/test_rope_kv_store_triton.py tests/ops/test_sampling_triton.py \
    tests/compiler/test_codegen_triton.py tests/compiler/test_runtime_triton.py \
    tests/compiler/test_gemm_epilogue.py::test_triton_fused_gemm_equals_torch
# 4. Quantize / dequantize GB/s at 64M and 256M values: Triton vs device copy and HBM peak,
#    and vs the torch-eager codec at 64M.
step 90 formats_gpu.log python3 benchmarks/bench_formats_gpu.py --out "$OUT/formats_gpu.jsonl"
# 5. Performance model: calibrate the GPU's row from GEMM / copy / attention / launch
#    microbenchmarks (the h200 row's measured efficiencies).
step 90 calibrate_gpu.log python3 benchmarks/calibrate_gpu.py --out "$OUT"
# 6. The weight-only quantized linear's speed against F.linear in bf16.
step 90 kernels.log python3 benchmarks/bench_linear_triton.py --out "$OUT/linear_triton.jsonl"
echo "device check done in $((SECONDS - start)) s, status $status"
exit $status
