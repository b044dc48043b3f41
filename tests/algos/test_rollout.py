"""The batched AEC rollout collector: loop semantics, token ids, rewards, groups."""

from __future__ import annotations

import re

import pytest

import marft_envs
from marft_algos.rollout import RolloutCollector

models = pytest.importorskip("marft_algos.models")


class ScriptedPolicy:
    """A policy without a model: char-level ids; ``say(role, prompt_text)`` picks the reply.

    Lets us assert exact env semantics (who is rewarded for what) independently of a
    model's randomness. ``calls`` records every generate batch.
    """

    def __init__(self, say):
        self.say = say
        self.calls: list[list] = []

    def encode(self, role, messages):
        text = "\n".join(f"<{m['role']}>{m['content']}" for m in messages)
        return [ord(c) for c in text]

    def generate(self, requests):
        self.calls.append(list(requests))
        out = []
        for r in requests:
            for _ in range(r.n):  # n samples of one prompt, consecutively (the policy's contract)
                text = self.say(r.role, "".join(chr(i) for i in r.prompt_ids))
                ids = [ord(c) for c in text] + [0]  # + "EOS"
                out.append(models.GenResult(token_ids=ids, text=text, logprobs=[-0.5] * len(ids), finish_reason="eos"))
        return out


def echo_fn(**kw):
    return lambda: marft_envs.make("echo-duo-v0", **kw)


def speaker_word(prompt: str) -> str | None:
    m = re.search(r"\[speaker\]: (\w+)", prompt)
    return m.group(1) if m else None


def test_aec_loop_over_many_envs_and_reward_attribution():
    # speaker says "red" always; the listener copies only when the problem lists "red" first
    def say(role, prompt):
        if role == "speaker":
            return "red"
        first = re.search(r"Vocabulary: (\w+)", prompt).group(1)
        return speaker_word(prompt) if first == "red" else "blue"

    policy = ScriptedPolicy(say)
    col = RolloutCollector(echo_fn(), policy, num_envs=6, group_size=1, seed=3)
    batch = col.collect()
    assert len(batch.episodes) == 6
    # all envs advanced in lock-step: one generate call per agent position, batched over envs
    assert [sum(r.n for r in c) for c in policy.calls] == [6, 6]
    assert {r.role for r in policy.calls[0]} == {"speaker"} and {r.role for r in policy.calls[1]} == {"listener"}
    for ep, env in zip(batch.episodes, col.envs, strict=True):
        assert not env.agents  # every episode ran to its end (dead steps included)
        assert ep.dead_steps == 2  # both agents were stepped with None after termination
        sp, li = ep.transitions
        assert (sp.agent, sp.index, li.agent, li.index) == ("speaker", 0, "listener", 1)
        correct = li.text == "red"
        # reward read right after the step: the speaker's action is not graded, the listener's is
        assert sp.reward == 0.0 and li.reward == float(correct)
        # the turn's team reward reaches every action of the turn, and each agent's credit
        assert sp.team_reward == li.team_reward == float(correct)
        assert sp.credited_reward == li.credited_reward == float(correct)
        assert ep.team_return == float(correct) and ep.correct is correct
        assert li.done and not sp.done  # the turn (and the episode) ends with the listener
    assert batch.metrics["team/reward"] == pytest.approx(sum(ep.team_return for ep in batch.episodes) / 6)
    assert batch.metrics["rollout/dead_steps"] == 12


def test_groups_share_problems_and_stream_is_seeded():
    policy = ScriptedPolicy(lambda role, prompt: "red")
    col = RolloutCollector(echo_fn(), policy, num_envs=8, group_size=4, seed=11)
    batch = col.collect()
    groups = batch.groups()
    assert len(groups) == 2 and all(len(g) == 4 for g in groups.values())
    for g in groups.values():
        assert len({ep.problem_id for ep in g}) == 1 and len({ep.seed for ep in g}) == 1
        # identical first prompts inside a group (what shared-prefill group generation relies on)
        first = [t.prompt_ids for ep in g for t in ep.transitions if t.index == 0]
        assert all(p == first[0] for p in first)
    # ... and they went to the policy as ONE request with n = G (one prefill)
    first_call = policy.calls[0]
    assert sorted(r.n for r in first_call) == [4, 4] and batch.metrics["rollout/shared_prefill_rows"] >= 6
    seeds = [ep.seed for ep in batch.episodes]
    # the problem stream is a function of the collector seed, and resumes from its state
    col2 = RolloutCollector(echo_fn(), policy, num_envs=8, group_size=4, seed=11)
    assert [ep.seed for ep in col2.collect().episodes] == seeds
    state = col.state_dict()
    nxt = [ep.seed for ep in col.collect().episodes]
    col2.load_state_dict(state)
    assert [ep.seed for ep in col2.collect().episodes] == nxt


