"""Statistics for meta-evaluating alignment metrics against human judgments.

One idea per module:
- `correlation`: SRCC, Kendall tau-b, plain Pearson, PLCC after a 4-parameter logistic fit
  (signed; bounded starts then an unbounded refit, the references' optimum; failed fits
  reported, never below plain Pearson: the fallback to the line is named in the note);
- `pairwise`: exact tie-calibrated pairwise accuracy (acc23);
- `choice`: Winoground text/image/group accuracy and multiple-choice accuracy with tie policies;
- `bootstrap`: group-resampling BCa intervals, single and paired (equal to scipy.stats.bootstrap);
- `exact`: discrete statistics (0/1 and 1/k credits) as whole numbers over one denominator, so
  equal accuracies are equal floats and BCa counts ties as ties;
- `group_statistics`: SRCC / Kendall / Pearson of group multiplicities, with resamples in
  O(N) / O(N log D) each and exact fast leave-one-group-out jackknives (`dominance`: the
  quadrant counts they need);
- `diagnostics`: answer distribution and the commitment-weighting gain;
- `classification`: ROC AUC of a score against known labels, with an exact jackknife (how
  right curation's keep rule is against a truth file: `pipeline.curation.truth`).
`pipeline.metaeval` combines them into the statistics / deltas tables.
"""
from pipeline.stats.bootstrap import Interval, group_interval, paired_group_interval
from pipeline.stats.choice import (
    ChoiceResult,
    WinogroundResult,
    multiple_choice,
    winoground,
)
from pipeline.stats.correlation import (
    Correlation,
    DegenerateInputWarning,
    LogisticCorrelation,
    kendall,
    pearson,
    plcc,
    srcc,
)
from pipeline.stats.pairwise import PairwiseAccuracy, pairwise_accuracy

__all__ = [
    "ChoiceResult", "Correlation", "DegenerateInputWarning", "Interval", "LogisticCorrelation",
    "PairwiseAccuracy", "WinogroundResult", "group_interval", "multiple_choice", "paired_group_interval",
    "kendall", "pairwise_accuracy", "pearson", "plcc", "srcc", "winoground",
]  # fmt: skip
