"""Loaders of the human-rated benchmarks (one module each, plus the built-in `demo`): an official
release -> the ITEMS table and the problems found in it (`io`: record parsers; files are read
through `pipeline.store.folder.Folder`)."""
