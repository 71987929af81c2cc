"""`pipeline.cli.key_values`: how jobs read `key=value` arguments without importing omegaconf."""
from __future__ import annotations

import pytest

from pipeline.cli import key_values
from pipeline.config import ConfigError


def test_values_read_as_written_over_the_defaults():
    args = key_values(["metrics=[depict,vqascore]", "n_resamples=0", "human=null", "out=runs/a b", "a.b=2"],
                      {"n_resamples": 2000, "seed": 0, "human": "h.csv"})
    assert args == {"n_resamples": 0, "seed": 0, "human": None, "metrics": ["depict", "vqascore"], "out": "runs/a b",
                    "a": {"b": 2}}


def test_a_malformed_value_names_its_key():
    with pytest.raises(ConfigError, match="metrics") as caught:
        key_values(["seed=1", "metrics=[depict,"])
    assert "seed" not in str(caught.value)


def test_a_bare_word_is_refused():
    with pytest.raises(ConfigError, match="key=value"):
        key_values(["scores.parquet"])
