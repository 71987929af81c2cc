"""DSG's released VQA answers (j-min/DSG, `vqa_answers_release/<vqa>_dsg.csv`), scored by our DSG scorer.

Answer file columns, as released: `dsg_prompt_split, qg_model, t2i_model, item_id, question,
question_id, dependency_id, answer` — one row per (image, question); the image is
(t2i_model, item_id), e.g. ("mini-dalle", "tifa160_0"); `question_id` counts from 1 within
the prompt; `dependency_id` lists the parent question ids, comma-separated ("1,2"), 0 meaning
no parent; `answer` is the VQA model's text ("yes", "no", or anything it generated).

Human file: `tifa160-likert-anns.csv` (the same repository): columns `t2i_model, item_id,
worker_id, answer` (1-5), five raters per image; human = their mean.

Text answers become hard answers by one of two documented rules (`answer_rule`; the DSG
preset `load` uses `dsg`, `read_answers` defaults to `strict`):
- `strict`: trimmed, lower-cased "yes" -> 1, "no" -> 0; anything else (empty,
  "no bus", "unanswerable") is an error row naming file, line and field, and the image's DSG
  score is null (reported), never a silent 0;
- `dsg`: exactly "yes" -> 1, anything else -> 0, which is what DSG's released scorer does
  (`float(answer == "yes")`); how many answers were neither "yes" nor "no" is reported. Like
  DSG's scorer, an image with an unreadable `dependency_id` ("1, outside") is then scored
  without dependencies (under `strict` its score is null and the row is reported).
A hard answer reaches the scorer as the log-probabilities of a certain answer: yes is
(log 1, log 0) = (0, CERTAIN_NO_LOGP), no the reverse. log 0 is written as -1e9 because the
scorer treats a non-finite log-probability as a missing answer; exp(-1e9) is exactly 0, and
the scorer reads only P(yes) > 0.5 anyway. The dependency rule is the scorer's (a question
whose parent was answered "no" scores 0), so it is not repeated here.

An image with no answer rows has no questions: DSG's released scorer gives it 0 (one
TIFA160 prompt, tifa160_134, has none), our scorer gives null with note "no_questions"; the
DSG protocol below sets `no_questions="zero"`, so the published numbers are reproduced and
the statistics note records it.
"""
from __future__ import annotations

import polars as pl

from operators.metrics.decomposed import dsg_scores
from pipeline.config import ProtocolSpec
from pipeline.released.release_files import Released, read_text_csv

ANSWER_COLUMNS = ("dsg_prompt_split", "qg_model", "t2i_model", "item_id", "question_id", "dependency_id", "answer")
LIKERT_COLUMNS = ("t2i_model", "item_id", "answer")
ANSWER_RULES = ("strict", "dsg")
CERTAIN_NO_LOGP = -1e9  # stands for log 0 (see module doc)
PROTOCOL = ProtocolSpec(
    kind="correlation", statistics=["srcc", "kendall", "pearson", "plcc", "pairwise_acc"],
    primary_statistic="srcc", no_questions="zero",
)  # fmt: skip
DEFAULT_RULE = "dsg"  # the preset reproduces DSG's published numbers


def item_key(t2i_model: pl.Expr, item_id: pl.Expr) -> pl.Expr:
    """Our item id of a released image: "<t2i_model>/<item_id>", e.g. "mini-dalle/tifa160_0"."""
    return pl.concat_str([t2i_model.str.strip_chars(), item_id.str.strip_chars()], separator="/")


def hard_answers(answers: pl.Series, rule: str) -> pl.Series:
    """1.0 / 0.0 per text answer; null where `strict` cannot read it (see module doc)."""
    if rule not in ANSWER_RULES:
        raise ValueError(f"answer_rule must be one of {ANSWER_RULES}, got {rule!r}")
    if rule == "dsg":
        return (answers == "yes").fill_null(False).cast(pl.Float64)
    text = answers.str.strip_chars().str.to_lowercase()
    return pl.select(pl.when(text == "yes").then(1.0).when(text == "no").then(0.0).otherwise(None).alias("a")).to_series()


