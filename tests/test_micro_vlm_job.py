"""`jobs/micro_vlm.py train|evaluate`: every argument is checked before any work (one line, exit 2),
the shipped weights are written only on request (out=builtin), an output that cannot be written
fails before training, and a run keeps a checkpoint so a kill or a failed final save loses
minutes, not the run."""
from __future__ import annotations

import errno
import hashlib
import json
import time
from pathlib import Path

import pytest

from operators import tiny_models

FOLDER = tiny_models.SHIPPED["builtin:micro-vlm"]


def _snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def no_work(monkeypatch):
    """The job's work functions, replaced by ones that fail the test if they are reached."""
    import jobs.micro_vlm as job

    def reached(*_args, **_kwargs):
        raise AssertionError("the job started work despite a bad argument")

    monkeypatch.setattr(job, "train_micro_vlm", reached)
    monkeypatch.setattr(job, "evaluate_micro_vlm", reached)
    monkeypatch.setattr(job, "evaluate_writing", reached)
    return job


BAD_TRAIN = [
    ("seconds=0", "seconds"), ("seconds=-5", "seconds"), ("seconds=nan", "seconds"), ("seconds=inf", "seconds"),
    ("threads=0", "threads"), ("lr=-1", "lr"), ("lr=0", "lr"), ("per_step=image:-5", "per_step image"),
    ("per_step=image:0,caption:0,holistic:0", "per_step"), ("per_step=caption:8", "warm-up"),
    ("per_step=video:3", "video"), ("position_weight=-1", "position_weight"), ("type_weights=spatial:-1", "spatial"),
    ("type_weights=spatial:nan", "spatial"), ("warmup_seconds=-1", "warmup_seconds"), ("checkpoint_minutes=0", "checkpoint_minutes"),
    ("init=/nonexistent", "/nonexistent"), ("hybrid_share=1.5", "hybrid_share"), ("negbench_share=-0.1", "negbench_share"),
    ("seed=x", "seed"), ("colour=red", "colour"), ("hidden=100", "hidden"), ("hidden=0", "hidden"), ("layers=0", "layers"),
    (f"hidden=256 init={FOLDER}", "init="),
]


