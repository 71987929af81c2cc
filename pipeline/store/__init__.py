"""Everything the pipeline keeps on disk or an object store, and how it stays correct.

- `folder`: `Folder`, a local directory or fsspec prefix with safe joins, atomic writes and
  content-named files (images); `BadRecord` / `FileError` for bad paths and unreadable files;
- `settings`: the storage settings Ray workers need, and retrying transient storage errors;
- `fs`: whole-file reads and atomic writes on any fsspec path, the helpers every writer uses
  (`read_table`, `write_json`, `write_bytes_atomic`, `join_url`, ...);
- `parts`: the content-keyed answer store (`PartStore`: immutable Parquet parts, markers,
  quarantine);
- `key_index`: the per-part key index that finds a key's row groups without reading the part;
- `admin`: `jobs/store.py verify | gc | compact` over a store;
- `lease`: one writer per output (heartbeat, expiry, take-over);
- `image_packs`: a shard's embedded images as one content-named tar, read by byte range;
- `run_folder`: all-or-nothing run folders (a sweep's outputs and their manifest).

It imports `operators` only, never another pipeline package: every other package may use it.
"""
