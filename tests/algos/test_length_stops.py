"""DAPO's overlong filtering (``mask_length_stops``): actions cut by ``max_new_tokens`` carry
no policy-gradient signal, after every algorithm's estimator, and nothing else changes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marft_algos.length_stops import mask_length_stops
from marft_algos.records import Episode, RolloutBatch, Transition

pytest.importorskip("marft_algos.models")
from helpers import tiny_echo  # noqa: E402
from helpers.marft_echo import echo_kwargs, letter_policy  # noqa: E402

from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from marft_algos.algos.marft_action import MARFTActionConfig, MARFTActionTrainer  # noqa: E402
from marft_algos.algos.marft_token import MARFTTokenConfig, MARFTTokenTrainer  # noqa: E402


def _tr(eid: int, k: int, agent: str, finish: str, adv: float | None = None, **kw) -> Transition:
    t = Transition(eid, eid, k, 0, agent, [1], [2, 3], [-1.0, -1.0], **kw)
    t.finish_reason, t.advantage = finish, adv
    return t


def test_only_length_stops_are_zeroed_and_a_shadow_counts_once():
    owner = _tr(0, 0, "speaker", "length", 0.7)
    kept = _tr(0, 1, "listener", "eos", -0.4)
    shadow = _tr(1, 0, "speaker", "length", 0.7, shadow=True)
    batch = RolloutBatch(episodes=[Episode(0, 0, 0, transitions=[owner, kept]), Episode(1, 0, 0, transitions=[shadow])])
    batch.estimates[owner].token_advantages = [0.5, 0.9]
    batch.estimates[kept].token_advantages = [-0.2, -0.6]
    assert mask_length_stops(batch) == 1
    assert owner.advantage == 0.0 and batch.estimates[owner].token_advantages == [0.0, 0.0]
    assert kept.advantage == -0.4 and batch.estimates[kept].token_advantages == [-0.2, -0.6]


def _grpo_batch(finishes: list[str]) -> RolloutBatch:
    returns = [1.0, 0.0, 0.0, 1.0]
    eps = []
    for e, (R, fin) in enumerate(zip(returns, finishes, strict=True)):
        ep = Episode(episode_id=e, group_id=0, seed=0, team_return=R)
        for k, a in enumerate(("speaker", "listener")):
            t = Transition(e, 0, k, 0, a, [1], [2], [-1.0], team_reward=R)
            t.finish_reason = fin if a == "speaker" else "eos"
            ep.transitions.append(t)
        eps.append(ep)
    return RolloutBatch(episodes=eps)


def test_grpo_masks_after_the_group_statistics():
    """The group's mean and std still include the cut episodes (their rewards are facts);
    only the cut actions lose their advantage."""
    finishes = ["length", "eos", "length", "eos"]
    trainer = GRPOTrainer(tiny_echo.echo_config(GRPOConfig, group_size=4), policy=tiny_echo.letter_policy())
    plain = _grpo_batch(finishes)
    trainer.estimate(plain)
    trainer.config.mask_length_stops = True
    masked = _grpo_batch(finishes)
    trainer.estimate(masked)
    assert masked.metrics["train/length_stops_masked"] == 2.0
    for p, m in zip(plain.transitions, masked.transitions, strict=True):
        expected = 0.0 if m.finish_reason == "length" else p.advantage
        assert m.advantage == pytest.approx(expected, abs=0) and p.advantage != 0.0
    assert "train/length_stops_masked" not in plain.metrics


def test_token_level_marft_zeroes_every_token_advantage_of_a_cut_action():
    t = MARFTTokenTrainer(MARFTTokenConfig(**echo_kwargs(normalize_advantages="none", mask_length_stops=True)), policy=letter_policy())
    ep = Episode(episode_id=0, group_id=0, seed=0)
    batch = RolloutBatch(episodes=[ep])
    for k, (agent, r, vals, fin) in enumerate([("speaker", 0.0, [0.1, 0.2], "length"), ("listener", 1.0, [0.4, 0.5], "eos")]):
        tr = Transition(0, 0, k, 0, agent, [1, 2], [3, 4], [-1.0, -1.0], reward=r)
        tr.finish_reason = fin
        batch.estimates[tr].token_values = vals
        ep.transitions.append(tr)
    t.estimate(batch)
    sp, li = (batch.estimates[x] for x in batch.transitions)
    assert sp.token_advantages == [0.0, 0.0]
    np.testing.assert_allclose(li.token_advantages, [0.6, 0.5], atol=1e-12)  # 1 - V, gamma = lam = 1 in a token chain
    assert sp.token_returns is not None and any(v != 0.0 for v in sp.token_returns)  # the critic's targets stay


def _params(t: MARFTActionTrainer) -> list[torch.Tensor]:
    return [p.detach().clone() for a in t.agents for p in t.policy.trainable_parameters(a)]


def _moved(before: list[torch.Tensor], t: MARFTActionTrainer) -> bool:
    now = [p for a in t.agents for p in t.policy.trainable_parameters(a)]
    return any(not torch.equal(b, p) for b, p in zip(before, now, strict=True))


@pytest.mark.parametrize("mask", [True, False])
def test_a_step_whose_every_action_is_cut_moves_only_the_critic(mask):
    """One-token actions end at max_new_tokens=1: every action is a length stop. Masked, the
    policies do not move at all (beta = ent_coef = 0) while the critic learns; unmasked, they move."""
    t = MARFTActionTrainer(MARFTActionConfig(**echo_kwargs(mask_length_stops=mask)), policy=letter_policy())
    pol, crit = _params(t), [p.detach().clone() for p in t.algorithm.critic.parameters()]
    m = t.train_step()
    assert m["rollout/length_stops"] == m["rollout/actions"] > 0
    assert ("train/length_stops_masked" in m) is mask
    if mask:
        assert m["train/length_stops_masked"] == m["rollout/actions"]
    assert _moved(pol, t) is not mask
    assert any(not torch.equal(b, p) for b, p in zip(crit, t.algorithm.critic.parameters(), strict=True))


def _watch_run(fracs: list[float], threshold: float = 0.5, watch=None):
    """Feed a watch one agent's per-step cut shares; the steps at which it warned."""
    from types import SimpleNamespace

    from marft_algos.length_stops import LengthStopWatch

    watch = watch or LengthStopWatch(window=3)
    trainer = SimpleNamespace(config=SimpleNamespace(length_stop_warn=threshold), agents=["reasoner", "actor"], global_step=0)
    warned = []
    for step, f in enumerate(fracs, 1):
        trainer.global_step = step
        before = set(watch.warned)
        watch.on_step_end(trainer, {"agent/reasoner/length_stop_frac": f, "agent/actor/length_stop_frac": 0.0}, None)
        if watch.warned - before:
            warned.append(step)
    return warned, watch