@pytest.mark.parametrize("arg,named", BAD_TRAIN, ids=[a for a, _ in BAD_TRAIN])
def test_a_bad_train_argument_is_one_line_and_exit_2_before_any_work(arg, named, no_work, tmp_path, capsys):
    start = time.monotonic()
    assert no_work.main(["train", *arg.split(), f"out={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and named in err and "Traceback" not in err, err
    assert "Repo id" not in err
    assert time.monotonic() - start < 30


def test_init_must_be_a_folder_holding_a_model(no_work, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert no_work.main(["train", f"init={tmp_path / 'empty'}", f"out={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.json" in err and "holds no saved model" in err, err


def test_a_bad_evaluate_argument_is_one_line_and_exit_2(no_work, capsys):
    for arg in ("n_per_type=0", "n_per_type=-3", "n_per_type=many", "n_views=0", "n_writing=-1"):
        assert no_work.main(["evaluate", arg]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and arg.split("=")[0] in err, err


def test_a_bad_writing_argument_is_one_line_and_exit_2(no_work, capsys):
    for arg in ("n=0", "n=many", "judge=maybe", "seed=x", "n_writing=5"):
        assert no_work.main(["writing", arg]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and arg.split("=")[0] in err, err


def test_train_without_out_never_touches_the_shipped_weights(no_work, capsys):
    """out= is required: the shipped folder is written only by an explicit out=builtin."""
    before = _snapshot(FOLDER)
    for argv in (["train"], ["train", "seconds=0"], ["train", "seconds=5"], ["train", "seconds=nan", "threads=1"]):
        assert no_work.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "out=" in err, err
    assert _snapshot(FOLDER) == before


def test_out_builtin_is_the_explicit_way_to_the_shipped_folder(monkeypatch, tmp_path):
    import jobs.micro_vlm as job

    seen = {}
    monkeypatch.setattr(job, "train_micro_vlm", lambda out, seconds, **kw: seen.update(out=out) or {"seconds": 0})
    monkeypatch.setitem(tiny_models.SHIPPED, "builtin:micro-vlm", tmp_path / "shipped")
    assert job.main(["train", "out=builtin", "seconds=1"]) == 0
    assert seen["out"] == str(tmp_path / "shipped")


def test_an_output_that_cannot_be_written_fails_before_training(no_work, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    start = time.monotonic()
    assert no_work.main(["train", f"out={blocker / 'model'}", "seconds=2400"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(blocker) in err, err
    assert time.monotonic() - start < 30


def test_a_read_only_output_is_the_storage_line_before_training(no_work, tmp_path, monkeypatch, capsys):
    """A folder the job may not write (EROFS here; root ignores permission bits): exit 4 at once."""

    real_write = Path.write_bytes

    def read_only(self, data):
        if self.name.startswith(".write-check-"):
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real_write(self, data)

    monkeypatch.setattr(Path, "write_bytes", read_only)
    assert no_work.main(["train", f"out={tmp_path / 'model'}"]) == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "read-only file system" in err, err


class _Model:
    """Stands in for a model whose save writes one file."""

    def to(self, _dtype):
        return self

    def float(self):
        return self

    def save_pretrained(self, folder):
        (Path(folder) / "model.safetensors").write_bytes(b"new weights")


class _FailingProcessor:
    def save_pretrained(self, folder):
        (Path(folder) / "tokenizer.json").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device", str(folder))


def test_a_failed_final_save_leaves_the_folders_previous_model_whole(tmp_path):
    from operators import micro_vlm_recipe

    out = tmp_path / "model"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"old weights")
    (out / "tokenizer.json").write_bytes(b"old tokenizer")
    with pytest.raises(OSError):
        micro_vlm_recipe.save(_Model(), _FailingProcessor(), out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {"model.safetensors": b"old weights", "tokenizer.json": b"old tokenizer"}


def test_a_run_whose_final_save_fails_keeps_a_checkpoint_to_continue_from(tmp_path, monkeypatch):
    """Checkpoints every `checkpoint_minutes` (here every step): the final save fails (disk
    full), the float32 checkpoint is there, and `init=` from it trains on and saves; after a
    successful save the checkpoint is gone."""
    import torch
    from safetensors import safe_open

    from operators import micro_vlm_recipe
    from pipeline.config import load_config

    templates = load_config([]).prompts.templates
    out = tmp_path / "model"
    lines: list[str] = []

    def disk_full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(out))

    monkeypatch.setattr(micro_vlm_recipe, "save", disk_full)
    with pytest.raises(OSError):
        micro_vlm_recipe.train(out, templates, seconds=1.0, threads=1, lr=1e-9, init=FOLDER, checkpoint_minutes=0.001, eval_every=1e9, log=lines.append)
    checkpoint = out / micro_vlm_recipe.CHECKPOINT
    assert any(line.startswith("checkpoint: step") for line in lines), lines
    assert {"config.json", "model.safetensors", "training.json"} <= {p.name for p in checkpoint.iterdir()}
    state = json.loads((checkpoint / "training.json").read_text())
    assert state["step"] >= 1 and state["options"]["lr"] == 1e-9
    with safe_open(str(checkpoint / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float32}
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no staging folder left

    monkeypatch.undo()
    micro_vlm_recipe.check_train_options(init=checkpoint)
    continued = tmp_path / "continued"
    report = micro_vlm_recipe.train(continued, templates, seconds=0.5, threads=1, lr=1e-9, init=checkpoint, eval_every=1e9, log=lambda _line: None)
    assert report.history[-1]["image"] >= 0.9, report.history[-1]
    assert (continued / "model.safetensors").is_file() and not (continued / micro_vlm_recipe.CHECKPOINT).exists()
    made_by = json.loads((continued / "training.json").read_text())  # the options and last check, beside the weights
    assert made_by["options"]["init"] == str(checkpoint) and made_by["final"]["step"] == report.steps
