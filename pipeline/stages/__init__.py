"""The DAG's stages, each over Arrow batches: ingest (items, image hashes), questions, answers
(caption-only and on the image, through the content-keyed answer store), judge, evidence
(grounding and masked views) and scores. `engine_stage` runs an engine's requests as Ray Data
actors (or, for small API calls, in this process: `executor`), keeping what is answered."""
