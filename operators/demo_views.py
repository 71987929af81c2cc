"""Masked views of demo scenes, and what each view still shows.

The evidence checks (docs/method.md, "Evidence checks") ask a claim again on views of the image
with boxes filled (`operators.views`). On a demo scene the truth of such a view is known: a
thing whose pixels are all filled is gone, a thing left untouched is still there. This module
draws the views the pipeline draws (the production `render_view`, `draw_controls` and fills) on
demo scenes and says which things each view shows, so a model can be taught, and measured, to
answer a claim on a view as the view shows it.

A thing counts as shown when at least `CLEAR` of its pixels are untouched, and as gone when at
most `GONE` are; a view that cuts a thing in between shows something no one can call, so it
gets no truth (`SceneView.shown` is None) and is never used.

Pure numpy; the boxes are pixel boxes of the rendered scene (`demo_world.SIZE` square).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from operators import demo_world, views
from operators.views import Box

CLEAR, GONE = 0.9, 0.1
EVIDENCE_VIEWS = ("minus_evidence", "only_evidence")
CONTROL_VIEWS = ("minus_control", "only_control")


def rgb(scene: demo_world.Scene) -> np.ndarray:
    """The scene's (SIZE, SIZE, 3) pixels, exactly those of its PNG (`demo_world.png_bytes`)."""
    return demo_world.RGB_PALETTE[demo_world.render(scene)]


@dataclass(frozen=True)
class SceneView:
    """One view of a drawn scene: `view` (operators.views.VIEWS) with `boxes` filled by `fill`."""

    scene: demo_world.Scene
    view: str
    boxes: tuple[Box, ...]
    fill: str

    def pixels(self) -> np.ndarray:
        return views.render_view(rgb(self.scene), self.view, self.boxes, self.fill)

    def kept(self) -> dict[demo_world.SceneObject, float]:
        """Each thing's share of pixels the view leaves untouched."""
        if self.view == "full":
            return {obj: 1.0 for obj in self.scene}
        inside = views.box_mask(self.boxes, demo_world.SIZE, demo_world.SIZE)
        untouched = ~inside if self.view.startswith("minus_") else inside
        out = {}
        for obj in self.scene:
            painted = demo_world.object_mask(obj.shape, obj.row, obj.col)
            out[obj] = float((painted & untouched).sum() / painted.sum())
        return out

    def shown(self) -> demo_world.Scene | None:
        """The things the view shows, or None when it cuts one between GONE and CLEAR."""
        kept = self.kept()
        if any(GONE < share < CLEAR for share in kept.values()):
            return None
        return tuple(obj for obj in self.scene if kept[obj] >= CLEAR)


def named_boxes(scene: demo_world.Scene, fact: demo_world.Fact) -> list[Box]:
    """The boxes a faithful detector returns for the phrases of a fact's claim: every thing its
    noun names (and, for a relation, every thing its other noun names)."""
    nouns = [(fact.shape, fact.colour)] + ([fact.other] if fact.other is not None else [])
    found = dict.fromkeys(obj for shape, colour in nouns for obj in demo_world._matching(scene, shape, colour))
    return [demo_world.object_box(o.shape, o.row, o.col) for o in found]


def _jittered(box: Box, rng: random.Random, most: int) -> Box:
    """A box as a detector draws it: each side off by up to `most` pixels, inside the image."""
    x0, y0, x1, y1 = (v + rng.randint(-most, most) for v in box)
    return views.pixel_box((x0, y0, x1, y1), demo_world.SIZE, demo_world.SIZE)


def draw_view(scene: demo_world.Scene, fact: demo_world.Fact, view: str, fill: str, rng: random.Random,
              jitter: int = 3) -> SceneView | None:
    """The `view` the evidence checks draw for a claim of `fact` on `scene`: the evidence is what
    the claim names (or, when it names nothing there, one other thing, as a detector's near miss),
    the controls are drawn by the production rules. None when the view cannot be drawn (no thing
    at all, or no control box fits)."""
    evidence = named_boxes(scene, fact)
    if not evidence and scene:
        near = rng.choice(scene)
        evidence = [demo_world.object_box(near.shape, near.row, near.col)]
    if not evidence:
        return None
    evidence = [_jittered(b, rng, jitter) for b in evidence]
    if view in CONTROL_VIEWS:
        drawn = views.draw_controls(evidence, evidence, demo_world.SIZE, demo_world.SIZE,
                                    np.random.default_rng(rng.getrandbits(64)))
        if not drawn.eligible:
            return None
        return SceneView(scene, view, drawn.boxes, fill)
    return SceneView(scene, view, tuple(evidence), fill)


def claim_request(sampler: demo_world.WorldSampler, view: str = "full", fill: str | None = None) -> demo_world.WorldRequest:
    """A claim of one of the world's fact types, true or false evenly on the drawn scene, asked
    on a view of it (the `claim` request kind; "full": the scene itself), with its truth on what
    the view shows."""
    rng = sampler.rng
    while True:
        scene = sampler.scene()
        fact = sampler.fact(scene, rng.choice(tuple(demo_world.FACT_TYPES.values())), rng.random() < 0.5)
        if fact is None:
            continue
        seen = None
        if view != "full":
            seen = draw_view(scene, fact, view, fill or rng.choice(views.FILLS), rng)
            scene = seen.shown() if seen is not None else None
        if scene is not None:
            return demo_world.WorldRequest("claim", scene, None, fact.claim().text, fact.holds(scene),
                                           demo_world.FACT_TYPES[fact.kind], "claims", (fact,), view=seen)
