"""Action-level MARFT: chain GAE through the trainer, whole-action ratios, critic, KL cut, learning.

The learning toy: ``echo-duo-v0`` with the single-letter vocabulary ``a b c d`` and a
tiny random model whose output layer is biased towards those letters (one new token per
action). The untrained team then says vocabulary words at random, i.e. it scores the
env's documented chance level ``1/|V| = 0.25``; the optimum (1.0) needs the two agents
to coordinate (the listener repeating the speaker). The bias only makes the action
*format* likely (a random byte-level model never emits a vocabulary word); it gives no
hint about which word to say.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from marft_algos.buffer import AgentBuffer
from marft_algos.config import ConfigError
from marft_algos.records import BatchEstimates, Episode, RolloutBatch, Transition

pytest.importorskip("marft_algos.models")
from helpers.marft_checks import assert_learns_echo, reference_action_gae  # noqa: E402
from helpers.marft_echo import (  # noqa: E402
    AGENTS,
    echo_kwargs,
    letter_model,
    letter_policy,
)

from marft_algos.algos.marft_action import MARFTActionConfig, MARFTActionTrainer  # noqa: E402
from marft_algos.models import TeamPolicy, TokenStats  # noqa: E402
from marft_algos.optim import CRITIC_KEY  # noqa: E402


def tiny_config(**kw) -> MARFTActionConfig:
    return MARFTActionConfig(**echo_kwargs(**kw))


def snapshot(params) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params]


def changed(before, params) -> bool:
    return any(not torch.equal(b, p) for b, p in zip(before, params, strict=True))


@pytest.fixture(scope="module")
def trainer() -> MARFTActionTrainer:
    return MARFTActionTrainer(tiny_config(normalize_advantages="none"), policy=letter_policy())


def chain_batch(episodes: list[list[tuple[int, str, float, float]]]) -> RolloutBatch:
    """episodes[e] = [(turn, agent, reward, value), ...] in execution order."""
    out = []
    for e, links in enumerate(episodes):
        ep = Episode(episode_id=10 + e, group_id=e, seed=e)
        for k, (turn, agent, r, v) in enumerate(links):
            ep.transitions.append(
                Transition(10 + e, e, k, turn, agent, [1, 2], [3], [-1.0], reward=r, value=v, done=k == len(links) - 1)
            )
        out.append(ep)
    return RolloutBatch(episodes=out)


# --------------------------------------------------------------------------------------
# registry and config
# --------------------------------------------------------------------------------------


def test_registered_by_name_for_cli_and_python():
    from marft_algos.registry import get_algorithm

    spec = get_algorithm("marft-action")
    assert spec.trainer_cls is MARFTActionTrainer and spec.config_cls is MARFTActionConfig
    assert {s.name for s in __import__("marft_algos.registry").registry.list_algorithms()} >= {"grpo", "ippo", "marft-action", "marft-token"}


@pytest.mark.parametrize("algo", ["marft-action", "marft-token"])
def test_cli_help_lists_the_options(algo, capsys):
    from marft_algos.cli import main

    assert main(["train", "--algo", algo, "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--gamma-agent", "--kl-threshold", "--agent-by-agent", "--critic-warmup-steps", "--recovery-lr-factor"):
        assert flag in out


def test_config_rejects_bad_combinations_with_a_reason():
    with pytest.raises(ConfigError, match="logprob_norm"):
        tiny_config(logprob_norm="chars")
    with pytest.raises(ConfigError, match="gamma_agent"):
        tiny_config(gamma_agent=1.5)
    with pytest.raises(ConfigError, match="eps_high"):
        tiny_config(eps_low=0.3, eps_high=0.2)
    with pytest.raises(ConfigError, match="kl_threshold"):
        tiny_config(kl_threshold=0.0)
    with pytest.raises(ConfigError, match="value_loss"):
        tiny_config(value_loss="l1")
    with pytest.raises(ConfigError, match="one adapter per agent"):
        tiny_config(agent_by_agent=True, mode="shared")
    with pytest.raises(ConfigError, match="unknown dtype"):
        tiny_config(dtype="int8")
    with pytest.raises(ConfigError, match="lora_dropout must be 0"):
        tiny_config(lora_dropout=0.1)
    tiny_config(beta=0.1, mode="full")  # full mode has a frozen reference copy: allowed
    tiny_config(eps_low=0.2, eps_high=0.28, kl_threshold=1e-3, agent_by_agent=True, agent_interval=2)


# --------------------------------------------------------------------------------------
# advantages through the trainer
# --------------------------------------------------------------------------------------


def test_chain_gae_through_trainer_matches_reference_recursion(trainer):
    # episode 0: 2 agents x 2 turns, team reward on the listener of turn 1, terminated.
    # episode 1: terminated after one turn (inside the batch): must not leak into episode 0.
    ep0 = [(0, "speaker", 0.0, 0.2), (0, "listener", 0.0, 0.5), (1, "speaker", 0.0, 0.4), (1, "listener", 1.0, 0.7)]
    ep1 = [(0, "speaker", 0.0, 0.3), (0, "listener", 1.0, 0.6)]
    batch = chain_batch([ep0, ep1])
    trainer.estimate(batch)
    g, lam = 0.99, 0.95
    # the reference implementation's loop, for episode 0:
    r = np.array([[0.0, 0.0], [0.0, 1.0]])
    V = np.array([[0.2, 0.5], [0.4, 0.7], [0.0, 0.0]])
    A, _ = reference_action_gae(r, V, np.array([1.0, 1.0, 0.0]), g, lam)
    got = [tr.advantage for tr in batch.episodes[0].transitions]
    np.testing.assert_allclose(got, A.reshape(-1), atol=1e-12)
    np.testing.assert_allclose([tr.returns for tr in batch.episodes[0].transitions], A.reshape(-1) + V[:2].reshape(-1), atol=1e-12)
    # episode 1 by hand: A1 = 1 - 0.6 = 0.4; A0 = 0.99*0.6 - 0.3 + 0.9405*0.4 = 0.6702
    np.testing.assert_allclose([tr.advantage for tr in batch.episodes[1].transitions], [0.99 * 0.6 - 0.3 + g * lam * 0.4, 0.4])


def test_overlong_action_is_passed_through_in_the_chain(trainer):
    # speaker -> listener (prompt over the context: not trainable, value placeholder 0) ->
    # speaker of the next turn (reward 1, terminal): the first speaker bootstraps from
    # the second one, not from a value of 0
    batch = chain_batch([[(0, "speaker", 0.0, 0.2), (0, "listener", 0.0, 0.0), (1, "speaker", 1.0, 0.6)]])
    batch.transitions[1].trainable = False
    trainer.estimate(batch)
    g, lam = 0.99, 0.95
    A2 = 1.0 - 0.6
    A1 = g * lam * A2
    A0 = g * (g * 0.6) - 0.2 + g * lam * A1
    np.testing.assert_allclose([t.advantage for t in batch.transitions], [A0, A1, A2], atol=1e-12)
    assert A0 > 0.5  # bootstrapping from V = 0 would have given 0.9405 * 0.376 - 0.2 = 0.15


def test_separate_turn_discount_in_the_trainer(trainer):
    c = trainer.config
    old = (c.gamma_agent, c.lam_agent, c.gamma_turn, c.lam_turn)
    c.gamma_agent, c.lam_agent, c.gamma_turn, c.lam_turn = 1.0, 1.0, 0.5, 1.0
    try:
        batch = chain_batch([[(0, "speaker", 0.0, 0.0), (0, "listener", 1.0, 0.0), (1, "speaker", 0.0, 0.0), (1, "listener", 4.0, 0.0)]])
        trainer.estimate(batch)
    finally:
        c.gamma_agent, c.lam_agent, c.gamma_turn, c.lam_turn = old
    # reward-to-go with a 0.5 discount only across the turn boundary: [3, 3, 4, 4]
    np.testing.assert_allclose([t.advantage for t in batch.transitions], [3.0, 3.0, 4.0, 4.0])


# --------------------------------------------------------------------------------------
# whole-action ratio: log-prob normalisation modes
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "norm, expected",
    [
        # action 0: 3 tokens, log-ratio sum 1.0, 2 words; action 1: 1 token, log-ratio 0.5, 1 word
        ("sum", [math.exp(1.0), math.exp(0.5)]),
        ("token", [math.exp(1.0 / 3), math.exp(0.5)]),
        ("word", [math.exp(1.0 / 2), math.exp(0.5)]),
    ],
)
def test_whole_action_ratio_normalisation(trainer, norm, expected):
    trs = [
        Transition(0, 0, 0, 0, "speaker", [1], [5, 6, 7], [0.0] * 3, text="two words", advantage=1.0),
        Transition(0, 0, 1, 0, "speaker", [1], [8], [0.0], text="one", advantage=1.0),
    ]
    est = BatchEstimates()
    est[trs[0]].old_logp = [-1.5, -2.0, -3.5]
    est[trs[1]].old_logp = [-1.0]
    mb = AgentBuffer.from_transitions("speaker", trs, est).minibatch([0, 1])
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    stats = TokenStats(logp, torch.zeros_like(logp), mask)
    trainer.config.logprob_norm, trainer.config.eps_high = norm, 10.0  # no clipping: read the raw ratio
    try:
        _, m = trainer.algorithm.policy_loss("speaker", mb, stats)
    finally:
        trainer.config.logprob_norm, trainer.config.eps_high = "token", 0.2
    assert m["agent/speaker/ratio_max"] == pytest.approx(max(expected), rel=1e-6)
    assert m["agent/speaker/ratio_mean"] == pytest.approx(np.mean(expected), rel=1e-6)


# --------------------------------------------------------------------------------------
# critic, warm-up, KL hard cut
# --------------------------------------------------------------------------------------


def test_critic_warmup_trains_only_the_critic():
    t = MARFTActionTrainer(tiny_config(critic_warmup_steps=1), policy=letter_policy())
    pol = snapshot(p for a in t.agents for p in t.policy.trainable_parameters(a))
    crit = snapshot(t.algorithm.critic.parameters())
    m = t.train_step()
    assert not changed(pol, [p for a in t.agents for p in t.policy.trainable_parameters(a)])
    assert changed(crit, t.algorithm.critic.parameters())
    assert m["agent/speaker/policy_updated"] == 0.0 and "agent/speaker/value_loss" in m
    m = t.train_step()  # warm-up over: the policy trains
    assert m["agent/speaker/policy_updated"] == 1.0
    assert changed(pol, [p for a in t.agents for p in t.policy.trainable_parameters(a)])


def test_shared_critic_by_default_per_agent_option():
    t = MARFTActionTrainer(tiny_config(), policy=letter_policy())
    heads = {a: {id(p) for p in t.algorithm.critic.vm.trainable_parameters(a)} for a in t.agents}
    assert heads["speaker"] == heads["listener"]
    t2 = MARFTActionTrainer(tiny_config(critic_per_agent=True), policy=letter_policy())
    heads = {a: {id(p) for p in t2.algorithm.critic.vm.trainable_parameters(a)} for a in t2.agents}
    assert not (heads["speaker"] & heads["listener"])


@pytest.mark.parametrize("algo", ["action", "token"])
def test_heterogeneous_team_with_the_default_shared_critic(algo):
    # two bases of different hidden sizes (64 and 32): one critic head per base
    from marft_algos.algos.marft_token import MARFTTokenConfig, MARFTTokenTrainer

    cls, cfg = (MARFTActionTrainer, tiny_config) if algo == "action" else (MARFTTokenTrainer, lambda **kw: MARFTTokenConfig(**echo_kwargs(**kw)))
    pol = TeamPolicy(list(AGENTS), base={"speaker": letter_model(), "listener": letter_model(seed=1, hidden=32, heads=2, kv_heads=1)})
    t = cls(cfg(), policy=pol)
    heads = t.algorithm.critic.vm.heads
    assert len(heads) == 2 and sorted(h.net[0].in_features for h in heads.values()) == [32, 64]
    crit = snapshot(t.algorithm.critic.parameters())
    m = t.train_step()
    assert changed(crit, t.algorithm.critic.parameters())
    assert all(math.isfinite(m[f"agent/{a}/value_loss"]) for a in AGENTS)


def test_kl_hard_cut_skips_the_policy_step_not_the_critic_and_logs_per_agent():
    # a tiny threshold: every step would move KL(old || new) past it, so each is undone after
    # the step (the trust region), epoch after epoch; the critic trains on regardless
    t = MARFTActionTrainer(tiny_config(ppo_epochs=2, kl_threshold=1e-9, lr=0.05, logprob_norm="sum"), policy=letter_policy())
    before = {a: snapshot(t.policy.trainable_parameters(a)) for a in t.agents}
    m = t.train_step()
    for a in t.agents:
        assert t.optimizer_steps[a] == 0  # both epochs' steps were undone
        assert not changed(before[a], t.policy.trainable_parameters(a))
        assert t.counters[f"agent/{a}/kl_cuts"] == 2
        assert m[f"agent/{a}/step_kl"] > 1e-9
    assert t.optimizer_steps[CRITIC_KEY] == 4  # 2 epochs x 2 agents: the critic never stops
    assert m["train/kl_cuts"] == 4


def test_kl_hard_cut_fires_at_the_defaults_after_a_step_too_large():
    # one epoch, one minibatch: the pre-step KL is 0 by construction, the post-step one is not;
    # a step past the threshold is undone (weights and Adam state), one within it is kept
    t = MARFTActionTrainer(tiny_config(kl_threshold=1e-12, lr=0.05), policy=letter_policy())
    assert t.config.ppo_epochs == 1 and t.config.num_minibatches == 1
    before = snapshot(t.policy.trainable_parameters("speaker"))
    m = t.train_step()
    assert m["agent/speaker/kl_cut"] == 1.0 and m["agent/speaker/kl"] < 1e-9 < m["agent/speaker/step_kl"]
    assert not changed(before, t.policy.trainable_parameters("speaker")) and t.optimizer_steps["speaker"] == 0
    assert not t.optimizers["speaker"].state  # Adam's moments are back to none
    loose = MARFTActionTrainer(tiny_config(kl_threshold=1e3, lr=0.05), policy=letter_policy())
    m = loose.train_step()
    assert m["agent/speaker/kl_cut"] == 0.0 and loose.optimizer_steps["speaker"] == 1


def test_old_logp_are_the_sampler_logprobs():
    """fp32: the sampler's log-probs are the behaviour policy's (no extra forward); they
    match the training forward, so an unmoved policy has ratio 1 and KL ~ 0."""
    t = MARFTActionTrainer(tiny_config(), policy=letter_policy())
    assert t.behaviour.sampler_exact()
    batch = t.collect()
    t.estimate(batch)
    t.behaviour.fill(batch, t.agents, reference=t.needs_reference())
    trs = [x for x in batch.transitions if x.trainable]
    assert trs and all(batch.estimates[x].old_logp == x.sampler_logprobs for x in trs)
    m = t.update(batch)
    for a in t.agents:
        assert m[f"agent/{a}/kl"] < 1e-9 and m[f"agent/{a}/action_kl"] < 1e-9
        assert m[f"agent/{a}/ratio_max"] == pytest.approx(1.0, abs=1e-4)


def test_kl_cut_fires_at_default_epochs_when_the_policy_moved_since_the_rollout():
    # one epoch, one minibatch (the MARFT defaults): the "old" log-probs are those of the
    # rollout policy, so a policy that moved between rollout and update is caught
    t = MARFTActionTrainer(tiny_config(kl_threshold=0.1), policy=letter_policy())
    assert t.config.ppo_epochs == 1 and t.config.num_minibatches == 1
    batch = t.collect()
    t.estimate(batch)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in t.policy.trainable_parameters("speaker"):
            p.add_(torch.randn(p.shape, generator=g))
    m = t.update(batch)
    assert m["agent/speaker/action_kl"] > 0.1 and m["agent/speaker/kl_cut"] == 1.0
    assert t.counters["agent/speaker/kl_cuts"] == 1 and t.optimizer_steps["speaker"] == 0
    assert m["agent/listener/kl_cut"] == 0.0 and t.optimizer_steps["listener"] == 1  # its adapter did not move
    assert t.optimizer_steps[CRITIC_KEY] == 2


@pytest.mark.parametrize("mode, source", [("shared", "sampler"), ("full", "sampler"), ("shared", "recomputed")])
def test_shared_parameters_second_agent_sees_the_first_agents_step(mode, source):
    # one adapter (or model) for both agents: the listener's old log-probs are from the
    # rollout, i.e. from before the speaker's step moved the shared parameters; under
    # bf16/fp16 autocast they are recomputed, still before any optimizer step
    # (no KL cut here: it would undo the speaker's step; kl_sample=0: no diagnostic passes to count)
    t = MARFTActionTrainer(tiny_config(mode=mode, kl_sample=0, lr=0.05, logprob_norm="sum"), policy=letter_policy(mode=mode))
    if source == "recomputed":
        t.behaviour.sampler_exact = lambda: False
    passes = []
    real = t.policy.sequence_logprobs

    def counting(*a, **kw):
        passes.append(torch.is_grad_enabled())
        return real(*a, **kw)

    t.policy.sequence_logprobs = counting
    m = t.train_step()
    assert passes.count(False) == (2 if source == "recomputed" else 0)  # old-log-prob passes, one per agent
    assert m["agent/speaker/kl"] < 1e-9
    assert m["agent/listener/kl"] > 1e-6  # the pre-step KL the cut reads sees the speaker's step


def test_agent_by_agent_rejects_agents_that_share_parameters():
    with pytest.raises(ConfigError, match="share"):
        MARFTActionTrainer(tiny_config(agent_by_agent=True, mode="full"), policy=letter_policy(mode="full"))
    with pytest.raises(ConfigError, match="share"):
        MARFTActionTrainer(tiny_config(agent_by_agent=True), policy=letter_policy(adapters={"speaker": "x", "listener": "x"}))


def test_kl_penalty_to_the_frozen_reference_in_full_mode():
    t = MARFTActionTrainer(tiny_config(mode="full", beta=0.1, lr=0.01), policy=letter_policy(mode="full"))
    first = t.train_step()
    second = t.train_step()
    assert first["agent/speaker/ref_kl"] < 1e-9  # nothing has moved yet
    assert first["agent/listener/ref_kl"] > 0  # one model: the speaker's step moved it
    for a in t.agents:
        assert second[f"agent/{a}/ref_kl"] > 0


def test_critic_lora_trains_its_own_adapter_and_not_the_policy_base():
    t = MARFTActionTrainer(tiny_config(critic_lora=True, critic_warmup_steps=1), policy=letter_policy())
    assert not t.algorithm.critic.can_cache  # the base under the critic changes: no hidden-state cache
    lora = snapshot(t.algorithm.critic.vm._critic_params)
    frozen = [p for n, p in t.policy.base_model("speaker").named_parameters() if "lora_" not in n]
    base = snapshot(frozen)
    t.train_step()
    assert changed(lora, t.algorithm.critic.vm._critic_params)
    assert not changed(base, frozen)


def test_docs_describe_every_config_field():
    """docs/algorithms.md names every algorithm-specific field of the four algorithms."""
    import dataclasses
    from pathlib import Path

    from marft_algos.config import TrainConfig
    from marft_algos.registry import get_algorithm

    page = (Path(__file__).resolve().parents[2] / "docs" / "algorithms.md").read_text()
    shared = {f.name for f in dataclasses.fields(TrainConfig)}
    missing = []
    for name in ("grpo", "ippo", "marft-action", "marft-token"):
        for f in dataclasses.fields(get_algorithm(name).config_cls):
            if f"`{f.name}`" not in page:
                missing.append(f"{name}.{f.name}")
    assert not missing, missing
    assert all(f"`{n}`" in page for n in shared)


def test_checkpoint_round_trip_restores_the_critic(tmp_path):
    t = MARFTActionTrainer(tiny_config(out_dir=str(tmp_path / "run")), policy=letter_policy())
    t.train_step()
    path = t.save_checkpoint()
    saved = snapshot(t.algorithm.critic.parameters())
    t.train_step()
    assert changed(saved, t.algorithm.critic.parameters())
    t.load_checkpoint(path)
    assert not changed(saved, t.algorithm.critic.parameters())
    assert t.global_step == 1


# --------------------------------------------------------------------------------------
# learning
# --------------------------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_marft_action_learns_echo():
    """Team reward rises from chance (1/|V| = 0.25) to well above it."""
    assert_learns_echo(MARFTActionTrainer, tiny_config)


def test_train_step_with_fewer_groups_reaches_the_critic_trainer():
    """MARFT's train_step (the collapse check around the runtime's) passes num_groups through."""
    t = MARFTActionTrainer(tiny_config(num_envs=4), policy=letter_policy())
    t.train_step(num_groups=1)
    assert len(t.last_batch.episodes) == 1 and t.global_step == 1
