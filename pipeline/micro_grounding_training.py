"""Training and measuring `builtin:micro-grounding-dino` (operators/micro_grounding_recipe.py).

`train_micro_grounding` runs the recipe (or resumes a run from its checkpoint);
`evaluate_micro_grounding` measures a saved detector through the unchanged grounding operator
(`operators.grounding.GroundingDetector`, default thresholds) on held-out demo scenes and checks
the recipe's `FLOORS`.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from operators.micro_grounding_recipe import DEFAULTS as DEFAULTS
from operators.micro_grounding_recipe import FLOORS as FLOORS
from operators.micro_grounding_recipe import RESUME_OVERRIDES, check_options, resume_options
from operators.run_folders import check_writable as check_writable


def check_train_arguments(seconds: float, resume: str | None, options: dict) -> dict:
    """The options a run will train with, every one checked (ValueError naming the bad one)."""
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"seconds must be a finite number above 0, got {seconds}")
    if resume is not None:
        if set(options) - RESUME_OVERRIDES:
            raise ValueError(f"resume= continues a run with its own options (only {', '.join(sorted(RESUME_OVERRIDES))} "
                             f"may change); drop {', '.join(sorted(set(options) - RESUME_OVERRIDES))}")
        return check_options(resume_options(resume) | options)
    return check_options(options)


def train_micro_grounding(out: str, seconds: float, resume: str | None = None, **options) -> dict:
    """Train (or resume) for `seconds` of wall time in all; the final report as a dict."""
    from operators.micro_grounding_recipe import train

    return train(out, seconds, resume=resume, log=lambda line: print(line, flush=True), **options)


def evaluate_micro_grounding(model: str, seed: int = 1, scenes: int = 300, out: str | None = None,
                             threshold: float | None = None) -> dict:
    """Held-out recall and absent-phrase numbers of a saved detector against `FLOORS`, printed
    (and written to out/evaluation.json when `out` is given); `threshold`: box and text
    thresholds (default: the operator's)."""
    from operators.grounding import Thresholds
    from operators.micro_grounding_recipe import evaluate

    thresholds = Thresholds(box=threshold, text=threshold) if threshold is not None else None
    report = evaluate(model, seed=seed, scenes=scenes, thresholds=thresholds)
    print(json.dumps(report))
    for name, floor in FLOORS.items():
        value = report.get(name)
        print(f"{name}: {value} (floor {floor}) {'ok' if value is not None and value >= floor else 'BELOW'}")
    if out is not None:
        (Path(out) / "evaluation.json").write_text(json.dumps(report, indent=1))
    return report


def calibrate_micro_grounding(model: str, seed: int = 2, scenes: int = 150) -> dict:
    """`calibrate` (training scenes), printed as a table with the chosen threshold."""
    from operators.micro_grounding_recipe import calibrate

    result = calibrate(model, seed=seed, scenes=scenes)
    names = ["threshold", *FLOORS, "worst"]
    print("  ".join(f"{n:>19}" for n in names))
    for row in result["table"]:
        print("  ".join(f"{row[n]:>19}" for n in names))
    print(f"chosen on training scenes: box_threshold = text_threshold = {result['threshold']}")
    return result
