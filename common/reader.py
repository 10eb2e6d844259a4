"""Reading one section of the configuration file: typed fields, every error with its path.

A ``Section`` wraps one mapping of the file. Each ``field``/``sections`` call converts one key
and records a failure as ``path: message`` instead of raising, so one pass reports every error;
``Section.done`` then names the keys nobody read (typos must not be silently ignored).
"""

from __future__ import annotations

import datetime as dt
import difflib
import re
import urllib.parse
import zoneinfo
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, TypeVar, cast

from common.durations import duration_parse

T = TypeVar("T")
Converter = Callable[[Any], T]


class Invalid(Exception):
    """A converter's refusal; the ``Section`` prefixes it with the field's path (plus ``at``,
    e.g. ``[2]`` for an item of a list)."""

    def __init__(self, message: str, at: str = "") -> None:
        super().__init__(message)
        self.at = at


class ConfigError(Exception):
    """An invalid configuration file: every error found, each naming its path in the file."""

    def __init__(self, errors: Sequence[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = list(errors)


class Errors:
    def __init__(self) -> None:
        self.messages: list[str] = []

    def add(self, path: str, message: str) -> None:
        self.messages.append(f"{path or '(file)'}: {message}")


def describe(value: object) -> str:
    """A value as an error message quotes it: strings in quotes, containers by their kind."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing"
    return repr(value) if isinstance(value, str) else str(value)


def child_path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


class _Required:
    pass


REQUIRED: Any = _Required()


class Section:
    """One mapping of the file at ``path``."""

    def __init__(self, value: object, path: str, errors: Errors) -> None:
        self.path = path
        self.errors = errors
        self._read: set[str] = set()
        if isinstance(value, dict):
            self._value: dict[Any, Any] = value
        else:
            errors.add(path, f"must be a mapping, got {describe(value)}")
            self._value = {}

    def has(self, key: str) -> bool:
        """Whether the file gives ``key`` at all (valid or not)."""
        return self._value.get(key) is not None

    def field(self, key: str, convert: Converter[T], default: T = REQUIRED) -> T:
        """The converted value of ``key``; on error the error is recorded and a placeholder
        returned (the caller's result is discarded, because ``errors`` is not empty)."""
        self._read.add(key)
        if key not in self._value or self._value[key] is None:
            if default is REQUIRED:
                self.errors.add(child_path(self.path, key), "is required")
                return cast(T, None)
            return default
        try:
            return convert(self._value[key])
        except Invalid as error:
            self.errors.add(child_path(self.path, key) + error.at, str(error))
            return cast(T, None)

    def section(self, key: str, parse: Callable[[Section], T]) -> T:
        """The required mapping under ``key``, parsed by ``parse``."""
        self._read.add(key)
        path = child_path(self.path, key)
        if self._value.get(key) is None:
            self.errors.add(path, "is required")
            return cast(T, None)
        return parse(Section(self._value[key], path, self.errors))

    def sections(self, key: str, parse: Callable[[Section], T]) -> list[T]:
        """A list of mappings under ``key`` (absent means empty), each parsed by ``parse``."""
        self._read.add(key)
        items = self._value.get(key)
        path = child_path(self.path, key)
        if items is None:
            return []
        if not isinstance(items, list):
            self.errors.add(path, f"must be a list, got {describe(items)}")
            return []
        return [
            parse(Section(item, child_path(path, i), self.errors)) for i, item in enumerate(items)
        ]

    def done(self) -> None:
        """Record every key of the mapping that no field read."""
        known = sorted(self._read)
        for key in self._value:
            if key in self._read:
                continue
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            self.errors.add(
                child_path(self.path, str(key)),
                f"unknown key ({hint}known: {', '.join(known)})",
            )


# --- Converters: value → typed value, or Invalid("must …, got …") -------------------------------


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Invalid(f"must be a number, got {describe(value)}")
    return float(value)


def positive_number(value: object) -> float:
    number = _number(value)
    if number <= 0:
        raise Invalid(f"must be a positive number, got {describe(value)}")
    return number


def non_negative_number(value: object) -> float:
    number = _number(value)
    if number < 0:
        raise Invalid(f"must be zero or a positive number, got {describe(value)}")
    return number


def _integer(value: object, minimum: int, wording: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise Invalid(f"must be {wording}, got {describe(value)}")
    return value


def positive_int(value: object) -> int:
    return _integer(value, 1, "a positive whole number")


def non_negative_int(value: object) -> int:
    return _integer(value, 0, "zero or a positive whole number")


def boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise Invalid(f"must be true or false, got {describe(value)}")
    return value


def price(value: object) -> Decimal:
    """USD per million tokens, kept exact (0.1 stays 0.1 in the database)."""
    non_negative_number(value)
    return Decimal(str(value))


def text(max_length: int, pattern: str | None = None, wording: str = "") -> Converter[str]:
    compiled = re.compile(pattern) if pattern else None

    def convert(value: object) -> str:
        if not isinstance(value, str) or not value.strip():
            raise Invalid(f"must be a non-empty string, got {describe(value)}")
        if len(value) > max_length:
            raise Invalid(f"must be at most {max_length} characters, got {len(value)}")
        if compiled is not None and not compiled.fullmatch(value):
            raise Invalid(f"must be {wording}, got {describe(value)}")
        return value

    return convert


# Names of partners, tenants, teams, apps, providers and workload classes are Django slugs.
slug = text(100, r"[-a-zA-Z0-9_]+", "a slug (letters, digits, '-' and '_')")
# Model ids clients send: slashes allowed, no ':' (a suffix such as ':floor' selects a sort).
model_slug = text(200, r"[A-Za-z0-9][A-Za-z0-9._/-]*", "a model id (letters, digits, . _ / -)")
env_name = text(200, r"[A-Za-z_][A-Za-z0-9_]*", "an environment variable name")


def choice(*options: str) -> Converter[str]:
    def convert(value: object) -> str:
        if value not in options:
            raise Invalid(f"must be one of {', '.join(options)}, got {describe(value)}")
        return value

    return convert


def url(value: object) -> str:
    address = text(500)(value)
    parts = urllib.parse.urlsplit(address)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise Invalid(f"must be an http(s) URL, got {describe(value)}")
    return address


def clock_time(value: object) -> dt.time:
    if isinstance(value, int) and not isinstance(value, bool):
        # YAML 1.1 reads an unquoted 12:30 as the base-60 number 750.
        raise Invalid(f'must be a time "HH:MM" in quotes, got the number {value}')
    if not isinstance(value, str) or not re.fullmatch(r"\d\d:\d\d", value):
        raise Invalid(f'must be a time "HH:MM", got {describe(value)}')
    hours, minutes = int(value[:2]), int(value[3:])
    if hours > 23 or minutes > 59:
        raise Invalid(f'must be a time "HH:MM", got {describe(value)}')
    return dt.time(hours, minutes)


def timezone_name(value: object) -> str:
    name = text(64)(value)
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise Invalid(f"unknown time zone {describe(value)}") from None
    return name


def timestamp(value: object) -> dt.datetime:
    """A point in time with a zone: YAML ``2027-01-01T00:00:00Z``; a bare date means 00:00 UTC."""
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value)
        except ValueError:
            raise Invalid(
                f"must be a date-time such as 2027-01-01T00:00:00Z, got {value!r}"
            ) from None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise Invalid(f"must include a time zone (e.g. Z or +02:00), got {value.isoformat()}")
        return value
    if isinstance(value, dt.date):
        return dt.datetime.combine(value, dt.time(), tzinfo=dt.UTC)
    raise Invalid(f"must be a date-time such as 2027-01-01T00:00:00Z, got {describe(value)}")


def list_of(convert: Converter[T]) -> Converter[list[T]]:
    def convert_list(value: object) -> list[T]:
        if not isinstance(value, list):
            raise Invalid(f"must be a list, got {describe(value)}")
        result: list[T] = []
        for i, item in enumerate(value):
            try:
                result.append(convert(item))
            except Invalid as error:
                raise Invalid(str(error), at=f"[{i}]{error.at}") from None
        return result

    return convert_list


def duration(value: object) -> float:
    """Seconds from ``500ms``, ``10s``, ``1m``, ``5h``, ``1d``; bare numbers are refused as
    ambiguous."""
    seconds = duration_parse(value) if isinstance(value, str) else None
    if seconds is None or seconds <= 0:
        raise Invalid(f"must be a duration such as 500ms, 10s, 1m, 5h, 1d, got {describe(value)}")
    return seconds
