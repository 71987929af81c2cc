"""Nightly curation: score the new shards of image-caption pairs, keep the good ones, publish.

The same DAG as the sweep, not a second code path: shards are read into the ITEMS table
(Ray Data, one task per shard; embedded images written content-addressed under
<store>/images/), images are hashed by the sweep's ingest, and questions, answers and
scores come from `pipeline.scoring.score_items_all_backbones` against the shared answer
cache. Only the reading of shards and the publishing of decisions are curation's own.

Scoring is kept apart from deciding: every input row's scores are stored once
(`decisions/<shard_id>.parquet`), and `decide` re-applies a new `min_score` /
`top_fraction` to those stored scores without any model work.

Incremental: `manifest.json` records each processed shard by (uri, size, ETag or mtime, or
content hash) and the fingerprint of the scoring configuration; a run processes only shards
that are new or changed, so rerunning the same night does nothing and rewrites nothing.

Modules, in the order a run uses them:
- `config`: `load_curation_config` (inputs, columns, rule, windows) and the scoring fingerprint;
- `shards`: finding shards and their versions, reading Parquet / WebDataset rows (`tar_walk`:
  tar headers without reading members), publishing a filtered shard;
- `pairs_cache`: each shard's rows kept once read; `prune`: `store gc gone_shards=true`;
- `windows`: a night in bounded groups of shards; `rows`: shards -> pairs -> items, and the
  per-row decision and evidence tables; `rule`: which rows are kept;
- `publish`: the per-shard tables and filtered shards; `manifest`: the processed shards;
- `report`: report.json / report.md / histogram and the printed summary; `truth`: with a truth
  file, how right each metric's keep decisions are; `run`: the run itself;
- `demo_corpus`: writing the demo world's corpus whose mismatches are known (jobs/demo_corpus.py).

Output layout (`output`, default <root>/curation/<name>):

    manifest.json                      processed shards: version, fingerprint, counts, rule
    filtered/<shard_id>.parquet        kept rows: the original columns + score_<metric> columns
    decisions/<shard_id>.parquet       every input row: row, item_id, score_<metric>..., note, error, keep
    evidence/<shard_id>.parquet        per (row, question): the question, p_v, p_t and log-probs
    errors/<shard_id>.parquet          the shard's bad rows
    runs/<run_id>/                     report.json, report.md, histogram.png, errors.parquet,
                                       and the shared scoring outputs (questions, scores/, records/)
"""