def test_token_ids_kept_end_to_end_with_tiny_model():
    policy = models.TeamPolicy(["speaker", "listener"], base="tiny-random")
    seen = []
    real_generate = policy.generate

    def spy(requests):
        results = real_generate(requests)
        seen.extend(zip([r for r in requests for _ in range(r.n)], results, strict=True))
        return results

    policy.generate = spy
    env_fn = echo_fn()
    col = RolloutCollector(env_fn, policy, num_envs=4, group_size=2, seed=0, sampling_overrides={"speaker": {"max_new_tokens": 5}, "listener": {"max_new_tokens": 5}})
    batch = col.collect()
    # generation order = lock-step over envs: all first actions, then all second actions
    trs = [ep.transitions[k] for k in (0, 1) for ep in batch.episodes]
    assert len(batch.transitions) == len(seen) == 8
    for t, (req, res) in zip(trs, seen, strict=True):
        assert t.agent == req.role
        assert t.prompt_ids == list(req.prompt_ids)  # the exact context the tokens were sampled in
        assert t.response_ids == list(res.token_ids)  # the exact sampled ids, no re-tokenisation
        assert len(t.sampler_logprobs) == len(t.response_ids) and len(t.response_ids) <= 5
        assert t.text == res.text
    # the prompt ids are the chat-templated messages of that agent
    env = env_fn()
    env.reset(seed=batch.episodes[0].seed)
    assert trs[0].prompt_ids == policy.encode("speaker", env.messages("speaker"))


def test_overlong_prompts_are_counted_not_truncated():
    policy = ScriptedPolicy(lambda role, prompt: "red")
    col = RolloutCollector(echo_fn(), policy, num_envs=2, seed=0, max_context=50)
    batch = col.collect()
    assert batch.metrics["rollout/overlong"] == 4  # every prompt is longer than 50 chars
    for t in batch.transitions:
        assert not t.trainable and t.finish_reason == "overlong" and "context_overflow" in t.flags
        assert len(t.prompt_ids) > 50  # the prompt is kept whole, never cut
    assert policy.calls == []


def test_dynamic_topology_follows_the_env():
    # arith-routed-v0: an orchestrator routes each problem to ONE specialist
    env_fn = lambda: marft_envs.make("arith-routed-v0")  # noqa: E731
    agents = env_fn().possible_agents
    specialists = [a for a in agents if a != agents[0]]

    def say(role, prompt):
        if role == agents[0]:
            return "ROUTE: " + specialists[sum(map(ord, prompt)) % len(specialists)]  # prompt-dependent route
        return "42"

    col = RolloutCollector(env_fn, ScriptedPolicy(say), num_envs=6, seed=5)
    batch = col.collect()
    executed_sets = set()
    for ep in batch.episodes:
        order = [t.agent for t in ep.transitions]
        graded = [t for t in ep.transitions if "executed" in t.info]
        assert graded, "the turn was graded"
        assert order == graded[-1].info["executed"]  # we followed agent_iter exactly
        executed_sets.add(tuple(order))
    assert len(executed_sets) >= 2  # different routes in different envs of one batch


