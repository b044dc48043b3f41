"""Token-level MARFT: the token backup through the trainer, per-token ratios, critic targets, learning."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from marft_algos.buffer import AgentBuffer
from marft_algos.config import ConfigError
from marft_algos.records import BatchEstimates, Episode, RolloutBatch, Transition

pytest.importorskip("marft_algos.models")
from helpers.marft_checks import assert_learns_echo  # noqa: E402
from helpers.marft_echo import echo_kwargs, letter_policy  # noqa: E402

from marft_algos.algos.marft_token import MARFTTokenConfig, MARFTTokenTrainer  # noqa: E402
from marft_algos.models import TokenStats  # noqa: E402


def tiny_config(**kw) -> MARFTTokenConfig:
    return MARFTTokenConfig(**echo_kwargs(**kw))


@pytest.fixture(scope="module")
def trainer() -> MARFTTokenTrainer:
    return MARFTTokenTrainer(tiny_config(normalize_advantages="none", gamma_agent=0.9, lam_agent=0.5), policy=letter_policy())


def token_batch(actions: list[tuple[int, str, float, list[float]]], episode_id: int = 0) -> RolloutBatch:
    """One episode; actions = [(turn, agent, reward, token values)]; responses have len(values) tokens."""
    ep = Episode(episode_id=episode_id, group_id=0, seed=0)
    batch = RolloutBatch(episodes=[ep])
    for k, (turn, agent, r, vals) in enumerate(actions):
        tr = Transition(episode_id, 0, k, turn, agent, [1, 2], list(range(3, 3 + len(vals))), [-1.0] * len(vals), reward=r)
        batch.estimates[tr].token_values = list(vals)
        ep.transitions.append(tr)
    return batch


def test_registered_and_config_checks():
    from marft_algos.registry import get_algorithm

    assert get_algorithm("marft-token").trainer_cls is MARFTTokenTrainer
    with pytest.raises(ConfigError, match="gamma_token"):
        tiny_config(gamma_token=2.0)
    with pytest.raises(ConfigError, match="loss_agg"):
        tiny_config(loss_agg="episode")
    cfg = tiny_config()
    assert cfg.gamma_token == 1.0 and cfg.lam_token == 1.0  # credit does not decay per token


def test_token_backup_through_trainer_two_agents_three_tokens_by_hand(trainer):
    # one turn; speaker token values [.1 .2 .3], listener [.4 .5 .6]; team reward 1 on the listener.
    # gamma_token = lam_token = 1, gamma_agent = 0.9, lam_agent = 0.5, terminal at the end:
    # listener: A = 1 - V_j = [.6 .5 .4];  speaker: last token .06 + .45*.6 = .33, then .43, .53
    batch = token_batch([(0, "speaker", 0.0, [0.1, 0.2, 0.3]), (0, "listener", 1.0, [0.4, 0.5, 0.6])])
    trainer.estimate(batch)
    sp, li = (batch.estimates[t] for t in batch.transitions)
    np.testing.assert_allclose(sp.token_advantages, [0.53, 0.43, 0.33], atol=1e-12)
    np.testing.assert_allclose(li.token_advantages, [0.6, 0.5, 0.4], atol=1e-12)
    np.testing.assert_allclose(li.token_returns, [1.0, 1.0, 1.0], atol=1e-12)
    # speaker returns = A + V: [.63 .63 .63] (= 0.9 * V_listener_0 + 0.45 * A_listener_0 ...)
    np.testing.assert_allclose(sp.token_returns, [0.63, 0.63, 0.63], atol=1e-12)


def test_reference_per_token_discount_is_reproducible(trainer):
    # with gamma_token = 0.99 the early tokens' credit decays (the reference's behaviour)
    c = trainer.config
    c.gamma_token, c.lam_token = 0.99, 0.95
    try:
        batch = token_batch([(0, "listener", 1.0, [0.0] * 5)])
        trainer.estimate(batch)
    finally:
        c.gamma_token, c.lam_token = 1.0, 1.0
    adv = batch.estimates[batch.transitions[0]].token_advantages
    # values 0: A_j = (0.99*0.95)^(4-j) * 1
    np.testing.assert_allclose(adv, [(0.99 * 0.95) ** (4 - j) for j in range(5)], atol=1e-12)


def test_empty_action_keeps_the_chain_connected(trainer):
    # the speaker produced nothing (not trainable): one virtual link valued V(o); the listener's
    # reward still reaches it and nothing crashes
    batch = token_batch([(0, "speaker", 0.0, []), (0, "listener", 1.0, [0.5])])
    sp = batch.transitions[0]
    sp.trainable = False
    batch.estimates.clear()  # no token values yet: the trainer computes them
    sp.response_ids = []
    trainer.estimate(batch)
    est = batch.estimates[sp]
    assert len(est.token_advantages) == 1 and est.token_values == [0.0]
    assert np.isfinite(est.token_advantages[0])


def test_overlong_action_is_passed_through_by_hand(trainer):
    # speaker (2 tokens) -> listener (prompt over the context: not trainable) -> speaker of
    # the next turn (reward 1, terminal); fixture: gamma_agent 0.9, lam_agent 0.5
    batch = token_batch([(0, "speaker", 0.0, [0.1, 0.2]), (0, "listener", 0.0, [0.0]), (1, "speaker", 1.0, [0.5])])
    batch.transitions[1].trainable = False
    trainer.estimate(batch)
    A_last = 1.0 - 0.5
    A_skip = 0.99 * 0.95 * A_last
    A_sp1 = 0.9 * (0.99 * 0.5) - 0.2 + 0.45 * A_skip  # bootstraps from the next speaker's first token
    np.testing.assert_allclose(batch.estimates[batch.transitions[0]].token_advantages, [0.1 + A_sp1, A_sp1], atol=1e-12)


def test_per_token_ratio_and_advantages_in_the_loss(trainer):
    # two tokens with different advantages (+1, -1): with ratio r per token, the unclipped
    # surrogate is mean(-A r) = -(r0 - r1)/2
    trs, est = [Transition(0, 0, 0, 0, "speaker", [1], [5, 6], [0.0, 0.0])], BatchEstimates()
    est[trs[0]].token_advantages = [1.0, -1.0]
    est[trs[0]].old_logp = [0.0, 0.0]
    mb = AgentBuffer.from_transitions("speaker", trs, est).minibatch([0])
    logp = torch.tensor([[np.log(1.1), np.log(0.95)]], dtype=torch.float32, requires_grad=True)
    stats = TokenStats(logp, torch.zeros_like(logp), torch.ones_like(logp))
    loss, m = trainer.algorithm.policy_loss("speaker", mb, stats)
    assert float(loss.detach()) == pytest.approx(-(1.1 - 0.95) / 2, rel=1e-5)
    assert m["agent/speaker/ratio_mean"] == pytest.approx((1.1 + 0.95) / 2, rel=1e-5)
    loss.backward()
    # d/dlogp_j of -A_j r_j / 2 = -A_j r_j / 2
    np.testing.assert_allclose(logp.grad[0].numpy(), [-1.1 / 2, 0.95 / 2], rtol=1e-5)


def test_critic_trains_on_token_returns():
    t = MARFTTokenTrainer(tiny_config(), policy=letter_policy())
    before = [p.detach().clone() for p in t.algorithm.critic.parameters()]
    m = t.train_step()
    assert any(not torch.equal(b, p) for b, p in zip(before, t.algorithm.critic.parameters(), strict=True))
    for a in t.agents:
        assert np.isfinite(m[f"agent/{a}/value_loss"])


@pytest.mark.timeout(600)
def test_marft_token_learns_echo():
    """Team reward rises from chance (1/|V| = 0.25) to well above it."""
    assert_learns_echo(MARFTTokenTrainer, tiny_config)
