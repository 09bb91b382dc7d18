"""Speculative decoding (issue 24): decode tokens per second with each proposer against the same
engine without speculation, and against the peers' own prompt-lookup speculation, same run,
greedy, the default model (fp32).

Workloads (batch 1 unless named):
  copy      "repeat the passage": a 1,200-character passage of data/python_docs.txt, then its
            first 200 characters again; the continuation copies the rest (quotes)
  edit      a chat turn: a ~300-token function of this repository and "rename one variable
            and show the whole function" (an edit that copies the code back)
  agentic   a multi-turn agent trace: the user's task, the assistant's tool call, the tool's
            output (a file of this repository), and "print function X as it is in the file"
  open      a passage to continue freely (little to copy: speculation should not pay)
  copy x16, open x16   16 such requests at once (different passages): throughput, where
            verifying drafts costs compute and the cost model should turn itself off

Configurations: no speculation; ngram and suffix with num_speculative_tokens="auto" (the cost
model picks the drafts; before every run the proposer forgets finished requests' answers — else
suffix would draft each repeat from the identical answer of the run before); ngram with a fixed
k = --k; at batch 1 also layerskip (the first half of the layers draft) and a draft model (the
target's own weights as int4: "self:int4"), both "auto". Each (workload, configuration)
generates --tokens tokens a request, configurations alternating, best of --repeats (the batch
rows: --batch-repeats); a fresh engine per configuration, warmed up on the workload's prompts
(their blocks then come from the prefix cache in every round). Each speculating configuration's
ratio is against the no-speculation engine, the two runs' steps interleaved
(benchmarks/interleave.py: the one less far along steps next, so both finish together and
each run's time is a sum over the same stretch of wall time): this host's decode switches
between two speeds (a step of ~12 ms or ~18 ms, for 6-20 s at a time), so two runs made one
after the other compared two speeds about as often as one (rounds of 0.7 where the
configurations were equal). Interleaved, two plain engines measured 0.99-1.02x of each other
in rounds at 54 to 80 tok/s. The ratio reported is the median of the rounds' ratios (which
engine steps first alternates by round).
Batch 1 rates are decode rates (after the first token: the prompt's prefill is not in them,
as the peers report theirs); batch 16 rates (--tokens / 2 a request) count every output token
over the whole run (prefill included: the prompts' cached blocks and each last partial one,
the same for every configuration).
Peers at batch 1 (benchmarks/spec_peers.py): transformers with and without prompt lookup,
llama-server with and without its ngram speculation. JSON lines to --out: a result per
(workload, configuration), a ratio per proposer against no speculation and against each
peer's speculative mode, with the acceptance rate and tokens per verifying step; and the
performance model's predicted speed-up of the n-gram and suffix configurations (batch 1,
`infergen predict --gpu cpu-local --acceptance-from` the measured line) against the measured
one. The model's hardware row: the cached calibration (run `infergen perf calibrate` first,
else the predictions are skipped with the reason) with the rates that drift — GEMM curve,
bandwidths, attention fractions — taken again after every round of each batch-1 workload
(InRunRates; ~5 s a time). This host's decode switches between two speeds for seconds at a
time, and a speed-up is larger at the slow one (a verifying step's extra rows cost compute
that a slower weight stream hides), so the rates taken after a round may be of the other
speed: each round is predicted from the snapshot, of all those taken in the run for that
model row, whose predicted plain decode step is nearest the round's measured one
(`matched_rates`; the plain step chooses the rates, the speed-up is what is predicted), and
the line's prediction is the median of its rounds' ("rounds": each round's prediction
beside its measured ratio; "round_error": the median of their relative errors;
"matched_plain_step_error": how near each chosen snapshot's plain step was). The rates
are written as a "calibration" line per workload (the fastest of each rate, "row", and
each round's, "round_rows"). --predict-from FILE measures nothing: it makes an earlier
run's predictions again, from that run's rates (or, with --cached-calibration, this
host's).

Model rows (--models, both by default):
  smollm2-135m  the default model: every workload, configuration and peer above.
  gemma-3-270m  Gemma-3-270M (base, fp32; ~2 minutes to build its engines): the copy-heavy
                batch-1 workloads as completions, since it has no chat template
                (spec_workloads.completion_prompts: the edit as a before / after of the same
                function, the agentic trace as a shell session whose `sed` prints a class the
                earlier `cat` showed); metrics named "edit@gemma-3-270m" and so on. Why: the
                135M default model does not do the chat edit and agentic tasks (it writes a
                different, shorter function, or calls another tool, then, past its end of
                turn, unrelated chat), so its rows measure speculation on text that does not
                copy; Gemma-3-270M's continuations do copy. Configurations without a drafting
                model only (no speculation, ngram auto, suffix auto, ngram k); the same peers
                on its GGUF (transformers' early-exit assistant: 9 of its 18 layers).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import math
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
sys.path.insert(0, str(ROOT))

from bench_generate import git_state, machine_info  # noqa: E402
from interleave import interleaved  # noqa: E402
from peers.cpu_contention import OtherCpu  # noqa: E402
from results_file import read_lines, write_lines  # noqa: E402
from spec_workloads import batch_prompts, completion_prompts, single_prompts  # noqa: E402

NONE = "no speculation"
DEFAULT, GEMMA = "smollm2-135m", "gemma-3-270m"
MODELS = (DEFAULT, GEMMA)  # the --models rows


def configs(k: int) -> dict[str, dict]:
    return {
        NONE: {},
        "ngram auto": {"speculative": "ngram", "num_speculative_tokens": "auto"},
        "suffix auto": {"speculative": "suffix", "num_speculative_tokens": "auto"},
        f"ngram k={k}": {"speculative": "ngram", "num_speculative_tokens": k},
        "layerskip auto": {"speculative": "layerskip", "num_speculative_tokens": "auto"},
        "draft self:int4 auto": {
            "speculative": "draft",
            "draft_model": "self:int4",
            "num_speculative_tokens": "auto",
        },
    }


# the batch rows leave out the model-based proposers (their drafting passes are batch-1 tools)
BATCH_CONFIGS = 4


def workload_of(metric: str) -> str:
    """The workload of a line's metric, "decode_tok_s [<workload>, batch <n>]"."""
    return metric.split("[")[1].split(",")[0]


