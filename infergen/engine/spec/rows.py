"""Every PROPOSERS row, registered by importing its module (the engine's config and build
import this)."""

from infergen.engine.spec import draft, layerskip, mtp, ngram, suffix  # noqa: F401 - their rows
from infergen.engine.spec.proposer import PROPOSERS

__all__ = ["PROPOSERS"]
