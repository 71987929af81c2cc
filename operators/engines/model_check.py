"""Whether a backbone's model can be loaded, found in seconds before any work starts.

Loading a model that is not there fails late and loudly: a hub id while offline retries for
minutes, a missing folder is taken for a malformed hub id ("Repo id must be ..."), an engine
whose package is not installed fails inside a worker, each with hundreds of lines of tracebacks.
`model_problem` answers from what is on this machine: the folder and its config.json, the local
Hugging Face cache, the engine's package. Only a hub id that is neither cached nor offline costs
one short request to the hub (`HUB_TIMEOUT_S`).

Pure: huggingface_hub and importlib only; no model, torch, transformers or Ray is loaded.
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

from operators.engines import NO_WEIGHTS
from operators.engines.spec import BackboneSpec

# Engines and the package each needs: the install extra that brings it.
ENGINE_PACKAGES = {"vllm": ("vllm", "pip install 'depict-pipeline[vllm]'")}
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
HUB_TIMEOUT_S = 10.0
SKIP_ENV = "DEPICT_SKIP_MODEL_CHECK"  # "1": trust the ids (models only the workers' machines hold)


def offline() -> bool:
    """Whether downloads are switched off (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE)."""
    return any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on") for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def model_problem(spec: BackboneSpec) -> tuple[str, str] | None:
    """(the config field at fault, one line naming the backbone, the model id and the fix), or
    None when the model can be loaded as far as this machine can tell."""
    if spec.engine in NO_WEIGHTS or os.environ.get(SKIP_ENV, "") not in ("", "0"):  # no model to look for
        return None
    what = f"backbone {spec.name!r} (model {spec.model_id})"
    needed = ENGINE_PACKAGES.get(spec.engine)
    if needed is not None and not importable(needed[0]):
        return "engine", (f"{what} runs on engine {spec.engine}, whose package {needed[0]} is not installed; "
                          f"fix: {needed[1]}, or backbone_overrides.{spec.name}.engine=hf")
    model_id = spec.model_id
    if model_id.startswith("builtin:"):
        return _builtin_problem(spec, what)
    if "://" in model_id:  # object stores and other schemes: the engine's own loader reads them
        return None
    folder = Path(os.path.expanduser(model_id))
    if folder.is_dir():
        return _folder_problem(folder, what, spec.name)
    if _looks_like_a_path(model_id) or not HUB_ID.match(model_id):
        return "model_id", (f"{what}: no such folder ({folder.resolve()}); fix: point backbone_overrides.{spec.name}.model_id "
                            "at a folder holding config.json and the weights, or give a Hugging Face id (org/name)")
    return _hub_problem(spec, what)


def importable(package: str) -> bool:
    """Whether `import package` would find it (a None in sys.modules blocks it, as import does)."""
    if package in sys.modules:
        return sys.modules[package] is not None
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def _looks_like_a_path(model_id: str) -> bool:
    return model_id.startswith(("/", ".", "~")) or model_id.count("/") > 1 or (os.sep != "/" and os.sep in model_id)


def _builtin_problem(spec: BackboneSpec, what: str) -> tuple[str, str] | None:
    from operators.tiny_models import BUILDERS, SHIPPED

    if spec.model_id in SHIPPED:
        folder = Path(SHIPPED[spec.model_id])
        if not any(folder.glob("*.safetensors")):
            return "model_id", f"{what}: the package has no weights in {folder}; fix: reinstall depict-pipeline"
        return None
    if spec.model_id not in BUILDERS:
        return "model_id", f"{what}: unknown builtin model; fix: one of {', '.join(sorted([*BUILDERS, *SHIPPED]))}"
    return None


def _folder_problem(folder: Path, what: str, name: str) -> tuple[str, str] | None:
    if not (folder / "config.json").is_file():
        return "model_id", (f"{what}: the folder {folder.resolve()} has no config.json, so it holds no saved model; "
                            f"fix: point backbone_overrides.{name}.model_id at the folder save_pretrained wrote")
    weights = [p for pattern in ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json") for p in folder.glob(pattern)]
    if not weights:
        return "model_id", (f"{what}: the folder {folder.resolve()} has config.json but no weights (*.safetensors, *.bin); "
                            "fix: copy the weight files into it")
    return None


def _hub_problem(spec: BackboneSpec, what: str) -> tuple[str, str] | None:
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(spec.model_id, "config.json", revision=spec.revision)
    if isinstance(cached, str):
        return None
    download = f"hf download {spec.model_id}" + (f" --revision {spec.revision}" if spec.revision else "")
    if offline():
        return "model_id", (f"{what} is not in the local Hugging Face cache ({_cache_dir()}) and downloads are off "
                            f"(HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE); fix: `{download}` on a machine with network into that "
                            "cache (HF_HOME), or unset the offline switch")
    return _ask_hub(spec, what, download)


def _ask_hub(spec: BackboneSpec, what: str, download: str) -> tuple[str, str] | None:
    """One short request: does the hub have this model at this revision, and can we reach it?"""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        HfApi().model_info(spec.model_id, revision=spec.revision, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        return "model_id", f"{what} is gated on the Hugging Face Hub; fix: accept its terms on its page and log in (hf auth login or HF_TOKEN)"
    except RevisionNotFoundError:
        return "revision", f"{what} has no revision {spec.revision!r} on the Hugging Face Hub; fix: backbone_overrides.{spec.name}.revision"
    except RepositoryNotFoundError:
        return "model_id", (f"{what} does not exist on the Hugging Face Hub (or is private); fix: check the id, "
                            "or log in (hf auth login or HF_TOKEN) for a private model")
    except Exception as exc:  # no network, DNS, proxy, timeout: the download would fail the same way, minutes later
        reason = " ".join(str(exc).split())[:160] or type(exc).__name__
        return "model_id", (f"{what} is not in the local Hugging Face cache ({_cache_dir()}) and the hub cannot be reached "
                            f"({type(exc).__name__}: {reason}); fix: connect, or `{download}` on a machine with network "
                            "into that cache and set HF_HUB_OFFLINE=1")
    return None


def _cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)
