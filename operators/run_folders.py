"""The folders a training run writes (the micro VLM's and the micro detector's recipes): an output
checked writable before any work, and a checkpoint folder replaced whole, never half-written."""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path


def check_writable(out: str | Path) -> Path:
    """Create `out` and write a probe file in it, so that an output that cannot be written fails
    before training rather than after it (OSError naming the path)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    probe = out / f".write-check-{uuid.uuid4().hex}"
    probe.write_bytes(b"")
    probe.unlink()
    return out


def swap_in(staging: Path, final: Path) -> None:
    """Put the folder `staging` where `final` is: a reader sees the old folder or the new one."""
    old = final.with_name(f".{final.name}-old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.rename(final, old)
    os.rename(staging, final)
    shutil.rmtree(old, ignore_errors=True)


CHECKPOINT = "checkpoint"  # out/checkpoint: the latest state of a run still going
TRAINER_STATE = "trainer.pt"  # in a checkpoint: what `resume` restores (optimizer, generators, training-only heads)


def save_checkpoint(model, processor, out: str | Path, state: dict, trainer: dict | None = None) -> Path:
    """The model in float32 (training goes on from exactly these weights), its processor,
    `state` (step, seconds trained, the run's options) and `trainer` (what `resume` restores)
    in out/checkpoint, swapped in whole."""
    import json

    out = Path(out)
    staging = out / f".{CHECKPOINT}-{uuid.uuid4().hex}"
    try:
        staging.mkdir()
        model.save_pretrained(staging)
        processor.save_pretrained(staging)
        (staging / "training.json").write_text(json.dumps(state, indent=1, default=str))
        if trainer is not None:
            import torch

            torch.save(trainer, staging / TRAINER_STATE)
        swap_in(staging, out / CHECKPOINT)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out / CHECKPOINT
