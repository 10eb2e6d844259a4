"""Configuration as data (DESIGN): the YAML file that ``manage.py loadconfig`` applies.

Parsing is pure — no Django, no database: ``config_read`` loads the YAML, ``config_parse``
turns it into the dataclasses of ``schema`` or raises ``ConfigError`` listing every problem
with its path in the file. ``configfile.apply`` writes a parsed ``Config`` to the database and
``configfile.prune`` removes what the file no longer names.

Above the domain apps, below the proxy: it imports the apps' validation rules and rows; none of
them imports it. ``prune`` keeps what the proxy's ledger and jobs still refer to through the
check the proxy registers (``configfile.prune.history_register``, from ``gateway/apps.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from common.reader import ConfigError, Errors, Section
from configfile.schema import Config, parse_config
from configfile.validate import KnownNames, config_validate

__all__ = ["Config", "ConfigError", "KnownNames", "config_parse", "config_read"]


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error
    (PyYAML silently keeps the last one, hiding a typo)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def config_read(path: str | Path) -> object:
    """The YAML document of ``path``; a syntax error becomes a ``ConfigError``."""
    try:
        with open(path, encoding="utf-8") as stream:
            return yaml.load(stream, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.YAMLError as error:
        raise ConfigError([f"(file): not valid YAML: {error}"]) from None


def config_parse(data: object, *, known: KnownNames | None = None) -> Config:
    """The validated configuration, or ``ConfigError`` with every error found.

    ``known`` holds names already in the database, which the file may refer to.
    """
    errors = Errors()
    config = parse_config(Section(data, "", errors))
    config_validate(config, known or KnownNames(), errors)
    if errors.messages:
        raise ConfigError(errors.messages)
    return config
