"""The options table (engine/options.py) is the one declaration of every engine option: it
builds EngineConfig, LLM's keywords and each command's flags."""

from __future__ import annotations

import pytest

from infergen import LLM
from infergen.cli import build_parser
from infergen.engine.config import EngineConfig
from infergen.engine.options import OPTIONS, engine_config, options_from_args
from infergen.errors import ConfigError

COMMANDS = ("generate", "chat", "serve", "compile", "quantize", "eval", "predict", "profile")
# flags a command defines itself with another meaning: quantize --weights (the scheme to
# write), eval --weights / --kv-format (the schemes and formats to score, repeatable),
# generate / chat --seed (the sampling seed), profile --seed (its prompts'); predict's flags
# of the deployment it simulates (a config or checkpoint, formats, scheduler limits; --seed:
# the workload's)
OWN_FLAGS = {
    "predict": (
        "model",
        "seed",
        "block_size",
        "max_num_seqs",
        "max_num_batched_tokens",
        "admission",
        "weights",
        "activations",
        "draft_model",  # (its own: the performance model's draft config)
    ),  # fmt: skip
    "quantize": ("weights",),
    "eval": ("weights", "kv_format", "kv_press"),  # (eval scores a list of each)
    "generate": ("seed",),
    "chat": ("seed",),
    "profile": ("seed",),
}


def _field(config: EngineConfig, path: str):
    value = config
    for part in path.split("."):
        value = getattr(value, part)
    return value


def test_table_defaults_are_the_dataclass_defaults():
    """engine_config() with nothing given is EngineConfig(): the table and the sections agree
    on every default (a default changed in one place only fails here)."""
    assert engine_config() == EngineConfig()
    for option in OPTIONS:
        assert option.value(option.default) == _field(EngineConfig(), option.path), option.name


@pytest.mark.parametrize(
    "name, given, expected",
    [
        ("kv_cache_memory", "2MiB", 2 << 20),
        ("max_num_seqs", 3, 3),
        ("weights", "int8", "int8"),
        ("keep", ["lm_head"], ("lm_head",)),
        ("attention", "fp8_e4m3", "fp8_e4m3"),
        ("compile", "jit", "jit"),
        ("streaming_window", 32, 32),
    ],
)
def test_each_option_lands_in_its_section(name, given, expected):
    extra = {"kv_format": "fp8_e4m3"} if name == "attention" else {}
    config = engine_config(**{name: given}, **extra)
    path = next(o.path for o in OPTIONS if o.name == name)
    assert _field(config, path) == expected
    others = {o.path for o in OPTIONS} - {path, "cache.kv_format"}
    for other in others:  # everything else stays at its default
        assert _field(config, other) == _field(EngineConfig(), other), other


def test_unknown_keyword_names_the_closest_option():
    with pytest.raises(ConfigError) as err:
        engine_config(kv_cache_memroy="1GiB")
    assert "kv_cache_memroy" in str(err.value) and "'kv_cache_memory'" in str(err.value)
    with pytest.raises(ConfigError, match="unknown option 'colour'"):
        LLM(colour="blue")  # before any loading


def test_bad_values_name_the_option():
    with pytest.raises(ConfigError, match="weights"):
        engine_config(weights="int9")
    with pytest.raises(ConfigError, match="kv_cache_memory"):
        engine_config(kv_cache_memory="lots")
    with pytest.raises(ConfigError, match="compile"):
        engine_config(compile="fastest")


def _argv(option) -> list[str]:
    if option.choices:
        text = option.choices[-1]
    elif option.parse is int:
        text = "3"
    elif option.parse is float:
        text = "0.5"
    elif option.name == "device":
        text = "cpu"
    elif option.metavar == "on|off":
        text = "on"
    elif option.metavar == "N|auto":
        text = "auto"
    else:
        text = "x"
    return [option.flag, text]


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_takes_exactly_its_options(command):
    parser = build_parser()
    positional = {"generate": ["hi"], "quantize": ["--weights", "int8", "--out", "o"]}
    base = [command, *positional.get(command, [])]
    taken = [o for o in OPTIONS if command in o.commands]
    args = parser.parse_args(base)
    assert set(options_from_args(args, command)) == {o.name for o in taken}
    for option in OPTIONS:
        if option.name in OWN_FLAGS.get(command, ()):
            continue  # the command's own flag of that name (a scheme to write / score)
        if command in option.commands:
            args = parser.parse_args([*base, *_argv(option)])
            got = getattr(args, option.name)
            assert got == ([_argv(option)[1]] if option.repeat else option.parse(_argv(option)[1]))
        else:  # a flag the command does not use is refused, not ignored
            with pytest.raises(SystemExit):
                parser.parse_args([*base, *_argv(option)])
