"""A tiny random Llama model and a byte-level tokenizer, built in-process (no downloads).

Used by tests and CI. The tokenizer is a byte-level BPE without merges (every UTF-8
byte is a token, so any text round-trips), plus ChatML-style special tokens and a Jinja
chat template. ``pad == eos`` by default on purpose: it is the trap that made the
reference implementation mask EOS out of training.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

__all__ = ["TINY_CHAT_TEMPLATE", "build_tiny_model", "build_tiny_tokenizer"]

TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]


def build_tiny_tokenizer(*, pad_is_eos: bool = True) -> PreTrainedTokenizerFast:
    """Byte-level tokenizer: ids 0..255 are bytes, then the special tokens (vocab 260).

    ``eos`` is ``<|im_end|>`` (what a chat model emits to end a turn); ``pad`` is the same
    token when ``pad_is_eos`` (default) else ``<|pad|>``.
    """
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_chars = sorted(alphabet, key=lambda c: _byte_of(c))
    vocab = {c: i for i, c in enumerate(byte_chars)}
    for tok in _SPECIALS:
        vocab[tok] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(_SPECIALS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|im_end|>" if pad_is_eos else "<|pad|>",
        unk_token=None,
    )
    fast.chat_template = TINY_CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def _byte_of(char: str) -> int:
    """Inverse of GPT-2's bytes->unicode map (printable bytes map to themselves)."""
    table = _bytes_to_unicode()
    return {v: k for k, v in table.items()}[char]


def _bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs], strict=True))


def build_tiny_model(
    vocab_size: int = 264,
    hidden: int = 64,
    layers: int = 2,
    *,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    max_positions: int = 4096,
    init_std: float = 0.1,
    seed: int = 0,
    pad_is_eos: bool = True,
) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """A tiny random Llama (fp32, eval mode) and its tokenizer; deterministic given ``seed``.

    The tokenizer spends one token per byte, so a realistic multi-agent prompt (a system
    prompt, the problem, the predecessors' actions) is 1,000-2,000 tokens: ``max_positions``
    (4096 by default; RoPE positions, no parameters) leaves room for it, and the trainers'
    ``max_context`` (2048 by default) is the limit that applies.

    ``init_std`` is larger than the usual 0.02 so that next-token distributions are not
    nearly uniform (greedy decoding then has no near-ties, which keeps equality tests
    between batched and unbatched decoding meaningful).
    """
    tokenizer = build_tiny_tokenizer(pad_is_eos=pad_is_eos)
    if vocab_size < len(tokenizer):
        raise ValueError(f"vocab_size must be >= {len(tokenizer)} (the tokenizer's size), got {vocab_size}")
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        initializer_range=init_std,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.to(torch.float32)
    model.eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model, tokenizer