def test_the_watch_warns_once_on_a_drift_and_again_only_after_a_recovery(caplog):
    drift = [0.06, 0.31, 0.44, 0.56, 0.88, 0.81, 0.75, 1.0, 1.0]
    with caplog.at_level("WARNING", logger="marft"):
        warned, _ = _watch_run(drift)
    # window means from step 3: 0.27, 0.44, 0.63 (step 5: warn), then high: no repeat
    assert warned == [5]
    (msg,) = [r.getMessage() for r in caplog.records if "max_new_tokens" in r.getMessage()]
    assert "agent reasoner: 63% of its actions" in msg and "27% over the run's first 3 steps" in msg and "mask_length_stops=true" in msg
    assert msg.index("normalize_advantages=batch") < msg.index("mask_length_stops=true")  # the measured remedy first
    # below half the threshold (mean < 0.25) re-arms it; a second rise warns again
    assert _watch_run(drift + [0.1, 0.1, 0.1, 0.9, 0.9, 0.9])[0] == [5, 14]
    assert _watch_run(drift + [0.3, 0.3, 0.3, 0.9, 0.9, 0.9])[0] == [5]  # 0.30 >= 0.25: still armed off


def test_the_watch_is_off_at_zero_and_never_fires_below_its_threshold():
    assert _watch_run([1.0] * 6, threshold=0.0)[0] == []
    assert _watch_run([0.49, 0.49, 0.49, 0.3, 0.6, 0.5])[0] == []  # window means 0.49, 0.43, 0.47, 0.47


def test_the_watch_state_survives_a_checkpoint():
    from marft_algos.length_stops import LengthStopWatch

    _, watch = _watch_run([0.9, 0.9, 0.9])
    resumed = LengthStopWatch(window=3)
    resumed.load_state_dict(watch.state_dict(), frozenset({"progress"}))
    assert _watch_run([0.9, 0.9], watch=resumed)[0] == []  # already warned before the checkpoint
    fresh = LengthStopWatch(window=3)
    fresh.load_state_dict(None, frozenset({"progress"}))
    assert _watch_run([0.9, 0.9, 0.9], watch=fresh)[0] == [3]


def test_a_run_whose_every_action_is_cut_warns(caplog):
    """Built in: a real trainer whose one-token actions all end at max_new_tokens=1."""
    t = MARFTActionTrainer(MARFTActionConfig(**echo_kwargs()), policy=letter_policy())
    with caplog.at_level("WARNING", logger="marft"):
        for _ in range(3):
            t.train_step()
    msgs = [r.getMessage() for r in caplog.records if "cut by its max_new_tokens" in r.getMessage()]
    assert len(msgs) == len(t.agents) and all(": 100% of its actions" in m for m in msgs)
