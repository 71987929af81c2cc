"""Pure, Ray-free building blocks: metric formulas, prompts, parsing, engines, geometry.

Every operator works on a plain Arrow table or polars DataFrame, so it can be tested
without a cluster. `pipeline/` composes these into Ray Data stages.
"""
