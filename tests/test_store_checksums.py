"""Bit rot in a stored part: a flipped byte anywhere in a part (its magic, a value column such
as the log-probs, a page header, the footer) makes the part bad for every reader and for
`verify`, so it is quarantined and its keys computed again, never read as other numbers.

Parts are written through the production writer (`PartStore.write`, `PartStore.compact`) and
damaged in place, as a disk or an object store would."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from operators import schema
from operators.hashing import keys_digest
from pipeline.store.admin import verify
from pipeline.store.fs import write_table
from pipeline.store.parts import PartStore

N = 200


def answers(n: int = N, start: int = 0) -> pa.Table:
    keys = [f"{i:032x}" for i in range(start, start + n)]
    rng = np.random.default_rng(start)
    return pa.table({
        "key": keys,
        "backbone": ["b"] * n,
        "kind": ["image"] * n,
        "logp_yes": rng.uniform(-12, 0, n),
        "logp_no": rng.uniform(-12, 0, n),
        "answer_mass": rng.uniform(0.5, 1, n),
    })


def flipped(path: Path, offset: int, mask: int = 0x10) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def column_offsets(path: Path, name: str) -> tuple[int, int]:
    """(first byte, bytes) of column `name`'s chunk in row group 0 (dictionary page included)."""
    meta = pq.read_metadata(path).row_group(0)
    (chunk,) = [meta.column(i) for i in range(meta.num_columns) if meta.column(i).path_in_schema == name]
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    return start, chunk.total_compressed_size


def places(path: Path) -> dict[str, int]:
    """The bytes the audit flips: the file's start, the middle of each value column (the
    log-prob columns first), the key column, a page header, the footer and the trailing magic."""
    size = path.stat().st_size
    footer = int.from_bytes(path.read_bytes()[-8:-4], "little")
    found = {"magic at the start": 0}
    for name in ("logp_yes", "logp_no", "answer_mass", "key"):
        start, length = column_offsets(path, name)
        found[f"middle of {name}"] = start + length // 2
    start, _ = column_offsets(path, "logp_yes")
    found["page header of logp_yes"] = start + 2
    found["middle of the footer"] = size - 8 - footer // 2
    found["footer length"] = size - 6
    found["magic at the end"] = size - 2
    return found


def silent_flip(data: bytes, start: int, length: int) -> tuple[int, list[tuple[float, float]]]:
    """The first byte of `data[start:start + length]` whose lowest bit, flipped, still reads
    as a Parquet file (no checks beyond Parquet's own) with other log-probs; and which changed."""
    clean = pq.read_table(pa.BufferReader(data)).column("logp_yes").to_pylist()
    for offset in range(start, start + length):
        damaged = data[:offset] + bytes([data[offset] ^ 0x01]) + data[offset + 1:]
        try:
            read = pq.read_table(pa.BufferReader(damaged)).column("logp_yes").to_pylist()
        except Exception:  # noqa: BLE001 (Parquet noticed this one itself)
            continue
        changed = [(a, b) for a, b in zip(clean, read) if a != b]
        if changed:
            return offset, changed
    raise AssertionError("no flip in the column reads as other values")


def bad_parts(root: Path) -> list[dict]:
    return [b for r in verify(str(root)) for b in r.bad_parts]


def test_verify_names_a_part_with_a_flipped_byte_at_every_place_the_audit_tried(tmp_path):
    clean = tmp_path / "clean"
    PartStore(str(clean / "answers" / "b"), schema.ANSWERS).write(answers())
    assert bad_parts(clean) == []
    (part,) = (clean / "answers" / "b").glob("part-*.parquet")
    for what, offset in places(part).items():
        root = tmp_path / what.replace(" ", "-")
        shutil.copytree(clean, root)
        victim = root / "answers" / "b" / part.name
        flipped(victim, offset)
        found = bad_parts(root)
        assert [Path(b["path"]).name for b in found] == [part.name], f"a flip in the {what} (byte {offset}) went unnoticed"