def paired_rates(spec_llm, plain_llm, prompts: list[list[int]], tokens: int, single: bool,
                 spec_first: bool):  # fmt: skip
    """The speculating engine's and the plain engine's runs on `prompts`, their steps
    interleaved (interleave.py: both see the same moments of the host), greedy, `tokens` a
    request: batch 1, tokens after the first over the steps since; else every output token
    over all the steps. `spec_first`: which engine is first in line (alternated by round)."""
    from infergen import SamplingParams

    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    engine = spec_llm.engine
    if engine.speculator is not None:  # (each run's answers drafted as if never seen before:
        engine.speculator.proposer.forget()  # not from the identical answers of earlier runs)
    pair = [engine, plain_llm.engine]
    runs = interleaved(pair if spec_first else pair[::-1], prompts, params, single)
    return tuple(runs if spec_first else runs[::-1])


class InRunRates:
    """The host's drifting rates (perf/calibrate.measure_rates: GEMM curve, bandwidths,
    attention fractions, the layers' cost op by op) measured in this run after each round of
    a batch-1 workload's configurations, the fastest of each of that workload's rounds kept
    (calibrate.best_of, as its measured rates are the best of its --repeats rounds), on top
    of the cached calibration (`infergen perf calibrate`: launch costs, the disk tier, the
    link): the hardware row that workload's predictions take. A VM's memory and GEMM rates
    change by up to 1.5x from one minute to the next (a run here: Gemma's edit trace decoded
    at 28 tok/s in all three of its rounds, its agentic trace a minute later at 31-41), and
    a speed-up measured while memory is slow is larger: a calibration from another hour, or
    from the fastest minute of the run, predicts another machine. Empty without a cached
    calibration (the predictions are then skipped with its reason)."""

    def __init__(self):
        from infergen.errors import ConfigError
        from infergen.perf.hardware import CPU_LOCAL, resolve

        try:
            self.base = resolve(CPU_LOCAL)
        except ConfigError:
            self.base = None
        self.hw: dict = {}  # workload -> its rounds' fastest rates
        self.each: dict = {}  # workload -> the rates taken after each of its rounds
        self.takes: dict[str, int] = {}

    def take(self, workload: str) -> None:
        from infergen.perf.calibrate import best_of, measure_rates

        if self.base is None:
            return
        now = measure_rates(self.base, threads=2)
        self.hw[workload] = best_of(self.hw[workload], now) if workload in self.hw else now
        self.each.setdefault(workload, []).append(now)
        self.takes[workload] = self.takes.get(workload, 0) + 1

    def rows(self) -> dict[str, dict]:
        """{workload: its hardware row, as `infergen perf calibrate` saves it}."""
        from infergen.perf.calibrate import as_row

        return {work: as_row(hw) for work, hw in self.hw.items()}

    def round_rows(self) -> dict[str, list[dict]]:
        """{workload: the hardware row of each of its rounds' rates, in order}."""
        from infergen.perf.calibrate import as_row

        return {work: [as_row(hw) for hw in each] for work, each in self.each.items()}

    def lines(self, base: dict) -> list[dict]:
        """A "calibration" line per workload (its row), for --predict-from to predict from
        again."""
        each = self.round_rows()
        return [{**base, "kind": "calibration", "metric": f"decode_tok_s [{work}, batch 1]",
                 "engine": "infergen perf calibrate", "takes": self.takes[work], "row": row,
                 "round_rows": each[work]}
                for work, row in self.rows().items()]  # fmt: skip


