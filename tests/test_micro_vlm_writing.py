"""The micro VLM's writing lessons: what the model reads is what the generation stages send,
the loss sits on the answer alone, unseen words are answered by a refusal, and a checkpointed
run resumes where it stopped."""
from __future__ import annotations

import errno
import json
import random

import pytest

from operators import demo_generations, demo_world, micro_vlm_recipe, micro_vlm_writing
from pipeline.config import load_config

TEMPLATES = dict(load_config([]).prompts.templates)


@pytest.fixture(scope="module")
def processor():
    return micro_vlm_recipe.build_processor(TEMPLATES, seed=0, writing=True)


@pytest.fixture(scope="module")
def encoder(processor):
    pixels = micro_vlm_recipe.PixelTable(processor.image_processor)
    return micro_vlm_writing.LessonEncoder(processor, TEMPLATES, pixels, 9)


def test_world_words_are_one_token_templates_are_short_and_yes_no_stay_single(processor):
    tok = processor.tokenizer
    split = sorted(w for w in demo_generations.world_words() if len(tok.encode(" " + w, add_special_tokens=False)) != 1)
    assert not split, split
    for kind in micro_vlm_writing.WRITE_KINDS:  # the shipped 512-token BPE: about 3 tokens a word
        template = TEMPLATES[micro_vlm_writing.TEMPLATES[kind]]
        assert len(tok.encode(template, add_special_tokens=False)) < 2 * len(template.split()), kind
    assert [len(tok.encode(w, add_special_tokens=False)) for w in ("Yes", "No")] == [1, 1]


def test_a_lessons_inputs_are_the_generation_prompt_then_the_answer_with_loss_on_the_answer_only(processor, encoder):
    sampler = demo_world.WorldSampler(3, "train")
    lessons = [micro_vlm_writing.draw_lesson(sampler, kind, 0.25) for kind in micro_vlm_writing.WRITE_KINDS]
    batch = encoder.batch(lessons)
    for row, lesson in enumerate(lessons):
        ids, labels = batch["inputs"]["input_ids"][row].tolist(), batch["labels"][row].tolist()
        prompt, answer = encoder.prompt_ids(lesson), encoder.answer_ids(lesson)
        assert ids[:len(prompt) + len(answer)] == prompt + answer
        assert labels[:len(prompt)] == [-100] * len(prompt) and labels[len(prompt):len(prompt) + len(answer)] == answer
        assert all(x == -100 for x in labels[len(prompt) + len(answer):])  # padding carries no loss
        assert processor.tokenizer.decode(answer, skip_special_tokens=True) == lesson.answer  # the text round-trips
        text = micro_vlm_writing.prompt_text(processor, TEMPLATES, lesson)
        assert lesson.caption in text and text.endswith("<|im_start|>assistant\n")
        assert ("<|image_pad|>" in text) == lesson.kind.startswith("judge_")
    assert batch["inputs"]["image_grid_thw"].tolist() == [[1, 6, 6], [1, 6, 6]]  # the two judge lessons' images


