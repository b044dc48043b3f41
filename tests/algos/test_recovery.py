"""Collapse recovery: detectors on their own, then injected faults on a real (tiny) run."""

from __future__ import annotations

import json
import math

import pytest
import torch

from marft_algos.config import RecoveryConfig
from marft_algos.recovery import CollapseDetector, CollapseError

AGENTS = ["speaker", "listener"]


def healthy(step: int, reward: float = 0.5, entropy: float = 1.0) -> dict[str, float]:
    return {"team/reward": reward, "train/nonfinite_skips": 0.0, **{f"agent/{a}/entropy": entropy for a in AGENTS}, **{f"agent/{a}/kl": 0.01 for a in AGENTS}}


# --------------------------------------------------------------------------------------
# detectors
# --------------------------------------------------------------------------------------


def test_detector_nonfinite_entropy_kl_and_reward():
    d = CollapseDetector(RecoveryConfig(warmup=2), AGENTS)
    for k in range(3):
        assert d.check(healthy(k)) == []
    assert d.check({**healthy(3), "train/nonfinite_skips": 1.0}) == ["nonfinite"]
    assert d.check({**healthy(4), "agent/speaker/entropy": 5.0}) == ["entropy_surge/speaker"]  # 5 > 3 x 1 and +4 nats
    assert d.check({**healthy(5), "agent/listener/update_kl": 3.0}) == ["kl_spike/listener"]  # the post-update KL (issue 27 item 4)
    assert d.check({**healthy(6), "agent/listener/entropy": float("nan")}) == ["nonfinite"]
    assert d.check(healthy(7), params=[torch.tensor([1.0, math.inf])]) == ["nonfinite"]
    # reward: EMA(0.5) best 0.5; a drop to 0.0 gives EMA 0.25 -> not < 0.25; a second one does
    assert d.check(healthy(8, reward=0.0)) == []
    assert d.check(healthy(9, reward=0.0)) == ["reward_collapse"]


def test_detector_baselines_learn_only_from_healthy_steps_and_warmup():
    d = CollapseDetector(RecoveryConfig(warmup=2, entropy_factor=3.0, entropy_min_delta=1.0), AGENTS)
    assert d.check({**healthy(0), "agent/speaker/entropy": 9.0}) == []  # not armed yet
    assert d.check(healthy(1)) == []
    base = d.entropy_baseline["speaker"]
    assert d.check({**healthy(2), "agent/speaker/entropy": 50.0}) == ["entropy_surge/speaker"]
    assert d.entropy_baseline["speaker"] == base  # the surge did not move the baseline
    # a small relative surge on a tiny baseline is not a collapse (min delta)
    d2 = CollapseDetector(RecoveryConfig(warmup=0), AGENTS)
    d2.check(healthy(0, entropy=0.01))
    assert d2.check(healthy(1, entropy=0.05)) == []


def armed_at(ref: float, **settings: float) -> CollapseDetector:
    """A detector armed with both reward levels at ``ref`` (as after a long steady run)."""
    d = CollapseDetector(RecoveryConfig(warmup=0, **settings), AGENTS)
    d.reward_ema = d.reward_ref = ref
    return d


def episodes(reward: float, n: int) -> dict[str, float]:
    return {"team/reward": reward, "rollout/episodes": float(n)}


def test_reward_noise_is_the_bhatia_davis_bound_scaled_to_the_ema():
    d = armed_at(0.3)
    # per episode (1 - 0.3)(0.3 - 0) = 0.21; 16 episodes; EMA weight 0.5 -> x 0.5 / 1.5
    assert d.reward_noise(0.3, 16) == pytest.approx(math.sqrt(0.21 / 16 / 3))
    assert d.reward_noise(0.3, None) == 0.0
    wide = armed_at(0.3, reward_low=-1.0, reward_high=1.0)  # (1 - 0.3)(0.3 + 1) = 0.91
    assert wide.reward_noise(0.3, 16) == pytest.approx(math.sqrt(0.91 / 16 / 3))