def test_train_vs_eval_sampling_settings():
    env = echo_fn()()
    env.team.profiles["speaker"].sampling.update({"temperature": 0.9, "max_new_tokens": 7})
    env.team.profiles["speaker"].eval_sampling.update({"temperature": 0.1})
    col = RolloutCollector(lambda: env, ScriptedPolicy(lambda r, p: "red"), num_envs=1, sampling_overrides={"speaker": {"top_p": 0.5}})
    assert col.sampling_settings(env, "speaker") == {"temperature": 0.9, "max_new_tokens": 7, "top_p": 0.5}
    col_eval = RolloutCollector(lambda: env, ScriptedPolicy(lambda r, p: "red"), num_envs=1, mode="eval")
    assert col_eval.sampling_settings(env, "speaker") == {"temperature": 0.1}


# --------------------------------------------------------------------------------------
# concurrent env stepping (grading) within a generation round
# --------------------------------------------------------------------------------------


class SlowEnv:
    """Delegates to a real env; ``step`` sleeps (a grader running a program) and records
    how many steps of different envs overlapped."""

    active = 0
    peak = 0

    def __init__(self, env, lock, delay: float = 0.05):
        self.__dict__.update(_env=env, _lock=lock, _delay=delay)

    def __getattr__(self, name):
        return getattr(self._env, name)

    def step(self, action):
        import time

        with self._lock:
            SlowEnv.active += 1
            SlowEnv.peak = max(SlowEnv.peak, SlowEnv.active)
        try:
            time.sleep(self._delay)
            self._env.step(action)
        finally:
            with self._lock:
                SlowEnv.active -= 1


def _records(batch):
    return [
        (t.episode_id, t.group_id, t.index, t.turn, t.agent, t.prompt_ids, t.response_ids, t.sampler_logprobs, t.text, t.finish_reason,
         t.reward, t.credited_reward, t.team_reward, t.done, t.flags, t.info, t.trainable)
        for t in batch.transitions
    ] + [(ep.episode_id, ep.team_return, ep.correct, ep.problem_id, ep.dead_steps) for ep in batch.episodes]


@pytest.mark.parametrize("env_id", ["echo-duo-v0", "arith-duo-v0"])
def test_concurrent_stepping_gives_the_records_of_serial_stepping(env_id):
    import torch

    sampling = {a: {"max_new_tokens": 4} for a in marft_envs.make(env_id).possible_agents}
    out = {}
    for workers in (1, 8):
        policy = models.TeamPolicy(marft_envs.make(env_id).possible_agents, base="tiny-random")
        col = RolloutCollector(lambda: marft_envs.make(env_id), policy, num_envs=8, group_size=2, seed=4, sampling_overrides=sampling,
                               step_workers=workers)
        torch.manual_seed(0)
        batches = [col.collect() for _ in range(2)]
        out[workers] = ([_records(b) for b in batches], [{k: v for k, v in b.metrics.items() if not k.startswith("perf/")} for b in batches])
    assert out[1] == out[8]


def test_envs_of_a_round_are_stepped_concurrently_and_in_order():
    import threading

    lock = threading.Lock()
    SlowEnv.active = SlowEnv.peak = 0
    # the listener's prompt (300 chars) does not fit, the speaker's (250) does: overlong
    # steps are part of the concurrent round too
    kw = dict(num_envs=6, seed=2, max_context=280)
    serial = RolloutCollector(lambda: SlowEnv(marft_envs.make("echo-duo-v0"), lock), ScriptedPolicy(lambda r, p: "red"), step_workers=1, **kw)
    a = serial.collect()
    assert SlowEnv.peak == 1
    conc = RolloutCollector(lambda: SlowEnv(marft_envs.make("echo-duo-v0"), lock), ScriptedPolicy(lambda r, p: "red"), step_workers=4, **kw)
    b = conc.collect()
    assert SlowEnv.peak > 1  # envs of one round overlapped (at most 4 at a time)
    assert SlowEnv.peak <= 4
    assert _records(a) == _records(b)
    assert b.metrics["rollout/overlong"] == 6 and not any(t.trainable for t in b.transitions if t.agent == "listener")
    with pytest.raises(ValueError, match="step_workers"):
        RolloutCollector(echo_fn(), ScriptedPolicy(lambda r, p: "red"), num_envs=1, step_workers=0)


# --------------------------------------------------------------------------------------
# per-agent reward metrics and the route_unparsed rate (issue 28 item 23)
# --------------------------------------------------------------------------------------

