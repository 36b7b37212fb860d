"""The spec's YAML loader: safe, and bounded before anything is built.

``yaml.safe_load`` lets the last of two equal keys win without a word, builds
a billion-laughs bomb (aliases of aliases) in memory, recurses until
RecursionError on deep nesting, and follows recursive aliases. ``load_yaml``
composes the node graph (nesting bounded while composing, since the composer
recurses), checks it (duplicate keys, tags, expanded size, aliases), and only
then constructs Python values. Every refusal is a ``YAMLRefusal`` naming the
place as a field path.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_DEPTH = 32  # a spec nests 5 deep; JSON schema tools and pydantic stay far from their limits
MAX_ALIASES = 100
MAX_NODES = 100_000  # values after expanding every alias
# Digits of a number: every bound in a spec has a few; Python refuses past 4,300 anyway, and
# there the error could name only the file, not the field.
MAX_NUMBER_CHARS = 40
_CORE = "tag:yaml.org,2002:"
# The JSON-like types a spec is made of, plus the implicit ones YAML resolves by itself
# (a date-looking scalar, the merge key `<<`); pydantic refuses what does not fit a field.
ALLOWED_TAGS = frozenset(
    _CORE + t for t in ("str", "int", "float", "bool", "null", "seq", "map", "timestamp", "merge")
)


class YAMLRefusal(yaml.YAMLError):
    """The YAML parses but is refused: ``path`` is where, ``fix`` how to mend it."""

    def __init__(self, path: str, message: str, fix: str):
        super().__init__(message)
        self.path = path
        self.message = message
        self.fix = fix


def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


class _Loader(yaml.SafeLoader):
    """SafeLoader whose composer counts nesting and aliases as it goes."""

    def __init__(self, text: str):
        super().__init__(text)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise YAMLRefusal(
                    "(file)",
                    f"more than {MAX_ALIASES} aliases (*name), line {mark.line + 1}",
                    "write the values out; a spec needs few anchors",
                )
        self._depth += 1
        if self._depth > MAX_DEPTH:
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            raise YAMLRefusal(
                "(file)",
                f"nested deeper than {MAX_DEPTH} levels at line {mark.line + 1}",
                "flatten the YAML; a spec nests a few levels",
            )
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _join(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


class _Checker:
    def __init__(self) -> None:
        self.seen: dict[int, tuple[int, int]] = {}  # node -> (values, height), aliases expanded
        self.open: set[int] = set()

    def check(self, node: Node, path: str, depth: int) -> tuple[int, int]:
        """Values under ``node`` and its height, each alias counted where it is used."""
        where = path or "(top level)"
        if node.tag not in ALLOWED_TAGS:
            raise YAMLRefusal(
                where,
                f"the tag {node.tag!r} (line {_line(node)}) is not allowed in a spec",
                "remove the tag: a spec holds plain strings, numbers, lists and mappings",
            )
        if (
            isinstance(node, ScalarNode)
            and node.tag in (_CORE + "int", _CORE + "float")
            and len(node.value) > MAX_NUMBER_CHARS
        ):
            raise YAMLRefusal(
                where,
                f"a number of {len(node.value)} characters (line {_line(node)}); no bound of a"
                f" spec needs more than {MAX_NUMBER_CHARS}",
                "write the number you mean (each field's bound is in docs/operations.md)",
            )
        if id(node) in self.open:
            raise YAMLRefusal(
                where,
                f"a recursive alias (line {_line(node)}): the value contains itself",
                "write the values out",
            )
        if id(node) not in self.seen:
            self.open.add(id(node))
            self.seen[id(node)] = self._children(node, path, depth)
            self.open.discard(id(node))
        n, height = self.seen[id(node)]
        if depth + height > MAX_DEPTH:  # an alias can carry a deep value deeper still
            raise YAMLRefusal(
                where,
                f"nested deeper than {MAX_DEPTH} levels once aliases are expanded",
                "write the values out instead of nesting aliases",
            )
        if n > MAX_NODES:
            raise YAMLRefusal(
                where,
                f"expands to more than {MAX_NODES} values (aliases of aliases: a YAML bomb?)",
                "write the spec without nested aliases",
            )
        return n, height

    def _children(self, node: Node, path: str, depth: int) -> tuple[int, int]:
        pairs: list[tuple[Node, str]] = []
        if isinstance(node, SequenceNode):
            pairs = [(child, _join(path, i)) for i, child in enumerate(node.value)]
        elif isinstance(node, MappingNode):
            seen: dict[tuple[str, str], Node] = {}
            for key, value in node.value:
                label = key.value if isinstance(key, ScalarNode) else "?"
                if isinstance(key, ScalarNode) and key.tag != _CORE + "merge":
                    if (first := seen.get((key.tag, key.value))) is not None:
                        raise YAMLRefusal(
                            _join(path, label),
                            f"duplicate key {key.value!r} at lines {_line(first)} and {_line(key)}",
                            "keep one of them; YAML would silently use the last",
                        )
                    seen[(key.tag, key.value)] = key
                pairs += [(key, path), (value, _join(path, label))]
        n, height = 1, 0
        for child, where in pairs:
            m, h = self.check(child, where, depth + 1)
            n, height = n + m, max(height, h + 1)
        return n, height


def load_yaml(text: str) -> Any:
    """The YAML document in ``text`` as Python values; YAMLRefusal or yaml.YAMLError if refused."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _Checker().check(node, "", 0)
        try:
            return loader.construct_document(node)
        except ValueError as err:  # e.g. an integer of more than 4300 digits
            raise YAMLRefusal(
                "(file)", f"a value cannot be read: {err}", "write a smaller value"
            ) from None
    finally:
        loader.dispose()
