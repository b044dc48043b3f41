"""Continuous batching in the ``hf`` engine (``generate_stream``) and the collector using it.

The reference is the round-based path (``generate``, the collector's lock-step rounds):
greedy tokens must be identical and log-probs equal up to float rounding (1e-5), since a
row's inputs (its prompt, positions and the tokens it attends to) do not change when its
batch companions do.
"""

from __future__ import annotations

import pytest
import torch
from helpers.policies import perturb

import marft_envs
from marft_algos.engines import GenerationEngine
from marft_algos.engines.hf import HFEngine
from marft_algos.models import GenRequest, SamplingParams, TeamPolicy
from marft_algos.rollout import RolloutCollector

ROLES = ["planner", "solver"]




@pytest.fixture(scope="module")
def policy() -> TeamPolicy:
    pol = TeamPolicy(ROLES, base="tiny-random", max_context=256)
    perturb(pol)  # distinct adapters: a row decoded with the wrong one would show
    return pol


def _prompt(policy: TeamPolicy, role: str, text: str) -> list[int]:
    return policy.encode(role, [{"role": "user", "content": text}])


def _ragged(policy: TeamPolicy, sampling: dict) -> list[GenRequest]:
    """Both roles, prompts of different lengths, different max_new_tokens (rows leave at different steps)."""
    return [
        GenRequest(r, _prompt(policy, r, f"question {i} " + "word " * (3 * i)), SamplingParams(max_new_tokens=3 + 4 * i, **sampling))
        for i, r in enumerate(ROLES * 3)
    ]


def _stream(policy: TeamPolicy, items, follow=None, seed=None):
    """Run ``generate_stream``; ``follow[key]`` = the follow-ups to submit when ``key`` finishes.
    Returns ({key: result}, keys in finishing order)."""
    got, order = {}, []

    def on_done(key, res):
        got[key] = res
        order.append(key)
        return (follow or {}).get(key)

    policy.generate_stream(items, on_done, seed=seed)
    return got, order


def _assert_same(a, b, atol=1e-5):
    assert a.token_ids == b.token_ids
    assert a.finish_reason == b.finish_reason and a.text == b.text
    assert len(a.logprobs) == len(b.logprobs)
    assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=atol, rtol=0)


def test_greedy_stream_equals_round_based_generate_for_mixed_roles_and_ragged_lengths(policy):
    reqs = _ragged(policy, {"greedy": True})
    ref = policy.generate(reqs)
    got, order = _stream(policy, list(enumerate(reqs)))
    assert sorted(got) == list(range(len(reqs)))
    for i, r in enumerate(ref):
        _assert_same(got[i], r)
    # rows finish when their own budget runs out, not with the batch
    assert order.index(0) < order.index(5)


def test_a_request_that_joins_mid_batch_gets_its_greedy_output_alone(policy):
    greedy = {"greedy": True}
    long_ = GenRequest("planner", _prompt(policy, "planner", "a long running question " * 3), SamplingParams(max_new_tokens=24, **greedy))
    short = GenRequest("solver", _prompt(policy, "solver", "short"), SamplingParams(max_new_tokens=2, **greedy))
    joiner = GenRequest("solver", _prompt(policy, "solver", "I join while the planner is still decoding"), SamplingParams(max_new_tokens=6, **greedy))
    got, order = _stream(policy, [("long", long_), ("short", short)], follow={"short": [("joiner", joiner)]})
    # the joiner started after "short" and finished before "long": it ran inside the running batch
    assert order == ["short", "joiner", "long"]
    _assert_same(got["joiner"], policy.generate([joiner])[0])
    _assert_same(got["long"], policy.generate([long_])[0])
    _assert_same(got["short"], policy.generate([short])[0])


def test_a_small_max_batch_queues_requests_and_keeps_the_results(policy):
    reqs = _ragged(policy, {"greedy": True})
    ref = policy.generate(reqs)
    old = policy.max_batch
    policy.max_batch = 2
    try:
        got, _ = _stream(policy, list(enumerate(reqs)))
    finally:
        policy.max_batch = old
    for i, r in enumerate(ref):
        _assert_same(got[i], r)


def test_identical_prompts_joining_together_are_prefilled_once(policy):
    p = _prompt(policy, "solver", "the same problem for the whole group")
    sp = SamplingParams(greedy=True, max_new_tokens=4)
    before = policy.stats["prefill_shared"]
    got, _ = _stream(policy, [(k, GenRequest("solver", p, sp)) for k in range(4)])
    assert policy.stats["prefill_shared"] - before == 3
    ref = policy.generate([GenRequest("solver", p, sp)])[0]
    for k in range(4):
        _assert_same(got[k], ref)


def test_sampled_stream_reports_the_sampled_ids_with_the_trainers_logprobs_and_is_seeded(policy):
    reqs = _ragged(policy, {"temperature": 0.8, "top_p": 0.9})
    follow = {0: [("f", GenRequest("solver", _prompt(policy, "solver", "follow-up"), SamplingParams(temperature=0.8, max_new_tokens=7)))]}
    got, _ = _stream(policy, list(enumerate(reqs)), follow=follow, seed=11)
    again, _ = _stream(policy, list(enumerate(reqs)), follow=follow, seed=11)
    assert {k: v.token_ids for k, v in got.items()} == {k: v.token_ids for k, v in again.items()}
    flat = list(enumerate(reqs)) + follow[0]
    for role in ROLES:
        rows = [(req, got[k]) for k, req in flat if req.role == role]
        stats = policy.sequence_logprobs(role, [q.prompt_ids for q, _ in rows], [r.token_ids for _, r in rows], temperature=0.8)
        for i, (_, res) in enumerate(rows):
            n = len(res.token_ids)
            assert n > 0
            assert torch.allclose(stats.logprobs[i, :n], torch.tensor(res.logprobs), atol=1e-4)


