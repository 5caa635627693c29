"""A small local tokenizer with the Qwen3 chat template's special tokens, built in-process.

For offline tests and demos of the renderer client: a byte-level BPE (the
`tokenizers` library, installed with the `renderers` extra) trained in a few
milliseconds on a tiny corpus, saved as a tokenizer directory
(`tokenizer.json` + `tokenizer_config.json`) that `renderers.load_tokenizer`
(transformers) loads from disk, never from the Hugging Face hub. Any text
encodes (byte fallback); the special tokens are single ids.
"""

from __future__ import annotations

import json
from pathlib import Path

CHATML_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
                         "</tool_call>", "<tool_response>", "</tool_response>"]
_CORPUS = ["system user assistant tool What is the answer? 6 * 7 = 42.",
           '{"name": "mul", "arguments": {"a": 6, "b": 7}} function description parameters properties type']


def build_chatml_tokenizer(directory: str | Path, vocab_size: int = 400) -> Path:
    """Write a Qwen3-style tokenizer to `directory` (created) and return it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=CHATML_SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS, trainer)
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "model_max_length": 32768}))
    return path