def run_infergen(
    work: dict,
    args,
    base: dict,
    model: str | None = None,
    model_based: bool = True,
    rates_in_run: InRunRates | None = None,
) -> tuple[list[dict], dict]:
    """Every (workload, configuration) of `work` on `model` (None: the default model);
    without `model_based`, the configurations without a drafting model only; with
    `rates_in_run`, the host's rates taken after each round of a batch-1 workload."""
    from infergen import LLM, SamplingParams

    every = configs(args.k)
    if not model_based:
        every = dict(list(every.items())[:BATCH_CONFIGS])
    # the first engine a process built decoded ~12 % slower on these VMs (its weights in 4 KB
    # pages; infergen now asks PyTorch for huge pages, which evens them out): one is still
    # built and kept first, so that the measured engines are alike whatever the host does
    spare = LLM(model=model, num_threads=2)
    engines = {name: LLM(model=model, num_threads=2, **options) for name, options in every.items()}
    lines, rates = [], {}
    for name_work, (prompts, single) in work.items():
        table = every if single else dict(list(every.items())[:BATCH_CONFIGS])
        # warm-up on every prompt of the workload: its blocks then come from the prefix cache
        # in every round (a batch's rate counts its prefill: in the first round the
        # speculating run prefilled 16 prompts and the detached run right after it found them
        # cached — a paired ratio of ~0.3 in that round, whatever the configuration)
        for llm in engines.values():
            llm.generate(prompts, SamplingParams(max_tokens=4, temperature=0))
        best: dict = {}
        outputs: dict = {}
        plain: dict = {}  # the plain engine's best rate interleaved with each configuration
        paired: dict = {}  # each round's rate with the proposer / the plain one beside it
        paired_plain: dict = {}  # each round's plain rate (tok/s) beside each configuration
        accepted: dict = {}  # each round's acceptance (acceptance_fields) of each configuration
        tokens = args.tokens if single else args.tokens // 2
        repeats = args.repeats if single else args.batch_repeats
        for i in range(repeats):
            speculating = [name for name in table if name != NONE]
            for name in speculating if i % 2 == 0 else speculating[::-1]:
                llm = engines[name]
                spec = llm.engine.speculator
                before = dict(spec.stats)
                histogram_before = collections.Counter(spec.drafts_histogram)
                with OtherCpu() as other:
                    run, alone = paired_rates(llm, engines[NONE], prompts, tokens, single,
                                              spec_first=i % 2 == 0)  # fmt: skip
                outputs[name], outputs[NONE] = run.outputs, alone.outputs
                delta = {k: spec.stats[k] - before[k] for k in before}
                delta["drafts_histogram"] = spec.drafts_histogram - histogram_before
                accepted.setdefault(name, []).append(acceptance_fields(delta))
                if run.rate > best.get(name, (0,))[0]:
                    best[name] = (run.rate, other.cores, delta)
                if alone.rate > best.get(NONE, (0,))[0]:
                    best[NONE] = (alone.rate, other.cores, {})
                plain[name] = max(plain.get(name, 0.0), alone.rate)
                paired.setdefault(name, []).append(run.rate / alone.rate)
                paired_plain.setdefault(name, []).append(alone.rate)
            if single and rates_in_run is not None:
                rates_in_run.take(name_work)
        batch = "batch 1" if single else f"batch {len(prompts)}"
        metric = f"decode_tok_s [{name_work}, {batch}]"
        for name in table:
            rate, cores, delta = best[name]
            rates[(name_work, name)] = rate
            baseline = plain.get(name, best[NONE][0])
            rates[(name_work, name, "plain")] = baseline
            speedup = statistics.median(paired[name]) if name in paired else rate / baseline
            rates[(name_work, name, "ratio")] = speedup
            rates[(name_work, name, "rounds")] = paired.get(name)
            rates[(name_work, name, "round_plain")] = paired_plain.get(name)
            extra = {}
            if delta:
                extra = {
                    "proposer": table[name]["speculative"],
                    **acceptance_fields(delta),
                    "rounds_acceptance": accepted[name],
                    "same_tokens_as_no_speculation": outputs[name] == outputs[NONE],
                }
            lines.append({**base, "kind": "result", "metric": metric, "engine": "infergen",
                          "config": name, "value": rate, "unit": "tok/s",
                          "stat": f"best of {repeats}", "other_cpu_cores": cores,
                          "params": {"tokens": tokens, "requests": len(prompts)},
                          **extra})  # fmt: skip
            if name != NONE:
                lines.append({**base, "kind": "ratio", "metric": metric, "engine": "infergen",
                              "config": name, "peer": NONE, "infergen_value": rate,
                              "peer_value": baseline, "value": speedup, "unit": "x",
                              "rounds": paired.get(name),
                              "round_plain_tok_s": paired_plain.get(name),
                              "stat": "median of the rounds' "
                              "ratios", "definition": "tok/s with the proposer / the "
                              "no-speculation engine's, the two runs' steps interleaved "
                              "(benchmarks/interleave.py), the median over the rounds "
                              "(infergen_value and peer_value: each one's best round)",
                              **extra})  # fmt: skip
            ratio = f"{speedup:5.2f}x (plain {baseline:.1f})" if name != NONE else ""
            print(f"{name_work:8} {batch:8} {name:13} {rate:7.1f} tok/s {ratio} {extra}")
    del spare  # (kept until every engine was measured)
    return lines, rates


