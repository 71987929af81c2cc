"""The helpers every writer and stage shares: one error-table concatenation, one atomic local
write, one local-path check, one image-hash cache folder, one streaming writer."""
from __future__ import annotations

import errno
import os

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from operators import schema
from pipeline.scoring import write_concatenated
from pipeline.stages.ingest import image_hash_cache
from pipeline.store.fs import absolute_path, is_local, is_local_path, local_atomic_file, write_bytes_atomic, write_local_atomically


def test_error_tables_of_different_shapes_become_one_errors_table_in_order():
    first = pa.table({"stage": ["ingest"], "reason": ["unreadable_image"]})  # a subset of ERRORS' columns
    second = schema.error_table([{"stage": "answers", "item_id": "i7", "reason": "engine_error", "detail": "boom"}])
    merged = schema.concat_errors([first, second])
    assert merged.schema == schema.ERRORS
    assert merged.column("stage").to_pylist() == ["ingest", "answers"]
    assert merged.column("item_id").to_pylist() == [None, "i7"]
    assert schema.concat_errors([]).schema == schema.ERRORS and schema.concat_errors(iter([])).num_rows == 0


def test_what_counts_as_local():
    assert is_local(fsspec.filesystem("file"))
    assert not is_local(fsspec.filesystem("memory"))
    assert is_local_path("/data/x") and is_local_path("relative/x") and is_local_path("file:///data/x")
    assert not is_local_path("s3://bucket/x") and not is_local_path("gs://bucket/x")


def test_local_paths_become_absolute_and_urls_stay_as_they_are(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert absolute_path("data/x.parquet") == str(tmp_path.resolve() / "data" / "x.parquet")
    assert absolute_path("~/runs") == str(tmp_path.resolve() / "home" / "runs")
    assert absolute_path("s3://bucket/data/x.parquet") == "s3://bucket/data/x.parquet"


def test_the_image_hash_cache_is_one_folder_of_the_store():
    assert image_hash_cache("s3://bucket/store/") == "s3://bucket/store/image_hashes"
    assert image_hash_cache("/srv/store") == "/srv/store/image_hashes"


def test_a_local_write_that_fails_leaves_neither_the_file_nor_a_temporary(tmp_path):
    target = tmp_path / "new" / "file.bin"
    with pytest.raises(RuntimeError):
        with local_atomic_file(str(target)) as f:
            f.write(b"half")
            raise RuntimeError("killed mid-write")
    assert not target.exists() and os.listdir(target.parent) == []
    write_bytes_atomic(str(target), b"whole")
    assert target.read_bytes() == b"whole" and os.listdir(target.parent) == ["file.bin"]


def test_a_failed_local_write_names_the_file_not_its_temporary(tmp_path, monkeypatch):
    class Full:  # the file object of a full disk: the write fails with an errno and no file name
        def __init__(self, fd, mode):
            os.close(fd)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("pipeline.store.fs.os.fdopen", Full)
    target = tmp_path / "x.parquet"
    with pytest.raises(OSError) as caught:
        write_local_atomically(str(target), b"x")
    monkeypatch.undo()
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(target)
    assert os.listdir(tmp_path) == []  # the temporary file is removed


def test_write_concatenated_streams_tables_into_one_file_made_visible_only_when_complete(tmp_path):
    url = str(tmp_path / "records" / "b.parquet")
    write_concatenated(url, (pa.table({"x": [i, i + 1]}) for i in (0, 2)))
    assert pq.read_table(url).column("x").to_pylist() == [0, 1, 2, 3]

    def dying():
        yield pa.table({"x": [9]})
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        write_concatenated(url, dying())
    assert pq.read_table(url).column("x").to_pylist() == [0, 1, 2, 3]  # the old file, whole
    assert os.listdir(tmp_path / "records") == ["b.parquet"]
