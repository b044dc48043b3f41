"""Issue 28 item 24: the default settings bound a training forward's tokens (and so its memory)."""

from __future__ import annotations

from marft_algos.algos.grpo import GRPOConfig
from marft_algos.algos.marft_token import MARFTTokenConfig
from marft_algos.config import DEFAULT_MICRO_BATCH_TOKENS


def test_default_caps_a_training_forward():
    assert 0 < DEFAULT_MICRO_BATCH_TOKENS <= 2048  # ~1.6 MB per padded token on SmolLM2-135M, fp32
    assert GRPOConfig().micro_batch_tokens == DEFAULT_MICRO_BATCH_TOKENS
    assert MARFTTokenConfig().micro_batch_tokens == DEFAULT_MICRO_BATCH_TOKENS


def test_explicit_settings_and_fsdp_keep_their_meaning():
    assert GRPOConfig(micro_batch_tokens=0).micro_batch_tokens == 0  # no cap, asked for
    assert GRPOConfig(micro_batch_tokens=4096).micro_batch_tokens == 4096
    # FSDP runs no micro-batches: the default means no cap there instead of a refusal
    assert GRPOConfig(distributed={"strategy": "fsdp"}, mode="full").micro_batch_tokens == 0
