"""`Registry[T]`: named rows for everything that varies (architectures, backends, formats...).

Adding an architecture or a backend is adding a row, never an if/elif chain across files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from infergen.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """A name → value table with a clear error for unknown names."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._rows: dict[str, T] = {}

    def register(self, name: str, value: T) -> T:
        if name in self._rows:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._rows[name] = value
        return value

    def decorator(self, name: str) -> Callable[[T], T]:
        """Use as `@REGISTRY.decorator("name")` on a class or function."""

        def wrap(value: T) -> T:
            return self.register(name, value)

        return wrap

    def get(self, name: str, *, where: str | None = None, fallback: str | None = None) -> T:
        """The row `name`; without one, the row `fallback` when given (an op with no kernel
        of a kernel set runs its torch row), else a ConfigError naming the rows."""
        if fallback is not None and name not in self._rows:
            name = fallback
        try:
            return self._rows[name]
        except KeyError:
            raise ConfigError(
                f"unknown {self.kind} {name!r}",
                where=where,
                expected=f"one of {sorted(self._rows)}",
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._rows

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def names(self) -> list[str]:
        return sorted(self._rows)

    def items(self) -> list[tuple[str, T]]:
        return list(self._rows.items())
