"""Tiny random-weight models, built offline, so every code path runs without downloads.

`builtin:tiny-vlm` (a Qwen3.5-architecture VLM), `builtin:tiny-qwen3vl` and
`builtin:tiny-qwen2vl` (the families vLLM's CPU build runs: text head_dim 32, float32) and
`builtin:tiny-grounding-dino` are saved with `save_pretrained` and loaded back through the same
`from_pretrained` calls real checkpoints go through (and, for the two vLLM ones, through
`vllm.LLM`). Their answers are meaningless (random weights): they exist to test plumbing —
shapes, batching, padding, caching, the real engines' agreement — end to end.

A builder is deterministic: the same seed gives bit-identical weights and the same tokenizer.
"""
from __future__ import annotations

import functools
import itertools
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

# Bump when a recipe changes, so cached copies built by the old recipe are not reused.
RECIPE_VERSION = 3  # bump on any recipe change: it names the cache dir and enters answer keys

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# ChatML, with an image item rendered as the vision placeholder the processor expands.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Words the answer readers look for; the corpus repeats them so BPE learns each as one token.
ANSWER_WORDS = ["Yes", "No", "yes", "no", " Yes", " No", " yes", " no", "YES", "NO"]


def _training_corpus() -> list[str]:
    """A fixed English corpus in the style of the prompts this system sends (~450 lines)."""
    subjects = ["a red cat", "two dogs", "a blue car", "an old man", "a small bird", "three apples",
                "a wooden table", "a green tree", "a young woman", "a yellow bus"]
    places = ["on the grass", "in the kitchen", "near the river", "under a bridge", "at the beach",
              "inside a box"]
    questions = ["Is there {s} {p}?", "Does the image show {s} {p}?",
                 "Does this figure show \"{s} {p}\"? Answer yes or no.",
                 "Is the claim \"{s} is {p}\" true of the image?"]
    lines = []
    for (s, p), q in itertools.product(itertools.product(subjects, places), questions):
        lines.append(q.format(s=s, p=p))
    for s, answer in itertools.product(subjects, ANSWER_WORDS):
        lines.append(f"Question: is it {s}? Answer:{answer}.")
        lines.append(f"{answer.strip()}, it is {s}.")
    lines += [
        '{"questions": ["Is there a cat?", "Is the cat red?"], "score": 0.75}',
        '{"claims": [{"type": "object", "text": "a dog"}], "box": [0.1, 0.2, 0.5, 0.9]}',
        "List the questions, one per line. Reply in JSON.",
        "0 1 2 3 4 5 6 7 8 9 10 100 0.05 0.5 0.95",
    ]
    return lines


