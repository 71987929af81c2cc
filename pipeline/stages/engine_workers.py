"""The engine stage's Ray actors for model work that every sweep runs: answering yes/no requests
(`AnswerWorker`) and greedy generations (`GenerationWorker`).

Each loads its engine once per actor, stores a batch's rows through a `PartSink` before it
returns, and reports one status row per key (`status_table`); `pipeline.stages.engine_stage`
places them, feeds them batches and isolates requests that kill them.
"""
from __future__ import annotations

import pyarrow as pa

from operators import schema
from operators.engines.spec import BackboneSpec
from pipeline.stages.engine_stage import PartSink, status_table
from pipeline.store.parts import PartStore


class EngineWorker:
    """What both actors share: the backbone's engine, loaded once per replica, and a store of
    rows of `STORED` written through a `PartSink`."""

    STORED: pa.Schema

    def __init__(self, backbone: BackboneSpec, templates: dict, store_url: str):
        from pipeline.stages.executor import load_engine  # shared in-process, own engine in a Ray actor

        self.backbone = backbone
        self.templates = templates
        self.store = PartStore(store_url, self.STORED)
        self.parts = PartSink(self.store)
        self.engine = load_engine(backbone)


class AnswerWorker(EngineWorker):
    """Ray actor: one engine per replica; answers a batch and stores it before returning."""

    STORED = schema.ANSWERS

    def __init__(self, backbone: BackboneSpec, templates: dict, store_url: str):
        from operators.images import load_image

        super().__init__(backbone, templates, store_url)
        self.load_image = load_image  # checks the bytes against the request's image hash

    def prepare(self, batch: pa.Table):
        """Decode a part's images ahead of its call (PartWriter overlaps it with the engine)."""
        from operators.answering import prefetch_images

        return prefetch_images(batch, self.load_image)

    def __call__(self, batch: pa.Table, images=None) -> pa.Table:
        from operators.answering import answer_batch

        answers, errors = answer_batch(self.engine, batch, self.templates, self.load_image, system=self.backbone.system_prompt, cache=images)
        self.parts.write(answers)
        return status_table(batch.column("key"), errors)


class GenerationWorker(EngineWorker):
    """Ray actor: greedy generations (questions, DSG graphs, claims) stored raw."""

    STORED = schema.GENERATIONS

    def __call__(self, batch: pa.Table) -> pa.Table:
        from operators.answering import generate_batch

        generations, errors = generate_batch(
            self.engine, batch, self.templates, max_new_tokens=self.backbone.max_new_tokens, system=self.backbone.system_prompt
        )
        self.parts.write(generations)
        return status_table(batch.column("key"), errors)
