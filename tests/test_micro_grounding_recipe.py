"""The micro GroundingDINO recipe: its targets are the drawn shapes' tight boxes in the
detector's convention, an absent phrase has none, the held-out scoring counts what it says,
a killed run resumes its own optimizer, step and clock, and the job refuses bad arguments in
one line before any work."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from operators import demo_world
from operators import micro_grounding_recipe as recipe
from operators.grounding import Detections

TINY = {"d_model": 32, "queries": 4, "image_size": 96, "batch": 2, "eval_scenes": 2, "decoder_layers": 2}


def _drawn_box(scene, obj) -> tuple[int, int, int, int]:
    """The box of the non-background pixels inside the object's own grid cell, from `render`."""
    pixels = demo_world.render(scene)
    cell = demo_world.SIZE / 3
    y, x = np.nonzero(pixels)
    inside = (x // cell == obj.col) & (y // cell == obj.row)
    return int(x[inside].min()), int(y[inside].min()), int(x[inside].max()) + 1, int(y[inside].max()) + 1


def test_targets_are_the_tight_pixel_boxes_as_normalised_centre_width_height():
    sampler = demo_world.WorldSampler(3, "train")
    rng = random.Random(0)
    checked = 0
    for _ in range(40):
        scene = sampler.scene()
        query = recipe.draw_query(rng, scene, absent_share=0.0, plural_share=0.3)
        words = query.phrase.split()
        shape = words[-1].removesuffix("s")
        colour = words[0] if len(words) == 2 else None
        named = [o for o in scene if o.shape == shape and colour in (None, o.colour)]
        assert named and len(query.boxes) == len(named), (query, scene)  # every object the phrase names
        expected = sorted(_drawn_box(scene, o) for o in named)
        assert sorted(query.boxes) == expected
        target = recipe.targets(query)
        assert target["class_labels"].tolist() == [0] * len(named)
        cx, cy, w, h = target["boxes"].double().numpy().T * demo_world.SIZE
        back = sorted(zip(np.rint(cx - w / 2).astype(int).tolist(), np.rint(cy - h / 2).astype(int).tolist(),
                          np.rint(cx + w / 2).astype(int).tolist(), np.rint(cy + h / 2).astype(int).tolist()))
        assert back == expected
        checked += len(named)
    assert checked >= 50


def test_an_absent_phrase_names_nothing_in_the_scene_and_has_no_targets():
    sampler = demo_world.WorldSampler(4, "train")
    rng = random.Random(1)
    near_misses = 0
    for _ in range(200):
        scene = sampler.scene()
        query = recipe.draw_query(rng, scene, absent_share=1.0, plural_share=0.2)
        words = query.phrase.split()
        shape, colour = words[-1].removesuffix("s"), (words[0] if len(words) == 2 else None)
        assert query.kind == "absent" and query.boxes == ()
        assert not any(o.shape == shape and colour in (None, o.colour) for o in scene), (query.phrase, scene)
        near_misses += any(o.shape == shape or o.colour == colour for o in scene)
        target = recipe.targets(query)
        assert tuple(target["boxes"].shape) == (0, 4) and target["class_labels"].numel() == 0
    assert near_misses > 100  # mostly near misses: colour and shape must both be read


def test_scene_images_are_the_demo_pngs_pixel_for_pixel():
    from operators.images import decode_image

    sampler = demo_world.WorldSampler(5, "heldout")
    for _ in range(30):
        scene = sampler.scene()
        png = decode_image(demo_world.png_bytes(demo_world.render(scene)), "scene.png")
        assert np.array_equal(np.asarray(recipe.scene_image(scene)), np.asarray(png))


def _found(boxes, scores=None) -> Detections:
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    scores = np.full(len(boxes), 0.9) if scores is None else np.asarray(scores)
    return Detections(boxes, scores, scores, demo_world.SIZE, demo_world.SIZE)


def test_scoring_counts_recall_at_iou_half_per_kind_and_clean_absent_phrases():
    scene = demo_world.scene("red circle top left", "red circle middle centre", "blue star bottom right")
    circles = recipe.phrase_boxes(scene, "circle", "red")
    star = recipe.phrase_boxes(scene, "star", None)
    queries = [recipe.Query(scene, "red circle", circles, "colour_shape"), recipe.Query(scene, "star", star, "shape"),
               recipe.Query(scene, "green square", (), "absent"), recipe.Query(scene, "yellow star", (), "absent")]
    x0, y0, x1, y1 = star[0]
    shifted = (x0 + 0.5 * (x1 - x0), y0, x1 + 0.5 * (x1 - x0), y1)  # IoU 1/3 with the star
    found = [_found([circles[0]]), _found([shifted]), _found([]), _found([circles[1]])]
    report = recipe.score_detections(queries, found)
    assert report["recall_colour_shape"] == 0.5 and report["recall_several"] == 0.5  # one of two red circles
    assert report["all_found_several"] == 0.0
    assert report["recall_shape"] == 0.0  # IoU 1/3 is a miss
    assert report["absent_clean"] == 0.5 and report["n_absent"] == 2
    assert report["spare_boxes_per_present"] == 0.5  # the shifted box matches nothing
    nearly = (x0 + 0.2 * (x1 - x0), y0, x1 + 0.2 * (x1 - x0), y1)  # IoU 0.8/1.2 = 0.67: a hit
    assert recipe.score_detections(queries[1:2], [_found([nearly])])["recall_shape"] == 1.0
    assert recipe.box_iou([[0, 0, 10, 10]], [[5, 0, 15, 10]])[0, 0] == pytest.approx(1 / 3)


def test_separation_is_the_share_of_present_absent_pairs_ranked_right():
    got = recipe.separation(np.array([0.9, 0.5, 0.2]), np.array([0.4, 0.5]))
    assert got["auc_present_absent"] == pytest.approx((2 + 1.5 + 0) / 6, abs=1e-4)
    assert got["median_present"] == 0.5 and got["median_absent"] == 0.45


def test_presence_loss_is_bce_on_the_best_query_mean_phrase_logit():
    import torch

    ids = torch.tensor([[101, 7, 8, 1012, 102], [101, 9, 1012, 102, 0]])
    attention = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    logits = torch.full((2, 3, 6), float("-inf"))  # padded to max_text_len with -inf, as the model does
    logits[0, :, :5] = torch.tensor([[9.0, 1.0, 3.0, 9.0, 9.0], [9.0, 4.0, 4.0, 9.0, 9.0], [0.0, -1.0, -1.0, 0.0, 0.0]])
    logits[1, :, :4] = torch.tensor([[9.0, -2.0, 9.0, 9.0], [9.0, -3.0, 9.0, 9.0], [9.0, 0.5, 9.0, 9.0]])
    got = recipe.presence_loss(logits, ids, attention, [0, 100, 101, 102, 103, 1012], torch.tensor([True, False]))
    best = torch.tensor([4.0, 0.5])  # row 0: mean(4, 4) beats mean(1, 3); special tokens never count
    expected = torch.nn.functional.binary_cross_entropy_with_logits(best, torch.tensor([1.0, 0.0]))
    assert torch.isfinite(got) and float(got) == pytest.approx(float(expected))


class Killed(Exception):
    """Stands for a kill right after a checkpoint was written."""


def _kill_after_checkpoint(lines):
    def log(line):
        lines.append(line)
        if line.startswith('{"t"'):
            raise Killed

    return log


def test_a_checkpoint_resumes_the_same_run(tmp_path):
    import torch

    out = tmp_path / "run"
    first: list[str] = []
    with pytest.raises(Killed):
        recipe.train(out, 600, log=_kill_after_checkpoint(first), checkpoint_minutes=0.05, **TINY)
    saved = json.loads((out / "checkpoint" / "training.json").read_text())
    assert saved["step"] > 0 and saved["seconds_trained"] >= 3 and saved["history"][0]["step"] == saved["step"]
    assert recipe.resume_options(out / "checkpoint") == recipe.check_options(TINY | {"checkpoint_minutes": 0.05})

    second: list[str] = []
    with pytest.raises(Killed):
        recipe.train(out, 600, resume=out / "checkpoint", log=_kill_after_checkpoint(second), presence_weight=1.0)
    assert second[0] == f"resumed at step {saved['step']} after {saved['seconds_trained']} s"
    again = json.loads((out / "checkpoint" / "training.json").read_text())
    assert again["step"] > saved["step"] and again["seconds_trained"] > saved["seconds_trained"]
    assert [row["step"] for row in again["history"]] == [saved["step"], again["step"]]
    assert again["options"] == saved["options"] | {"presence_weight": 1.0}  # a loss term may change, nothing else
    trainer = torch.load(out / "checkpoint" / recipe.TRAINER_STATE, weights_only=False)
    adam_steps = {float(state["step"]) for state in trainer["optimizer"]["state"].values()}
    assert adam_steps == {float(again["step"])}  # the optimizer went on; a fresh one would count from 0

    with pytest.raises(ValueError, match="own options"):
        recipe.train(out, 600, resume=out / "checkpoint", lr=1.0)
    with pytest.raises(ValueError, match="not a checkpoint"):
        recipe.train(out, 600, resume=tmp_path)


def test_a_finished_run_saves_a_model_the_grounding_operator_loads(tmp_path):
    report = recipe.train(tmp_path / "run", 4, log=lambda _line: None, **TINY)
    assert report["final"] and report["n_absent"] == 2 and report["batch_invariant"] is True
    assert not (tmp_path / "run" / "checkpoint").exists()
    assert (tmp_path / "run" / "model.safetensors").is_file()


@pytest.fixture
def no_work(monkeypatch):
    import jobs.micro_grounding as job

    def reached(*_args, **_kwargs):
        raise AssertionError("the job started work despite a bad argument")

    monkeypatch.setattr(job, "train_micro_grounding", reached)
    monkeypatch.setattr(job, "evaluate_micro_grounding", reached)
    return job


BAD_TRAIN = [("seconds=0", "seconds"), ("seconds=nan", "seconds"), ("seconds=inf", "seconds"), ("threads=0", "threads"),
             ("lr=-1", "lr"), ("lr=x", "lr"), ("absent_share=1.5", "absent_share"), ("d_model=0", "d_model"),
             ("image_size=64", "image_size"), ("aux_loss=maybe", "aux_loss"), ("colour=red", "colour"),
             ("checkpoint_minutes=0", "checkpoint_minutes"), ("resume=/nonexistent", "/nonexistent")]


@pytest.mark.parametrize("arg,named", BAD_TRAIN, ids=[a for a, _ in BAD_TRAIN])
def test_a_bad_train_argument_is_one_line_and_exit_2(arg, named, no_work, tmp_path, capsys):
    assert no_work.main(["train", arg, f"out={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and named in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_bad_evaluate_arguments_and_a_missing_out_are_one_line_and_exit_2(no_work, capsys):
    for argv in (["train"], ["evaluate"], ["evaluate", "model=m", "scenes=0"], ["evaluate", "model=m", "seed=one"],
                 ["train", "out=x", "resume=y", "lr=0.1"]):
        assert no_work.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, (argv, err)
