"""The operator's YAML files (pool, variants), read strictly.

PyYAML keeps the last of two equal keys in a mapping without a word, so a worker or a variant
defined twice would silently lose its first definition; a file that is not UTF-8 would end in a
traceback. Both are a ConfigurationError here, naming the file and the place.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode

from conductor.errors import ConfigurationError

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (merge keys, ``<<``, may still
    be overridden: that is what they are for)."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue  # SafeLoader reports an unhashable key itself
            if key in first_line:
                raise ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"found {key!r} a second time (first on line {first_line[key] + 1})",
                    key_node.start_mark,
                )
            first_line[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str) -> Any:
    """YAML text, with duplicate keys refused (yaml.YAMLError)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects


def load_yaml_file(path: Path, what: str) -> Any:
    """The parsed file; a ConfigurationError naming ``what`` (e.g. "pool file") and the path when
    it cannot be read, is not UTF-8, is not YAML or repeats a key."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"cannot read {what} {path}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigurationError(
            f"{what} {path} is not UTF-8 text (byte {exc.start} is {data[exc.start]:#04x})"
        ) from None
    try:
        return parse_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"{what} {path} is not valid YAML: {exc}") from None
