"""From items and questions to the unique yes/no requests one backbone must answer.

The plan tables say which request answers which (item, question); the request table holds
each distinct request once. Two dedup rules make the DAG cheap:
- a caption-only answer depends on (caption, question) alone, so a caption shown with six
  images is asked once;
- an image answer depends on (image, question), so the same image with the same question
  (e.g. Winoground's shared images, repeated corpus pairs) is asked once.
Keys hash everything that determines an answer (operators.hashing.content_key), so the
answer store is a cache shared by every metric, benchmark, sweep and curation run.
"""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl
import pyarrow as pa

from operators import schema
from operators.hashing import content_key, content_keys

# Question sets whose questions are also answered from the caption alone (p_t).
CAPTION_ANSWERED_SETS = ("depict",)
# Request kind used to answer each question set on the image.
IMAGE_KIND = {"depict": "image", "dsg": "image", "claims": "claim"}


@dataclass(frozen=True)
class KeySpec:
    """What makes one backbone's answers distinct: its fingerprint and the prompt ids."""

    backbone: str
    fingerprint: str
    prompt_ids: dict  # request kind -> prompt id ("v1:abcd...")

    def key(self, kind: str, image_hash: str | None, caption: str | None, text: str) -> str:
        return content_key(self.fingerprint, self.prompt_ids[kind], kind, image_hash, caption, text)


def _keys(spec: KeySpec, kind: str, frame: pl.DataFrame, image_col: str | None, caption_col: str | None, text_col: str) -> pl.Series:
    """Keys for each row, hashing each distinct tuple once (vectorised: `content_keys` gives
    exactly `spec.key(...)` per row, so stored answers stay addressable)."""
    cols = [c for c in (image_col, caption_col, text_col) if c]
    distinct = frame.select(cols).unique(maintain_order=True)
    if distinct.height == 0:
        return pl.Series("__key", [], dtype=pl.String)
    none = pl.Series([None] * distinct.height, dtype=pl.String)
    parts = [
        distinct[image_col] if image_col else none,
        distinct[caption_col] if caption_col else none,
        distinct[text_col],
    ]
    keys = content_keys(parts, prefix=(spec.fingerprint, spec.prompt_ids[kind], kind))
    if distinct.height == frame.height:  # no tuple repeats: `distinct` is `frame` in its own order
        return pl.Series("__key", keys, dtype=pl.String)
    lookup = distinct.with_columns(pl.Series("__key", keys, dtype=pl.String))
    return frame.select(cols).join(lookup, on=cols, how="left", nulls_equal=True, maintain_order="left")["__key"]


def plan_questions(items: pl.DataFrame, questions: pl.DataFrame, spec: KeySpec, sets: list[str]) -> pl.DataFrame:
    """One row per (item, question) with the keys of its image and caption-only answers.

    Columns: item_id, question_set, question_id, question, parents, claim_type, image_hash,
    image_uri, caption, key_v (image answer), key_t (caption-only answer, null when the set
    is not answered from the caption).
    """
    qs = questions.filter(pl.col("question_set").is_in(sets)).select(
        "caption", "question_set", "question_id", "question", "parents", "claim_type"
    )
    plan = items.select("item_id", "image_hash", "image_uri", "caption").join(qs, on="caption", how="inner")
    if plan.height == 0:
        return plan.with_columns(key_v=pl.lit(None, pl.String), key_t=pl.lit(None, pl.String))
    parts = []
    for qset, group in plan.group_by("question_set", maintain_order=True):
        qset = qset[0]
        key_v = _keys(spec, IMAGE_KIND[qset], group, "image_hash", None, "question")
        if qset in CAPTION_ANSWERED_SETS:
            key_t = _keys(spec, "caption", group, None, "caption", "question")
        else:
            key_t = pl.Series("__key", [None] * group.height, dtype=pl.String)
        parts.append(group.with_columns(key_v=key_v, key_t=key_t))
    return pl.concat(parts).sort("item_id", "question_set", "question_id")


def plan_holistic(items: pl.DataFrame, spec: KeySpec) -> pl.DataFrame:
    """One row per item: the key of its holistic (VQAScore) answer."""
    frame = items.select("item_id", "image_hash", "image_uri", "caption")
    return frame.with_columns(key_h=_keys(spec, "holistic", frame.with_columns(text=pl.col("caption")), "image_hash", "caption", "text"))


def unique_requests(spec: KeySpec, question_plan: pl.DataFrame | None, holistic_plan: pl.DataFrame | None) -> pa.Table:
    """The distinct requests behind the plans, ordered so an image's requests are adjacent, and
    a caption's caption-only requests (the engines' prefix caches then reuse the shared start)."""
    frames = []
    if question_plan is not None and question_plan.height:
        kinds = pl.col("question_set").replace_strict(IMAGE_KIND, default=None)
        frames.append(
            question_plan.select(
                key=pl.col("key_v"), kind=kinds, image_hash="image_hash", image_uri="image_uri",
                caption=pl.lit(None, pl.String), text="question",
            )
        )
        caption_rows = question_plan.filter(pl.col("key_t").is_not_null())
        frames.append(
            caption_rows.select(
                key=pl.col("key_t"), kind=pl.lit("caption"), image_hash=pl.lit(None, pl.String),
                image_uri=pl.lit(None, pl.String), caption="caption", text="question",
            )
        )
    if holistic_plan is not None and holistic_plan.height:
        frames.append(
            holistic_plan.select(
                key=pl.col("key_h"), kind=pl.lit("holistic"), image_hash="image_hash", image_uri="image_uri",
                caption="caption", text="caption",
            )
        )
    if not frames:
        return schema.REQUESTS.empty_table()
    requests = (
        pl.concat(frames)
        .unique(subset="key", keep="first", maintain_order=True)
        .with_columns(backbone=pl.lit(spec.backbone), prompt_id=pl.col("kind").replace_strict(spec.prompt_ids, default=None))
        # image requests grouped by image, caption-only requests (a null hash, last) by caption:
        # the hf engine shares the prefix of requests that meet in one call
        .sort(["image_hash", "kind", "caption", "text"], nulls_last=True)
    )
    return schema.conform(requests.to_arrow(), schema.REQUESTS, what="requests")