def test_a_shared_prompt_opening_gives_the_loss_and_gradients_of_one_full_pass_per_row():
    """lesson_loss runs the template's opening once for a batch of question lessons: the loss
    and every gradient equal those of the full pass (the path judge lessons, with their own
    images, take), and a batch whose rows share nothing takes the full pass."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from operators.tiny_models import SHIPPED

    processor = AutoProcessor.from_pretrained(SHIPPED["builtin:micro-vlm"])
    model = AutoModelForImageTextToText.from_pretrained(SHIPPED["builtin:micro-vlm"], dtype=torch.float32)
    encoder = micro_vlm_writing.LessonEncoder(processor, TEMPLATES, micro_vlm_recipe.PixelTable(processor.image_processor), 9)
    sampler = demo_world.WorldSampler(3, "train")
    lessons = [micro_vlm_writing.draw_lesson(sampler, "dsg", 0.25) for _ in range(4)]
    shared = micro_vlm_writing.shared_length([encoder.prompt_ids(x) for x in lessons])
    assert shared > 150  # the chat template's opening and the template's instructions: the caption comes last
    with torch.no_grad():  # an image batch first, as in training: it leaves rope offsets behind in the model
        b = encoder.batch([micro_vlm_writing.draw_lesson(sampler, "judge_holistic", 0.25) for _ in range(3)])
        model(**b["inputs"])

    def loss_and_grads(full: bool):
        model.zero_grad()
        if full:  # what lesson_loss did before it shared the opening
            b = encoder.batch(lessons)
            logits = model(**b["inputs"]).logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), b["labels"][:, 1:].reshape(-1), ignore_index=-100)
        else:
            loss = micro_vlm_writing.lesson_loss(model, encoder, lessons)
        loss.backward()
        return float(loss), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    full_loss, full_grads = loss_and_grads(full=True)
    loss, grads = loss_and_grads(full=False)
    assert abs(loss - full_loss) < 1e-6 and len(grads) == len(full_grads)
    assert max(float((a - b).abs().max()) for a, b in zip(grads, full_grads)) < 1e-5
    assert micro_vlm_writing.shared_length([[1, 2, 3], [1, 2, 4]]) == 2 and micro_vlm_writing.shared_length([[1, 2], [1, 2, 3]]) == 1


def test_the_longest_lesson_fits_the_models_positions(encoder):
    sampler = demo_world.WorldSampler(0, "train")
    longest = max(len(encoder.prompt_ids(x)) + len(encoder.answer_ids(x))
                  for x in (micro_vlm_writing.draw_lesson(sampler, "judge_decomposed", 0.25) for _ in range(300)))
    assert longest < 2048, longest


def test_a_caption_with_an_unseen_word_is_answered_by_the_refusal():
    sampler = demo_world.WorldSampler(1, "train")
    lessons = [micro_vlm_writing.draw_lesson(sampler, "dsg", 0.25, refusal_share=0.5) for _ in range(200)]
    refused = [x for x in lessons if x.answer == demo_generations.REFUSAL]
    assert 70 < len(refused) < 130
    assert all(not demo_generations.knows(x.caption) for x in refused)
    assert all(demo_generations.knows(x.caption) for x in lessons if x not in refused)
    words = {micro_vlm_writing.unseen_word(random.Random(i)) for i in range(200)}
    assert not words & demo_generations.world_words() and len(words) > 50


def test_clause_weights_set_how_long_the_lessons_captions_are_and_the_default_is_the_worlds_mix(capsys, tmp_path):
    from jobs.micro_vlm import main

    def clauses(weights, seed=2):
        sampler = demo_world.WorldSampler(seed, "train")
        return [len(micro_vlm_writing.draw_lesson(sampler, "depict", 0.25, clause_weights=weights).caption.split(" and "))
                for _ in range(150)]

    assert set(clauses((1, 0, 0))) == {1}
    long = clauses((0, 0, 1))
    assert sum(n == 3 for n in long) > 0.4 * len(long)  # 0.57: a clause the scene cannot give is dropped
    world = demo_world.WorldSampler(2, "train")
    default = [len(micro_vlm_writing.draw_lesson(world, "depict", 0.25).caption.split(" and ")) for _ in range(150)]
    assert default == clauses(demo_world.CLAUSE_WEIGHTS)  # no weights given: the world's own mix, draw for draw
    assert main(["train", "write_clause_weights=1,2", f"out={tmp_path}"]) == 2
    assert "write_clause_weights are how often writing lessons' captions have 1, 2 and 3 clauses" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_a_caption_repeats_a_shape_when_two_of_its_mentions_name_it():
    repeats = {"a square left of a triangle and a green square": True, "a circle and a square and a blue circle": True,
               "a triangle above a triangle": True, "two stars and no blue star": True,
               "a red circle below a star": False, "a blue star right of a circle and a green square and a triangle": False,
               "three circles": False}
    from operators.engines.world_oracle import parse_caption

    assert {text: parse_caption(text).repeats_a_shape for text in repeats} == repeats


def test_repeat_share_draws_that_share_of_lessons_naming_a_shape_twice_and_zero_is_the_worlds_draws(capsys, tmp_path):
    from jobs.micro_vlm import main

    def captions(share, seed=4):
        sampler = demo_world.WorldSampler(seed, "train")
        return [micro_vlm_writing.draw_lesson(sampler, "dsg", 0.25, repeat_share=share).caption for _ in range(200)]

    def repeating(texts):
        from operators.engines.world_oracle import parse_caption

        return sum(parse_caption(t).repeats_a_shape for t in texts) / len(texts)

    world = demo_world.WorldSampler(4, "train")
    assert captions(0.0) == [micro_vlm_writing.draw_lesson(world, "dsg", 0.25).caption for _ in range(200)]
    assert repeating(captions(0.0)) < 0.45  # the world's own share (0.30 of 2,000 draws)
    assert repeating(captions(1.0)) == 1.0
    assert 0.75 < repeating(captions(0.8)) < 0.98  # 0.8 forced, and some of the rest repeat by chance
    assert main(["train", "write_repeat_share=1.5", f"out={tmp_path}"]) == 2
    assert "write_repeat_share must be a number between 0 and 1, got '1.5'" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"write_repeat_share is a share of writing lessons \(those whose caption names one shape twice\)"):
        micro_vlm_recipe.check_train_options(seconds=1, write_repeat_share=float("nan"))
    assert not any(tmp_path.iterdir())


def test_exact_match_by_caption_splits_each_format_by_clauses_and_repeated_shapes():
    from pipeline.micro_vlm_writing import Written, by_caption

    def w(kind, caption, exact):
        return Written(kind, caption, "", True, exact)

    written = [w("depict", "a red circle", True), w("dsg", "a red circle", True),
               w("depict", "a star and a red star", False), w("dsg", "a star and a red star", True),
               w("depict", "a square and a green square", True), w("dsg", "a square and a green square", False),
               w("depict", "a star and a circle", True), w("dsg", "a star and a circle", True),
               w("judge_holistic", "a star and a circle", False)]  # no question set: not counted
    assert by_caption(written) == [
        {"clauses": 1, "repeats_a_shape": False, "n": 1, "depict": 1.0, "dsg": 1.0},
        {"clauses": 2, "repeats_a_shape": False, "n": 1, "depict": 1.0, "dsg": 1.0},
        {"clauses": 2, "repeats_a_shape": True, "n": 2, "depict": 0.5, "dsg": 0.5},
    ]


def test_deepen_adds_layers_that_change_nothing_until_trained(processor, tmp_path):
    import torch
    from transformers import AutoModelForImageTextToText

    model = micro_vlm_recipe.build_model(processor, seed=0, layers=2).eval()
    ids = processor.tokenizer("a red star left of a triangle and a red star", return_tensors="pt").input_ids

    def greedy(m):
        with torch.no_grad():
            return m(input_ids=ids).logits, m.generate(input_ids=ids, max_new_tokens=12, do_sample=False)

    logits, tokens = greedy(model)
    micro_vlm_recipe.deepen(model, 4)
    assert len(model.model.language_model.layers) == 4 and model.config.text_config.num_hidden_layers == 4
    deep_logits, deep_tokens = greedy(model)
    torch.testing.assert_close(deep_logits, logits, atol=1e-6, rtol=0)
    assert torch.equal(deep_tokens, tokens)
    trained = micro_vlm_recipe.build_model(processor, seed=0, layers=2).eval()
    micro_vlm_recipe.deepen(trained, 4)
    with torch.no_grad():  # as training leaves them: the new layers compute something
        for layer in trained.model.language_model.layers[2:]:
            layer.self_attn.o_proj.weight.normal_(0, 0.5)
        cached, recomputed = (trained.generate(input_ids=ids, max_new_tokens=12, do_sample=False, use_cache=use)
                              for use in (True, False))
    assert torch.equal(cached, recomputed)  # each new layer keeps its own key-value cache slot
    model.save_pretrained(tmp_path)
    saved = AutoModelForImageTextToText.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert len(saved.model.language_model.layers) == 4
    torch.testing.assert_close(greedy(saved)[0], logits, atol=1e-6, rtol=0)
    processor.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="already has 4 layers"):
        micro_vlm_recipe.check_train_options(init=str(tmp_path), layers=3)
    with pytest.raises(ValueError, match="hidden sizes a model trained from scratch"):
        micro_vlm_recipe.check_train_options(init=str(tmp_path), hidden=256)
    micro_vlm_recipe.check_train_options(init=str(tmp_path), layers=6)
    with pytest.raises(ValueError, match="would remove layers"):
        micro_vlm_recipe.deepen(saved, 3)


def test_resume_takes_no_options_of_its_own(tmp_path, monkeypatch, capsys):
    import jobs.micro_vlm as job

    monkeypatch.setattr(job, "train_micro_vlm", lambda *a, **k: pytest.fail("the job started work"))
    assert job.main(["train", f"out={tmp_path}", f"resume={tmp_path}", "seconds=60"]) == 2
    assert "leave out seconds" in capsys.readouterr().err
    assert job.main(["train", f"out={tmp_path}", f"resume={tmp_path}"]) == 2
    assert "not a checkpoint" in capsys.readouterr().err


@pytest.mark.slow
def test_a_resumed_run_goes_on_at_the_next_step_with_its_schedule(tmp_path, monkeypatch):
    out = tmp_path / "model"
    lines: list[str] = []

    def disk_full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(out))

    monkeypatch.setattr(micro_vlm_recipe, "save", disk_full)
    options = dict(seconds=1.0, threads=1, lr=1e-3, checkpoint_minutes=0.001, warmup_seconds=0.0, eval_every=1e9,
                   per_step={"image": 2, "caption": 2, "holistic": 2}, write_per_step={"dsg": 1}, write_eval_every=1e9,
                   hidden=64, layers=2)
    with pytest.raises(OSError):
        micro_vlm_recipe.train(out, TEMPLATES, log=lines.append, **options)
    checkpoint = out / micro_vlm_recipe.CHECKPOINT
    saved = json.loads((checkpoint / "training.json").read_text())
    assert (checkpoint / micro_vlm_recipe.TRAINER_STATE).is_file() and saved["step"] >= 1
    monkeypatch.undo()
    again: list[str] = []
    resumed = micro_vlm_recipe.resume_options(checkpoint)
    assert resumed["write_per_step"] == {"dsg": 1} and resumed["lr"] == 1e-3
    text = json.loads((checkpoint / "config.json").read_text())["text_config"]
    assert (text["hidden_size"], text["num_hidden_layers"]) == (64, 2) and saved["options"]["hidden"] == 64
    assert "hidden" not in resumed and "layers" not in resumed  # the checkpoint is the model: its size comes with it
    more = {"seconds": saved["seconds_trained"] + 1.0, "eval_every": 1e9}  # the first run used its whole second
    micro_vlm_recipe.train(out, TEMPLATES, init=checkpoint, resume=True, log=again.append, **{**resumed, **more})
    assert f"resumed at step {saved['step']} after {saved['seconds_trained']} s" in again
    first = json.loads(next(line for line in again if line.startswith("{")))
    assert first["step"] == saved["step"] + 1 and first["t"] >= int(saved["seconds_trained"])
    with pytest.raises(ValueError, match="not a checkpoint"):
        micro_vlm_recipe.resume_options(tmp_path)
