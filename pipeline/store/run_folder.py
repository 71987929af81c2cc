"""All-or-nothing run folders: a sweep's outputs are either one finished run or refused.

A sweep rewrites `<root>/runs/<run_name>/` file by file. Killed halfway through a rerun with
other settings, the folder would hold the new scores next to the old statistics and
manifest, and reports would read that mixture as one run. So `manifest.json` carries the
run's state:

- `begin`: before any output is written, the manifest says `status: running` with a fresh
  `run_id`, and the previous run's outputs are removed (they are derived files: rerunning
  that configuration rebuilds them from the answer cache without any model work).
- `finish`: after the last output, the manifest says `status: finished` and lists every
  output file with its size and SHA-256.

Readers (`pipeline/reports/finished_run.py`, hence jobs/tables.py) call `require_finished` and
`Outputs.read`: an unfinished run, a file that is not the one the manifest lists (changed
after the run finished, e.g. by a second writer) or a listed file that is missing is
refused with a message naming the run, the file and what to do. Content digests rather
than timestamps, so a finished run copied elsewhere (`aws s3 sync`, `cp -r`) still reads.
"""
from __future__ import annotations

import hashlib
import posixpath
import time
import uuid

from pipeline.store.fs import exists, filesystem, read_bytes, read_json, write_json
from pipeline.store.settings import retrying

MANIFEST = "manifest.json"
# What a sweep writes into its run folder (docs/DESIGN.md, "Files"); `begin` removes exactly
# these, never anything else a user may keep there.
OUTPUT_FILES = (
    "items.parquet", "questions.parquet", "statistics.parquet", "statistics.csv",
    "deltas.parquet", "deltas.csv", "errors.parquet", "summary.txt",
)  # fmt: skip
OUTPUT_FOLDERS = ("scores", "records", "evidence", "judge", "tables")
# Written after the run by jobs/tables.py (and the lease): not part of the run's own outputs.
NOT_OUTPUTS = (MANIFEST, "_lease.json")


class RunNotFinished(ValueError):
    """The run folder is being written, was killed, or mixes outputs of different runs (jobs exit 2
    with its message: `pipeline.cli.guarded`)."""


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:8]}"


def begin(run_dir: str, run_id: str, info: dict) -> None:
    """Mark the folder as being written by `run_id`, then clear the previous run's outputs."""
    write_json(f"{run_dir}/{MANIFEST}", {**info, "status": "running", "run_id": run_id, "started_at": _now()})
    fs, root = filesystem(run_dir)
    for name in (*OUTPUT_FILES, *OUTPUT_FOLDERS):
        path = posixpath.join(root, name)
        fs.invalidate_cache(path)
        if retrying(f"check {run_dir}/{name}", lambda path=path: fs.exists(path)):
            retrying(f"remove {run_dir}/{name}", lambda path=path, name=name: fs.rm(path, recursive=name in OUTPUT_FOLDERS))
    fs.invalidate_cache(root)


def output_files(run_dir: str) -> dict[str, dict]:
    """Every file in the run folder (relative path -> bytes, sha256), the manifest excluded."""
    fs, root = filesystem(run_dir)
    fs.invalidate_cache(root)
    listed = {}
    for path in sorted(retrying(f"list {run_dir}", lambda: fs.find(root))):
        rel = posixpath.relpath(path, root)
        if rel in NOT_OUTPUTS or rel.startswith("tables/") or posixpath.basename(rel).startswith(".tmp-"):
            continue
        data = read_bytes(f"{run_dir.rstrip('/')}/{rel}")
        listed[rel] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return listed


def finish(run_dir: str, run_id: str, info: dict) -> dict:
    """Mark the run finished, listing its outputs; refuses if another run took the folder over."""
    current = read_manifest(run_dir)
    if current.get("run_id") != run_id:
        raise RunNotFinished(
            f"{run_dir}: run {run_id} was superseded by run {current.get('run_id')!r} "
            "writing the same folder; its outputs are not marked finished"
        )
    manifest = {**info, "status": "finished", "run_id": run_id, "started_at": current.get("started_at"), "finished_at": _now()}
    manifest["outputs"] = output_files(run_dir)
    write_json(f"{run_dir}/{MANIFEST}", manifest)
    return manifest


def read_manifest(run_dir: str) -> dict:
    url = f"{run_dir.rstrip('/')}/{MANIFEST}"
    if not exists(url):
        raise FileNotFoundError(f"{url} not found: {run_dir} is not a finished sweep run directory")
    return read_json(url)


def require_finished(run_dir: str, manifest: dict) -> None:
    """Refuse a run that is not marked finished (legacy manifests without a status pass)."""
    status = manifest.get("status")
    if status is None or status == "finished":
        return
    started = manifest.get("started_at", "?")
    raise RunNotFinished(
        f"{run_dir} is not a finished run: run {manifest.get('run_id', '?')} started at {started} "
        f"is {status} (or was killed); its outputs may mix two runs. Rerun the same sweep command "
        "to finish it (cached answers make this cheap)"
    )


class Outputs:
    """Reads a run's files, checking each against the manifest's list (when it has one)."""

    def __init__(self, run_dir: str, manifest: dict):
        self.run_dir = run_dir.rstrip("/")
        self.listed: dict[str, dict] | None = manifest.get("outputs")
        self.run_id = manifest.get("run_id", "?")

    def url(self, rel: str) -> str:
        return f"{self.run_dir}/{rel}"

    def exists(self, rel: str) -> bool:
        if self.listed is not None:
            return rel in self.listed
        return exists(self.url(rel))

    def names(self, folder: str, suffix: str) -> list[str]:
        """Relative paths of the run's files directly in `folder` ending with `suffix`."""
        if self.listed is not None:
            found = [r for r in self.listed if posixpath.dirname(r) == folder and r.endswith(suffix)]
            present = self._glob(folder, suffix)
            present = [p for p in present if not posixpath.basename(p).startswith(".tmp-")]
            extra = sorted({f"{folder}/{posixpath.basename(p)}" for p in present} - set(found))
            if extra:
                raise RunNotFinished(f"{self.url(extra[0])} is not an output of run {self.run_id} (manifest.json does not list it): the folder mixes runs; rerun the sweep")
            return sorted(found)
        paths = self._glob(folder, suffix)
        return sorted(f"{folder}/{posixpath.basename(p)}" for p in paths if not posixpath.basename(p).startswith(".tmp-"))

    def _glob(self, folder: str, suffix: str) -> list[str]:
        fs, root = filesystem(self.url(folder))
        fs.invalidate_cache(root)
        pattern = posixpath.join(root, f"*{suffix}")
        return retrying(f"list {self.url(folder)}", lambda: fs.glob(pattern) if fs.exists(root) else [])

    def read(self, rel: str) -> bytes:
        url = self.url(rel)
        if self.listed is not None and rel not in self.listed:
            raise FileNotFoundError(f"{url} not found (run {self.run_id} did not write it)")
        if not exists(url):
            if self.listed is None:
                raise FileNotFoundError(f"{url} not found")
            raise RunNotFinished(f"{url}: listed in manifest.json of run {self.run_id} but missing: the run folder is incomplete; rerun the sweep")
        data = read_bytes(url)
        if self.listed is not None:
            expected = self.listed[rel]
            if len(data) != expected.get("bytes") or hashlib.sha256(data).hexdigest() != expected.get("sha256"):
                raise RunNotFinished(
                    f"{url} changed after run {self.run_id} finished (its size or SHA-256 differs from manifest.json): "
                    "the folder mixes runs; rerun the sweep"
                )
        return data


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
