#!/usr/bin/env bash
# Build the benchmark peers once into a cache outside the project and the test run,
# ${INFERGEN_PEERS_DIR:-$HOME/.cache/infergen/peers}; each part is independent, skipped once built:
#   llama-server      llama.cpp's own C++ llama-server and llama-bench (bench_serving.py), built
#                     with cmake from the llama.cpp sources vendored in the llama-cpp-python sdist
#                     of the pinned version into $PEERS/llama.cpp/bin (~11 min on 2 cores)
#   guidellm          a third-party load generator (crosscheck_guidellm.py), in its own venv
#   llama-cpp-python  its Python bindings (bench_generate.py, bench_quant.py): no wheel here,
#                     pip compiles llama.cpp from source (~15 min on 2 cores)
#   kvpress           NVIDIA's kvpress (KV presses on transformers' cache: bench_kv_press_peer.py)
#                     in its own venv: it needs transformers < 5.3 (ours is newer)
# Usage: bash benchmarks/setup_peers.sh [PART...]   (default: all four, in this order)
set -euo pipefail
PEERS="${INFERGEN_PEERS_DIR:-$HOME/.cache/infergen/peers}"
LLAMA_VENV="$PEERS/llama-cpp"
LLAMA_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
LLAMA_CPP="$PEERS/llama.cpp"
# llama.cpp's build number of a commit is its commit count, which the sdist (no .git) lacks: the
# known ones, from llama.cpp's release tags (bNNNN); an unknown commit builds as number 0
declare -A LLAMA_BUILD_NUMBERS=([0c1e57098]=11312)
GUIDELLM_VENV="$PEERS/guidellm"
GUIDELLM_VERSION="${GUIDELLM_VERSION:-0.8.1}"
KVPRESS_VENV="$PEERS/kvpress"
KVPRESS_VERSION="${KVPRESS_VERSION:-0.5.5}"
KVPRESS_TRANSFORMERS="${KVPRESS_TRANSFORMERS:-5.2.0}"
TMP_BUILD=""
trap 'rm -rf "$TMP_BUILD"' EXIT

build_llama_server() {
  local stamp="llama-cpp-python $LLAMA_VERSION sources"
  if [ -x "$LLAMA_CPP/bin/llama-server" ] && [ -x "$LLAMA_CPP/bin/llama-bench" ] \
    && [ "$(cat "$LLAMA_CPP/SOURCE" 2>/dev/null)" = "$stamp" ]; then
    echo "llama-server already built in $LLAMA_CPP/bin"
  else
    local tmp src commit number start
    start=$(date +%s)
    tmp="$(mktemp -d)" # outside any git checkout: llama.cpp's cmake would read its commit
    TMP_BUILD="$tmp"
    python3 -m pip download -q --no-binary :all: --no-deps -d "$tmp" \
      "llama-cpp-python==$LLAMA_VERSION"
    tar xzf "$tmp"/llama_cpp_python-"$LLAMA_VERSION".tar.gz -C "$tmp"
    src="$tmp/llama_cpp_python-$LLAMA_VERSION"
    # the vendored commit, from the sdist's changelog ("update llama.cpp to ...llama.cpp@HASH")
    commit="$(awk -v v="## [$LLAMA_VERSION]" '$0 == v {on = 1; next} on && /^## \[/ {exit}
      on && match($0, /llama\.cpp@[0-9a-f]+/) {print substr($0, RSTART + 10, RLENGTH - 10); exit}' \
      "$src/CHANGELOG.md")"
    number="${LLAMA_BUILD_NUMBERS[${commit:-none}]:-0}"
    # CPU only, native ISA, static (two self-contained binaries), no web UI (its prebuilt
    # assets would be downloaded), no TLS
    cmake -S "$src/vendor/llama.cpp" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release \
      -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
      -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
      -DLLAMA_BUILD_COMMIT="${commit:-unknown}" -DLLAMA_BUILD_NUMBER="$number" >"$tmp/cmake.log" \
      || { cat "$tmp/cmake.log"; return 1; }
    cmake --build "$tmp/build" --target llama-server llama-bench -j "$(nproc)"
    mkdir -p "$LLAMA_CPP/bin"
    install -m 755 "$tmp/build/bin/llama-server" "$tmp/build/bin/llama-bench" "$LLAMA_CPP/bin/"
    echo "$stamp" >"$LLAMA_CPP/SOURCE"
    rm -rf "$tmp"
    echo "llama-server built in $(($(date +%s) - start)) s"
  fi
  "$LLAMA_CPP/bin/llama-server" --version
  "$LLAMA_CPP/bin/llama-bench" --version
}

build_guidellm() {
  # torch pinned first (the local CPU wheel), then guidellm and its dependencies
  if ! "$GUIDELLM_VENV/bin/guidellm" --version 2>/dev/null | grep -q "$GUIDELLM_VERSION"; then
    mkdir -p "$PEERS"
    python3 -m venv "$GUIDELLM_VENV"
    "$GUIDELLM_VENV/bin/pip" install -q --upgrade pip
    "$GUIDELLM_VENV/bin/pip" install -q torch==2.13.0
    "$GUIDELLM_VENV/bin/pip" install -q "guidellm==$GUIDELLM_VERSION"
  fi
  "$GUIDELLM_VENV/bin/guidellm" --version
}

build_kvpress() {
  # torch pinned first (the local CPU wheel), then kvpress with the newest transformers it takes
  if ! "$KVPRESS_VENV/bin/python" -c "import kvpress, importlib.metadata as m; \
      assert m.version('kvpress') == '$KVPRESS_VERSION'" 2>/dev/null; then
    mkdir -p "$PEERS"
    python3 -m venv "$KVPRESS_VENV"
    "$KVPRESS_VENV/bin/pip" install -q --upgrade pip
    "$KVPRESS_VENV/bin/pip" install -q torch==2.13.0
    "$KVPRESS_VENV/bin/pip" install -q "kvpress==$KVPRESS_VERSION" \
      "transformers==$KVPRESS_TRANSFORMERS"
  fi
  "$KVPRESS_VENV/bin/python" -c "import importlib.metadata as m; \
    print('kvpress', m.version('kvpress'), 'transformers', m.version('transformers'))"
}

build_llama_cpp_python() {
  if [ -x "$LLAMA_VENV/bin/python" ] \
    && "$LLAMA_VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
    echo "llama-cpp-python already built in $LLAMA_VENV"
  else
    mkdir -p "$PEERS"
    python3 -m venv "$LLAMA_VENV"
    "$LLAMA_VENV/bin/pip" install -q --upgrade pip
    # Native CPU build (AVX2/FMA here); the build uses every core.
    CMAKE_ARGS="-DGGML_NATIVE=ON" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      "$LLAMA_VENV/bin/pip" install "llama-cpp-python==$LLAMA_VERSION"
  fi
  "$LLAMA_VENV/bin/python" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"
}

parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(llama-server guidellm llama-cpp-python kvpress)
for part in "${parts[@]}"; do
  case "$part" in
    llama-server) build_llama_server ;;
    guidellm) build_guidellm ;;
    llama-cpp-python) build_llama_cpp_python ;;
    kvpress) build_kvpress ;;
    *) echo "unknown part '$part' (llama-server, guidellm, llama-cpp-python, kvpress)" >&2
       exit 2 ;;
  esac
done
