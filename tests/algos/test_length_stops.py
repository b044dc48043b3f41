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
