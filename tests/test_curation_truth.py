"""Judging keep decisions against a truth file: ROC AUC equal to the Mann-Whitney U (scipy) on
hand cases and on resamples, precision and recall by hand, the rule applied per shard, the
report's section, and a corrupted rule caught."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from scipy.stats import mannwhitneyu

from pipeline.config import BootstrapSpec
from pipeline.curation.report import truth_markdown, truth_summary
from pipeline.curation.rule import Rule
from pipeline.curation.truth import judge, labelled_decisions, read_truth, truth_section
from pipeline.stats.classification import auc_statistic, roc_auc
from pipeline.stats.statistic import naive_jackknife
from pipeline.store.folder import FileError

FEW = BootstrapSpec(n_resamples=200, seed=0)


def test_roc_auc_on_hand_cases():
    # the textbook case: of the 4 (match, mismatch) pairs, 3 are ordered right
    assert roc_auc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == 0.75
    # ties count half: positives 0.5, 0.5 against negatives 0.5, 0.2 -> (0.5 + 1 + 0.5 + 1) / 4
    assert roc_auc([0.5, 0.5, 0.5, 0.2], [True, True, False, False]) == 0.75
    assert roc_auc([0.9, 0.8, 0.1], [True, True, False]) == 1.0
    assert roc_auc([0.1, 0.2, 0.9], [True, True, False]) == 0.0
    assert np.isnan(roc_auc([0.1, 0.2], [True, True]))  # no negative: undefined
    # rows in neither class count for nothing: the AUC of matches against one kind
    assert roc_auc([0.9, 0.1, 0.95, 0.0], [True, False, False, False], [False, True, False, False]) == 1.0


def test_roc_auc_is_the_mann_whitney_u_on_data_and_on_resamples():
    rng = np.random.default_rng(7)
    for _ in range(50):
        n = int(rng.integers(6, 30))
        scores = rng.integers(0, 6, n) / 5.0  # many ties
        label = rng.integers(0, 3, n)
        pos, neg = label == 0, label == 1
        if pos.sum() < 2 or neg.sum() < 2:
            continue
        u = mannwhitneyu(scores[pos], scores[neg]).statistic
        assert roc_auc(scores, pos, neg) == pytest.approx(u / (pos.sum() * neg.sum()), abs=1e-12)
        statistic = auc_statistic(scores, pos, neg)
        counts = rng.integers(0, 3, (5, n)).astype(np.float64)
        for row, value in zip(counts, statistic(counts), strict=True):
            drawn = np.repeat(np.arange(n), row.astype(int))
            p, q = drawn[pos[drawn]], drawn[neg[drawn]]
            expected = mannwhitneyu(scores[p], scores[q]).statistic / (p.size * q.size) if p.size and q.size else np.nan
            assert value == pytest.approx(expected, abs=1e-12, nan_ok=True)
        assert np.allclose(statistic.jackknife(n), naive_jackknife(statistic.function, n), equal_nan=True)


def test_roc_auc_refuses_rows_without_a_score_in_a_class():
    with pytest.raises(ValueError, match="finite"):
        roc_auc([0.5, np.nan], [True, False])
    with pytest.raises(ValueError, match="both"):
        roc_auc([0.5, 0.2], [True, False], [True, True])


def decisions(scores: list[float | None], shard: str = "/in/pairs-0000.parquet") -> tuple[str, pl.DataFrame]:
    """One shard's stored decisions as curation writes them (the rule's `keep` is redone)."""
    return shard, pl.DataFrame({"row": list(range(len(scores))), "score_depict": scores, "keep": [False] * len(scores)},
                               schema={"row": pl.Int64, "score_depict": pl.Float64, "keep": pl.Boolean})


def labelled(scores: list[float | None], labels: list[str], shard: str = "pairs-0000") -> pl.DataFrame:
    truth = pl.DataFrame({"shard": [shard] * len(labels), "row": list(range(len(labels))), "label": labels})
    rows, unlabelled = labelled_decisions(truth, [decisions(scores, f"/in/{shard}.parquet")])
    assert unlabelled == 0
    return rows


def test_precision_recall_and_drops_by_hand():
    # kept at >= 0.5: rows 0, 1, 3, 5, 8; matches 0, 1, 2, 6; a missing score (row 6) is dropped
    scores = [0.9, 0.7, 0.4, 0.6, 0.2, 0.55, None, 0.1, 0.8]
    labels = ["match", "match", "match", "wrong_count", "wrong_count", "other_caption", "match", "other_caption", "swapped_attribute"]
    (row,) = judge(labelled(scores, labels), ["depict"], Rule("depict", min_score=0.5), FEW)
    assert row["decides"] and row["kept"] == 5 and row["unscored"] == 1
    assert row["precision"]["estimate"] == 0.4  # 2 of 5 kept match
    assert row["recall"]["estimate"] == 0.5  # 2 of 4 matches kept (the unscored one is not)
    assert row["mismatch_dropped"]["estimate"] == 0.4  # rows 4 and 7 of 3, 4, 5, 7, 8
    kinds = row["kinds"]
    assert (kinds["wrong_count"]["pairs"], kinds["wrong_count"]["dropped"]["estimate"]) == (2, 0.5)
    assert (kinds["other_caption"]["dropped"]["estimate"], kinds["swapped_attribute"]["dropped"]["estimate"]) == (0.5, 0.0)
    # AUC over scored rows: matches 0.9, 0.7, 0.4 against 0.6, 0.2, 0.55, 0.1, 0.8 -> (5 + 4 + 2) / 15
    assert row["auc"]["estimate"] == pytest.approx(11 / 15, abs=1e-6)
    assert kinds["wrong_count"]["auc"]["estimate"] == pytest.approx(5 / 6, abs=1e-6)  # (2 + 2 + 1) / 6
    assert kinds["swapped_attribute"]["auc"]["estimate"] == pytest.approx(1 / 3, abs=1e-6)  # only 0.9 beats 0.8
    assert row["auc"]["note"].startswith("statistic undefined in")  # 9 pairs: some resamples hold no match


def test_a_top_fraction_is_applied_per_shard():
    truth = pl.DataFrame({"shard": ["a"] * 4 + ["b"] * 4, "row": [0, 1, 2, 3] * 2, "label": ["match", "x", "match", "x"] * 2})
    rows, _ = labelled_decisions(truth, [decisions([0.9, 0.8, 0.7, 0.6], "/in/a.parquet"), decisions([0.4, 0.3, 0.2, 0.1], "/in/b.tar")])
    (row,) = judge(rows, ["depict"], Rule("depict", min_score=None, top_fraction=0.5), FEW)
    assert row["kept"] == 4  # the best two of each shard, not the best four of the night
    assert row["precision"]["estimate"] == 0.5


def test_a_corrupted_rule_is_caught():
    """A rule that keeps the worst pairs (its score inverted) has AUC below 0.5 and precision
    below the share of matches; the right one is far above both."""
    rng = np.random.default_rng(3)
    labels = ["match"] * 40 + ["wrong_count"] * 20 + ["swapped_attribute"] * 20
    good = np.concatenate([rng.uniform(0.5, 1.0, 40), rng.uniform(0.0, 0.6, 40)])
    right, = judge(labelled(good.tolist(), labels), ["depict"], Rule("depict", min_score=0.5), FEW)
    inverted, = judge(labelled((1.0 - good).tolist(), labels), ["depict"], Rule("depict", min_score=0.5), FEW)
    assert right["auc"]["estimate"] > 0.9 and right["precision"]["estimate"] > 0.8
    for key in ("precision", "recall", "mismatch_dropped", "auc"):
        assert right[key]["low"] <= right[key]["estimate"] <= right[key]["high"]
    assert inverted["auc"]["estimate"] < 0.5 and inverted["auc"]["high"] < 0.5
    assert inverted["precision"]["estimate"] < 0.5 and inverted["recall"]["estimate"] < 0.5
    assert inverted["auc"]["estimate"] == pytest.approx(1 - right["auc"]["estimate"], abs=1e-6)


def test_truth_files_are_checked_and_matched_by_shard_name_and_row(tmp_path):
    path = tmp_path / "truth.csv"
    path.write_text("shard,row,label\npairs-0000,0,match\npairs-0000,1,wrong_count\npairs-0001,0,match\n")
    truth = read_truth(str(path))
    rows, unlabelled = labelled_decisions(truth, [decisions([0.9, 0.1, 0.5], "/x/pairs-0000.tar"), decisions([0.3], "/x/other.parquet")])
    assert rows.select("shard", "row", "label").rows() == [("pairs-0000", 0, "match"), ("pairs-0000", 1, "wrong_count")]
    assert unlabelled == 2
    path.write_text("shard,row,label\npairs-0000,0,match\npairs-0000,0,wrong_count\n")
    with pytest.raises(FileError, match="row 1: shard 'pairs-0000' row 0 is labelled more than once"):  # the repeat is named
        read_truth(str(path))
    path.write_text("shard,row\npairs-0000,0\n")
    with pytest.raises(FileError, match=r"lacks column\(s\) \['label'\]"):
        read_truth(str(path))
    path.write_text("shard,row,label\npairs-0000,0,\n")
    with pytest.raises(FileError, match="row 0: label is empty"):
        read_truth(str(path))
    with pytest.raises(FileError, match="truth file not found"):
        read_truth(str(tmp_path / "none.parquet"))


def test_the_report_section_and_summary(tmp_path):
    path = tmp_path / "truth.parquet"
    labels = ["match", "match", "wrong_count", "other_caption", "match", "wrong_count"]
    pl.DataFrame({"shard": ["pairs-0000"] * 6, "row": list(range(6)), "label": labels}).write_parquet(path)
    section = truth_section(str(path), [decisions([0.9, 0.8, 0.3, 0.6, 0.4, 0.1])], ["depict"], Rule("depict", 0.5), FEW)
    assert (section["pairs"], section["match"], section["mismatch"], section["unlabelled_rows"]) == (6, 3, 3, 0)
    assert section["labels"] == {"match": 3, "other_caption": 1, "wrong_count": 2}
    text = "\n".join(truth_markdown(section))
    assert "| **depict** (decides) | 3 | 0 | 0.667 | 0.667 | 0.667 | 0.889 |" in text  # 6 pairs: no interval
    assert "| metric | other_caption (1) | wrong_count (2) |" in text
    assert "precision 0.667" in "\n".join(truth_summary(section))
    nothing = truth_section(str(path), [decisions([0.5], "/in/else.parquet")], ["depict"], Rule("depict", 0.5), FEW)
    assert nothing["pairs"] == 0 and nothing["unlabelled_rows"] == 1 and nothing["metrics"] == []
