"""fp16 training: fp32 master weights, fp16 autocast forwards, dynamic loss scaling.

The tiny model runs fp16 autocast on the CPU (the same code path a GPU takes), so the
scaler's three jobs are checked without a GPU: scaled steps move the weights, an overflow
skips the step and halves the scale without touching the weights or the divergence
counters, and the scale survives a checkpoint.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("marft_algos.models")
from helpers.marft_echo import echo_kwargs  # noqa: E402  (shaped reward: every step has a signal)
from helpers.tiny_echo import ENV_KWARGS, SAMPLING, letter_policy  # noqa: E402

from marft_algos.algos.grpo import (
    GRPOConfig,  # noqa: E402
    GRPOTrainer,  # noqa: E402
)
from marft_algos.algos.marft_action import MARFTActionConfig, MARFTActionTrainer  # noqa: E402


def grpo(dtype: str | None, **kw) -> GRPOTrainer:
    cfg = GRPOConfig(env_id="echo-duo-v0", env_kwargs=ENV_KWARGS, model="tiny-random", num_envs=4, group_size=2,
                     progress=False, tensorboard=False, sampling_overrides=SAMPLING, dtype=dtype, **kw)
    return GRPOTrainer(cfg, policy=letter_policy(dtype=dtype))


def marft(**kw) -> MARFTActionTrainer:
    cfg = MARFTActionConfig(**echo_kwargs(dtype="fp16", lr=0.05, **kw))
    return MARFTActionTrainer(cfg, policy=letter_policy(dtype="fp16"))


def adapter_weights(t) -> list[torch.Tensor]:
    return [p.detach().clone() for a in t.agents for p in t.policy.trainable_parameters(a)]


def moved(before: list[torch.Tensor], after: list[torch.Tensor]) -> bool:
    return any(not torch.equal(b, a) for b, a in zip(before, after, strict=True))


def test_scaler_only_for_fp16():
    assert grpo(None).optim.scaler is None and grpo("bf16").optim.scaler is None
    t = grpo("fp16", init_loss_scale=1024.0)
    assert isinstance(t.optim.scaler, torch.amp.GradScaler) and t.optim.scaler.get_scale() == 1024.0
    # the sampler decodes under autocast too, so its log-probs are not the training forward's
    assert not t.behaviour.sampler_exact()


def test_policy_forward_runs_in_fp16_with_fp32_master_weights():
    pol = letter_policy(dtype="fp16")
    assert all(p.dtype == torch.float32 for a in pol.roles for p in pol.trainable_parameters(a))
    with pol._autocast():
        x = torch.randn(2, 8) @ torch.randn(8, 4)
    assert x.dtype == torch.float16


def test_fp16_steps_move_weights_and_log_the_scale():
    t = marft(init_loss_scale=2.0**10)
    before = adapter_weights(t)
    m = t.train_step()
    assert moved(before, adapter_weights(t))
    assert all(torch.isfinite(p).all() for p in adapter_weights(t))
    assert m["train/loss_scale"] == 2.0**10  # no overflow: the scale grows only after 2000 clean steps
    assert m.get("train/amp_overflow_skips", 0.0) == 0.0 and m.get("train/nonfinite_skips", 0.0) == 0.0


def test_overflow_skips_the_step_halves_the_scale_and_is_not_a_divergence():
    t = marft(init_loss_scale=1e38, recovery=True)
    before = adapter_weights(t)
    m = t.train_step()
    # 1e38 x any gradient overflows fp16 in the autocast backward: every step is skipped
    skips = m["train/amp_overflow_skips"]
    assert skips >= 2  # (both agents' policy steps; the critic's head is fp32 and may step)
    assert not moved(before, adapter_weights(t))
    assert m["train/loss_scale"] <= 1e38 / 2**skips * (1 + 1e-6)
    assert m.get("train/nonfinite_skips", 0.0) == 0.0
    assert m.get("recovery/rollbacks", 0.0) == 0.0  # the scaler's normal working, not a collapse
    # the scale comes down, and training resumes once it is representable
    t.optim.scaler.update(new_scale=2.0**10)
    before = adapter_weights(t)
    t.train_step()
    assert moved(before, adapter_weights(t))


def test_loss_scale_survives_a_checkpoint(tmp_path):
    t = marft(init_loss_scale=2.0**12, out_dir=str(tmp_path / "run"))
    t.train_step()
    t.optim.scaler.update(new_scale=123.0)
    path = t.save_checkpoint()
    fresh = marft(init_loss_scale=2.0**12, out_dir=str(tmp_path / "run2"))
    fresh.load_checkpoint(path)
    assert fresh.optim.scaler.get_scale() == 123.0