def test_a_drop_within_the_batch_noise_is_not_a_collapse_but_the_same_drop_on_a_big_batch_is():
    # from 0.3, two steps at 0 put the fast EMA at 0.075: under the drop line (0.15) on any batch;
    # beyond 3 standard errors (0.3 - 3 x 0.0661 = 0.102) with 16 episodes a step, not with 4
    big = armed_at(0.3)
    assert big.check(episodes(0.0, 16)) == []  # 0.15: on the line, not under it
    assert big.check(episodes(0.0, 16)) == ["reward_collapse"]  # 0.075
    small = armed_at(0.3)
    for _ in range(4):  # 0.15, 0.075, 0.0375, 0.019: never 3 x 0.132 = 0.397 below 0.3
        assert small.check(episodes(0.0, 4)) == []
    assert small.reward_ref == pytest.approx(0.3 * 0.9)  # only the first step (on the line) entered the reference
    ratio_only = armed_at(0.3, reward_z=None)
    ratio_only.check(episodes(0.0, 4))
    assert ratio_only.check(episodes(0.0, 4)) == ["reward_collapse"]


def test_the_noise_units_are_the_problems_when_the_rollout_names_them():
    # 64 leaves of 4 trees: 4 units (0.3 - 3 x 0.132 < 0: no alarm), not 64 (an alarm)
    trees = armed_at(0.3)
    leaves = armed_at(0.3)
    for _ in range(2):
        got_trees = trees.check({**episodes(0.0, 64), "rollout/problems": 4.0})
        got_leaves = leaves.check(episodes(0.0, 64))
    assert got_trees == [] and got_leaves == ["reward_collapse"]


def binary_team_rewards(levels: list[float], n: int, seed: int) -> list[float]:
    gen = torch.Generator().manual_seed(seed)
    return [float((torch.rand(n, generator=gen) < p).float().mean()) for p in levels]


def alarms(rewards: list[float], n: int, **settings: float) -> list[int]:
    d = CollapseDetector(RecoveryConfig(**settings), AGENTS)
    return [t for t, r in enumerate(rewards) if d.check(episodes(r, n))]


def test_a_steady_noisy_policy_is_not_a_collapse_and_a_real_one_is_caught_within_three_steps():
    # a 0.3 policy, 16 binary episodes a step: the detector before the noise test (the best
    # fast EMA halved) fired about 6 times in 68 such steps; now at most once in 3,000
    fired = [alarms(binary_team_rewards([0.3] * 300, 16, seed=seed), 16) for seed in range(10)]
    assert sum(map(len, fired)) <= 1, fired
    # a real collapse: 0.35 for 30 steps, then 0.02
    for seed in range(5):
        rewards = binary_team_rewards([0.35] * 30 + [0.02] * 10, 16, seed=seed)
        fired = alarms(rewards, 16)
        assert fired and 30 <= fired[0] <= 32, (seed, fired)


def test_an_old_checkpoint_state_still_loads():
    d = CollapseDetector(RecoveryConfig(), AGENTS)
    d.load_state_dict({"entropy_baseline": {}, "reward_ema": 0.3, "best_reward_ema": 0.4, "healthy_steps": 5})
    assert d.reward_ref == 0.4
    d.load_state_dict({"entropy_baseline": {}, "reward_ema": None, "best_reward_ema": -math.inf, "healthy_steps": 0})
    assert d.reward_ref is None
    d.load_state_dict(CollapseDetector(RecoveryConfig(), AGENTS).state_dict())
    assert d.reward_ref is None


def test_settings_validation():
    with pytest.raises(ValueError):
        RecoveryConfig(lr_factor=0.0)
    with pytest.raises(ValueError):
        RecoveryConfig(reward_drop=1.5)
    with pytest.raises(ValueError, match="reward range"):
        RecoveryConfig(reward_low=1.0, reward_high=0.0)
    with pytest.raises(ValueError):
        RecoveryConfig(reward_ref_ema=0.0)


# --------------------------------------------------------------------------------------
# injected faults on a real run
# --------------------------------------------------------------------------------------

