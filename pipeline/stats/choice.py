"""Accuracy on choice benchmarks: Winoground (2 images x 2 captions) and multiple choice.

Both take a polars frame with one row per scored (image, caption) item:
`group_id, image_index, caption_index, score` (+ `correct`, `template` for multiple choice).
A group with a missing (null / NaN) score, a duplicated or missing option is excluded and
listed in `excluded` with the reason: it is never scored as wrong or right silently.
Results keep one value per scored group so the bootstrap can resample groups.

Ties (exactly equal scores) matter because hard metrics (DSG, hard fixed-yes) tie often:
- Winoground is strict: every comparison must be won (">"); a tie fails.
- Multiple choice has three policies:
  `expected` (default): a tie among the k top-scoring options that includes the correct one
      earns 1/k, the expected accuracy of picking uniformly among them;
  `strict`: the correct option must be the only top-scoring one;
  `first`: the official NegBench argmax, which credits a tie to the first listed option
      (lowest caption_index).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from pipeline.stats import exact

TIE_POLICIES = ("expected", "strict", "first")


@dataclass(frozen=True)
class WinogroundResult:
    group_ids: list[str]  # scored groups, sorted
    text: np.ndarray  # per group 1.0 / 0.0: both images pick their own caption
    image: np.ndarray  # per group: both captions pick their own image
    group: np.ndarray  # per group: text and image
    excluded: dict[str, str] = field(default_factory=dict)  # group_id -> reason

    @property
    def n(self) -> int:
        return len(self.group_ids)

    def accuracy(self, which: str) -> float:
        """`which` is text, image or group (also accepted: text_acc, image_acc, group_acc)."""
        return exact.mean(getattr(self, which.removesuffix("_acc")))


@dataclass(frozen=True)
class ChoiceResult:
    group_ids: list[str]  # scored groups, sorted
    credit: np.ndarray  # per group, in [0, 1]
    templates: list[str | None]  # per group: the correct option's template
    tie_policy: str
    n_tied: int  # scored groups whose top score is shared by several options
    excluded: dict[str, str] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.group_ids)

    @property
    def accuracy(self) -> float:
        return exact.mean(self.credit)  # 1/k credits summed exactly, as the bootstrap does

    def by_template(self) -> dict[str, tuple[float, int]]:
        """Template -> (accuracy, number of groups); groups without a template are left out."""
        templates = np.array([t if t is not None else "" for t in self.templates])
        return {
            str(name): (exact.mean(self.credit[templates == name]), int(np.count_nonzero(templates == name)))
            for name in sorted(set(templates) - {""})
        }


def _require(frame: pl.DataFrame, columns: list[str], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{what}: missing column(s) {missing}; have {frame.columns}")


def _bad_groups(frame: pl.DataFrame) -> dict[str, str]:
    """Groups with a missing score or a repeated option, with the reason."""
    problems: dict[str, str] = {}
    missing = frame.filter(pl.col("score").is_null() | pl.col("score").is_nan())
    for row in missing.group_by("group_id").agg(pl.len()).sort("group_id").iter_rows():
        problems[str(row[0])] = f"{row[1]} option(s) without a score"
    keys = ["group_id", "image_index", "caption_index"]
    repeated = frame.group_by(keys).agg(pl.len()).filter(pl.col("len") > 1).sort(keys)
    for group_id, image_index, caption_index, count in repeated.iter_rows():
        problems.setdefault(str(group_id), f"option (image {image_index}, caption {caption_index}) appears {count} times")
    return problems


def winoground(frame: pl.DataFrame) -> WinogroundResult:
    """Strict text / image / group accuracy per Winoground example (see module doc)."""
    _require(frame, ["group_id", "image_index", "caption_index", "score"], "winoground scores")
    frame = frame.with_columns(pl.col("score").cast(pl.Float64))
    excluded = _bad_groups(frame)
    frame = frame.filter(~pl.col("group_id").is_in(list(excluded)))
    in_range = pl.col("image_index").is_in([0, 1]) & pl.col("caption_index").is_in([0, 1])
    shape = frame.group_by("group_id").agg(n=pl.len(), n_in_range=in_range.sum())
    for group_id, n, n_in_range in shape.filter((pl.col("n") != 4) | (pl.col("n_in_range") != 4)).iter_rows():
        excluded[str(group_id)] = f"needs exactly images 0/1 x captions 0/1, got {n} option(s), {n_in_range} of them in range"
    cells = ["s00", "s01", "s10", "s11"]  # s<image><caption>
    wide = (
        frame.filter(~pl.col("group_id").is_in(list(excluded)))
        .with_columns(cell=pl.format("s{}{}", pl.col("image_index"), pl.col("caption_index")))
        .pivot(on="cell", index="group_id", values="score", on_columns=cells)
        .sort("group_id")
    )
    s00, s01, s10, s11 = (wide[c].to_numpy() for c in cells)
    text = (s00 > s01) & (s11 > s10)  # each image prefers its own caption
    image = (s00 > s10) & (s11 > s01)  # each caption prefers its own image
    return WinogroundResult(
        [str(g) for g in wide["group_id"].to_list()],
        text.astype(np.float64),
        image.astype(np.float64),
        (text & image).astype(np.float64),
        dict(sorted(excluded.items())),
    )


def multiple_choice(frame: pl.DataFrame, tie_policy: str = "expected") -> ChoiceResult:
    """Accuracy of picking the `correct` option by highest score, per group (see module doc)."""
    if tie_policy not in TIE_POLICIES:
        raise ValueError(f"tie_policy must be one of {TIE_POLICIES}, got {tie_policy!r}")
    _require(frame, ["group_id", "caption_index", "correct", "score"], "multiple-choice scores")
    if "image_index" not in frame.columns:
        frame = frame.with_columns(pl.lit(0).alias("image_index"))
    if "template" not in frame.columns:
        frame = frame.with_columns(pl.lit(None, dtype=pl.String).alias("template"))
    frame = frame.with_columns(pl.col("score").cast(pl.Float64), pl.col("correct").fill_null(False))
    excluded = _bad_groups(frame)
    per_group = (
        frame.filter(~pl.col("group_id").is_in(list(excluded)))
        .group_by("group_id")
        .agg(
            options=pl.len(),
            n_correct=pl.col("correct").sum(),
            top=pl.col("score").max(),
            correct_score=pl.col("score").filter(pl.col("correct")).first(),
            correct_index=pl.col("caption_index").filter(pl.col("correct")).first(),
            template=pl.col("template").filter(pl.col("correct")).first(),
        )
    )
    tops = frame.join(per_group.select("group_id", "top"), on="group_id").filter(pl.col("score") == pl.col("top"))
    top_stats = tops.group_by("group_id").agg(n_top=pl.len(), first_top=pl.col("caption_index").min())
    per_group = per_group.join(top_stats, on="group_id", how="left").sort("group_id")
    for group_id, options, n_correct in per_group.select("group_id", "options", "n_correct").iter_rows():
        if options < 2:
            excluded[str(group_id)] = f"only {options} option"
        elif n_correct != 1:
            excluded[str(group_id)] = f"{n_correct} options marked correct (need exactly 1)"
    per_group = per_group.filter(~pl.col("group_id").is_in(list(excluded)))

    wins = (per_group["correct_score"] == per_group["top"]).to_numpy()
    n_top = per_group["n_top"].to_numpy()
    if tie_policy == "expected":
        credit = np.where(wins, 1.0 / n_top, 0.0)
    elif tie_policy == "strict":
        credit = (wins & (n_top == 1)).astype(np.float64)
    else:
        credit = (wins & (per_group["first_top"] == per_group["correct_index"]).to_numpy()).astype(np.float64)
    return ChoiceResult(
        [str(g) for g in per_group["group_id"].to_list()],
        credit,
        per_group["template"].to_list(),
        tie_policy,
        int(np.count_nonzero(n_top > 1)),
        dict(sorted(excluded.items())),
    )
