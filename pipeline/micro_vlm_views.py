"""How a backbone's answers to claims move when the evidence checks mask their evidence, measured
on held-out demo scenes whose truth under every view is known (operators/demo_views.py).

Each held-out claim (the world's fact types, true or false evenly, naming something there) is asked, through the engine
and the run's `claim` template, on three views drawn as the evidence stage draws them: the image
I, the evidence filled I\\E (every thing the claim names, in a detector-like box) and a matched
control filled I\\R (production control rules). Claims whose views cut a thing in half are
not drawn (no one could say what such a view shows). Per claim:

- drop = p_yes(I) - p_yes(I\\E), averaged over true claims about things that are there (hiding
  them makes the claim false): the evidence matters (floor >= 0.5);
- control move = |p_yes(I) - p_yes(I\\R)|, averaged over claims whose truth the control leaves
  unchanged: a random region does not matter (floor <= 0.1);
- the causal delta d_sel - d_rnd (log-odds, docs/method.md "Causal deltas") ranks the true
  claims of the drop (those whose evidence is all the image has for them) above the false ones:
  AUC (floor >= 0.9). A true claim the masked view still supports (the detector boxed one of two
  stars) is left out of this AUC, as of the drop: its answer rightly stays, so a delta near 0 is
  no failure of the answers. The AUC over every claim is `delta_auc_all`, reported without a
  floor: pooling mixes fact types whose deltas live on different scales (a false count claim
  grows more confidently false, by several log-odds, when its one object is masked).

The views are the pipeline's own (`operators.views.render_view`, PNG bytes decoded as the
engine decodes them), so a model measured here answers the evidence stage's views the same way.

`run_views` reads the same numbers off a finished demo run's evidence checks (its own boxes,
views, answers and deltas, against the world's truth), adding how far any control box reaches
into an evidence box of its image (floor: IoU < 0.1, the control rules' own bound).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from operators import demo_views, demo_world

FLOORS = {"drop_mean": 0.5, "control_move_mean": 0.1, "delta_auc": 0.9, "control_overlap_max": 0.1}


@dataclass(frozen=True)
class ViewedClaim:
    """One claim with its three views and their truths."""

    fact: demo_world.Fact
    scene: demo_world.Scene
    evidence: demo_views.SceneView
    control: demo_views.SceneView
    truth: bool  # on the image
    truth_without_evidence: bool
    truth_without_control: bool


def heldout_claims(n: int, seed: int = 0, fill: str = "blur") -> list[ViewedClaim]:
    """`n` held-out claims, true and false in turn, that name something in their scene (a claim
    whose things are all absent gets no box, hence no views, in the evidence stage), each with an
    evidence view and a control view that cut no thing in half."""
    sampler = demo_world.WorldSampler(f"views-{seed}", "heldout")
    rng = sampler.rng
    types = tuple(demo_world.FACT_TYPES.values())
    out: list[ViewedClaim] = []
    while len(out) < n:
        scene = sampler.scene()
        # true and false in turn; a type that cannot be both (nothing named there) is drawn again
        fact = sampler.fact(scene, rng.choice(types), len(out) % 2 == 0)
        if fact is None or not demo_views.named_boxes(scene, fact):  # nothing to ground: the pipeline draws no views
            continue
        evidence = demo_views.draw_view(scene, fact, "minus_evidence", fill, rng)
        control = demo_views.draw_view(scene, fact, "minus_control", fill, rng)
        if evidence is None or control is None:
            continue
        without_e, without_r = evidence.shown(), control.shown()
        if without_e is None or without_r is None:
            continue
        out.append(ViewedClaim(fact, scene, evidence, control, fact.holds(scene), fact.holds(without_e), fact.holds(without_r)))
    return out


def answer_views(engine, claims: Sequence[ViewedClaim], templates: dict, system: str | None = None) -> pl.DataFrame:
    """p_yes and log-odds of each claim on I, I\\E and I\\R, through the engine as the answers stage asks."""
    from operators.answering import answer_prompt, tell_templates
    from operators.hashing import image_hash
    from operators.images import decode_image
    from operators.views import png_bytes

    tell_templates(engine, templates)
    prompts = []
    for c in claims:
        for data in (demo_world.png_bytes(demo_world.render(c.scene)), png_bytes(c.evidence.pixels()), png_bytes(c.control.pixels())):
            row = {"text": c.fact.claim().text, "caption": None, "image_hash": image_hash(data)}
            prompts.append(answer_prompt("claim", row, templates, decode_image(data, "view.png"), system))
    logp = np.asarray(engine.score_yes_no(prompts), dtype=np.float64).reshape(len(claims), 3, 2)
    odds = logp[:, :, 0] - logp[:, :, 1]
    p_yes = 1 / (1 + np.exp(-odds))
    return pl.DataFrame({
        "fact_type": [demo_world.FACT_TYPES[c.fact.kind] for c in claims],
        "claim": [c.fact.claim().text for c in claims],
        "truth": [c.truth for c in claims],
        "truth_without_evidence": [c.truth_without_evidence for c in claims],
        "truth_without_control": [c.truth_without_control for c in claims],
        "p_image": p_yes[:, 0], "p_without_evidence": p_yes[:, 1], "p_without_control": p_yes[:, 2],
        "d_sel": odds[:, 0] - odds[:, 1], "d_rnd": odds[:, 0] - odds[:, 2],
    })


def summarize_views(answers: pl.DataFrame) -> dict:
    """The three numbers of the module docstring, with their counts."""
    from pipeline.stats.classification import roc_auc

    hidden = answers.filter(pl.col("truth") & ~pl.col("truth_without_evidence"))
    steady = answers.filter(pl.col("truth") == pl.col("truth_without_control"))
    decided = answers.filter(~(pl.col("truth") & pl.col("truth_without_evidence")))  # hidden + false claims

    def auc(frame: pl.DataFrame) -> float | None:
        value = roc_auc((frame["d_sel"] - frame["d_rnd"]).to_numpy(), frame["truth"].to_numpy())
        return None if math.isnan(value) else round(value, 4)

    def mean(values: pl.Series) -> float | None:
        return None if values.is_empty() else round(float(values.mean()), 4)

    out = {
        "claims": answers.height,
        "accuracy_image": round(float(((answers["p_image"] > 0.5) == answers["truth"]).mean()), 4),
        "drop_mean": mean(hidden["p_image"] - hidden["p_without_evidence"]), "drop_n": hidden.height,
        "control_move_mean": mean((steady["p_image"] - steady["p_without_control"]).abs()), "control_n": steady.height,
        "delta_auc": auc(decided), "delta_auc_n": decided.height, "delta_auc_all": auc(answers),
    }
    if "control_overlap" in answers.columns:  # a run's views: how far a control box reaches into the evidence
        out["control_overlap_max"] = round(float(answers["control_overlap"].max()), 4)
    return out


def view_floors(summary: dict) -> dict[str, bool]:
    """Which of `FLOORS` a summary meets (a missing number meets none)."""
    def at_least(name: str) -> bool:
        return summary[name] is not None and summary[name] >= FLOORS[name]

    return {
        f"drop on hiding the evidence of a true claim >= {FLOORS['drop_mean']}": at_least("drop_mean"),
        f"move on hiding a control <= {FLOORS['control_move_mean']}": summary["control_move_mean"] is not None
        and summary["control_move_mean"] <= FLOORS["control_move_mean"],
        f"AUC of d_sel - d_rnd, true claims the view hides vs false claims >= {FLOORS['delta_auc']}": at_least("delta_auc"),
    } | ({f"control boxes' IoU with evidence < {FLOORS['control_overlap_max']}": summary["control_overlap_max"] < FLOORS["control_overlap_max"]}
         if "control_overlap_max" in summary else {})


# ----------------------------------------------------------------- a demo run's evidence checks


def run_views(run_dir: str, backbone: str) -> pl.DataFrame:
    """A finished demo run's evidence checks (evidence/<backbone>/views and deltas) in the frame
    `summarize_views` reads: each eligible claim's truth on its image and on the views the run
    drew (from the demo world: the item's scene, the claim's fact, the run's own boxes), and the
    answers and deltas the run computed. Also each claim's largest IoU between a control box and
    an evidence box of the item (`control_overlap`; the control rules keep it under 0.10)."""
    from operators.engines.world_oracle import claim_table
    from operators.views import iou

    scenes = demo_scenes_by_hash()
    facts_of_claim = claim_table()
    folder = f"{run_dir}/evidence/{backbone}"
    views_table = pl.read_parquet(f"{folder}/views.parquet").filter(pl.col("eligible"))
    deltas = pl.read_parquet(f"{folder}/deltas.parquet").filter(pl.col("eligible") & pl.col("d_sel").is_not_null())
    item_evidence: dict[str, list] = {}
    for r in views_table.iter_rows(named=True):
        item_evidence.setdefault(r["item_id"], []).extend(tuple(b) for b in r["evidence_boxes"])
    key = ["item_id", "question_set", "claim_id"]
    joined = deltas.join(views_table.select(*key, "image_hash", "evidence_boxes", "control_boxes", "fill"), on=key)
    rows = []
    for r in joined.iter_rows(named=True):
        scene = scenes[r["image_hash"]]
        (fact, *_) = facts_of_claim[r["claim"]]
        evidence = tuple(tuple(b) for b in r["evidence_boxes"])
        control = tuple(tuple(b) for b in r["control_boxes"])
        without_e = demo_views.SceneView(scene, "minus_evidence", evidence, r["fill"]).shown()
        without_r = demo_views.SceneView(scene, "minus_control", control, r["fill"]).shown()
        rows.append({
            "claim": r["claim"], "fact_type": demo_world.FACT_TYPES[fact.kind], "truth": fact.holds(scene),
            # a view that cuts a thing in half has no truth: counted as unchanged (it leaves the drop's set)
            "truth_without_evidence": fact.holds(without_e) if without_e is not None else fact.holds(scene),
            "truth_without_control": fact.holds(without_r) if without_r is not None else fact.holds(scene),
            "p_image": _p(r["s_full"]), "p_without_evidence": _p(r["s_minus_evidence"]), "p_without_control": _p(r["s_minus_control"]),
            "d_sel": r["d_sel"], "d_rnd": r["d_rnd"],
            "control_overlap": max((iou(c, e) for c in control for e in item_evidence[r["item_id"]]), default=0.0),
        })
    return pl.DataFrame(rows)


def demo_scenes_by_hash() -> dict[str, demo_world.Scene]:
    """Every scene of the demo benchmarks (fixed and drawn items) by its PNG's content hash, the
    image_hash a run records."""
    from operators.hashing import image_hash

    parts = (demo_world.FIXED_ITEMS, demo_world.drawn_items())
    return {image_hash(demo_world.png_bytes(demo_world.render(s))): s for items in parts for s in demo_world.item_scenes(items)}


def _p(log_odds: float) -> float:
    return 1.0 / (1.0 + math.exp(-log_odds))
