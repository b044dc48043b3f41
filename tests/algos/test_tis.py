"""Truncated importance sampling: an engine that keeps its own log-probs (vLLM's
``logprob_source="engine"``) gets its policy gradient weighted by
``min(exp(trainer old log-prob - engine log-prob), tis_cap)``, checked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from marft_algos.buffer import AgentBuffer
from marft_algos.config import ConfigError
from marft_algos.losses import truncated_is_weights
from marft_algos.records import BatchEstimates, Transition

pytest.importorskip("marft_algos.models")
from helpers.marft_echo import ONE_TOKEN, SHAPED, echo_kwargs, letter_policy  # noqa: E402

from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from marft_algos.algos.marft_action import MARFTActionConfig, MARFTActionTrainer  # noqa: E402
from marft_algos.algos.marft_token import MARFTTokenConfig, MARFTTokenTrainer  # noqa: E402
from marft_algos.models import TokenStats  # noqa: E402

PLAIN = dict(env_id="echo-duo-v0", env_kwargs=SHAPED, model="tiny-random", num_envs=4, steps=1, progress=False,
             tensorboard=False, sampling_overrides=ONE_TOKEN)


def keeping_engine_logprobs(trainer):
    """The trainer's real (hf) engine, declared to return its own log-probs as vLLM's
    ``logprob_source="engine"`` does."""
    trainer.policy.engine.logprobs_exact = False
    return trainer


def test_weights_by_hand():
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, 0.0, 0.0]])
    engine = torch.tensor([[-1.5, -2.0, -2.0], [-0.1, 5.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    w, st = truncated_is_weights(old, engine, mask, cap=2.0)
    # log-ratios 0.5, 0, 1.5 (cut at 2), -0.2; padding keeps weight 1
    np.testing.assert_allclose(w.numpy(), [[math.exp(0.5), 1.0, 2.0], [math.exp(-0.2), 1.0, 1.0]], rtol=1e-6)
    assert st["engine_logp_gap"].item() == pytest.approx((0.5 + 0 + 1.5 + 0.2) / 4, rel=1e-6)
    assert st["tis_clipped_frac"].item() == pytest.approx(1 / 4)
    assert not w.requires_grad
    with pytest.raises(ValueError, match="cap"):
        truncated_is_weights(old, engine, mask, cap=0.0)
    with pytest.raises(ConfigError, match="tis_cap"):
        GRPOConfig(tis_cap=-1.0, **PLAIN)


def one_action(trainer_old: list[float], engine: list[float], advantage: float = 1.0):
    """A minibatch of one speaker action: the engine's log-probs on the transition, the
    trainer's old log-probs in the batch's estimates."""
    t = Transition(0, 0, 0, 0, "speaker", [1], list(range(5, 5 + len(engine))), list(engine), advantage=advantage)
    est = BatchEstimates()
    est[t].old_logp = list(trainer_old)
    return AgentBuffer.from_transitions("speaker", [t], est).minibatch([0])


@pytest.mark.parametrize("algo", ["grpo", "marft-token"])
def test_per_token_weights_in_the_policy_loss_by_hand(algo):
    if algo == "grpo":
        t = GRPOTrainer(GRPOConfig(group_size=2, **PLAIN), policy=letter_policy())
    else:
        t = MARFTTokenTrainer(MARFTTokenConfig(**echo_kwargs()), policy=letter_policy())
    keeping_engine_logprobs(t)
    old, engine = [-1.0, -2.0, -0.5], [-1.5, -2.0, -2.0]
    mb = one_action(old, engine)
    if algo == "marft-token":  # token-level advantages: 1 on every token
        est = BatchEstimates()
        est[mb[0]].old_logp, est[mb[0]].token_advantages = old, [1.0, 1.0, 1.0]
        mb = AgentBuffer.from_transitions("speaker", list(mb), est).minibatch([0])
    # the policy moved: ratio 1.1 on every token (inside the clip range, A = 1 > 0)
    logp = (torch.tensor([old]) + math.log(1.1)).requires_grad_(True)
    stats = TokenStats(logp, torch.zeros_like(logp), torch.ones_like(logp))
    loss, m = t.algorithm.policy_loss("speaker", mb, stats)
    w = [math.exp(0.5), 1.0, 2.0]  # min(exp(old - engine), 2): e^0.5, e^0, e^1.5 cut at 2
    assert float(loss.detach()) == pytest.approx(-1.1 * sum(w) / 3, rel=1e-5)
    assert m["agent/speaker/engine_logp_gap"] == pytest.approx(2.0 / 3, rel=1e-6)
    assert m["agent/speaker/tis_clipped_frac"] == pytest.approx(1 / 3)
    loss.backward()  # d/dlogp_j of -w_j A rho_j / 3 = -w_j rho_j / 3: the weight has no gradient
    np.testing.assert_allclose(logp.grad[0].numpy(), [-x * 1.1 / 3 for x in w], rtol=1e-5)


def test_one_weight_per_action_in_action_level_marft_by_hand():
    t = keeping_engine_logprobs(MARFTActionTrainer(MARFTActionConfig(**echo_kwargs()), policy=letter_policy()))
    assert t.config.logprob_norm == "token"
    mb = one_action([-1.0, -2.0], [-1.5, -2.5], advantage=2.0)
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)  # unmoved: ratio 1
    stats = TokenStats(logp, torch.zeros_like(logp), torch.ones_like(logp))
    loss, m = t.algorithm.policy_loss("speaker", mb, stats)
    # whole-action log-probs (token mean): trainer -1.5, engine -2.0 -> w = e^0.5; L = -A w
    assert float(loss.detach()) == pytest.approx(-2.0 * math.exp(0.5), rel=1e-6)
    assert m["agent/speaker/engine_logp_gap"] == pytest.approx(0.5)
    assert m["agent/speaker/tis_clipped_frac"] == 0.0


def test_a_step_with_engine_logprobs_recomputes_the_old_ones_and_logs_the_gap():
    """The real loop: old log-probs come from the trainer's forward (not the engine's), the
    gap is logged per agent; the hf engine's fp32 numbers are the trainer's, so it is ~0."""
    t = GRPOTrainer(GRPOConfig(group_size=2, **PLAIN), policy=letter_policy())
    assert t.behaviour.sampler_exact() and not t.behaviour.engine_kept()
    m0 = t.train_step()
    assert not any(k.endswith("engine_logp_gap") for k in m0)  # the default: no correction
    keeping_engine_logprobs(t)
    assert not t.behaviour.sampler_exact()
    m = t.train_step()
    for a in t.agents:
        assert 0.0 <= m[f"agent/{a}/engine_logp_gap"] < 1e-4
        assert m[f"agent/{a}/tis_clipped_frac"] == 0.0
    trs = [x for x in t.last_batch.transitions if x.trainable]
    assert all(t.last_batch.estimates[x].old_logp is not None for x in trs)
