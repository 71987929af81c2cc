"""A backbone whose model cannot be loaded is refused at start, in seconds, in one line naming
the backbone, the model id and the fix: a missing folder, a folder without config.json, a hub id
that is not cached while downloads are off (or the hub cannot be reached), an engine whose install
extra is missing. Before, these took 38-313 s and 300-550 lines of tracebacks (the folder case
said "Repo id must be in the form ...")."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from operators.engines import model_check
from operators.engines.spec import BackboneSpec

REPO = Path(__file__).resolve().parent.parent


def _job(args: list[str], tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    environment = {**os.environ, "PYTHONPATH": str(REPO), "HF_HOME": str(tmp_path / "hf-home"), **env}
    environment.pop("HF_HUB_CACHE", None)
    start = time.monotonic()
    done = subprocess.run([sys.executable, *args], cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    return done, time.monotonic() - start


def _one_line(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr[-3000:]
    return lines[0]


def test_a_sweep_on_a_missing_folder_stops_in_seconds_with_one_line(tmp_path):
    done, seconds = _job([str(REPO / "jobs/sweep.py"), "sweep=smoke", f"root={tmp_path / 'out'}",
                          f"backbone_overrides.smoke.model_id={tmp_path / 'no-such-model'}"], tmp_path)
    line = _one_line(done)
    assert done.returncode == 2 and seconds < 60, (done.returncode, seconds)
    assert "'smoke'" in line and str(tmp_path / "no-such-model") in line and "no such folder" in line and "fix:" in line, line
    assert "Repo id" not in line and not (tmp_path / "out").exists()


def test_a_hub_id_not_cached_while_offline_stops_in_seconds_with_one_line(tmp_path):
    done, seconds = _job([str(REPO / "jobs/sweep.py"), "sweep=smoke", f"root={tmp_path / 'out'}",
                          "backbone_overrides.smoke.model_id=Qwen/Qwen3-VL-4B-Instruct"], tmp_path, HF_HUB_OFFLINE="1")
    line = _one_line(done)
    assert done.returncode == 2 and seconds < 60, (done.returncode, seconds)
    assert "Qwen/Qwen3-VL-4B-Instruct" in line and "not in the local Hugging Face cache" in line and "hf download" in line, line


def test_the_score_job_refuses_a_folder_without_config_json(tmp_path):
    (tmp_path / "half-model").mkdir()
    (tmp_path / "half-model" / "model.safetensors").write_bytes(b"")
    (tmp_path / "pairs.csv").write_text("image,caption\nx.png,a red circle\n")
    done, seconds = _job([str(REPO / "jobs/score.py"), "pairs=pairs.csv", "metrics=[vqascore]",
                          f"backbone_overrides.smoke.model_id={tmp_path / 'half-model'}"], tmp_path)
    line = _one_line(done)
    assert done.returncode == 2 and seconds < 60, (done.returncode, seconds)
    assert "has no config.json" in line and "'smoke'" in line, line


def test_a_missing_engine_extra_names_the_extra(monkeypatch, tmp_path):
    from pipeline import Scorer
    from pipeline.config import ConfigError

    monkeypatch.setitem(sys.modules, "vllm", None)  # as on a plain install: `import vllm` fails
    spec = BackboneSpec(name="big", model_id="org/model", engine="vllm")
    field, line = model_check.model_problem(spec)
    assert field == "engine" and "pip install 'depict-pipeline[vllm]'" in line and "'big'" in line and "org/model" in line, line
    scorer = Scorer("micro", metrics=["vqascore"], root=tmp_path, executor="local", overrides=["backbone_overrides.micro.engine=vllm"])
    with pytest.raises(ConfigError, match=r"depict-pipeline\[vllm\]"):
        scorer(images=[b"not an image"], texts=["a red circle"])
    assert scorer.last is None  # refused before any pair was read or stored


def _cache_with(cache: Path, repo_id: str) -> None:
    """The layout huggingface_hub writes: refs/main names a snapshot holding config.json."""
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("0" * 40)
    (folder / "snapshots" / ("0" * 40)).mkdir(parents=True)
    (folder / "snapshots" / ("0" * 40) / "config.json").write_text("{}")


def test_a_cached_hub_id_passes_offline_and_an_uncached_one_does_not(monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _cache_with(tmp_path, "org/cached")
    assert model_check.model_problem(BackboneSpec(name="b", model_id="org/cached", engine="hf")) is None
    field, line = model_check.model_problem(BackboneSpec(name="b", model_id="org/absent", engine="hf"))
    assert field == "model_id" and "org/absent" in line and str(tmp_path) in line


def test_an_unreachable_hub_is_one_line_not_minutes_of_retries(monkeypatch, tmp_path):
    from huggingface_hub import HfApi, constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    asked = []

    def no_network(self, repo_id, revision=None, timeout=None, **_kwargs):
        asked.append(timeout)
        raise ConnectionError("[Errno -2] Name or service not known")

    monkeypatch.setattr(HfApi, "model_info", no_network)
    field, line = model_check.model_problem(BackboneSpec(name="b", model_id="org/model", engine="hf"))
    assert asked == [model_check.HUB_TIMEOUT_S] and "cannot be reached" in line and "Name or service not known" in line, line


def test_folders_builtins_and_scripted_engines(tmp_path):
    good = tmp_path / "model"
    good.mkdir()
    (good / "config.json").write_text("{}")
    assert model_check.model_problem(BackboneSpec(name="b", model_id=str(good), engine="hf"))[1].count("no weights") == 1
    (good / "model.safetensors").write_bytes(b"")
    assert model_check.model_problem(BackboneSpec(name="b", model_id=str(good), engine="hf")) is None
    assert model_check.model_problem(BackboneSpec(name="b", model_id="builtin:micro-vlm", engine="hf")) is None
    assert model_check.model_problem(BackboneSpec(name="b", model_id="builtin:tiny-vlm", engine="hf")) is None
    assert "unknown builtin" in model_check.model_problem(BackboneSpec(name="b", model_id="builtin:nope", engine="hf"))[1]
    assert model_check.model_problem(BackboneSpec(name="b", model_id="/nowhere", engine="scripted")) is None


def test_curation_refuses_a_missing_model_before_any_work(tmp_path):
    (tmp_path / "in").mkdir()
    done, seconds = _job([str(REPO / "jobs/curate.py"), "curation=smoke", "backbones=[smoke]", f"inputs=[{tmp_path / 'in'}/]", f"root={tmp_path / 'out'}",
                          f"backbone_overrides.smoke.model_id={tmp_path / 'gone'}"], tmp_path)
    line = _one_line(done)
    assert done.returncode == 2 and seconds < 60, (done.returncode, seconds)
    assert "no such folder" in line and str(tmp_path / "gone") in line, line
    assert not (tmp_path / "out").exists()


def test_the_run_summaries_name_commands_an_installed_package_has(tmp_path):
    """A wheel has no jobs/ folder: the summaries name `depict <job>`, which every install has."""
    from pipeline.config import load_config
    from pipeline.sweep import RunResult, summary_text

    text = summary_text(load_config([f"root={tmp_path}"]), RunResult(run_dir=str(tmp_path / "run")))
    assert f"tables and figures: depict tables run={tmp_path / 'run'}" in text and "jobs/" not in text, text
    source = (REPO / "pipeline" / "pairs.py").read_text()
    assert 'f"explore: depict explore run={out}"' in source and "python jobs/" not in source
