"""Reading an untyped YAML/JSON tree; errors name the field path (``providers[1].limits``)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

from simulator.model.durations import parse_duration


class MarketError(ValueError):
    """A market file (or incident request) that does not have the expected shape."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path or '<root>'}: {problem}")
        self.path = path
        self.problem = problem


class Node:
    """One value of the tree with its path; the typed getters raise MarketError."""

    __slots__ = ("path", "value")

    def __init__(self, value: Any, path: str = "") -> None:
        self.value = value
        self.path = path

    def fail(self, problem: str) -> MarketError:
        return MarketError(self.path, problem)

    def child_path(self, key: str | int) -> str:
        if isinstance(key, int):
            return f"{self.path}[{key}]"
        return f"{self.path}.{key}" if self.path else key

    def mapping(self, allowed: frozenset[str] | None = None) -> Mapping[str, Any]:
        """The value as a mapping; with ``allowed``, unknown keys are refused (typo guard)."""
        if not isinstance(self.value, Mapping):
            raise self.fail(f"must be a mapping, got {type(self.value).__name__}")
        for key in self.value:
            if not isinstance(key, str):
                raise self.fail(f"keys must be strings, got {key!r}")
            if allowed is not None and key not in allowed:
                raise MarketError(
                    self.child_path(key),
                    f"unknown field (expected one of: {', '.join(sorted(allowed))})",
                )
        return self.value

    def items(self) -> Iterator[tuple[str, Node]]:
        for key, value in self.mapping().items():
            yield key, Node(value, self.child_path(key))

    def elements(self) -> Iterator[Node]:
        if not isinstance(self.value, list):
            raise self.fail(f"must be a list, got {type(self.value).__name__}")
        for index, value in enumerate(self.value):
            yield Node(value, self.child_path(index))

    def has(self, key: str) -> bool:
        return isinstance(self.value, Mapping) and self.value.get(key) is not None

    def get(self, key: str) -> Node:
        """The child ``key``; it must be present."""
        mapping = self.mapping()
        if key not in mapping or mapping[key] is None:
            raise MarketError(self.child_path(key), "is required")
        return Node(mapping[key], self.child_path(key))

    def text(self) -> str:
        if not isinstance(self.value, str) or not self.value.strip():
            raise self.fail("must be a non-empty string")
        return self.value.strip()

    def number(self, *, minimum: float = -math.inf, maximum: float = math.inf) -> float:
        if isinstance(self.value, bool) or not isinstance(self.value, int | float):
            raise self.fail(f"must be a number, got {self.value!r}")
        number = float(self.value)
        if not math.isfinite(number) or number < minimum or number > maximum:
            raise self.fail(f"must be between {minimum:g} and {maximum:g}, got {self.value!r}")
        return number

    def positive(self) -> float:
        number = self.number(minimum=0.0)
        if number <= 0:
            raise self.fail(f"must be greater than 0, got {self.value!r}")
        return number

    def integer(self, *, minimum: int = 0, maximum: int | None = None) -> int:
        if isinstance(self.value, bool) or not isinstance(self.value, int):
            raise self.fail(f"must be an integer, got {self.value!r}")
        if self.value < minimum or (maximum is not None and self.value > maximum):
            upper = "" if maximum is None else f" and at most {maximum}"
            raise self.fail(f"must be at least {minimum}{upper}, got {self.value}")
        return self.value

    def rate(self) -> float:
        return self.number(minimum=0.0, maximum=1.0)

    def duration(self, *, allow_zero: bool = False) -> float:
        if not isinstance(self.value, str):
            raise self.fail(f"must be a duration string such as '40m', got {self.value!r}")
        try:
            seconds = parse_duration(self.value)
        except ValueError as error:
            raise self.fail(str(error)) from None
        if seconds <= 0 and not allow_zero:
            raise self.fail("must be longer than 0")
        return seconds
