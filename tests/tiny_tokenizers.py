"""Tiny tokenizers of the backbone families whose templates write BOS themselves (tests only).

`build_gemma_style_tokenizer` saves a byte-level BPE tokenizer that, like Gemma's, adds
<bos> when asked for special tokens, and a Gemma-4-style chat template that also writes a
literal <bos>: exactly the situation where a prompt can end up with zero or two BOS tokens.
Saved without a model config, `AutoProcessor` loads it as a plain tokenizer (caption-only
prompts need nothing else).
"""
from __future__ import annotations

from pathlib import Path

GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>", "<|channel>", "<channel|>"]
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}"
    "{% endif %}<turn|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|turn>model\n{% endif %}"
)


def build_gemma_style_tokenizer(path: str | Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from operators.tiny_models import _training_corpus

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=GEMMA_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator(_training_corpus(), trainer)
    bos = bpe.token_to_id("<bos>")
    bpe.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", bos)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
        additional_special_tokens=GEMMA_SPECIALS[4:],
    )
    tokenizer.chat_template = GEMMA_TEMPLATE
    path = Path(path)
    tokenizer.save_pretrained(path)
    return path
