"""`fill` parses each template once; its output must equal the one-pass regex substitution it
replaced on every template and value (prompts are part of what the engine answers)."""
import random
import re

import pytest

from operators.prompts import fill

_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


def reference(template, **values):
    return _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), template)


def test_fill_equals_the_regex_substitution():
    rng = random.Random(1)
    parts = ["{caption}", "{question}", "{claim}", "{other}", "{{x}}", "{", "}", "text ", "é 日本", "{Caps}", "{a_b}", "\\1"]
    values = ["{question}", "c{", "plain", "\\1", "日本", 3]
    checked = 0
    for _ in range(5000):
        template = "".join(rng.choice(parts) for _ in range(rng.randint(0, 8)))
        given = {k: rng.choice(values) for k in rng.sample(["caption", "question", "claim", "other", "a_b"], rng.randint(0, 5))}
        holes = {n for n in _PLACEHOLDER.findall(template) if n not in given} & {"caption", "question", "claim"}
        if holes:
            with pytest.raises(KeyError):
                fill(template, **given)
            continue
        assert fill(template, **given) == reference(template, **given), (template, given)
        checked += 1
    assert checked > 1000