def test_stream_refuses_n_and_finishes_overlong_requests_at_once(policy):
    sp = SamplingParams(greedy=True, max_new_tokens=3)
    with pytest.raises(ValueError, match="one sample per request.*submit n requests"):
        policy.generate_stream([(0, GenRequest("solver", [1, 2, 3], sp, n=2))], lambda k, r: None)
    too_long = GenRequest("solver", [5] * 250, SamplingParams(max_new_tokens=10))  # 260 > max_context 256
    nothing = GenRequest("solver", [5, 6], SamplingParams(max_new_tokens=0))
    got, _ = _stream(policy, [("long", too_long), ("zero", nothing)])
    assert (got["long"].finish_reason, got["long"].token_ids) == ("context", [])
    assert (got["zero"].finish_reason, got["zero"].token_ids) == ("length", [])


def test_the_interfaces_round_based_default_gives_the_same_greedy_results(policy):
    class Rounds(HFEngine):
        generate_stream = GenerationEngine.generate_stream  # the default: rounds of generate()

    reqs = _ragged(policy, {"greedy": True})
    follow = {1: [("f", GenRequest("planner", _prompt(policy, "planner", "next"), SamplingParams(greedy=True, max_new_tokens=5)))]}
    cont, _ = _stream(policy, list(enumerate(reqs)), follow=follow)
    rounds, order = {}, []

    def on_done(key, res):
        rounds[key] = res
        order.append(key)
        return follow.get(key)

    Rounds(policy).generate_stream(list(enumerate(reqs)), on_done)
    assert order == [0, 1, 2, 3, 4, 5, "f"]  # a round's callbacks in submission order
    for k, r in rounds.items():
        _assert_same(cont[k], r)


def _records(batch):
    return [
        (t.episode_id, t.group_id, t.index, t.turn, t.agent, t.prompt_ids, t.response_ids, t.text, t.finish_reason,
         t.reward, t.credited_reward, t.team_reward, t.done, t.flags, t.info, t.trainable)
        for t in batch.transitions
    ] + [(ep.episode_id, ep.team_return, ep.correct, ep.problem_id, ep.dead_steps) for ep in batch.episodes]


@pytest.mark.parametrize("env_id", ["arith-duo-v0", "echo-duo-v0"])
def test_collector_with_continuous_batching_plays_the_same_greedy_episodes(env_id):
    agents = marft_envs.make(env_id).possible_agents
    sampling = {a: {"greedy": True, "max_new_tokens": 3 + 3 * k} for k, a in enumerate(agents)}
    out = {}
    for continuous in (False, True):
        policy = TeamPolicy(agents, base="tiny-random")
        perturb(policy)
        col = RolloutCollector(lambda: marft_envs.make(env_id), policy, num_envs=6, group_size=2, seed=4,
                               sampling_overrides=sampling, continuous_batching=continuous)
        out[continuous] = [col.collect() for _ in range(2)]
    for off, on in zip(out[False], out[True], strict=True):
        assert _records(on) == _records(off)  # transitions, rewards, and the agent order D
        for a, b in zip(on.transitions, off.transitions, strict=True):
            assert torch.allclose(torch.tensor(a.sampler_logprobs), torch.tensor(b.sampler_logprobs), atol=1e-5, rtol=0)
        metrics = {k for k in off.metrics if not k.startswith("perf/") and k != "rollout/shared_prefill_rows"}
        assert {k: on.metrics.get(k) for k in metrics} == {k: off.metrics[k] for k in metrics}


def test_join_fraction_decides_when_queued_requests_join(policy):
    greedy = {"greedy": True}
    longs = [(f"long{k}", GenRequest("planner", _prompt(policy, "planner", f"long question {k} " * 3), SamplingParams(max_new_tokens=20, **greedy)))
             for k in range(3)]
    short = ("short", GenRequest("solver", _prompt(policy, "solver", "short"), SamplingParams(max_new_tokens=2, **greedy)))
    follow = {"short": [("joiner", GenRequest("solver", _prompt(policy, "solver", "joiner"), SamplingParams(max_new_tokens=4, **greedy)))]}
    orders, results = {}, {}
    try:
        for fraction in (0.0, 1.0):
            policy.engine.join_fraction = fraction
            results[fraction], orders[fraction] = _stream(policy, [*longs, short], follow=follow)
    finally:
        policy.engine.join_fraction = 0.25
    assert orders[0.0][:2] == ["short", "joiner"]  # joins at the next step
    # 1 waiting < 1.0 x running rows: it joins once a single long row is left
    assert orders[1.0].index("joiner") > sorted(orders[1.0].index(f"long{k}") for k in range(3))[1]
    for key in results[0.0]:
        _assert_same(results[0.0][key], results[1.0][key])
    with pytest.raises(ValueError, match="join_fraction"):
        HFEngine(policy, join_fraction=1.5)


def test_the_collector_takes_continuous_batching_from_the_engine_options():
    from marft_algos.config import TrainConfig

    TrainConfig(engine_options={"continuous_batching": True, "join_fraction": 0.5})  # accepted options
    policy = TeamPolicy(["speaker", "listener"], base="tiny-random")
    assert not RolloutCollector(lambda: marft_envs.make("echo-duo-v0"), policy, num_envs=2).continuous_batching
    policy.engine = HFEngine(policy, continuous_batching=True)
    assert RolloutCollector(lambda: marft_envs.make("echo-duo-v0"), policy, num_envs=2).continuous_batching
    assert not RolloutCollector(lambda: marft_envs.make("echo-duo-v0"), policy, num_envs=2, continuous_batching=False).continuous_batching
