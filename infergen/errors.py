"""User-facing errors: one clear message naming what was wrong and what was expected.

Every error a person can cause (bad checkpoint, bad config, bad request) is raised as an
`InfergenError` subclass. The CLI prints its message and exits with code 2; a traceback is
shown only with `--debug`.
"""

from __future__ import annotations


class InfergenError(Exception):
    """Base class for errors caused by input (files, configs, requests), not by bugs."""

    def __init__(
        self,
        what: str,
        *,
        where: str | None = None,
        found: object = None,
        expected: object = None,
        hint: str | None = None,
    ) -> None:
        self.what = what
        self.where = where
        self.found = found
        self.expected = expected
        self.hint = hint
        super().__init__(self._format())

    def _format(self) -> str:
        parts = [f"{self.where}: {self.what}" if self.where else self.what]
        if self.found is not None:
            parts.append(f"found: {self.found}")
        if self.expected is not None:
            parts.append(f"expected: {self.expected}")
        if self.hint:
            parts.append(f"hint: {self.hint}")
        return "\n  ".join(parts)


class CheckpointError(InfergenError):
    """A checkpoint file or directory is missing, corrupt, or contradicts itself."""


class ConfigError(InfergenError):
    """A configuration value is invalid or contradicts another."""


class RequestError(InfergenError):
    """A generation request (prompt, sampling parameters) is invalid."""
