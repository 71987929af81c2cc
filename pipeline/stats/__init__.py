"""Statistics for meta-evaluating alignment metrics against human judgments.

One idea per module:
- `correlation`: SRCC, PLCC after a 4-parameter logistic fit (signed; failed fits reported);
- `pairwise`: exact tie-calibrated pairwise accuracy (acc23);
- `choice`: Winoground text/image/group accuracy and multiple-choice accuracy with tie policies;
- `bootstrap`: group-resampling BCa intervals, single and paired (scipy.stats.bootstrap);
- `diagnostics`: answer distribution and the commitment-weighting gain.
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
    plcc,
    srcc,
)
from pipeline.stats.pairwise import PairwiseAccuracy, pairwise_accuracy

__all__ = [
    "ChoiceResult", "Correlation", "DegenerateInputWarning", "Interval", "LogisticCorrelation",
    "PairwiseAccuracy", "WinogroundResult", "group_interval", "multiple_choice", "paired_group_interval",
    "pairwise_accuracy", "plcc", "srcc", "winoground",
]  # fmt: skip
