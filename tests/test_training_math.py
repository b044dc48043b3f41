"""Training math of the loop (issue 27 items 5-8): schedules per group, each loss term over
its own units, turn-level returns of tool segments, and the KL diagnostics that move."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("marft_algos.models")
from helpers.marft_echo import echo_kwargs, letter_policy  # noqa: E402

from marft_algos.advantages import turn_level_advantages  # noqa: E402
from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from marft_algos.algos.ippo import IPPOConfig, IPPOTrainer  # noqa: E402
from marft_algos.algos.marft_action import MARFTActionConfig, MARFTActionTrainer  # noqa: E402
from marft_algos.optim import CRITIC_KEY, lr_factor  # noqa: E402

SCHEDULE = dict(lr_scheduler="linear", warmup_steps=1, steps=4)


def grpo(**kw):
    kw = {k: v for k, v in echo_kwargs(**kw).items() if k not in ("critic_lr", "recovery")}
    return GRPOTrainer(GRPOConfig(group_size=2, **kw), policy=letter_policy(mode=kw.get("mode", "lora")))


def marft(**kw):
    return MARFTActionTrainer(MARFTActionConfig(**echo_kwargs(**kw)), policy=letter_policy())


@pytest.mark.parametrize("make, extra, groups", [
    (grpo, {}, ["speaker", "listener"]),
    (grpo, {"mode": "shared", "num_minibatches": 2}, ["speaker"]),  # one optimizer stepped twice per minibatch round
    (marft, {"agent_by_agent": True}, ["speaker", "listener", CRITIC_KEY]),  # the critic steps once per agent minibatch
], ids=["lora", "shared", "marft-agent-by-agent"])
def test_every_group_follows_the_schedule_of_the_training_step(make, extra, groups):
    t = make(**SCHEDULE, **extra)
    base = {k: t.optimizers[k].defaults["lr"] for k in groups}
    for k in range(4):
        t.train_step()
        for key in groups:  # the step-k update ran at factor(k), whatever the group's own step count
            want = base[key] * lr_factor(k, warmup=1, total=4, kind="linear")
            assert t.optimizers[key].param_groups[0]["lr"] == pytest.approx(want), (key, k)
    assert t.optimizers[groups[-1]].param_groups[0]["lr"] > 0  # decay reaches 0 only at `steps`


def test_ippo_value_loss_is_a_mean_over_actions_under_micro_batches():
    # actions of several tokens: a value loss weighted by tokens across pieces would give the
    # value heads another gradient than the whole minibatch's
    kw = echo_kwargs(recovery=None, sampling_overrides={"speaker": {"max_new_tokens": 3}, "listener": {"max_new_tokens": 5}})
    kw = {k: v for k, v in kw.items() if k != "recovery"}
    whole = IPPOTrainer(IPPOConfig(**kw), policy=letter_policy())
    whole.train_step()
    pieces = IPPOTrainer(IPPOConfig(**dict(kw, micro_batch_tokens=1)), policy=letter_policy())
    pieces.train_step()
    lengths = {len(t.response_ids) for t in pieces.last_batch.transitions}
    assert len(lengths) > 1  # the test needs actions of different lengths
    for a in whole.agents:
        for p, q in zip(whole.algorithm.value_parameters(a), pieces.algorithm.value_parameters(a), strict=True):
            torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)


def test_tool_segments_of_one_action_are_one_turn():
    # one action in three segments, the reward on the last: every segment's return is the
    # action's (before: 0.25 / 0.5 / 1.0 at gamma 0.5)
    _, G = turn_level_advantages([0, 0, 1], ["a", "a", "a"], gamma=0.5, normalize="none", action_ids=[(0, 0)] * 3)
    assert G.tolist() == [1.0, 1.0, 1.0]
    _, G = turn_level_advantages([0, 0, 1], ["a", "a", "a"], gamma=0.5, normalize="none", action_ids=[(0, 0), (1, 0), (1, 0)])
    assert G.tolist() == [0.5, 1.0, 1.0]  # the next action is the next turn: discounted


def test_kl_diagnostics_move_at_the_defaults():
    # one epoch, one minibatch: the in-loss KL is 0 by construction; the post-update KL and,
    # at the next step, the KL to the reference move once the policy has moved
    t = grpo(lr=0.05)
    history = [t.train_step() for _ in range(4)]
    assert history[0]["agent/speaker/rollout_ref_kl"] == pytest.approx(0.0, abs=1e-7)  # the first batch: policy = reference
    moved = [(k, a) for k, m in enumerate(history[:-1]) for a in t.agents if m[f"agent/{a}/update_kl"] > 1e-6]
    assert moved, "no update moved a policy in 3 steps"
    for k, a in moved:
        assert history[k][f"agent/{a}/kl"] < 1e-9
        assert history[k + 1][f"agent/{a}/rollout_ref_kl"] > 1e-6


def test_collapse_detector_watches_the_post_update_kl():
    from marft_algos.config import RecoveryConfig
    from marft_algos.recovery import CollapseDetector

    d = CollapseDetector(RecoveryConfig(kl_max=0.5, warmup=0), ["a"])
    assert d.check({"agent/a/kl": 0.0, "agent/a/update_kl": 0.7}) == ["kl_spike/a"]
    assert d.check({"agent/a/kl": 0.9, "agent/a/update_kl": 0.1}) == []
