"""A model's fields checked with the configuration file's own converters (``common.reader``).

``ConfigRules`` is the model mixin: each app names the rule of each field the file can set, so
the admin refuses what ``loadconfig`` refuses, with the file's wording.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from decimal import Decimal
from typing import Any, ClassVar

from django.core.exceptions import ValidationError

from common.reader import Invalid, positive_number

# A check of one field's value: returns anything, raises ``Invalid`` with the file's message.
FieldRule = Callable[[Any], object]
FieldErrors = dict[str, list[str]]


def seconds(value: object) -> float:
    """A duration the database holds in seconds; the file's ``duration`` refuses zero too."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value <= 0:
        raise Invalid(f"must be a positive number of seconds, got {value:g}")
    return positive_number(value)


def exact(rule: FieldRule) -> FieldRule:
    """``rule`` for a decimal field (prices): the file's converters read numbers, not Decimals."""

    def check(value: object) -> object:
        return rule(float(value) if isinstance(value, Decimal) else value)

    return check


def rules_check(
    values: Mapping[str, Any], rules: Mapping[str, FieldRule], skip: Collection[str] = ()
) -> FieldErrors:
    """Every field of ``rules`` whose value breaks its rule, with the file's message.

    An empty value (None or "") is left to the field's own checks: required fields refuse it.
    """
    errors: FieldErrors = {}
    for field, rule in rules.items():
        value = values.get(field)
        if field in skip or value is None or value == "":
            continue
        try:
            rule(value)
        except Invalid as error:
            where = f"{error.at.lstrip('.')}: " if error.at else ""
            errors.setdefault(field, []).append(f"{where}{error}")
    return errors


class ConfigRules:
    """A model mixin: ``clean_fields`` also applies ``config_rules`` (field → the file's rule).

    In ``clean_fields`` rather than ``clean`` because the admin excludes the fields a user may
    not edit (read-only for tenant members), so a bad value the platform set cannot block them.
    """

    config_rules: ClassVar[Mapping[str, FieldRule]] = {}

    def clean_fields(self, exclude: Collection[str] | None = None) -> None:
        errors: dict[str, list[Any]] = {}  # Django's messages, then the rules' strings
        try:
            super().clean_fields(exclude=exclude)  # type: ignore[misc]
        except ValidationError as error:
            errors = error.update_error_dict({})
        values = {field: getattr(self, field) for field in self.config_rules}
        # A field Django already refused has one message; the rule's would repeat it.
        skip = {*(exclude or ()), *errors}
        for field, messages in rules_check(values, self.config_rules, skip).items():
            errors.setdefault(field, []).extend(messages)
        if errors:
            raise ValidationError(errors)