def _train_tokenizer(corpus: list[str] | None = None, vocab_size: int = 640):
    """Byte-level BPE with Qwen3.5's normalizer and pre-tokenizer, trained on the corpus
    (default: `_training_corpus()`; the micro VLM gives its own)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import AddedToken, Qwen3_5Tokenizer
    from transformers.models.qwen3_5.tokenization_qwen3_5 import PRETOKENIZE_REGEX

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_training_corpus() if corpus is None else corpus, trainer)
    model = json.loads(bpe.to_str())["model"]
    tokenizer = Qwen3_5Tokenizer(
        vocab=model["vocab"],
        merges=[tuple(m) for m in model["merges"]],
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        padding_side="left",
    )
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]}
    )
    for word in ANSWER_WORDS:
        ids = tokenizer.encode(word, add_special_tokens=False)
        if len(ids) != 1:
            raise RuntimeError(f"tiny tokenizer splits answer word {word!r} into {ids}")
    return tokenizer


def build_tiny_vlm(path: str | os.PathLike, seed: int = 0) -> Path:
    """Save a ~200k-parameter Qwen3.5 VLM with tokenizer, chat template and processor."""
    import torch
    from transformers import (
        Qwen2VLImageProcessor,
        Qwen3_5Config,
        Qwen3_5ForConditionalGeneration,
        Qwen3VLProcessor,
        Qwen3VLVideoProcessor,
    )

    path = Path(path)
    tokenizer = _train_tokenizer()
    token_id = tokenizer.convert_tokens_to_ids
    patch_size, merge_size = 16, 2
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(
            patch_size=patch_size,
            merge_size=merge_size,
            # Pixel counts: between 1 and 16 merged image tokens per image.
            size={"shortest_edge": 32 * 32, "longest_edge": 128 * 128},
        ),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(),
        chat_template=CHAT_TEMPLATE,
    )
    hidden, head_dim = 64, 16
    config = Qwen3_5Config(
        text_config={
            "vocab_size": (len(tokenizer) + 63) // 64 * 64,
            "hidden_size": hidden,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "layer_types": ["linear_attention", "full_attention"],
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": head_dim,
            "linear_conv_kernel_dim": 2,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "max_position_embeddings": 4096,
            # mrope_section must sum to head_dim * partial_rotary_factor / 2.
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1],
                                "mrope_interleaved": True},
            "eos_token_id": token_id("<|im_end|>"),
            "pad_token_id": token_id("<|endoftext|>"),
        },
        vision_config={
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "patch_size": patch_size,
            "spatial_merge_size": merge_size,
            "temporal_patch_size": 2,
            "out_hidden_size": hidden,
            "num_position_embeddings": 64,
        },
        image_token_id=token_id("<|image_pad|>"),
        video_token_id=token_id("<|video_pad|>"),
        vision_start_token_id=token_id("<|vision_start|>"),
        vision_end_token_id=token_id("<|vision_end|>"),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3_5ForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = token_id("<|im_end|>")
    model.generation_config.pad_token_id = token_id("<|endoftext|>")
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


# vLLM's CPU attention supports head sizes 32, 64, 80, ... (not 16): the vLLM builtins use 32.
VLLM_HEAD_DIM = 32
# Their chat template writes a BOS first, as Gemma's and Llama's do, so that the real engines show
# the template's BOS kept once (vLLM must neither drop it nor add a second one).
BOS_CHAT_TEMPLATE = "{{ bos_token }}" + CHAT_TEMPLATE


def _qwen_vl_parts(image_processor_cls, processor_cls, patch_size: int, **video):
    """Tokenizer (BOS: <|endoftext|>), processor and the token ids a Qwen-VL config names."""
    tokenizer = _train_tokenizer()
    tokenizer.bos_token = "<|endoftext|>"
    token_id = tokenizer.convert_tokens_to_ids
    processor = processor_cls(
        image_processor=image_processor_cls(
            patch_size=patch_size, merge_size=2,
            # The processor never shrinks what the pipeline sends (max_image_pixels: 65536 in
            # conf/backbones/tiny-*.yaml): vLLM 0.32 and transformers shrink a larger image to
            # different token counts, as no real checkpoint's limits ever make them do.
            size={"shortest_edge": (2 * patch_size) ** 2, "longest_edge": 65536},
        ),
        tokenizer=tokenizer,
        chat_template=BOS_CHAT_TEMPLATE,
        **video,
    )
    ids = {
        "image_token_id": token_id("<|image_pad|>"),
        "video_token_id": token_id("<|video_pad|>"),
        "vision_start_token_id": token_id("<|vision_start|>"),
        "vision_end_token_id": token_id("<|vision_end|>"),
    }
    text = {
        "vocab_size": (len(tokenizer) + 63) // 64 * 64,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 4096,
        "bos_token_id": token_id("<|endoftext|>"),
        "eos_token_id": token_id("<|im_end|>"),
        "pad_token_id": token_id("<|endoftext|>"),
    }
    return processor, ids, text


def _save_seeded(model_cls, config, processor, path: Path, seed: int) -> Path:
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config).eval()
    tokenizer = processor.tokenizer
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.generation_config.pad_token_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


def build_tiny_qwen3vl(path: str | os.PathLike, seed: int = 0) -> Path:
    """Save a tiny Qwen3-VL (deepstack vision, interleaved M-RoPE) that vLLM's CPU build runs."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor, Qwen3VLVideoProcessor

    processor, ids, text = _qwen_vl_parts(Qwen2VLImageProcessor, Qwen3VLProcessor, 16, video_processor=Qwen3VLVideoProcessor())
    text |= {
        "head_dim": VLLM_HEAD_DIM,
        # mrope_section sums to head_dim / 2
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [6, 5, 5], "mrope_interleaved": True},
    }
    vision = {
        "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 1, "patch_size": 16, "spatial_merge_size": 2,
        "temporal_patch_size": 2, "out_hidden_size": text["hidden_size"], "num_position_embeddings": 64, "deepstack_visual_indexes": [0],
    }
    config = Qwen3VLConfig(text_config=text, vision_config=vision, **ids)
    return _save_seeded(Qwen3VLForConditionalGeneration, config, processor, Path(path), seed)


