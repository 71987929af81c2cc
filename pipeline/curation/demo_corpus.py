"""Writing the demo curation corpus (`python jobs/demo_corpus.py out=DIR`): shape-world pairs
with a known share of mismatched captions, in both input formats curation reads, with the
questions the world writes for each caption and, apart from the inputs, the truth.

    <out>/parquet/pairs-0000.parquet ...   image (PNG bytes), caption, pair_id
    <out>/webdataset/pairs-0000.tar ...    <pair_id>.png + <pair_id>.txt: the same pairs, same order
    <out>/questions.parquet                 QUESTIONS rows of every caption (questions.source=file)
    <out>/truth.parquet                     shard, row, label (match or the mismatch kind), pair_id, ...
    <out>/corpus.json                       the settings and the count of each label; written last

Curate one of the two input folders (`inputs=[<out>/parquet/]`), not `<out>/` itself, which
would hold every pair twice. The drawing is `operators.demo_corpus`.
"""
from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass

from operators import demo_corpus
from pipeline.config import ConfigError
from pipeline.store.folder import FileError, Folder
from pipeline.store.fs import table_to_parquet_bytes

MANIFEST = "corpus.json"
FORMAT_FOLDERS = {"parquet": ".parquet", "webdataset": ".tar"}
QUESTIONS_FILE = "questions.parquet"
TRUTH_FILE = "truth.parquet"


@dataclass(frozen=True)
class WrittenCorpus:
    out: str  # the folder, as a URI
    counts: dict[str, int]  # label -> pairs
    shards: int  # per format

    def summary(self) -> str:
        """What the job prints: where each part is, the labels, and the commands that use it."""
        labels = ", ".join(f"{label} {n}" for label, n in self.counts.items())
        return "\n".join([
            f"demo corpus: {sum(self.counts.values())} pairs ({labels}) in {self.shards} shard(s) per format",
            f"  inputs:    {self.out}/parquet/  or  {self.out}/webdataset/  (the same pairs; curate one)",
            f"  questions: {self.out}/{QUESTIONS_FILE}",
            f"  truth:     {self.out}/{TRUTH_FILE}  (kept apart from the inputs)",
            f"curate it:  python jobs/curate.py curation=demo inputs=[{self.out}/parquet/] "
            f"questions.file={self.out}/{QUESTIONS_FILE} truth={self.out}/{TRUTH_FILE} root=<folder>",
        ])


def write_demo_corpus(
    out: str,
    pairs: int = demo_corpus.DEFAULT_PAIRS,
    mismatch_share: float = demo_corpus.DEFAULT_MISMATCH_SHARE,
    kinds: Mapping[str, float] | None = None,
    seed: int = 0,
    open_share: float = 0.0,
    pairs_per_shard: int = demo_corpus.DEFAULT_PAIRS_PER_SHARD,
) -> WrittenCorpus:
    """Draw the corpus and write it under `out` (a local folder or fsspec URL). A corpus already
    there is replaced (its files removed first, so no shard of a larger one is left behind); a
    folder holding anything else is refused, naming a file."""
    kinds = dict(demo_corpus.DEFAULT_KIND_SHARES if kinds is None else kinds)
    try:
        demo_corpus.check_draw(pairs, mismatch_share, kinds, seed)
        demo_corpus.check_files(pairs_per_shard, open_share)
    except demo_corpus.SettingError as exc:
        raise ConfigError(exc.key, str(exc).split(": ", 1)[1]) from None
    folder = Folder(out)
    make_room(folder)
    drawn = demo_corpus.draw_corpus(pairs, mismatch_share, kinds, seed)
    slices = demo_corpus.shard_slices(drawn, pairs_per_shard)
    for stem, chunk in slices:
        folder.write(folder.join(f"parquet/{stem}.parquet"), table_to_parquet_bytes(demo_corpus.parquet_table(chunk)))
        folder.write(folder.join(f"webdataset/{stem}.tar"), demo_corpus.webdataset_tar(chunk))
    folder.write(folder.join(QUESTIONS_FILE), table_to_parquet_bytes(demo_corpus.questions_table(drawn, open_share)))
    folder.write(folder.join(TRUTH_FILE), table_to_parquet_bytes(demo_corpus.truth_table(drawn, pairs_per_shard)))
    counts = demo_corpus.label_counts(pairs, mismatch_share, kinds)
    manifest = {
        "about": "Demo-world curation corpus: scenes and captions from the world's bench content slot; each pair's "
                 "caption is true of its scene ('match') or made false in the named way (truth.parquet). "
                 "See docs/curation.md, 'Does the filter keep the right pairs?'.",
        "pairs": pairs, "mismatch_share": mismatch_share, "kinds": kinds, "seed": seed, "open_share": open_share,
        "pairs_per_shard": pairs_per_shard, "counts": counts,
        "inputs": {name: f"{name}/" for name in FORMAT_FOLDERS}, "questions": QUESTIONS_FILE, "truth": TRUTH_FILE,
    }
    folder.write(folder.join(MANIFEST), (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
    return WrittenCorpus(out=folder.uri(), counts=counts, shards=len(slices))


def make_room(folder: Folder) -> None:
    """Make room for a corpus: remove the files a corpus writes (a larger corpus's shards, or
    the part of one a killed run wrote); refuse a folder that holds any other file."""
    fs = folder.fs
    if not fs.exists(folder.path):
        return
    if not fs.isdir(folder.path):
        raise FileError(f"{folder.uri()}: exists and is not a folder")
    found = sorted(posixpath.relpath(p, folder.path) for p in fs.find(folder.path))
    others = [relative for relative in found if not _written_by_corpus(relative)]
    if others:
        raise FileError(f"{folder.uri()}: holds files a demo corpus does not write (e.g. {others[0]}); choose an empty or new folder")
    for relative in found:
        fs.rm(folder.join(relative))


def _written_by_corpus(relative: str) -> bool:
    top, _, name = relative.partition("/")
    if not name:
        return relative in (MANIFEST, QUESTIONS_FILE, TRUTH_FILE)
    return top in FORMAT_FOLDERS and "/" not in name and name.endswith(FORMAT_FOLDERS[top])
