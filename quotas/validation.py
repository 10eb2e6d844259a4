"""The configuration file's rules as model validation: the admin refuses what ``loadconfig`` does.

Each field the file can set is checked here with the very converter ``loadconfig`` uses for it
(``common.reader`` / ``limits`` / ``schema``), with its wording; a limit's shape is
checked with the file's table of the keys each rule needs and refuses, then built with the
function the quota snapshot uses (``quotas.core.specs.bucket_spec_build``), so a row the admin
saves is one the snapshot can build. ``loadconfig`` itself saves through ``full_clean`` too.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from common.reader import positive_number, timezone_name
from common.rules import FieldErrors, FieldRule, rules_check, seconds
from quotas.core.specs import bucket_spec_build
from quotas.limits import DIMENSIONS, FIXED_WINDOWS, RULE_KEYS, ramp_factor

# --- Buckets: a limit's shape ------------------------------------------------------------------

# The file's key of each limit field of ``quotas.Bucket``.
BUCKET_FILE_KEYS = {
    "capacity": "capacity",
    "period_seconds": "per",
    "window": "window",
    "resets_at": "resets_at",
    "timezone": "timezone",
    "duration_seconds": "duration",
    "factor": "factor",
}
BUCKET_RULES: dict[str, FieldRule] = {
    "capacity": positive_number,
    "period_seconds": seconds,
    "duration_seconds": seconds,
    "timezone": timezone_name,
    "factor": ramp_factor,
}
# These dimensions have a rule of their own (the file derives the rule from them).
OWN_RULE_DIMENSIONS = ("concurrency", "ramp")
# The file's defaults for a fixed window that names no reset time or zone.
FIXED_WINDOW_DEFAULTS: dict[str, object] = {"resets_at": dt.time(0, 0), "timezone": "UTC"}


def bucket_defaults(values: Mapping[str, Any]) -> dict[str, object]:
    """The fields ``loadconfig`` fills in when a limit leaves them out (fixed window: 00:00 UTC)."""
    if values.get("rule") != "fixed_window":
        return {}
    return {k: v for k, v in FIXED_WINDOW_DEFAULTS.items() if values.get(k) in (None, "")}


def bucket_errors(values: Mapping[str, Any], *, name: str = "bucket") -> FieldErrors:
    """What ``loadconfig`` would refuse in a limit with these field values (``quotas.Bucket``
    names), by field; ``__all__`` for what only building the bucket finds."""
    rule, dimension = values.get("rule") or "", values.get("dimension") or ""
    if rule not in RULE_KEYS or dimension not in DIMENSIONS:
        return {}  # the fields' own choices refuse them
    errors: FieldErrors = {}
    if dimension in OWN_RULE_DIMENSIONS and rule != dimension:
        errors["rule"] = [f"a {dimension} limit has the rule {dimension}"]
    elif rule in OWN_RULE_DIMENSIONS and dimension != rule:
        errors["rule"] = [f"the {rule} rule is for the {rule} dimension only"]
    needed, refused = RULE_KEYS[rule]
    # In the file a rolling window is "window: rolling"; here it leaves the window empty.
    refused_keys = {*refused, *(() if rule == "fixed_window" else ("window",))}
    what = f"a {rule.replace('_', ' ')} limit"
    for field, key in BUCKET_FILE_KEYS.items():
        given = values.get(field) not in (None, "")
        if key in needed and not given:
            errors.setdefault(field, []).append(f"is required for {what}")
        elif key in refused_keys and given:
            errors.setdefault(field, []).append(f"is not allowed for {what}")
    if rule == "fixed_window" and values.get("window") not in (None, "", *FIXED_WINDOWS):
        errors.setdefault("window", []).append(f"must be one of {', '.join(FIXED_WINDOWS)}")
    for field, messages in rules_check(values, BUCKET_RULES, skip=errors).items():
        errors.setdefault(field, []).extend(messages)
    if not errors:
        errors = _bucket_build_errors(values, name)
    return errors


def _bucket_build_errors(values: Mapping[str, Any], name: str) -> FieldErrors:
    # The snapshot builds every bucket with this function: what it refuses would stop the
    # whole deployment's configuration from loading.
    try:
        bucket_spec_build(
            name=name or "bucket",
            scope="check",
            dimension=values["dimension"],
            rule=values["rule"],
            capacity=values.get("capacity"),
            period_seconds=values.get("period_seconds"),
            duration_seconds=values.get("duration_seconds"),
            window=values.get("window") or "",
            resets_at=values.get("resets_at"),
            timezone=values.get("timezone") or "",
            factor=values.get("factor"),
            shadow=bool(values.get("shadow")),
        )
    except (ValueError, TypeError) as error:
        return {"__all__": [str(error)]}
    return {}