def acceptance_fields(delta: dict) -> dict:
    """A run's acceptance from its speculator's counts (`delta`: Speculator.stats and
    drafts_histogram over the run), as perf/measured_acceptance.py reads them."""
    drafted, steps = delta["drafted"], delta["steps"]
    compared = delta["observed_kept"] + delta["observed_rejected"]
    return {
        "per_token_acceptance": delta["observed_kept"] / compared if compared else None,
        "acceptance_rate": delta["accepted"] / drafted if drafted else None,
        "tokens_per_verify_step": (delta["accepted"] + steps) / steps if steps else None,
        "verify_steps": steps,
        "drafts_per_verify_step": drafted / steps if steps else None,
        "verify_fraction": steps / delta["decodes"] if delta["decodes"] else None,
        "drafts_histogram": {str(d): n for d, n in sorted(delta["drafts_histogram"].items())},
    }


PREDICTED = ("ngram auto", "suffix auto")  # (and the fixed-k configuration)


def predicted_lines(
    work: dict,
    rates: dict,
    lines: list[dict],
    base: dict,
    args,
    model: str | None = None,
    rows: dict[str, dict] | None = None,
    round_rows: dict[str, list[dict]] | None = None,
) -> list[dict]:
    """The performance model's decode speed-up of the n-gram and suffix configurations at
    batch 1 (`infergen predict --gpu cpu-local`, fp32; `rows`: each workload's hardware row of
    the rates taken in the run beside it, InRunRates, else this host's cached calibration)
    with the
    acceptance measured here (`--acceptance-from` the configuration's result line: its tokens
    per verifying step, drafts per verifying step and share of decodes that verified; with
    `auto`, the drafts per verifying step rounded as the model's fixed k), against the
    measured one: TPOT without speculation / with. With `round_rows` (each workload's rates
    as taken after each of its rounds), also each round's prediction beside that round's
    measured ratio ("rounds", "round_error": the median of their relative errors)."""
    names = (f"ngram k={args.k}", *PREDICTED)
    out = []
    for line in lines:
        work_name = workload_of(line["metric"])
        name = line.get("config")
        if line["kind"] != "result" or name not in names or work_name not in work:
            continue
        if not work[work_name][1]:
            continue
        drafts = line["drafts_per_verify_step"]
        k = args.k if name == names[0] or drafts is None else max(1, round(drafts))
        k = k_of(line, k)  # (None: each step's drafts drawn from the measured ones)
        prompt = len(work[work_name][0][0])
        model_args = ["--model", model] if model else []
        argv = [sys.executable, "-m", "infergen.cli", "predict", *model_args, "--gpu", "cpu-local",
                "--weights", "fp32", "--activations", "fp32", "--kv", "fp32",
                "--isl", str(prompt), "--osl", str(args.tokens), "--num-requests", "2",
                "--concurrency", "1", "--json"]  # fmt: skip
        row = (rows or {}).get(work_name)
        plain_rounds = rates.get((work_name, name, "round_plain"))
        # the snapshots of this model row's workloads (one run's: a results file may hold
        # another run's for the other row)
        snapshots = [r for w, each in (round_rows or {}).items() if w in work for r in each]
        try:
            if plain_rounds and snapshots:  # each round from the rates of its host state
                steps = plain_steps(snapshots, model, prompt + args.tokens // 2)
                matched = [matched_rates(snapshots, steps, 1 / tok_s) for tok_s in plain_rounds]
                beside = [predicted_speedup(argv, own, k_of(own, k), r)
                          for own, (r, _) in zip(round_lines(line, len(matched)), matched,
                                                 strict=True)]  # fmt: skip
                predicted = statistics.median(beside)
                how = (
                    f"each round's from its own acceptance and the rates, of the "
                    f"{len(snapshots)} taken in the run for this model, whose plain decode "
                    "step is nearest that round's: the median"
                )
                extra = {"matched_plain_step_error": [e for _, e in matched]}
            else:
                predicted = predicted_speedup(argv, line, k, row)
                beside = [predicted_speedup(argv, line, k, r)
                          for r in (round_rows or {}).get(work_name, [])]  # fmt: skip
                how = "the rates taken in the run" if row else "this host's calibration"
                extra = {}
        except RuntimeError as e:  # (e.g. not calibrated: the measured lines still count)
            print(f"no predictions: `infergen predict` failed: {e}")
            return out + [{**base, "kind": "skipped", "engine": "infergen predict",
                           "why": str(e)[:500]}]  # fmt: skip
        measured = rates.get((work_name, name, "ratio"))
        measured = measured or rates[(work_name, name)] / rates[(work_name, name, "plain")]
        out.append({**base, "kind": "prediction", "metric": line["metric"], "config": name,
                    "spec_tokens": k or max(map(int, line["drafts_histogram"])),
                    "per_token_acceptance": line["per_token_acceptance"],
                    "tokens_per_verify_step": line["tokens_per_verify_step"],
                    "verify_fraction": line["verify_fraction"], "predicted_speedup": predicted,
                    "measured_speedup": measured, "value": predicted / measured - 1,
                    "unit": "relative error", "definition": "predicted / measured decode "
                    "speed-up - 1 (infergen predict --gpu cpu-local --acceptance-from the "
                    f"measured line; hardware: {how})", **extra, **_by_round(
                    beside, rates.get((work_name, name, "rounds")))})  # fmt: skip
        print(f"{work_name:8} {name}: predicted {predicted:.2f}x, measured {measured:.2f}x "
              f"({predicted / measured - 1:+.0%}), k {k}, "
              f"{line['tokens_per_verify_step']} tokens/verify step, "
              f"verify fraction {line['verify_fraction']}")  # fmt: skip
    return out


def plain_steps(snapshots: list[dict], model: str | None, context: int) -> list[float]:
    """Each hardware row's predicted plain decode step (batch 1, `context` tokens, fp32)."""
    from infergen.cli.predict import describe_model
    from infergen.io.default_model import default_model_path
    from infergen.perf import roofline
    from infergen.perf.hardware import from_dict
    from infergen.perf.step_cost import Chunk, Formats

    desc = describe_model(model or str(default_model_path()))
    fmt = Formats(weight_bits=32, kv_bits=32, act_bytes=4)
    steps = []
    for snapshot in snapshots:
        ((name, fields),) = snapshot.items()
        hw = from_dict(name, fields, "a rates snapshot")
        steps.append(roofline.step_seconds(roofline.predict_step(desc, hw, [Chunk(1, context)],
                                                                 fmt, "fp32")))  # fmt: skip
    return steps


def matched_rates(snapshots: list[dict], steps: list[float],
                  step_s: float) -> tuple[dict, float]:  # fmt: skip
    """Of the hardware rows of rates taken in the run (InRunRates; `steps`: their predicted
    plain decode steps, `plain_steps`), the one whose step is nearest `step_s`, a round's
    measured one, and the relative error of its prediction: this host's decode switches
    between two speeds for seconds at a time (module docstring), and a verifying step's
    cost relative to a plain one differs between them (its extra rows' compute is hidden
    behind a slower weight stream), so a round is predicted from rates taken at its speed.
    The plain step chooses the rates; what is predicted is the speed-up."""
    errors = [step / step_s - 1 for step in steps]
    best = min(range(len(snapshots)), key=lambda i: abs(math.log1p(errors[i])))
    return snapshots[best], errors[best]


_PLAIN: dict[str, float] = {}  # (argv, row) -> predicted TPOT without speculation


def round_lines(line: dict, rounds: int) -> list[dict]:
    """Result `line` as each of its `rounds` measured it: with its rounds' own acceptance
    ("rounds_acceptance": with auto k the drafts follow the measured step times, so a round
    at another host speed verified other draft counts), else the line's (its best round's)
    for every round."""
    own = line.get("rounds_acceptance")
    if not own or len(own) != rounds:
        return [line] * rounds
    return [{**line, **fields} for fields in own]


def k_of(line: dict, k: int | None) -> int | None:
    """The fixed k to predict `line` with: None where its drafts histogram is drawn from."""
    return None if line.get("drafts_histogram") else k


def predicted_speedup(argv: list[str], line: dict, k: int | None, row: dict | None) -> float:
    """`infergen predict` (`argv`) without and with speculation (k drafts, None: each step's
    drawn from the line's drafts_histogram; the acceptance of result `line`) on hardware
    `row` (None: the cached calibration): TPOT plain / with (the plain one predicted once
    per argv and row)."""
    if not line.get("verify_steps", 1):  # a round that verified nothing: no speculation
        return 1.0
    tpot = []
    key = json.dumps([argv, row], sort_keys=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json") as measured_file, \
            tempfile.NamedTemporaryFile("w", suffix=".json") as row_file:  # fmt: skip
        json.dump(line, measured_file)
        measured_file.flush()
        extra = []
        if row is not None:
            json.dump(row, row_file)
            row_file.flush()
            extra = ["--hardware-file", row_file.name]
        fixed = [] if k is None else ["--spec-tokens", str(k)]
        for spec in ([], [*fixed, "--acceptance-from", measured_file.name]):
            if not spec and key in _PLAIN:
                tpot.append(_PLAIN[key])
                continue
            run = subprocess.run(argv + extra + spec, capture_output=True, text=True)
            if run.returncode != 0:
                raise RuntimeError(run.stderr.strip() or run.stdout.strip())
            tpot.append(json.loads(run.stdout.strip().splitlines()[-1])["tpot_ms"]["mean"])
    _PLAIN[key] = tpot[0]
    return tpot[0] / tpot[1]


def _by_round(predicted: list[float], measured: list[float] | None) -> dict:
    """Each round's prediction (from the rates taken right after it) beside its measured
    ratio, and the median of their relative errors (empty without both)."""
    if not predicted or not measured or len(predicted) != len(measured):
        return {}
    errors = [p / m - 1 for p, m in zip(predicted, measured, strict=True)]
    pairs = [{"predicted": p, "measured": m} for p, m in zip(predicted, measured, strict=True)]
    return {"rounds": pairs, "round_error": statistics.median(errors)}


def peer_lines(name: str, out: dict, rates: dict, base: dict, args) -> list[dict]:
    """The peer's results, and infergen's best speculative configuration against each of
    the peer's modes per workload."""
    if "error" in out:
        print(f"[{name}] {out['error']}")
        return [{**base, "kind": "skipped", "engine": name, "why": out["error"][:500]}]
    lines = []
    for (work, mode), rate in out["rates"].items():
        metric = f"decode_tok_s [{work}, batch 1]"
        lines.append({**base, "kind": "result", "metric": metric, "engine": name,
                      "version": out["version"], "config": mode, "value": rate,
                      "unit": "tok/s", "stat": f"best of {args.repeats}"})  # fmt: skip
        ours = [c for c in configs(args.k) if c != NONE and (work, c) in rates]
        best = max(ours, key=lambda c: rates[(work, c)])
        lines.append({**base, "kind": "ratio", "metric": metric, "engine": "infergen",
                      "config": best, "peer": f"{name} {mode}",
                      "peer_version": f"{name} {out['version']}",
                      "infergen_value": rates[(work, best)], "peer_value": rate,
                      "value": rates[(work, best)] / rate, "unit": "x",
                      "definition": "infergen's best speculative tok/s / the peer's"})  # fmt: skip
        print(f"{work:8} {name} {mode:22} {rate:7.1f} tok/s  (infergen {best}: "
              f"{rates[(work, best)] / rate:.2f}x)")  # fmt: skip
    return lines


def gemma_work() -> tuple[str, dict, dict, int]:
    """Gemma-3-270M's row: (its path, the prompts by workload, the work, its layer count)."""
    from infergen import LLM
    from infergen.io.packaged_models import gemma3_270m_path

    gemma = str(gemma3_270m_path())
    llm = LLM(model=gemma, num_threads=2)  # the prompts' token ids
    prompts = {f"{w}@{GEMMA}": p for w, p in completion_prompts(llm, ROOT).items()}
    layers = llm.engine.model_config.num_hidden_layers
    return gemma, prompts, {w: ([p], True) for w, p in prompts.items()}, layers


def default_work(batch: int) -> tuple[dict, dict, int]:
    """The default model's row: (the batch-1 prompts, the work, its layer count)."""
    from infergen import LLM

    llm = LLM(num_threads=2)  # the prompts' token ids (chat templates)
    singles = single_prompts(llm, ROOT)
    work = {w: ([p], True) for w, p in singles.items()}
    work |= {f"{w} x{batch}": (ps, False)
             for w, ps in batch_prompts(llm, ROOT, batch).items()}  # fmt: skip
    return singles, work, llm.engine.model_config.num_hidden_layers


def repredict(path: pathlib.Path, args, base: dict) -> list[dict]:
    """An earlier run's lines with its predictions made again from its measured lines: the
    measured lines as they were, new prediction lines — from the rates taken in that run
    (its "calibration" line; with --cached-calibration, or where it has none, from this
    host's `infergen perf calibrate`)."""
    lines = read_lines(path)
    rates, results = {}, []
    # the rates taken in that run beside each workload (InRunRates), else this host's now
    rows = {workload_of(line["metric"]): line["row"] for line in lines
            if line["kind"] == "calibration" and not args.cached_calibration}  # fmt: skip
    each = {workload_of(line["metric"]): line["round_rows"] for line in lines
            if line["kind"] == "calibration" and "round_rows" in line
            and not args.cached_calibration}  # fmt: skip
    for line in lines:
        work = workload_of(line.get("metric", "[,"))
        if line["kind"] == "result" and line.get("engine") == "infergen":
            rates[(work, line["config"])] = line["value"]
            results.append(line)
            args.tokens = line["params"]["tokens"] if "batch 1]" in line["metric"] else args.tokens
            if line["config"].startswith("ngram k="):
                args.k = int(line["config"].split("=")[1])
        elif line["kind"] == "ratio" and line.get("peer") == NONE:
            rates[(work, line["config"], "plain")] = line["peer_value"]
            rates[(work, line["config"], "ratio")] = line["value"]
            rates[(work, line["config"], "rounds")] = line.get("rounds")
            rates[(work, line["config"], "round_plain")] = line.get("round_plain_tok_s")
    kept = [
        line
        for line in lines
        if line["kind"] != "prediction"
        and not (line["kind"] == "skipped" and line.get("engine") == "infergen predict")
    ]
    base = {**base, "predicted_from": f"{path.name} of {lines[0]['timestamp']}"}
    if any(f"@{GEMMA}" in line["metric"] for line in results):
        gemma, _, work, _ = gemma_work()
        mine = [line for line in results if f"@{GEMMA}" in line["metric"]]
        kept += predicted_lines(work, rates, mine, base, args, gemma, rows, each)
    mine = [line for line in results if f"@{GEMMA}" not in line["metric"]]
    if mine:
        kept += predicted_lines(
            default_work(args.batch)[1], rates, mine, base, args, rows=rows, round_rows=each
        )
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=128, help="tokens generated per request")
    parser.add_argument("--repeats", type=int, default=5,
                        help="runs per configuration at batch 1 (a paired ratio at one "
                        "acceptance varies by up to ±10 %% from round to round here: a "
                        "verifying step's extra rows are compute, whose speed on this VM "
                        "drifts apart from its memory's: the median of 5)")  # fmt: skip
    parser.add_argument("--batch-repeats", type=int, default=5,
                        help="runs per configuration of the batch rows (their paired ratios "
                        "vary by ±4 %% from round to round here: the median of 5)")  # fmt: skip
    parser.add_argument("--k", type=int, default=4, help="the fixed-k configuration's k")
    parser.add_argument("--batch", type=int, default=16, help="requests of the batch rows")
    parser.add_argument("--no-peers", action="store_true", help="infergen only (the peers' "
                        "lines already in --out are kept)")  # fmt: skip
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS),
                        help="model rows (default: both)")  # fmt: skip
    parser.add_argument("--predict-from", type=pathlib.Path, default=None, metavar="JSONL",
                        help="measure nothing: an earlier run's lines (e.g. results/spec.jsonl) "
                        "with the performance model's predictions made again from its measured "
                        "lines and the rates taken in that run (its calibration lines); written "
                        "to --out")  # fmt: skip
    parser.add_argument("--cached-calibration", action="store_true",
                        help="with --predict-from: predict from this host's cached calibration "
                        "(`infergen perf calibrate`), not the rates taken in that run")  # fmt: skip
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "benchmarks/results/spec.jsonl",
                        help="JSON lines: this run's replace those of the rows it ran (and "
                        "their peers', when it ran them); the others are kept (default: "
                        "%(default)s)")  # fmt: skip
    args = parser.parse_args()
    from infergen.io.default_model import default_model_path

    base = {
        "bench": "spec",
        "quick": False,
        "dtype": "fp32",
        "git": git_state(),
        "machine": machine_info(2),
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    if args.predict_from is not None:
        write_lines(args.out, repredict(args.predict_from, args, base))
        return
    lines, rates = [], {}
    in_run = InRunRates()
    if GEMMA in args.models:  # (first: its engines are freed before the default model's)
        gemma, prompts, work, layers = gemma_work()
        more, rates = run_infergen(work, args, base, gemma, False, in_run)
        lines += more + predicted_lines(
            work, rates, more, base, args, gemma, in_run.rows(), in_run.round_rows()
        )
        if not args.no_peers:
            lines += run_peers(pathlib.Path(gemma), prompts, layers, rates, base, args)
    if DEFAULT in args.models:
        singles, work, layers = default_work(args.batch)
        more, rates = run_infergen(work, args, base, rates_in_run=in_run)
        lines += more + predicted_lines(
            work, rates, more, base, args, rows=in_run.rows(), round_rows=in_run.round_rows()
        )
        if not args.no_peers:
            model = pathlib.Path(default_model_path())
            lines += run_peers(model, singles, layers, rates, base, args)
    kept = kept_lines(args.out, args.models, not args.no_peers)
    write_lines(args.out, kept + lines + in_run.lines(base))


def row_of(line: dict) -> str:
    """The model row (--models) a line belongs to: Gemma's metrics name it."""
    return GEMMA if f"@{GEMMA}" in line.get("metric", "") else DEFAULT


def is_peer_line(line: dict) -> bool:
    """A line of a peer's measurement: its results, its skips, infergen against it."""
    if line["kind"] == "ratio":
        return line.get("peer") != NONE
    return line["kind"] in ("result", "skipped") and line.get("engine") not in (
        "infergen", "infergen predict")  # fmt: skip


def kept_lines(path: pathlib.Path, models: list[str], peers: bool) -> list[dict]:
    """The lines of `path` this run does not replace: those of the model rows not run, and
    without `peers` the peers' lines of the rows run (each line keeps its own timestamp, the
    peers' ratios the infergen rates of their own run)."""
    return [ln for ln in read_lines(path)
            if row_of(ln) not in models or (not peers and is_peer_line(ln))]  # fmt: skip


def run_peers(model: pathlib.Path, prompts: dict, layers: int, rates: dict, base: dict,
              args) -> list[dict]:  # fmt: skip
    """Both peers on `model` (a GGUF of `layers` layers) and the batch-1 `prompts`: their
    lines and infergen's best speculative configuration against each of their modes."""
    from spec_peers import llama_server_peer, transformers_peer

    print(f"[transformers] loading {model.name} (~45 s; Gemma-3-270M ~110 s), then each "
          "workload")  # fmt: skip
    out = transformers_peer(model, prompts, args.tokens, args.repeats, layers)
    lines = peer_lines("transformers", out, rates, base, args)
    out = llama_server_peer(prompts, args.tokens, args.repeats, args.k, model)
    return lines + peer_lines("llama-server", out, rates, base, args)


if __name__ == "__main__":
    main()