def test_a_flip_that_parquet_reads_as_other_log_probs_is_caught_not_read(tmp_path):
    """The audit's case: a flip Parquet itself reads as other log-probs (no error at all)."""
    store = PartStore(str(tmp_path), schema.ANSWERS)
    table = answers()
    store.write(table)
    (part,) = tmp_path.glob("part-*.parquet")
    good = part.read_bytes()
    offset, changed = silent_flip(good, *column_offsets(part, "logp_yes"))
    assert changed  # Parquet alone reads this flip as other log-probs
    part.write_bytes(good[:offset] + bytes([good[offset] ^ 0x01]) + good[offset + 1:])
    assert store.missing(table.column("key")).to_pylist() == [True] * N  # its keys are computed again
    assert [Path(q["path"]).name for q in store.quarantined] == [part.name]
    assert "checksum" in store.quarantined[0]["reason"]
    assert not part.exists() and len(list((tmp_path / "_quarantine").iterdir())) == 1


def test_every_single_bit_flip_anywhere_in_a_part_makes_it_unreadable(tmp_path):
    """Not a sample of places: every byte of the file, each with one bit flipped."""
    store = PartStore(str(tmp_path), schema.ANSWERS)
    url = store.write(answers(40))
    path = url.removeprefix("file://")
    good = Path(path).read_bytes()
    silent = []
    for offset in range(len(good)):
        damaged = bytearray(good)
        damaged[offset] ^= 1 << (offset % 8)
        Path(path).write_bytes(bytes(damaged))
        try:
            store.read_part(path)
        except Exception:  # noqa: BLE001 (BadPart, or whatever pyarrow raised first: both make it bad)
            continue
        silent.append(offset)
    assert silent == [], f"{len(silent)} of {len(good)} flipped bytes were read as good, e.g. {silent[:10]}"