MULTIHOP = {
    "profiles": [{"role": "planner", "prompt": "Plan, then answer.", "with_answer": True},
                 {"role": "solver", "prompt": "Solve."}],
    "topology": {"type": "multihop", "orchestrator": "planner", "specialists": ["solver"], "max_hops": 2},
}


def test_agent_reward_is_the_team_reward_for_every_role_however_many_calls():
    # the planner speaks twice per episode (route, then answer), the solver once: one team reward
    def say(role, prompt):
        if role == "planner" and "[solver]" not in prompt:
            return "ROUTE: solver"
        return "42"

    env_fn = lambda: marft_envs.make("arith-duo-v0", profiles=MULTIHOP, reward={"format": 1.0})  # noqa: E731
    batch = RolloutCollector(env_fn, ScriptedPolicy(say), num_envs=4, seed=1).collect()
    m = batch.metrics
    assert all([t.agent for t in ep.transitions] == ["planner", "solver", "planner"] for ep in batch.episodes)
    assert m["team/reward"] >= 1.0  # "42" always parses: format 1, plus outcome when right
    assert m["agent/planner/reward"] == pytest.approx(m["team/reward"])
    assert m["agent/solver/reward"] == pytest.approx(m["team/reward"])
    # the per-call credit, separately named: the planner's first call earns nothing
    assert m["agent/planner/credit"] == pytest.approx(m["team/reward"] / 2)
    assert m["agent/solver/credit"] == pytest.approx(m["team/reward"])


def test_agent_reward_averages_over_the_episodes_the_agent_acted_in():
    from marft_algos.records import Episode, Transition
    from marft_algos.rollout import agent_reward_metrics

    def tr(ep: int, i: int, agent: str, credit: float) -> Transition:
        t = Transition(episode_id=ep, group_id=ep, index=i, turn=0, agent=agent, prompt_ids=[1], response_ids=[2],
                       sampler_logprobs=[0.0], temperature=1.0, text="x", finish_reason="eos", reward=0.0, done=False)
        t.credited_reward = credit
        return t

    # episode 0: router -> a (reward 1); episode 1: router -> b (reward 0); a never acted in episode 1
    e0 = Episode(episode_id=0, group_id=0, seed=0, transitions=[tr(0, 0, "router", 1.0), tr(0, 1, "a", 1.0)], team_return=1.0)
    e1 = Episode(episode_id=1, group_id=1, seed=0, transitions=[tr(1, 0, "router", 0.0), tr(1, 1, "b", 0.0)], team_return=0.0)
    m = agent_reward_metrics([e0, e1])
    assert m["agent/router/reward"] == 0.5 and m["agent/a/reward"] == 1.0 and m["agent/b/reward"] == 0.0


def test_routed_team_logs_its_route_unparsed_rate():
    env_fn = lambda: marft_envs.make("arith-routed-v0")  # noqa: E731
    agents = env_fn().possible_agents
    specialists = agents[1:]

    def say(role, prompt):
        return "ROUTE: " + specialists[0] if role == agents[0] else "42"

    batch = RolloutCollector(env_fn, ScriptedPolicy(say), num_envs=4, seed=5).collect()
    assert batch.metrics["team/route_unparsed"] == 0.0  # logged every step for a routed team, 0 when all parsed

    seen = []

    def say_badly(role, prompt):  # every other orchestrator reply has an unreadable route line
        if role == agents[0]:
            seen.append(1)
            return "ROUTE: nonsense" if len(seen) % 2 else "ROUTE: " + specialists[0]
        return "42"

    batch = RolloutCollector(env_fn, ScriptedPolicy(say_badly), num_envs=4, seed=5).collect()
    flagged = sum(any("route_unparsed" in t.flags for t in ep.transitions) for ep in batch.episodes)
    assert flagged == 2
    assert batch.metrics["team/route_unparsed"] == pytest.approx(flagged / 4)
    # a static team logs no routing rate
    chain = RolloutCollector(echo_fn(), ScriptedPolicy(lambda r, p: "red"), num_envs=2, seed=3).collect()
    assert "team/route_unparsed" not in chain.metrics
