"""`infergen predict`: the JSON fields the issue names, --explain, --sweep (table and PNG), TP
and clear errors."""

from __future__ import annotations

import json
import re

import pytest

from infergen.cli import main
from infergen.io.model_config import read_model_config
from infergen.perf.measured_acceptance import chain_acceptance

LLAMA_70B = "tests/perf/configs/llama-3.1-70b.json"
GPT_OSS = "tests/perf/configs/gpt-oss-20b.json"
GPT_OSS_120B = "tests/perf/configs/gpt-oss-120b.json"


def run_json(capsys, *argv) -> dict:
    assert main(["predict", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_has_the_fields_and_tp_halves_the_weights_per_device(capsys):
    argv = ["-m", LLAMA_70B, "--gpu", "h200", "--weights", "fp8_e4m3", "--kv", "fp8_e4m3"]
    argv += ["--isl", "1000", "--osl", "100", "--num-requests", "32", "--concurrency", "8"]
    one = run_json(capsys, *argv)
    two = run_json(capsys, *argv, "--tp", "2")
    for key in ("params_total", "params_active", "weight_bytes", "kv_bytes_per_token"):
        assert one[key] == two[key] > 0
    assert set(one["ttft_ms"]) >= {"mean", "p50", "p90", "p99"}
    assert two["memory_per_device"]["weights"] == pytest.approx(
        one["memory_per_device"]["weights"] / 2
    )
    assert two["itl_ms"]["mean"] < one["itl_ms"]["mean"]  # half the weights to stream each
    assert two["gpus"] == 2 and two["cost_per_mtok_usd"] > 0
    assert one["max_concurrency"] >= 1


def test_moe_with_mxfp4_experts_and_expert_parallelism(capsys):
    base = ["-m", GPT_OSS, "--isl", "256", "--osl", "32", "--num-requests", "16"]
    bf16 = run_json(capsys, *base, "--expert-weights", "bf16")
    mx = run_json(capsys, *base, "--expert-weights", "mxfp4")
    assert mx["weight_bytes"] < 0.4 * bf16["weight_bytes"]
    assert run_json(capsys, *base) == mx  # the checkpoint's stored format is the default
    ep = run_json(capsys, *base, "--expert-weights", "mxfp4", "--ep", "2")
    assert ep["memory_per_device"]["weights"] < mx["memory_per_device"]["weights"]


def test_the_checkpoints_stored_formats_are_the_default_and_flags_override_them(capsys):
    """gpt-oss-120b ships MXFP4 experts (quantization_config): it fits on one H200 as
    shipped, not with bf16 experts; --weights alone leaves the experts as stored."""
    base = ["-m", GPT_OSS_120B, "--gpu", "h200", "--isl", "256", "--osl", "32"]
    base += ["--num-requests", "8"]
    shipped = run_json(capsys, *base)
    assert (shipped["weights_bits"], shipped["expert_weights_bits"]) == (16, 4.25)
    assert shipped["memory_per_device"]["weights"] < 70e9
    assert main(["predict", *base, "--expert-weights", "bf16"]) != 0
    assert "does not fit on h200" in capsys.readouterr().err
    fp8 = run_json(capsys, *base, "--weights", "fp8_e4m3")
    assert (fp8["weights_bits"], fp8["expert_weights_bits"]) == (8, 4.25)
    assert main(["predict", *base]) == 0  # the report names both widths
    assert "weights 16 bits (routed experts 4.25)" in capsys.readouterr().out
    llama = run_json(capsys, *base[:1], LLAMA_70B, *base[2:], "--tp", "2")
    assert (llama["weights_bits"], llama["expert_weights_bits"]) == (16, None)  # unquantized


def test_info_and_perf_step_take_the_stored_formats_too(capsys):
    assert main(["info", "-m", GPT_OSS_120B]) == 0
    out = capsys.readouterr().out
    assert "mxfp4 experts, bf16 elsewhere (mxfp4" in out
    assert main(["info", "-m", GPT_OSS_120B, "--expert-weights", "bf16", "--weights", "bf16"]) == 0
    desc = read_model_config(GPT_OSS_120B).describe()
    assert f"{desc.params_total() * 2:,}" in capsys.readouterr().out  # bf16 bytes
    assert main(["perf", "step", "-m", GPT_OSS_120B, "--batch", "4"]) == 0
    stored = capsys.readouterr().out
    assert (
        main(["perf", "step", "-m", GPT_OSS_120B, "--batch", "4", "--expert-weights", "bf16"]) == 0
    )
    assert stored != capsys.readouterr().out  # narrower experts: less to stream


@pytest.mark.parametrize(
    "model_type",
    ["llama", "mistral", "qwen2", "qwen3", "gemma3_text", "gpt_oss", "deepseek_v3",
     "qwen3_next", "mamba2", "falcon_h1"],
)  # fmt: skip
def test_predict_runs_every_family(model_type, tmp_path, capsys):
    """transformers' default config of each family (full size: the KV cache size is given,
    so no fit check; 8 sequences at most, so that the 263 MiB state slots of mamba2 fit);
    deepseek_v2's default has no routing (tests/config)."""
    transformers = pytest.importorskip("transformers")
    transformers.AutoConfig.for_model(model_type).save_pretrained(tmp_path)
    argv = ["-m", str(tmp_path), "--kv-memory", "4GiB", "--isl", "128", "--osl", "8"]
    argv += ["--max-num-seqs", "8"]
    r = run_json(capsys, *argv, "--num-requests", "4", "--concurrency", "2")
    assert r["requests"] == 4 and r["failed"] == 0 and r["output_tok_s"] > 0


def test_state_slots_that_take_the_kv_cache_are_a_clear_error(tmp_path, capsys):
    """The engine sets a recurrent-state slot aside per sequence the batch may hold before
    it cuts the rest into blocks; predict does the same and says which limit to lower."""
    transformers = pytest.importorskip("transformers")
    transformers.AutoConfig.for_model("qwen3_next").save_pretrained(tmp_path)
    argv = ["predict", "-m", str(tmp_path), "--kv-memory", "4GiB", "--isl", "128"]
    assert main([*argv, "--osl", "8", "--max-num-seqs", "256", "--json"]) == 2
    err = capsys.readouterr().err
    assert "recurrent-state slots" in err and "--max-num-seqs <= " in err
    fits = int(err.split("--max-num-seqs <= ")[1].split()[0])
    assert main([*argv, "--osl", "8", "--max-num-seqs", str(fits), "--json"]) == 0


def test_explain_names_the_bound_of_each_op(capsys):
    argv = ["predict", "-m", LLAMA_70B, "--tp", "2", "--concurrency", "1", "--isl", "2048"]
    assert main([*argv, "--osl", "64", "--explain"]) == 0
    decode, prefill = capsys.readouterr().out.split("\n\n")
    assert "all_reduce" in decode and "memory" in decode  # batch 1 streams the weights
    assert "2048-token prefill" in prefill and "compute" in prefill


def test_sweep_writes_a_table_and_a_png(capsys, tmp_path):
    png = tmp_path / "sweep.png"
    argv = ["predict", "-m", "tests/perf/configs/llama-3.1-8b.json", "--isl", "128"]
    argv += ["--osl", "32", "--num-requests", "64", "--sweep", "concurrency=1,4,16"]
    assert main([*argv, "--plot", str(png)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and "out tok/s" in lines[0]
    throughputs = [float(line.split()[1]) for line in lines[1:]]
    assert throughputs == sorted(throughputs)  # more clients, more tokens per second
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gpu", "tpu9"], "tpu9"),
        (["--sweep", "colour=1,2"], "sweep"),
        (["--isl", "10"], "--isl"),
        (["--weights", "fp7"], "fp7"),
        (["-m", "tests/perf/configs/llama-3.1-70b.json", "--gpu", "l40s"], "does not fit"),
        (["--kv-offload-memory", "8GiB", "--host-bandwidth", "fast"], "--host-bandwidth"),
        (["--kv-offload-memory", "lots"], "kv_offload_memory"),
    ],
)
def test_bad_input_gets_a_clear_error(capsys, argv, message):
    code = main(["predict", "-m", "tests/perf/configs/llama-3.1-8b.json", *argv])
    assert code != 0
    assert message in capsys.readouterr().err


# agentic sessions whose conversations outgrow a 512 MiB pool (8B, bf16 KV: 256 blocks)
OFFLOAD = ["predict", "-m", "tests/perf/configs/llama-3.1-8b.json", "--workload", "agentic"]
OFFLOAD += ["--input-len", "1000", "--output-len", "50", "--kv-memory", "512MiB"]


def test_kv_offload_prints_the_gain_of_the_tiers(capsys):
    """`--kv-offload-memory`: the load with a host tier and without; without it every
    reusable token is recomputed (the pool holds about 3 of the 8 sessions), with it part is
    loaded and later turns answer sooner. Not all: on an H200 a decode step takes ~4 ms, a
    tenth of it copies 5 of the 2 MiB blocks at 25 GB/s, so a later turn's 60-80 blocks load
    in the background (engine/tier_moves.py); a sequence whose load settled but which waits
    for room loses loaded blocks to eviction again, and those are recomputed (one background
    load per sequence)."""
    argv = [*OFFLOAD, "--num-requests", "32", "--concurrency", "8", "--kv-offload-memory", "8GiB"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "KV offload: host 8.59 GB at 25 GB/s (default (assumed))" in out
    row = next(line for line in out.splitlines() if line.startswith("TTFT p50, turns 2+"))
    no_tiers, tiers, gain = (float(v.rstrip("x")) for v in row.split()[-3:])
    assert gain == pytest.approx(no_tiers / tiers, rel=1e-2) and gain > 1
    assert "(no tiers): pool   0 %, host   0 %, disk   0 %, recomputed 100 %" in out
    line = next(line for line in out.splitlines() if "(tiers): pool" in line)
    shares = dict(re.findall(r"(pool|host|disk|recomputed)\s+(\d+) %", line))
    shares = {where: int(share) for where, share in shares.items()}
    assert shares["host"] > 0 and shares["disk"] == 0 and shares["recomputed"] < 100
    assert abs(sum(shares.values()) - 100) <= 2  # (each share rounded)
    assert "output tok/s" in out and "load vs recompute decisions" in out


def test_kv_offload_json_with_a_disk_tier(capsys, tmp_path):
    """The disk tier of --kv-offload-dir is simulated (the directory is not touched); the
    JSON carries both runs, the gains and where each bandwidth came from."""
    directory = tmp_path / "kv"
    argv = [*OFFLOAD, "--num-requests", "16", "--concurrency", "4"]
    argv += ["--kv-offload-memory", "256MiB", "--kv-offload-dir", str(directory)]
    argv += ["--kv-offload-disk", "50GiB", "--disk-bandwidth", "3GB"]
    r = run_json(capsys, *argv[1:])
    section = r["kv_offload"]
    assert section["tiers"]["disk"] == {
        "budget_bytes": 50 * 2**30,
        "bandwidth": 3e9,
        "bandwidth_from": "--disk-bandwidth",
    }
    assert section["tiers"]["host"]["budget_bytes"] == 256 * 2**20
    assert not directory.exists()
    on, off = section["with_tiers"], section["without_tiers"]
    assert on["ttft_p50_ms"] == r["ttft_ms"]["p50"]  # the top level is the run with the tiers
    assert on["reuse"]["disk"] > 0 and off["reuse"]["disk"] == 0
    assert section["gain"]["output_tok_s"] == on["output_tok_s"] / off["output_tok_s"]
    assert set(r["kv_tiers"]["tiers"]) == {"host", "disk"}


def test_measured_acceptance_from_the_engine_or_a_benchmark(capsys, tmp_path):
    """--acceptance-from takes the engine's measurements: a Speculator.summary() object equals
    giving --spec-acceptance the α whose chain of d drafts emits the measured tokens per
    verifying step, and --spec-verify-fraction the share of decodes that verified; JSON lines
    without those are filtered by --speculative's proposer and their per-token acceptance
    averaged; a file without one is a clear error."""
    from infergen import LLM, SamplingParams

    llm = LLM(speculative="ngram", num_speculative_tokens=4)
    text = "one two three four five six seven eight nine ten " * 8
    llm.generate([text, "Write a poem about the sea."],
                 SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))  # fmt: skip
    summary = llm.engine.speculator.summary()
    histogram = {int(d): n for d, n in summary.pop("drafts_histogram").items()}
    assert sum(histogram.values()) == summary["steps"]
    assert sum(d * n for d, n in histogram.items()) == summary["drafted"]
    alpha = chain_acceptance(summary["tokens_per_step"], summary["drafts_per_verify_step"])
    assert 0 < alpha < 1 and 0 < summary["verify_fraction"] < 1
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    argv = ["-m", "tests/perf/configs/llama-3.1-8b.json", "--isl", "500", "--osl", "64",
            "--num-requests", "8", "--concurrency", "1"]  # fmt: skip
    measured = run_json(capsys, *argv, "--acceptance-from", str(tmp_path / "summary.json"))
    typed = run_json(capsys, *argv, "--spec-tokens", "4", "--spec-acceptance", str(alpha),
                     "--spec-verify-fraction", str(summary["verify_fraction"]))  # fmt: skip
    plain = run_json(capsys, *argv)
    assert measured == typed and measured["output_tok_s"] > plain["output_tok_s"]
    # with the drafts histogram: α is the one whose chains over the histogram's draft counts
    # emit the measured tokens (a fixed --spec-tokens keeps that k); a histogram of k alone
    # is the fixed k
    mixed = chain_acceptance(summary["tokens_per_step"], histogram)
    for table, k in ((histogram, "4"), ({4: 10}, None)):
        file = tmp_path / "histogram.json"
        file.write_text(json.dumps({**summary, "drafts_histogram": table}))
        alpha = mixed if k else chain_acceptance(summary["tokens_per_step"], table)
        given = ["--spec-tokens", k] if k else []
        measured = run_json(capsys, *argv, *given, "--acceptance-from", str(file))
        typed = run_json(capsys, *argv, "--spec-tokens", "4", "--spec-acceptance", str(alpha),
                         "--spec-verify-fraction", str(summary["verify_fraction"]))  # fmt: skip
        assert measured == typed
    lines = [{"proposer": "ngram", "per_token_acceptance": 0.2},
             {"proposer": "suffix", "per_token_acceptance": 0.9},
             {"proposer": "ngram", "per_token_acceptance": 0.4}, {"metric": "other"}]  # fmt: skip
    bench = tmp_path / "spec.jsonl"
    bench.write_text("\n".join(json.dumps(x) for x in lines))
    chosen = run_json(capsys, *argv, "--speculative", "ngram", "--acceptance-from", str(bench))
    assert chosen == run_json(capsys, *argv, "--spec-tokens", "4", "--spec-acceptance", "0.3")
    with pytest.raises(SystemExit):  # argparse: not a proposer
        main(["predict", *argv, "--speculative", "draft-x", "--acceptance-from", str(bench)])
    assert "draft-x" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"metric": "other"}\n')
    assert main(["predict", *argv, "--acceptance-from", str(empty)]) != 0
    assert "per_token_acceptance" in capsys.readouterr().err


def test_mtp_drafts_cost_a_layer_and_the_head(capsys):
    """--speculative mtp: each draft costs the model's MTP layer (a decoder layer and the LM
    head) — slower than free n-gram drafts at the same acceptance, faster than no
    speculation; a model without MTP layers is a clear error."""
    argv = ["-m", "tests/perf/configs/deepseek-v3.json", "--tp", "8", "--isl", "500", "--osl", "64",
            "--num-requests", "4", "--concurrency", "1", "--spec-acceptance", "0.8"]  # fmt: skip
    plain = run_json(capsys, *argv)
    mtp = run_json(capsys, *argv, "--speculative", "mtp", "--spec-tokens", "2")
    free = run_json(capsys, *argv, "--speculative", "ngram", "--spec-tokens", "2")
    assert plain["output_tok_s"] < mtp["output_tok_s"] < free["output_tok_s"]
    llama = ["-m", "tests/perf/configs/llama-3.1-8b.json", "--isl", "500", "--osl", "64"]
    assert main(["predict", *llama, "--speculative", "mtp"]) == 2
    assert "multi-token-prediction" in capsys.readouterr().err