pytest.importorskip("marft_algos.models")
from helpers.marft_echo import echo_kwargs, letter_policy  # noqa: E402

from marft_algos.algos.marft_action import MARFTAction, MARFTActionConfig, MARFTActionTrainer  # noqa: E402
from marft_algos.optim import CRITIC_KEY  # noqa: E402


def recovering_trainer(tmp_path, **kw) -> MARFTActionTrainer:
    # reward collapse is tested on its own above; a 4-episode toy batch is too noisy for it here
    cfg = MARFTActionConfig(**echo_kwargs(out_dir=str(tmp_path / "run"), **{"recovery": {"warmup": 1, "reward_drop": None}, "steps": 5, **kw}))
    return MARFTActionTrainer(cfg, policy=letter_policy())


def policy_weights(t) -> list[torch.Tensor]:
    return [p.detach().clone() for a in t.agents for p in t.policy.trainable_parameters(a)]


def test_injected_nan_triggers_exactly_one_rollback_and_training_continues(tmp_path, monkeypatch):
    t = recovering_trainer(tmp_path)
    real = MARFTAction.policy_loss
    snaps: dict[int, list[torch.Tensor]] = {}
    real_step = MARFTActionTrainer.train_step

    def nan_at_step_3(self, agent, mb, stats):
        loss, m = real(self, agent, mb, stats)
        if self.trainer.global_step == 2:  # the 3rd step
            loss = loss * float("nan")
        return loss, m

    def step_and_snapshot(self):
        m = real_step(self)
        snaps[self.global_step] = policy_weights(self)
        return m

    monkeypatch.setattr(MARFTAction, "policy_loss", nan_at_step_3)
    monkeypatch.setattr(MARFTActionTrainer, "train_step", step_and_snapshot)
    lr0 = t.optimizers["speaker"].param_groups[0]["lr"]
    hist = t.train()
    assert t.global_step == 5 and len(hist) == 5  # training went on to the end
    assert t.counters["recovery/rollbacks"] == 1
    assert t.counters["recovery/reason/nonfinite"] == 1
    assert len(t.algorithm.recovery.rollbacks) == 1
    event = t.algorithm.recovery.rollbacks[0]
    assert event["step"] == 3 and event["reasons"] == ["nonfinite"]
    # the good checkpoint was the one saved after step 1 (validated by the healthy step 2);
    # the one after step 2 was never validated (step 3 collapsed)
    assert event["restored"] == "step-00000001"
    assert hist[2]["recovery/rollback"] == 1.0
    # lr halved for every optimizer, policy and critic
    assert t.optimizers["speaker"].param_groups[0]["lr"] == pytest.approx(0.5 * lr0)
    assert t.optimizers[CRITIC_KEY].param_groups[0]["lr"] == pytest.approx(0.5 * t.config.critic_lr)
    assert t.lr_scale == 0.5
    # the rollback is on disk too
    lines = (tmp_path / "run" / "recovery.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["reasons"] == ["nonfinite"]
    assert all(torch.isfinite(p).all() for p in policy_weights(t))


def test_injected_entropy_spike_rolls_back_to_the_good_weights(tmp_path, monkeypatch):
    t = recovering_trainer(tmp_path, steps=4)
    real_update = MARFTActionTrainer.update
    after_step: dict[int, list[torch.Tensor]] = {}
    real_step = MARFTActionTrainer.train_step

    def spiky_update(self, batch):
        m = real_update(self, batch)
        if self.global_step == 2:
            for a in self.agents:
                m[f"agent/{a}/entropy"] = 50.0
        return m

    def step_and_snapshot(self):
        m = real_step(self)
        if not m.get("recovery/rollback"):
            after_step[self.global_step] = policy_weights(self)
        else:  # right after the rollback: the weights are those saved after step 1
            assert all(torch.equal(a, b) for a, b in zip(after_step[1], policy_weights(self), strict=True))
            after_step["rolled_back"] = True
        return m

    monkeypatch.setattr(MARFTActionTrainer, "update", spiky_update)
    monkeypatch.setattr(MARFTActionTrainer, "train_step", step_and_snapshot)
    t.train()
    assert after_step.get("rolled_back") is True
    assert t.counters["recovery/rollbacks"] == 1
    assert t.counters["recovery/reason/entropy_surge/speaker"] == 1
    assert t.global_step == 4


def test_too_many_rollbacks_stop_with_an_error(tmp_path, monkeypatch):
    t = recovering_trainer(tmp_path, recovery={"warmup": 1, "reward_drop": None, "max_rollbacks": 1}, steps=6)
    real = MARFTAction.policy_loss

    def always_nan_after_1(self, agent, mb, stats):
        loss, m = real(self, agent, mb, stats)
        return (loss * float("nan") if self.trainer.global_step >= 1 else loss), m

    monkeypatch.setattr(MARFTAction, "policy_loss", always_nan_after_1)
    with pytest.raises(CollapseError, match="after 1 rollbacks"):
        t.train()
    assert t.counters["recovery/rollbacks"] == 1


def test_the_stop_leaves_the_last_good_weights_and_says_what_stopped_it(tmp_path, monkeypatch):
    # steps 1-2 healthy (step 2 validates step 1's checkpoint), every later update poisons a
    # weight: step 3 rolls back to step 1's weights, step 4 stops, on step 1's weights again
    t = recovering_trainer(tmp_path, recovery={"warmup": 1, "reward_drop": None, "max_rollbacks": 1}, steps=6)
    start = policy_weights(t)
    real_update, real_step = MARFTActionTrainer.update, MARFTActionTrainer.train_step
    after: dict[int, list[torch.Tensor]] = {}

    def poisoning_update(self, batch):
        m = real_update(self, batch)
        if self.global_step >= 2:  # the update of the 3rd step on (global_step counts finished steps)
            with torch.no_grad():
                next(iter(self.policy.trainable_parameters(self.agents[0]))).fill_(float("nan"))
        return m

    def step_and_snapshot(self, *a, **kw):
        m = real_step(self, *a, **kw)
        after[self.global_step] = policy_weights(self)
        return m

    monkeypatch.setattr(MARFTActionTrainer, "update", poisoning_update)
    monkeypatch.setattr(MARFTActionTrainer, "train_step", step_and_snapshot)
    with pytest.raises(CollapseError, match=r"after 1 rollbacks.*last good checkpoint \(step-0*1\)") as caught:
        t.train()
    e = caught.value
    assert (e.step, e.reasons, t.global_step) == (4, ["nonfinite"], 4)
    assert e.metrics["rollout/tokens"] > 0 and e.metrics["train/step"] == 4.0
    now = policy_weights(t)
    assert all(torch.isfinite(w).all() for w in now)
    assert all(torch.equal(a, b) for a, b in zip(now, after[1], strict=True))  # step 1's weights, not the start's
    assert not all(torch.equal(a, b) for a, b in zip(now, start, strict=True))


def test_rollback_to_a_checkpoint_whose_adapters_never_moved(tmp_path, monkeypatch):
    # During critic warm-up the adapters stay at their initialisation; the good checkpoint
    # then holds adapters equal to a fresh policy's, and restoring it must still work.
    t = recovering_trainer(tmp_path, critic_warmup_steps=3, steps=4)
    fresh = policy_weights(t)
    real_update = MARFTActionTrainer.update

    def nan_at_step_3(self, batch):  # the 3rd step is still in the critic warm-up
        m = real_update(self, batch)
        if self.global_step == 2:
            m["agent/speaker/loss"] = float("nan")
        return m

    monkeypatch.setattr(MARFTActionTrainer, "update", nan_at_step_3)
    t.train()
    assert t.counters["recovery/rollbacks"] == 1
    assert t.global_step == 4
    restored = t.algorithm.recovery.rollbacks[0]["restored"]
    assert restored == "step-00000001"
    # the warm-up steps never touched the policy adapters
    assert t.global_step > t.config.critic_warmup_steps
    assert any(not torch.equal(a, b) for a, b in zip(fresh, policy_weights(t), strict=True))
