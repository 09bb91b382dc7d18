"""The engine's step trace (`Engine.on_step`, `infergen serve --step-trace`): every token the
requests needed is in exactly one step's chunks, steps respect the token budget, and the file
round-trips."""

from __future__ import annotations

import pytest

from infergen import LLM, SamplingParams
from infergen.engine.step_trace import StepTraceWriter, read
from tests.hf_models import build_hf_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny_llama_trace")
    build_hf_model("llama_gqa", directory)
    return str(directory)


def test_a_trace_accounts_for_every_token_once(model_dir, tmp_path):
    budget, new = 16, 5
    # distinct first tokens: no prefix-cache hits (a hit would skip a prompt's cached part)
    prompts = [list(range(start, start + n)) for start, n in ((1, 3), (80, 70), (160, 17))]
    llm = LLM(model_dir, max_num_batched_tokens=budget, block_size=4)
    writer = StepTraceWriter(tmp_path / "steps.jsonl")
    llm.engine.on_step = writer
    llm.generate(prompts, SamplingParams(max_tokens=new, temperature=0, ignore_eos=True))
    writer.close()
    steps = read(tmp_path / "steps.jsonl")
    # every prompt token and every generated token but the last is fed to exactly one step
    assert sum(n for s in steps for n, _ in s.chunks) == sum(len(p) + new - 1 for p in prompts)
    assert all(sum(n for n, _ in s.chunks) <= budget for s in steps)
    contexts = sorted({c for s in steps for _, c in s.chunks})
    assert contexts[-1] == 70 + new - 1  # the longest sequence's last step
    assert any(n > 1 for s in steps for n, _ in s.chunks)  # chunked prefill steps
    assert any(all(n == 1 for n, _ in s.chunks) for s in steps)  # decode-only steps
    assert all(s.forward_s > 0 and s.schedule_s >= 0 and s.after_s >= 0 for s in steps)
    assert [s.start for s in steps] == sorted(s.start for s in steps)


def test_cli_serve_has_the_step_trace_flag():
    from infergen.cli import build_parser

    args = build_parser().parse_args(["serve", "--step-trace", "t.jsonl"])
    assert args.step_trace == "t.jsonl"
