"""Answer distribution (NO share, undecided share) and the commitment-weighting gain."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from pipeline.stats import diagnostics
from pipeline.stats.correlation import srcc


def _answers():
    # caption a: 2 questions, one "no"; caption b: 3 questions, one undecided (|2*0.55-1| = 0.1)
    # caption c: 1 question, "no" and undecided (0.45). The repeated row of (a, q1) counts once.
    return pl.DataFrame(
        dict(
            caption=["a", "a", "a", "b", "b", "b", "c"],
            question=["q1", "q2", "q1", "q1", "q2", "q3", "q1"],
            p_t=[0.9, 0.2, 0.9, 0.95, 0.55, 0.99, 0.45],
        )
    )


def test_answer_distribution_hand_computed():
    result = diagnostics.answer_distribution(_answers(), n_resamples=500, seed=0)
    assert (result.n_pairs, result.n_captions) == (6, 3)
    assert result.no_share.estimate == pytest.approx(2 / 6)
    assert result.undecided.estimate == pytest.approx(2 / 6)
    assert result.no_share.low <= result.no_share.estimate <= result.no_share.high


def test_answer_distribution_from_log_probabilities():
    answers = _answers()
    logits = np.log(answers["p_t"] / (1 - answers["p_t"]))
    raw = answers.drop("p_t").with_columns(logp_yes_t=pl.Series(logits - 3.0), logp_no_t=pl.lit(-3.0))
    from_logs = diagnostics.answer_distribution(raw, n_resamples=100)
    direct = diagnostics.answer_distribution(answers, n_resamples=100)
    assert from_logs.no_share.estimate == pytest.approx(direct.no_share.estimate)
    assert from_logs.undecided.estimate == pytest.approx(direct.undecided.estimate)


def test_caption_bootstrap_is_wider_than_pair_bootstrap_for_clustered_answers():
    # all questions of a caption answer alike: the caption, not the pair, is the unit
    r = np.random.default_rng(0)
    no_caption = r.random(60) < 0.3
    rows = [(f"c{c}", f"q{q}", 0.1 if no_caption[c] else 0.9) for c in range(60) for q in range(8)]
    answers = pl.DataFrame(rows, schema=["caption", "question", "p_t"], orient="row")
    by_caption = diagnostics.answer_distribution(answers, n_resamples=500).no_share
    pairs_as_captions = diagnostics.answer_distribution(
        answers.with_columns(caption=pl.col("caption") + pl.col("question")), n_resamples=500
    ).no_share
    assert by_caption.estimate == pytest.approx(pairs_as_captions.estimate)
    assert by_caption.high - by_caption.low > 2 * (pairs_as_captions.high - pairs_as_captions.low)


def test_answer_distribution_bad_input():
    with pytest.raises(ValueError, match="different p_t"):
        diagnostics.answer_distribution(pl.DataFrame(dict(caption=["a", "a"], question=["q", "q"], p_t=[0.1, 0.9])))
    with pytest.raises(ValueError, match="outside"):
        diagnostics.answer_distribution(pl.DataFrame(dict(caption=["a"], question=["q"], p_t=[1.5])))
    with pytest.raises(ValueError, match="missing column"):
        diagnostics.answer_distribution(pl.DataFrame(dict(caption=["a"], question=["q"])))


def test_least_committed_quartile():
    mask, cut = diagnostics.least_committed(np.arange(1.0, 9.0))
    assert cut == pytest.approx(2.75) and mask.tolist() == [True, True] + [False] * 6


def _weighting_data(seed=0, n_groups=120, per_group=5):
    r = np.random.default_rng(seed)
    n = n_groups * per_group
    human = r.integers(1, 6, size=(n, 3)).mean(axis=1)
    commitment = r.random(n)
    # the unweighted metric is noisier where commitment is low; weighting removes that noise
    unweighted = human + r.normal(0, 0.4, n) + r.normal(0, 3.0, n) * (commitment < 0.25)
    weighted = human + r.normal(0, 0.4, n)
    groups = np.repeat(np.arange(n_groups), per_group)
    return weighted, unweighted, human, commitment, groups


def test_correlation_weighting_gain():
    weighted, unweighted, human, commitment, groups = _weighting_data()
    all_items, low = diagnostics.correlation_weighting_gain(weighted, unweighted, human, commitment, groups, n_resamples=300)
    assert all_items.subset == "all" and low.subset == "least_committed"
    assert all_items.gain.estimate == pytest.approx(srcc(weighted, human).value - srcc(unweighted, human).value)
    mask = commitment <= low.threshold
    assert low.n == mask.sum() and low.weighted == pytest.approx(srcc(weighted[mask], human[mask]).value)
    assert low.gain.estimate > all_items.gain.estimate > 0
    assert low.gain.excludes_zero


def test_choice_weighting_gain():
    r = np.random.default_rng(2)
    commitment = r.random(400)
    unweighted = (r.random(400) < np.where(commitment < 0.25, 0.4, 0.8)).astype(float)
    weighted = (r.random(400) < 0.8).astype(float)
    all_groups, low = diagnostics.choice_weighting_gain(weighted, unweighted, commitment, n_resamples=300)
    assert all_groups.gain.estimate == pytest.approx(weighted.mean() - unweighted.mean())
    assert low.n == 100 and low.gain.estimate > 0.2 and low.gain.excludes_zero
    with pytest.raises(ValueError, match="differ in length"):
        diagnostics.choice_weighting_gain(weighted, unweighted[:-1], commitment)
