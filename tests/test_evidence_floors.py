"""The evidence stage on the demo with the shipped detector and micro VLM, measured against the
demo world's truth (pipeline/micro_vlm_views.py `run_views`): hiding a true claim's evidence
drops its answer, a control box stays off every evidence box, and the causal delta tells true
claims from false ones. Each corruption of the production code fails the named floor:

- the mask filled outside its box instead of inside (operators/views.py `render_view`): the
  evidence is what stays, so hiding it drops nothing;
- a control box allowed to overlap the evidence (`draw_controls` forbidding no box);
- the causal deltas' sign flipped (pipeline/stages/evidence.py `view_deltas`: d_sel = s(I\\E) - s(I)
  and so on): the delta no longer tells true claims from false ones.

The sweep runs in this process (`executor.running_locally`), so a mutation reaches every stage."""
from __future__ import annotations

import pytest
from mutation import mutated

from operators import views
from pipeline import micro_vlm_views as MV
from pipeline.config import load_config

pytestmark = pytest.mark.slow
DROP = f"drop on hiding the evidence of a true claim >= {MV.FLOORS['drop_mean']}"
OVERLAP = f"control boxes' IoU with evidence < {MV.FLOORS['control_overlap_max']}"
AUC = next(name for name in MV.view_floors(dict.fromkeys(MV.FLOORS, 0.0)) if name.startswith("AUC"))


def evidence_run(root) -> dict:
    from pipeline.stages import executor
    from pipeline.sweep import run_sweep

    cfg = load_config([f"root={root}", "sweep=demo_evidence", "benchmarks=[demo_large]", "benchmark_overrides.demo_large.limit_groups=6",
                       "compute.progress_bars=false", "bootstrap.n_resamples=50"])
    with executor.running_locally(executor.LocalExecutor()):
        result = run_sweep(cfg)
    return MV.summarize_views(MV.run_views(result.run_dir, "micro"))


def test_the_demo_evidence_run_meets_its_view_floors(tmp_path):
    summary = evidence_run(tmp_path)
    floors = MV.view_floors(summary)
    assert summary["claims"] > 30 and floors[DROP] and floors[OVERLAP] and floors[AUC], summary
    assert summary["control_move_mean"] <= MV.FLOORS["control_move_mean"], summary


@pytest.mark.parametrize("old,new,floor", [
    ("return fill(pixels, inside, how, sigma_fraction, blur_cache)", "return fill(pixels, ~inside, how, sigma_fraction, blur_cache)", DROP),
    ("forbidden = list(dict.fromkeys([*image_evidence, *evidence]))", "forbidden = []", OVERLAP),
], ids=["mask-outside-its-box", "control-overlapping-evidence"])
def test_a_corrupted_view_fails_its_floor(tmp_path, old, new, floor):
    with mutated(views, old, new):
        summary = evidence_run(tmp_path)
    assert not MV.view_floors(summary)[floor], summary


def test_a_flipped_causal_delta_fails_the_auc_floor(tmp_path):
    from pipeline.stages import evidence

    with mutated(evidence, '(pl.col(f"s_{a}") - pl.col(f"s_{b}")).alias(name)', '(pl.col(f"s_{b}") - pl.col(f"s_{a}")).alias(name)'):
        summary = evidence_run(tmp_path)
    assert not MV.view_floors(summary)[AUC], summary
