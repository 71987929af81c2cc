"""Filling prompt templates without tripping over braces.

Templates hold JSON examples (generation prompts) and captions may contain braces, so
`str.format` is unsafe both ways. Only the named placeholders are replaced.
"""
from __future__ import annotations

import functools
import re

_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


def placeholders(template: str) -> set[str]:
    return set(_PLACEHOLDER.findall(template))


def fill(template: str, **values: str) -> str:
    """Replace `{name}` for each given name; a placeholder the template needs but was not
    given raises KeyError (a prompt with a hole in it would be silently wrong)."""
    pieces, names = _parsed(template)
    missing = {name for name in names if name not in values} & {"caption", "question", "claim"}
    if missing:
        raise KeyError(f"template needs {sorted(missing)} but got {sorted(values)}")
    out = [pieces[0]]
    for k in range(1, len(pieces), 2):  # pieces alternate: text, placeholder name, text, ...
        name = pieces[k]
        out.append(str(values[name]) if name in values else "{" + name + "}")
        out.append(pieces[k + 1])
    return "".join(out)


def unfill(template: str, text: str) -> dict[str, str] | None:
    """The placeholder values that `fill(template, **values)` turns into `text`, or None when
    the text is not that template filled: how an engine that answers from the request itself
    (the world oracle) reads a prompt back, by the template's exact words and no guessing."""
    pattern = _unfill_pattern(template)
    found = pattern.fullmatch(text)
    if found is None:
        return None
    values = found.groupdict()
    return values if fill(template, **values) == text else None


@functools.lru_cache(maxsize=64)
def _unfill_pattern(template: str) -> re.Pattern:
    """The template as a regular expression: its text literal, each placeholder a group (the
    same name again must repeat the same value)."""
    pieces, _ = _parsed(template)
    out, seen = [], set()
    for k, piece in enumerate(pieces):
        if k % 2 == 0:
            out.append(re.escape(piece))
        elif piece in seen:
            out.append(f"(?P={piece})")
        else:
            out.append(f"(?P<{piece}>.*?)")
            seen.add(piece)
    return re.compile("".join(out), re.DOTALL)


@functools.lru_cache(maxsize=256)
def _parsed(template: str) -> tuple[tuple[str, ...], frozenset[str]]:
    """The template split once into text and placeholder names (a batch fills the same
    few templates thousands of times)."""
    pieces = tuple(_PLACEHOLDER.split(template))
    return pieces, frozenset(pieces[1::2])


def fill_column(template: str, values: dict[str, list]) -> list[str]:
    """`fill(template, **row)` for every row of equal-length value lists, in one pass.

    The template becomes a format string once (its literal braces escaped), so each row costs
    one `str.format` instead of a regex walk; the text equals `fill`'s byte for byte, `None`
    included (both write `str(value)`). Raises KeyError for a missing placeholder, as `fill`.
    """
    pieces, names = _parsed(template)
    missing = {name for name in names if name not in values} & {"caption", "question", "claim"}
    if missing:
        raise KeyError(f"template needs {sorted(missing)} but got {sorted(values)}")
    fmt, order = _format_string(pieces, frozenset(values))
    if not order:
        return [fmt.format()] * len(next(iter(values.values()), []))
    if len(order) == 1:
        return list(map(fmt.format, values[order[0]]))
    return [fmt.format(*row) for row in zip(*(values[name] for name in order), strict=True)]


@functools.lru_cache(maxsize=256)
def _format_string(pieces: tuple[str, ...], given: frozenset[str]) -> tuple[str, tuple[str, ...]]:
    """A positional format string for `pieces`: given names become `{0}`, `{1}`, ... and the
    others stay literal `{name}` (as `fill` leaves them)."""
    out, order = [], []
    for k, piece in enumerate(pieces):
        if k % 2 == 0 or piece not in given:
            literal = piece if k % 2 == 0 else "{" + piece + "}"
            out.append(literal.replace("{", "{{").replace("}", "}}"))
        else:
            out.append("{" + str(len(order)) + "}")
            order.append(piece)
    return "".join(out), tuple(order)
