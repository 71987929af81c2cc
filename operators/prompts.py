"""Filling prompt templates without tripping over braces.

Templates hold JSON examples (generation prompts) and captions may contain braces, so
`str.format` is unsafe both ways. Only the named placeholders are replaced.
"""
from __future__ import annotations

import re

_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


def placeholders(template: str) -> set[str]:
    return set(_PLACEHOLDER.findall(template))


def fill(template: str, **values: str) -> str:
    """Replace `{name}` for each given name; a placeholder the template needs but was not
    given raises KeyError (a prompt with a hole in it would be silently wrong)."""
    missing = {name for name in placeholders(template) if name not in values} & {"caption", "question", "claim"}
    if missing:
        raise KeyError(f"template needs {sorted(missing)} but got {sorted(values)}")
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), template)
