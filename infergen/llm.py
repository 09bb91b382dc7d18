"""`LLM`: the Python API.

from infergen import LLM, SamplingParams
llm = LLM()                                   # the default model
outs = llm.generate(["Hello"], SamplingParams(max_tokens=32, temperature=0))
print(outs[0].text)
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Sequence as Seq
from typing import Any

from tqdm import tqdm

from infergen.engine.engine import Engine
from infergen.engine.options import describe_options, engine_config
from infergen.engine.request import RequestOutput, StreamDelta
from infergen.engine.sampling_params import SamplingParams
from infergen.errors import RequestError

Prompt = str | Seq[int]


class LLM:
    """An engine plus the conveniences of batch generation, chat and streaming.

    Args:
        model: a .gguf file, a Hugging Face directory, or None for the default model.
        checkpoint: an already loaded checkpoint (io/checkpoint.py) instead of `model`.
        progress: show progress bars while calibrating.
        **options: engine options by name (engine/options.py declares each once; an unknown
            name is an error naming the closest one):

        {options}
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        checkpoint: Any = None,
        progress: bool = False,
        **options: Any,
    ):
        config = engine_config(model=model, **options)
        self.engine = Engine(config, checkpoint, progress=progress)
        self.config = self.engine.model_config
        self.tokenizer = self.engine.tokenizer

    def close(self) -> None:
        """Stop the engine's tensor-parallel workers, if any (also at interpreter exit)."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- batch generation -------------------------------------------------------------------
    def generate(
        self,
        prompts: Prompt | list[Prompt],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        *,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text, or a list of token ids); outputs in prompt order."""
        prompt_list = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(prompt_list))
        ids = [self.engine.add_request(p, sp) for p, sp in zip(prompt_list, params, strict=True)]
        with tqdm(total=len(ids), disable=not use_tqdm, unit="req") as bar:
            while self.engine.has_unfinished():
                bar.update(sum(d.finished for d in self.engine.step()))
        outputs = [self.engine.output(i) for i in ids]
        for i in ids:
            self.engine.release(i)
        if self.engine.kv_tiers is not None:  # its blocks written through are on disk now
            self.engine.kv_tiers.flush()
        return outputs

    def chat(
        self,
        messages: list[dict[str, str]] | list[list[dict[str, str]]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        **kwargs: Any,
    ) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"}) or a list of them."""
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        prompts = [self.chat_prompt(c) for c in conversations]
        return self.generate(prompts, sampling_params, **kwargs)

    def chat_prompt(self, conversation: list[dict[str, str]]) -> list[int]:
        if self.tokenizer is None:
            raise RequestError("this checkpoint has no tokenizer, so no chat template")
        text = self.tokenizer.apply_chat_template(conversation, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)

    # ---- streaming --------------------------------------------------------------------------
    def stream(
        self, prompt: Prompt, sampling_params: SamplingParams | None = None
    ) -> Iterator[StreamDelta]:
        """Yield text/token deltas of one request as they are generated."""
        request_id = self.engine.add_request(prompt, sampling_params)
        try:
            while True:
                done = False
                for delta in self.engine.step():
                    if delta.request_id == request_id:
                        done = delta.finished
                        if delta.text or delta.token_ids or done:
                            yield delta
                if done or not self.engine.has_unfinished():
                    return
        finally:
            self.engine.abort(request_id)
            self.engine.release(request_id)


def _as_prompt_list(prompts: Prompt | list[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, Seq) and prompts and all(isinstance(t, int) for t in prompts):
        return [list(prompts)]
    if isinstance(prompts, Seq) and prompts:
        return list(prompts)
    raise RequestError(
        "no prompts given", found=repr(prompts)[:80], expected="a string, token ids, or a list"
    )


def _as_params_list(
    params: SamplingParams | list[SamplingParams] | None, n: int
) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    if len(params) != n:
        raise RequestError(
            "one SamplingParams per prompt expected",
            found=f"{len(params)} for {n} prompts",
            expected=f"{n}, or a single SamplingParams",
        )
    return list(params)


LLM.__doc__ = LLM.__doc__.format(options=describe_options().lstrip())
