"""Edits that keep a file's comments and layout: a value of a YAML document or of a protobuf
text config (``config.pbtxt``) is changed where it is written, and only there.

A YAML edit sets (or deletes) the value at a path of mapping keys: the value's own characters are
replaced; a missing key is added beside its siblings, in their style (a ``{...}`` mapping gets
``, key: value``, a block mapping a new line at their indentation); a deleted key takes its lines
with it. Positions come from PyYAML's composer (the node tree with marks), so quoting, flow or
block style, anchors and comments elsewhere stay as written. A protobuf text edit does the same
on a small tokenizer of the text format. Callers check the result by parsing it (what it means
must be what was asked) and fall back to a full rewrite when an edit cannot be made in place.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

DELETE: Any = object()  # the value that removes a key


class TextEditError(ValueError):
    """An edit that cannot be made in place (the caller rewrites the file instead)."""


# ------------------------------------------------------------------------------------------ YAML

YamlEdit = tuple[tuple[str, ...], Any]  # (path of keys, value or DELETE)

_PLAIN = re.compile(r"[A-Za-z_][\w.:/-]*")
_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


def flow(value: Any) -> str:
    """``value`` as flow-style YAML (mappings ``{k: v}``, lists ``[a, b]``, scalars plain when
    they read back as the same string, else JSON-quoted)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{flow(str(k))}: {flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _WORDS:
        return text
    return json.dumps(text)


def yaml_edit(text: str, edits: list[YamlEdit]) -> str:
    """``text`` with each edit made in turn (see the module's docs)."""
    for path, value in edits:
        text = _yaml_one(text, path, value)
    return text


def _compose(text: str) -> MappingNode:
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        raise TextEditError(f"cannot read YAML: {exc}") from None
    if not isinstance(root, MappingNode):
        raise TextEditError("the document is not a mapping")
    return root


def _find(mapping: MappingNode, key: str) -> tuple[Node, Node] | None:
    for k, v in mapping.value:
        if isinstance(k, ScalarNode) and k.value == key:
            return k, v
    return None


def _nested(rest: tuple[str, ...], value: Any) -> Any:
    for key in reversed(rest):
        value = {key: value}
    return value


def _yaml_one(text: str, path: tuple[str, ...], value: Any) -> str:
    node: Node = _compose(text)
    for depth, key in enumerate(path):
        assert isinstance(node, MappingNode)
        pair = _find(node, key)
        rest = path[depth + 1 :]
        if pair is None:
            return text if value is DELETE else _insert(text, node, key, _nested(rest, value))
        k, v = pair
        if not rest:
            return _remove(text, node, k, v) if value is DELETE else _replace(text, k, v, value)
        if not isinstance(v, MappingNode):
            return text if value is DELETE else _replace(text, k, v, _nested(rest, value))
        node = v
    return text


def _end(node: Node) -> int:
    """Where ``node``'s own characters end (a block collection's mark runs on to the next token,
    past comments and blank lines: its last leaf's end is used instead)."""
    if isinstance(node, ScalarNode) or getattr(node, "flow_style", False) or not node.value:
        return int(node.end_mark.index)
    last: Node = node.value[-1][1] if isinstance(node, MappingNode) else node.value[-1]
    return _end(last)


def _line_end(text: str, index: int) -> int:
    if index > 0 and text[index - 1] == "\n":
        index -= 1
    end = text.find("\n", index)
    return len(text) if end < 0 else end


def _replace(text: str, key: Node, value: Node, new: Any) -> str:
    empty = isinstance(value, ScalarNode) and value.start_mark.index == value.end_mark.index
    if (isinstance(value, ScalarNode) and not empty) or getattr(value, "flow_style", False):
        start, end = value.start_mark.index, value.end_mark.index
        return text[:start] + flow(new) + text[end:]
    colon = text.find(":", key.end_mark.index)
    if colon < 0:
        raise TextEditError(f"no ':' after key {key.value!r}")
    end = colon + 1 if empty else _end(value)
    return text[: colon + 1] + " " + flow(new) + text[end:]


def _insert(text: str, mapping: MappingNode, key: str, value: Any) -> str:
    entry = f"{flow(key)}: {flow(value)}"
    if mapping.flow_style:
        if mapping.value:
            at = _end(mapping.value[-1][1])
            return text[:at] + ", " + entry + text[at:]
        at = text.index("{", mapping.start_mark.index) + 1
        return text[:at] + entry + text[at:]
    if not mapping.value:
        raise TextEditError("an empty block mapping")
    indent = int(mapping.value[0][0].start_mark.column)
    at = _line_end(text, _end(mapping))
    return text[:at] + "\n" + " " * indent + entry + text[at:]


def _remove(text: str, mapping: MappingNode, key: Node, value: Node) -> str:
    pairs = mapping.value
    index = next(i for i, (k, _) in enumerate(pairs) if k is key)
    if mapping.flow_style:
        if index > 0:
            start, end = _end(pairs[index - 1][1]), _end(value)
        elif len(pairs) > 1:
            start, end = key.start_mark.index, pairs[1][0].start_mark.index
        else:
            start, end = key.start_mark.index, _end(value)
        return text[:start] + text[end:]
    start = text.rfind("\n", 0, key.start_mark.index) + 1
    if text[start : key.start_mark.index].strip():
        raise TextEditError(f"key {key.value!r} does not start its line")
    if len(pairs) == 1:
        raise TextEditError(f"key {key.value!r} is its mapping's only key")
    end = _line_end(text, max(_end(value), key.end_mark.index))
    return text[:start] + text[min(end + 1, len(text)) :]


# -------------------------------------------------------------------------- protobuf text format

_TOKEN = re.compile(
    r"""(?P<space>\s+)|(?P<comment>\#[^\n]*)|(?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')"""
    r"""|(?P<punct>[{}\[\]<>:,;])|(?P<word>[^\s{}\[\]<>:,;\#"']+)"""
)
_CLOSE = {"{": "}", "<": ">"}


@dataclass(slots=True)
class Field:
    """One ``name: value`` of a message, by character positions: ``start`` at its name, ``end``
    after its value (and a ``,``/``;`` that follows it)."""

    name: str
    start: int
    end: int
    value_start: int
    value_end: int
    message: Message | None = None  # a ``{...}`` value
    items: list[Message] = field(default_factory=list)  # the messages of a ``[...]`` value
    listed: bool = False  # the value is a ``[...]`` list


@dataclass(slots=True)
class Message:
    """A message's fields; ``open``/``close``: its braces' positions (-1 for the file's top)."""

    fields: list[Field]
    open: int = -1
    close: int = -1

    def named(self, name: str) -> list[Field]:
        return [f for f in self.fields if f.name == name]


class _Tokens:
    def __init__(self, text: str) -> None:
        self.items: list[tuple[str, str, int, int]] = []  # (kind, text, start, end)
        pos = 0
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if match is None:
                raise TextEditError(f"cannot read the config at character {pos}")
            kind = match.lastgroup or ""
            if kind not in ("space", "comment"):
                self.items.append((kind, match.group(), match.start(), match.end()))
            pos = match.end()
        self.at = 0

    def peek(self) -> tuple[str, str, int, int] | None:
        return self.items[self.at] if self.at < len(self.items) else None

    def take(self) -> tuple[str, str, int, int]:
        token = self.peek()
        if token is None:
            raise TextEditError("the config ends in the middle of a value")
        self.at += 1
        return token


def parse_pbtxt(text: str) -> Message:
    tokens = _Tokens(text)
    top = _message(tokens, None)
    if tokens.peek() is not None:
        raise TextEditError(f"unexpected {tokens.peek()!r}")
    return top


def _message(tokens: _Tokens, close: str | None) -> Message:
    fields: list[Field] = []
    while True:
        token = tokens.peek()
        if token is None:
            if close is not None:
                raise TextEditError(f"a message is not closed with {close!r}")
            return Message(fields)
        if close is not None and token[1] == close:
            return Message(fields)
        kind, name, start, _ = tokens.take()
        if kind != "word":
            raise TextEditError(f"a field name expected at character {start}, got {name!r}")
        if tokens.peek() is not None and tokens.peek()[1] == ":":  # type: ignore[index]
            tokens.take()
        found = _value(tokens, Field(name, start, start, 0, 0))
        sep = tokens.peek()
        found.end = found.value_end
        if sep is not None and sep[1] in (",", ";"):
            tokens.take()
            found.end = sep[3]
        fields.append(found)


def _value(tokens: _Tokens, found: Field) -> Field:
    kind, text, start, end = tokens.take()
    found.value_start = start
    if text in _CLOSE:
        found.message = _message(tokens, _CLOSE[text])
        closing = tokens.take()
        found.message.open, found.message.close = start, closing[2]
        found.value_end = closing[3]
    elif text == "[":
        found.listed = True
        while tokens.peek() is not None and tokens.peek()[1] != "]":  # type: ignore[index]
            item = _value(tokens, Field("", 0, 0, 0, 0))
            if item.message is not None:
                found.items.append(item.message)
            if tokens.peek() is not None and tokens.peek()[1] == ",":  # type: ignore[index]
                tokens.take()
        found.value_end = tokens.take()[3]
    elif kind in ("word", "string"):
        found.value_end = end
        while tokens.peek() is not None and tokens.peek()[0] == "string" and kind == "string":  # type: ignore[index]
            found.value_end = tokens.take()[3]  # adjacent strings are one
    else:
        raise TextEditError(f"a value expected at character {start}, got {text!r}")
    return found


def _indent_of(text: str, index: int) -> str:
    start = text.rfind("\n", 0, index) + 1
    return text[start:index] if not text[start:index].strip() else ""


def pb_set(text: str, message: Message, name: str, value: str) -> str:
    """``name: value`` in ``message`` (a scalar field: its first occurrence replaced, else added)."""
    present = message.named(name)
    if present:
        f = present[0]
        return text[: f.value_start] + value + text[f.value_end :]
    return pb_add(text, message, f"{name}: {value}")


def pb_add(text: str, message: Message, entry: str) -> str:
    """``entry`` added as the message's last field: on a line of its own at its fields'
    indentation when the message spans lines, else beside them."""
    if message.open < 0:  # the file's top level
        body = text.rstrip("\n")
        return body + ("\n" if body else "") + entry + "\n"
    inside = text[message.open : message.close]
    if "\n" not in inside:
        last = message.fields[-1].end if message.fields else message.open + 1
        return text[:last] + " " + entry + text[last:]
    if message.fields:
        indent = _indent_of(text, message.fields[0].start)
        at = _line_end(text, message.fields[-1].end)
    else:
        indent = _indent_of(text, message.close) + "  "
        at = message.open + 1
    return text[:at] + "\n" + indent + entry + text[at:]


def pb_remove(text: str, f: Field) -> str:
    """The field gone; the whole line when it has a line of its own."""
    start, end = f.start, f.end
    line_start = text.rfind("\n", 0, start) + 1
    line_end = _line_end(text, end)
    rest = text[end:line_end].strip()
    if not text[line_start:start].strip() and (not rest or rest.startswith("#")):
        return text[:line_start] + text[min(line_end + 1, len(text)) :]
    return text[:start] + text[end:].lstrip(" ")


__all__ = [
    "DELETE",
    "Field",
    "Message",
    "TextEditError",
    "YamlEdit",
    "flow",
    "parse_pbtxt",
    "pb_add",
    "pb_remove",
    "pb_set",
    "yaml_edit",
]