def test_rewriting_a_corrupted_part_replaces_it_under_its_own_name(tmp_path):
    store = PartStore(str(tmp_path), schema.ANSWERS)
    url = store.write(answers())
    part = Path(url.removeprefix("file://"))
    start, length = column_offsets(part, "logp_no")
    flipped(part, start + length // 2)
    assert store.write(answers()) == url  # the flip is found and the part written again
    assert store.read().equals(PartStore(str(tmp_path), schema.ANSWERS).read())
    assert bad_parts(tmp_path) == []


def test_a_ranged_read_of_a_compacted_part_checks_the_pages_it_reads(tmp_path):
    store = PartStore(str(tmp_path), schema.ANSWERS)
    for start in range(0, 4 * N, N):
        store.write(answers(N, start))
    store.compact(small_rows=10)
    (part,) = tmp_path.glob("part-k*.parquet")
    assert (tmp_path / (part.name + ".keyidx")).exists()
    keys = [f"{i:032x}" for i in (1, 2)]
    assert PartStore(str(tmp_path), schema.ANSWERS).missing(keys).to_pylist() == [False, False]
    start, length = column_offsets(part, "logp_yes")
    flipped(part, start + length // 2)
    reader = PartStore(str(tmp_path), schema.ANSWERS)
    assert reader.read(["logp_yes"], keys=keys).num_rows == 0  # not other numbers: missing
    assert [Path(q["path"]).name for q in reader.quarantined] == [part.name]


def test_parts_written_without_a_checksum_stay_readable_and_verify_counts_them(tmp_path, capsys):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jobs"))
    import store as job  # jobs/store.py

    folder = tmp_path / "answers" / "b"
    old = answers(10)
    write_table(str(folder / f"part-{keys_digest(old.column('key'))}.parquet"), old)  # the name an older writer gave it
    store = PartStore(str(folder), schema.ANSWERS)
    store.write(answers(10, start=10))
    assert store.read().num_rows == 20 and not store.quarantined
    (report,) = verify(str(tmp_path))
    assert report.ok and report.unchecked == 1 and report.parts == 2
    assert job.main(["verify", f"store={tmp_path}"]) == 0
    assert "unchecked: 1 parts written without a checksum" in capsys.readouterr().out
    store.compact(small_rows=100)  # folded into a checksummed compacted part
    (report,) = verify(str(tmp_path))
    assert report.ok and report.unchecked == 0 and report.keys == 20


@pytest.mark.parametrize("what", ["magic at the start", "middle of logp_yes", "middle of the footer"])
def test_verify_with_repair_quarantines_a_flipped_part(tmp_path, what):
    folder = tmp_path / "answers" / "b"
    store = PartStore(str(folder), schema.ANSWERS)
    store.write(answers())
    (part,) = folder.glob("part-*.parquet")
    flipped(part, places(part)[what])
    (report,) = verify(str(tmp_path), repair=True)
    assert len(report.bad_parts) == 1 and report.bad_parts[0]["moved_to"]
    assert not part.exists()
    (again,) = verify(str(tmp_path))
    assert again.ok and again.parts == 0


@pytest.mark.slow
def test_a_rerun_after_one_flipped_log_prob_byte_recomputes_that_part_and_gives_the_clean_scores(ray_session, tmp_path):
    """End to end on the smoke sweep: one byte of one answers part's log-prob column flipped
    (a flip Parquet alone reads as other numbers) costs one part's recomputation, not a
    published number."""
    import polars as pl

    from pipeline.config import load_config
    from pipeline.sweep import run_sweep, summary_text

    cfg = load_config([f"root={tmp_path}", "sweep=smoke", "compute.rows_per_part=16", "compute.progress_bars=false",
                       "bootstrap.n_resamples=20", "backbones=[zero-cost]", "benchmark_overrides.demo.protocol.statistics=[srcc]"])

    def scores(result) -> pl.DataFrame:
        return pl.concat([pl.read_parquet(p) for p in sorted(Path(result.run_dir, "scores").glob("*.parquet"))]).sort("item_id", "metric")

    def answers_report(result):
        (report,) = [r for r in result.reports if r.stage == "answers"]
        return report

    first = run_sweep(cfg)
    reference = scores(first)
    store_dir = tmp_path / "store" / "answers" / "zero-cost"
    victim = sorted(store_dir.glob("part-*.parquet"))[1]
    rows = pq.read_metadata(victim).num_rows
    good = victim.read_bytes()
    offset, changed = silent_flip(good, *column_offsets(victim, "logp_yes"))
    assert changed
    victim.write_bytes(good[:offset] + bytes([good[offset] ^ 0x01]) + good[offset + 1:])
    assert [Path(b["path"]).name for b in bad_parts(tmp_path / "store")] == [victim.name]

    second = run_sweep(cfg)
    report = answers_report(second)
    assert (report.cached, report.sent, report.failed) == (report.needed - rows, rows, 0)
    assert [Path(q["path"]).name for q in report.quarantined] == [victim.name]
    assert "store: 1 bad parts (unreadable or failing their checksum) moved to _quarantine/" in summary_text(cfg, second)
    assert scores(second).equals(reference)
    assert victim.read_bytes() == good  # the same rows again: the same bytes under the same name
    assert bad_parts(tmp_path / "store") == []


def test_verify_finds_keys_a_finished_marker_promises_that_no_part_holds(tmp_path):
    """A deleted part leaves every other file intact; the folder's finished marker still says
    how many keys its stage stored (a marker is written only when every key was stored), so
    verify names the shortfall instead of reporting the folder ok."""
    from pipeline.store.parts import MARKERS, Markers

    folder = tmp_path / "answers" / "b"
    store = PartStore(str(folder), schema.ANSWERS)
    store.write(answers(100))
    store.write(answers(50, start=100))
    Markers(f"{folder}/{MARKERS}").mark("answers-abc", {"stage": "answers", "unit": "b", "needed": 150, "cached": 0, "sent": 150, "failed": 0})
    (report,) = verify(str(tmp_path))
    assert report.ok and report.keys == 150
    small = min(folder.glob("part-*.parquet"), key=lambda p: p.stat().st_size)
    small.unlink()
    (report,) = verify(str(tmp_path))
    assert not report.ok and report.keys == 100
    (lost,) = report.lost_keys
    assert lost["marker"].endswith("answers-abc.json") and lost["needed"] == 150 and lost["found"] == 100
    assert "1 finished markers promise keys no part holds" in report.line()
    (report,) = verify(str(tmp_path), repair=True)
    assert report.lost_keys[0]["removed"] and not (folder / MARKERS / "answers-abc.json").exists()
    (report,) = verify(str(tmp_path))
    assert report.ok and report.keys == 100
