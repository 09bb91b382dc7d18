#!/usr/bin/env bash
# Build the benchmark peers once into a cached virtualenv outside the project and the test run.
# llama-cpp-python has no wheel here: pip compiles llama.cpp from source (~15 min on 2 cores).
# Usage: bash benchmarks/setup_peers.sh   (idempotent; re-running is a no-op once built)
set -euo pipefail
PEERS="${INFERGEN_PEERS_DIR:-$HOME/.cache/infergen/peers}"
LLAMA_VENV="$PEERS/llama-cpp"
LLAMA_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
# llama.cpp's OpenAI-compatible server (benchmarks/bench_serving.py): the [server] extras,
# pinned, installed next to the built package (no rebuild)
SERVER_DEPS="uvicorn==0.54.0 fastapi==0.165.0 pydantic-settings==2.16.3 sse-starlette==3.7.0 starlette-context==0.3.6 PyYAML==6.0.4"
# guidellm (a third-party load generator; benchmarks/crosscheck_guidellm.py) in its own
# virtualenv: torch pinned first (the local CPU wheel), then guidellm and its dependencies
GUIDELLM_VENV="$PEERS/guidellm"
GUIDELLM_VERSION="${GUIDELLM_VERSION:-0.8.1}"
if ! "$GUIDELLM_VENV/bin/guidellm" --version 2>/dev/null | grep -q "$GUIDELLM_VERSION"; then
  mkdir -p "$PEERS"
  python3 -m venv "$GUIDELLM_VENV"
  "$GUIDELLM_VENV/bin/pip" install -q --upgrade pip
  "$GUIDELLM_VENV/bin/pip" install -q torch==2.13.0
  "$GUIDELLM_VENV/bin/pip" install -q "guidellm==$GUIDELLM_VERSION"
fi
"$GUIDELLM_VENV/bin/guidellm" --version
if [ -x "$LLAMA_VENV/bin/python" ] && "$LLAMA_VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
  echo "llama-cpp-python already built in $LLAMA_VENV"
  "$LLAMA_VENV/bin/python" -c "import uvicorn, sse_starlette, starlette_context" 2>/dev/null \
    || "$LLAMA_VENV/bin/pip" install -q $SERVER_DEPS
  exit 0
fi
mkdir -p "$PEERS"
python3 -m venv "$LLAMA_VENV"
"$LLAMA_VENV/bin/pip" install -q --upgrade pip
# Native CPU build (AVX2/FMA here); the build uses every core.
CMAKE_ARGS="-DGGML_NATIVE=ON" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
  "$LLAMA_VENV/bin/pip" install "llama-cpp-python==$LLAMA_VERSION"
"$LLAMA_VENV/bin/python" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"
"$LLAMA_VENV/bin/pip" install -q $SERVER_DEPS