def build_tiny_qwen2vl(path: str | os.PathLike, seed: int = 0) -> Path:
    """Save a tiny Qwen2-VL (14-pixel patches, M-RoPE) that vLLM's CPU build runs."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    processor, ids, text = _qwen_vl_parts(Qwen2VLImageProcessor, Qwen2VLProcessor, 14, video_processor=Qwen2VLVideoProcessor())
    # head_dim = hidden / heads = 32; mrope_section sums to head_dim / 2
    text |= {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]}}
    vision = {"depth": 1, "embed_dim": 32, "hidden_size": text["hidden_size"], "mlp_ratio": 2, "num_heads": 1,
              "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}
    config = Qwen2VLConfig(text_config=text, vision_config=vision, **ids)
    return _save_seeded(Qwen2VLForConditionalGeneration, config, processor, Path(path), seed)


def _wordpiece_vocab() -> list[str]:
    """BERT-style vocab with [CLS]=101, [SEP]=102, '.'=1012, '?'=1029 where GroundingDINO expects them."""
    fixed = {0: "[PAD]", 100: "[UNK]", 101: "[CLS]", 102: "[SEP]", 103: "[MASK]", 1012: ".", 1029: "?"}
    words = sorted({w.lower().strip('.?",:;[]{}()') for line in _training_corpus() for w in line.split()}
                   - {""} - set(fixed.values()))
    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    fillers = iter(dict.fromkeys(chars + ["##" + c for c in chars] + words))
    return [fixed.get(i) or next(fillers, f"[unused{i}]") for i in range(1100)]


def build_tiny_grounding_dino(path: str | os.PathLike, seed: int = 0) -> Path:
    """Save a tiny GroundingDINO (Swin + BERT) with a BertTokenizer and its processor."""
    import torch
    from transformers import (
        BertConfig,
        BertTokenizer,
        GroundingDinoConfig,
        GroundingDinoForObjectDetection,
        GroundingDinoImageProcessor,
        GroundingDinoProcessor,
        SwinConfig,
    )

    path = Path(path)
    vocab = _wordpiece_vocab()
    tokenizer = BertTokenizer(vocab={token: i for i, token in enumerate(vocab)}, do_lower_case=True)
    # 96 px: at 64 px a square image leaves a 1x1 feature map that group norm rejects for a batch of one
    image_processor = GroundingDinoImageProcessor(size={"shortest_edge": 96, "longest_edge": 128})
    processor = GroundingDinoProcessor(image_processor=image_processor, tokenizer=tokenizer)
    config = GroundingDinoConfig(
        backbone_config=SwinConfig(
            image_size=64, patch_size=4, embed_dim=8, depths=[1, 1, 1, 1], num_heads=[1, 1, 1, 1],
            window_size=4, out_indices=[2, 3, 4],
        ),
        text_config=BertConfig(
            vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=64, max_position_embeddings=256,
        ),
        d_model=32,
        encoder_layers=1,
        decoder_layers=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        num_queries=16,
        num_feature_levels=4,
        encoder_n_points=2,
        decoder_n_points=2,
        max_text_len=64,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GroundingDinoForObjectDetection(config).eval()
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


BUILDERS: dict[str, Callable[..., Path]] = {
    "builtin:tiny-vlm": build_tiny_vlm,
    "builtin:tiny-qwen3vl": build_tiny_qwen3vl,
    "builtin:tiny-qwen2vl": build_tiny_qwen2vl,
    "builtin:tiny-grounding-dino": build_tiny_grounding_dino,
}


# Trained models shipped inside the package (not built): `builtin:<name>` -> folder. Their
# revision in answer keys is a hash of their files (`builtin_revision`), not RECIPE_VERSION.
SHIPPED = {
    "builtin:micro-vlm": Path(__file__).parent / "weights" / "micro_vlm",
    "builtin:micro-grounding-dino": Path(__file__).parent / "weights" / "micro_grounding_dino",
    "builtin:micro-writer": Path(__file__).parent / "weights" / "micro_writer",
}
TRAINED_BY = {"micro_vlm": "python jobs/micro_vlm.py train", "micro_grounding_dino": "python jobs/micro_grounding.py train",
              "micro_writer": "python jobs/micro_vlm.py train (the writer's options: python jobs/micro_vlm.py --help)"}


def builtin_revision(model_id: str) -> str:
    """What stands for the revision of a `builtin:` model in answer keys: the shipped files'
    hash for a trained model (new weights never reuse old answers), else the recipe version."""
    if model_id in SHIPPED:
        return _shipped_hash(str(SHIPPED[model_id]))
    return f"recipe-{RECIPE_VERSION}"


@functools.cache
def _shipped_hash(folder: str) -> str:
    import hashlib

    digest = hashlib.blake2b(digest_size=16)
    found = Path(folder).iterdir() if Path(folder).is_dir() else ()
    files = sorted(p for p in found if p.is_file() and p.suffix in (".json", ".safetensors", ".jinja", ".txt"))
    if not any(p.suffix == ".safetensors" for p in files):
        raise FileNotFoundError(f"no weights in {folder}: the package is incomplete (reinstall it, or train: {TRAINED_BY[Path(folder).name]})")
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return "weights-" + digest.hexdigest()


def default_cache_dir() -> Path:
    """`$DEPICT_CACHE/builtin`, else `~/.cache/depict/builtin`."""
    root = os.environ.get("DEPICT_CACHE")
    return Path(root) / "builtin" if root else Path.home() / ".cache" / "depict" / "builtin"


def resolve_model_id(model_id: str, cache_dir: str | os.PathLike | None = None) -> str:
    """Local directory of a `builtin:` model (built on first use); any other id unchanged.

    Safe when several processes resolve the same id at once: each builds into its own
    temporary directory and renames it into place; a process that loses the race deletes
    its copy and uses the winner's (same seed, so the same bytes).
    """
    if not model_id.startswith("builtin:"):
        return model_id
    if model_id in SHIPPED:
        _shipped_hash(str(SHIPPED[model_id]))  # refuses a folder without weights, naming it
        return str(SHIPPED[model_id])
    builder = BUILDERS.get(model_id)
    if builder is None:
        raise ValueError(f"unknown builtin model {model_id!r}; known: {sorted([*BUILDERS, *SHIPPED])}")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = cache / f"{model_id.removeprefix('builtin:')}-r{RECIPE_VERSION}"
    if final.is_dir():
        return str(final)
    cache.mkdir(parents=True, exist_ok=True)
    # os.mkdir, not mkdtemp: its 0700 would stay on the renamed folder, and a shared
    # $DEPICT_CACHE would hold a model other users can see but not read (nor rebuild)
    staging = cache / f".{final.name}-{uuid.uuid4().hex}"
    try:
        staging.mkdir(mode=0o777)  # the umask applies
        builder(staging)
        os.rename(staging, final)
    except OSError:
        if not final.is_dir():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(final)
