"""A small reader for the subset of EDN that Jepsen and Knossos print in histories.

Public interface:

- ``parse(text) -> object``: one EDN value from ``text`` (surrounding whitespace allowed).
- ``EdnError(ValueError)``: raised with the character offset of the problem.

Mapping: ``nil`` -> ``None``, ``true``/``false`` -> bool, integers -> ``int``, decimals ->
``float``, ``"strings"`` -> ``str``, ``:keywords`` -> ``Keyword`` (a ``str`` subclass holding the
name without the colon, so ``Keyword("ok") == "ok"``), bare symbols -> ``str``, vectors and lists
-> ``tuple`` (hashable, so values can live in model states), maps -> ``dict``, sets -> ``frozenset``.
Commas are whitespace, as in EDN. Tagged literals, characters and metadata are not supported:
Jepsen's register and key-value histories do not use them, and refusing them loudly beats
guessing.
"""

from __future__ import annotations

import re

__all__ = ["EdnError", "Keyword", "parse"]


class EdnError(ValueError):
    """Malformed EDN; ``offset`` is the 0-based character position of the problem."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(f"{message} at column {offset + 1}")
        self.offset = offset


class Keyword(str):
    """An EDN keyword, stored without its leading colon."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f":{str(self)}"


_WS = re.compile(r"[\s,]*")
_NUMBER = re.compile(r"[+-]?\d+(\.\d+)?([eE][+-]?\d+)?N?M?")
_TOKEN = re.compile(r"[^\s,\[\]{}()\"#;]+")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "b": "\b", "f": "\f", "/": "/"}
_CLOSERS = {"[": "]", "(": ")", "{": "}"}


def parse(text: str) -> object:
    """Parse exactly one EDN value from ``text``."""
    value, pos = _value(text, _skip(text, 0))
    pos = _skip(text, pos)
    if pos != len(text):
        raise EdnError("unexpected trailing text", pos)
    return value


def _skip(text: str, pos: int) -> int:
    while True:
        pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
        if pos < len(text) and text[pos] == ";":  # comment to end of line
            end = text.find("\n", pos)
            pos = len(text) if end < 0 else end
            continue
        return pos


def _value(text: str, pos: int) -> tuple[object, int]:
    if pos >= len(text):
        raise EdnError("unexpected end of input", pos)
    c = text[pos]
    if c == '"':
        return _string(text, pos)
    if c in _CLOSERS:
        return _collection(text, pos, c)
    if c == "#":
        if text.startswith("#{", pos):
            items, end = _items(text, pos + 2, "}")
            return frozenset(items), end
        raise EdnError("tagged literals are not supported", pos)
    if c == ":":
        m = _TOKEN.match(text, pos + 1)
        if not m:
            raise EdnError("empty keyword", pos)
        return Keyword(m.group()), m.end()
    m = _NUMBER.match(text, pos)
    if m and (m.end() == len(text) or not _TOKEN.match(text, m.end())):
        token = m.group().rstrip("NM")
        return (float(token) if m.group(1) or m.group(2) else int(token)), m.end()
    m = _TOKEN.match(text, pos)
    if not m:
        raise EdnError(f"unexpected character {c!r}", pos)
    token = m.group()
    if token == "nil":
        return None, m.end()
    if token == "true":
        return True, m.end()
    if token == "false":
        return False, m.end()
    return token, m.end()  # a symbol; callers treat it as text


def _string(text: str, pos: int) -> tuple[str, int]:
    out: list[str] = []
    i = pos + 1
    while i < len(text):
        c = text[i]
        if c == '"':
            return "".join(out), i + 1
        if c == "\\":
            if i + 1 >= len(text):
                break
            e = text[i + 1]
            if e == "u":
                digits = text[i + 2 : i + 6]
                if len(digits) != 4 or not all(d in "0123456789abcdefABCDEF" for d in digits):
                    raise EdnError("bad \\u escape", i)
                out.append(chr(int(digits, 16)))
                i += 6
                continue
            if e not in _ESCAPES:
                raise EdnError(f"bad escape \\{e}", i)
            out.append(_ESCAPES[e])
            i += 2
            continue
        out.append(c)
        i += 1
    raise EdnError("unterminated string", pos)


def _items(text: str, pos: int, closer: str) -> tuple[list[object], int]:
    items: list[object] = []
    while True:
        pos = _skip(text, pos)
        if pos >= len(text):
            raise EdnError(f"missing {closer!r}", pos)
        if text[pos] == closer:
            return items, pos + 1
        if text[pos] in "]})":
            raise EdnError(f"expected {closer!r}, found {text[pos]!r}", pos)
        value, pos = _value(text, pos)
        items.append(value)


def _collection(text: str, pos: int, opener: str) -> tuple[object, int]:
    items, end = _items(text, pos + 1, _CLOSERS[opener])
    if opener != "{":
        return tuple(items), end
    if len(items) % 2:
        raise EdnError("map with an odd number of forms", pos)
    try:
        return {items[i]: items[i + 1] for i in range(0, len(items), 2)}, end
    except TypeError as exc:  # an unhashable key such as a map
        raise EdnError(f"unhashable map key ({exc})", pos) from None