def read_answers(path: str, *, split: str | None = "tifa160", answer_rule: str = "strict") -> tuple[pl.DataFrame, list[str]]:
    """The answer file as rows for `dsg_scores` (one per question), and the problems found."""
    frame = read_text_csv(path, ANSWER_COLUMNS, what="DSG answers")
    problems: list[str] = []
    other = sorted(set(frame["qg_model"].drop_nulls().unique()) - {"dsg"})
    if other:
        raise ValueError(f"DSG answers file {path}: column qg_model holds {other}; only DSG questions (qg_model 'dsg') have dependencies")
    if split is not None:
        frame = frame.filter(pl.col("dsg_prompt_split") == split)
        if frame.is_empty():
            raise ValueError(f"DSG answers file {path}: no rows with dsg_prompt_split == {split!r}")
    hard = hard_answers(frame["answer"], answer_rule)
    parents = frame["dependency_id"].fill_null("").str.split(",").list.eval(pl.element().str.strip_chars())
    bad_parent = parents.list.eval(~pl.element().str.contains(r"^\d+$")).list.any()
    bad_question = ~frame["question_id"].fill_null("").str.strip_chars().str.contains(r"^\d+$")
    for column, bad in (("question_id", bad_question), ("dependency_id", bad_parent), ("answer", hard.is_null())):
        rows = frame.filter(bad)
        if rows.height:
            example = rows.row(0, named=True)
            problems.append(
                f"{path}: {rows.height} row(s) with an unusable {column} (e.g. line {example['row']}: {example[column]!r}); "
                "their images score null"
            )
    if answer_rule == "dsg":
        odd = frame.filter(~pl.col("answer").fill_null("").is_in(["yes", "no"]))
        if odd.height:
            problems.append(f"{path}: {odd.height} answer(s) neither 'yes' nor 'no' scored 0 by DSG's rule (e.g. line {odd['row'][0]}: {odd['answer'][0]!r})")
    usable = ~(bad_question | bad_parent) & hard.is_not_null()
    if answer_rule == "dsg":
        # DSG's scorer parses an image's dependencies all at once and, when one cannot be
        # read ("1, outside"), scores that image with no dependencies at all.
        image = item_key(pl.col("t2i_model"), pl.col("item_id"))
        unreadable = frame.with_columns(_bad=bad_parent).group_by(image.alias("image")).agg(pl.col("_bad").any())
        unreadable = set(unreadable.filter(pl.col("_bad"))["image"])
        if unreadable:
            problems[:] = [p for p in problems if "dependency_id" not in p]
            problems.append(f"{path}: {len(unreadable)} image(s) with an unreadable dependency_id scored without dependencies, as DSG's scorer does")
            without = frame.select(image.is_in(list(unreadable))).to_series()
            parents = pl.select(pl.when(without).then(pl.lit(["0"])).otherwise(parents)).to_series()
            usable = ~bad_question & hard.is_not_null()
    rows = frame.with_columns(_yes=hard.fill_null(0.0) == 1.0, _usable=usable, _parents=parents).select(
        item_id=item_key(pl.col("t2i_model"), pl.col("item_id")),
        question_set=pl.lit("dsg"),
        question_id=pl.col("question_id").str.strip_chars(),
        parents=pl.col("_parents"),
        logp_yes_v=pl.when(pl.col("_usable")).then(pl.when(pl.col("_yes")).then(0.0).otherwise(CERTAIN_NO_LOGP)),
        logp_no_v=pl.when(pl.col("_usable")).then(pl.when(pl.col("_yes")).then(CERTAIN_NO_LOGP).otherwise(0.0)),
    )
    return rows, problems


def read_likert(path: str, *, benchmark: str = "tifa160") -> tuple[pl.DataFrame, list[str]]:
    """Items (item_id, group_id, human, benchmark) from DSG's TIFA160 Likert file."""
    frame = read_text_csv(path, LIKERT_COLUMNS, what="DSG Likert")
    rating = frame["answer"].str.strip_chars().cast(pl.Float64, strict=False)
    bad = frame.filter(rating.is_null() | ~rating.is_between(1, 5))
    problems = []
    if bad.height:
        problems.append(f"{path}: {bad.height} rating(s) not a number in 1-5 skipped (e.g. line {bad['row'][0]}: {bad['answer'][0]!r})")
    items = (
        frame.with_columns(rating=rating)
        .filter(pl.col("rating").is_between(1, 5))
        .group_by(item_id=item_key(pl.col("t2i_model"), pl.col("item_id")))
        .agg(group_id=pl.col("item_id").first().str.strip_chars(), human=pl.col("rating").mean())
        .sort("item_id")
        .with_columns(benchmark=pl.lit(benchmark))
    )
    return items, problems


def load(answers: str, human: str | None, *, split: str | None = "tifa160", answer_rule: str = DEFAULT_RULE) -> Released:
    """DSG and DSG-without-dependencies scores of the released answers, with the Likert items."""
    if human is None:
        raise ValueError("released DSG answers need human=<tifa160-likert-anns.csv>")
    rows, problems = read_answers(answers, split=split, answer_rule=answer_rule)
    items, human_problems = read_likert(human)
    scores = dsg_scores(rows, items["item_id"].to_list())
    unknown = rows.filter(~pl.col("item_id").is_in(items["item_id"].implode()))["item_id"].unique().sort()
    if unknown.len():
        problems.append(f"{answers}: {unknown.len()} image(s) not in {human}, ignored (e.g. {unknown[0]!r})")
    return Released(scores, items, PROTOCOL, "tifa160", problems + human_problems, target="dsg")
