"""Issue 28 item 24: the default settings bound a training forward's tokens (and so its memory)."""

from __future__ import annotations

import torch

from marft_algos.algos.grpo import GRPOConfig
from marft_algos.algos.marft_token import MARFTTokenConfig
from marft_algos.config import (
    DEFAULT_MICRO_BATCH_TOKENS,
    DEFAULT_MICRO_BATCH_TOKENS_GPU,
    default_micro_batch_tokens,
)


def test_default_caps_a_training_forward():
    assert 0 < DEFAULT_MICRO_BATCH_TOKENS <= 2048  # ~1.6 MB per padded token on SmolLM2-135M, fp32
    assert GRPOConfig(device="cpu").micro_batch_tokens == DEFAULT_MICRO_BATCH_TOKENS
    assert MARFTTokenConfig(device="cpu").micro_batch_tokens == DEFAULT_MICRO_BATCH_TOKENS


def test_a_gpu_default_caps_only_what_would_not_fit():
    # on a GPU each piece is a launch-bound forward + backward: the cap is far above a default batch
    assert DEFAULT_MICRO_BATCH_TOKENS_GPU >= 16 * DEFAULT_MICRO_BATCH_TOKENS
    for device in ("cuda", "cuda:1", "mps"):
        assert default_micro_batch_tokens(device) == DEFAULT_MICRO_BATCH_TOKENS_GPU
        assert GRPOConfig(device=device).micro_batch_tokens == DEFAULT_MICRO_BATCH_TOKENS_GPU
    assert default_micro_batch_tokens("cpu") == default_micro_batch_tokens("cpu:0") == DEFAULT_MICRO_BATCH_TOKENS
    assert default_micro_batch_tokens("cuda", "fsdp") == 0
    # "auto" is resolved as the policy resolves it: CUDA when there is one
    want = DEFAULT_MICRO_BATCH_TOKENS_GPU if torch.cuda.is_available() else DEFAULT_MICRO_BATCH_TOKENS
    assert GRPOConfig().micro_batch_tokens == default_micro_batch_tokens("auto") == want


def test_explicit_settings_and_fsdp_keep_their_meaning():
    assert GRPOConfig(micro_batch_tokens=0).micro_batch_tokens == 0  # no cap, asked for
    assert GRPOConfig(micro_batch_tokens=4096).micro_batch_tokens == 4096
    # FSDP runs no micro-batches: the default means no cap there instead of a refusal
    assert GRPOConfig(distributed={"strategy": "fsdp"}, mode="full").micro_batch_tokens == 0
