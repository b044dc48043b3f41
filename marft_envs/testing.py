"""Conformance checking for marft environments.

:func:`check_env` is what the test suite runs over every registered id, and
what a third party should run over its own envs::

    from marft_envs.testing import check_env
    check_env("my_pkg:mytask-duo-v0")

It checks the PettingZoo AEC contract, spaces, seeding, pickling, bad actions
and the info contract of :class:`~marft_envs.text_env.TextTeamEnv`, then runs
PettingZoo's own ``api_test`` and ``seed_test``. A failure raises
``AssertionError`` with a message naming the env and the broken rule.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import pickle
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium.utils.env_checker import data_equivalence

from marft_envs.registration import make
from marft_envs.spaces import UnicodeText

__all__ = [
    "BAD_ACTIONS",
    "GRADED_INFO_KEYS",
    "PROGRAM_BUG_FLAGS",
    "EnvContractError",
    "check_env",
    "check_step_output",
    "random_episode",
]

#: Keys every agent's info has after a graded turn (docs/design/contracts.md).
GRADED_INFO_KEYS = frozenset({"team_reward", "reward_components", "attribution", "grade", "flags", "turn"})

#: Actions a live agent may send that must never raise.
BAD_ACTIONS: tuple[Any, ...] = (
    None,
    "",
    "   \n\t ",
    "x" * 1_000_000,
    b"\x00\xff\xfe binary \x00" * 64,
    "\x00\x01\x02\x7f\x1b[31m",
    "\ud800 lone surrogate \udfff",
    12345,
    3.5,
    ["not", "text"],
    "\\boxed{" * 3000,
    "{" * 20_000 + "}" * 5,
    "\\frac{" * 2000 + "1" + "}" * 2000,
    "\\boxed{\\boxed{\\boxed{1}}}}}}} \\sqrt{-1}^{10^{10^{10}}} 9" * 50,
    "ROUTE: " * 3000,
)


#: Flags of a workflow program that misuses ``team.call`` whatever the model answers
#: (a role outside ``roles``, malformed messages, a foreign await, concurrent calls):
#: :func:`check_env` fails an env that raises one of them on every episode.
PROGRAM_BUG_FLAGS = frozenset({"unknown_role", "bad_messages", "foreign_await", "concurrent_calls"})


class EnvContractError(ValueError):
    """An env's step output breaks the AEC reward/info contract (names the env class)."""


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def check_step_output(
    env: Any,
    agent: str | None = None,
    *,
    previous_cumulative: dict[str, float] | None = None,
) -> None:
    """Check what any AEC env reports right after ``env.step``; raise :class:`EnvContractError`.

    For a collector to call after every step of an env it did not write, so that a broken
    third-party env fails loudly instead of training on zeros or NaN:

    * ``env.rewards`` is a dict of finite real numbers (not bools) with an entry for every
      live agent, and every agent in it is also in ``env._cumulative_rewards`` (finite);
    * ``env.infos`` holds a dict for every live agent;
    * given ``previous_cumulative`` (a copy of ``env._cumulative_rewards`` taken just before
      the step) and ``agent`` (the agent that stepped), each nonzero reward is accumulated:
      ``_cumulative_rewards[a]`` is ``rewards[a]`` plus ``a``'s previous value (or plus 0 for
      ``agent``, whose total PettingZoo resets when it acts). A reward left only in
      ``env.rewards`` (``_accumulate_rewards()`` never called) would reach ``last()`` as 0.

    Example::

        before = dict(env._cumulative_rewards)
        env.step(action)
        check_step_output(env, agent, previous_cumulative=before)
    """
    name = type(getattr(env, "unwrapped", env)).__name__
    where = f"{name}" + (f" after {agent!r} stepped" if agent is not None else "")

    def fail(msg: str) -> None:
        raise EnvContractError(f"{where}: {msg}")

    rewards = getattr(env, "rewards", None)
    if not isinstance(rewards, dict):
        fail(f"env.rewards must be a dict of agent -> float, got {type(rewards).__name__}")
    cumulative = getattr(env, "_cumulative_rewards", None)
    if not isinstance(cumulative, dict):
        fail("env._cumulative_rewards is missing: call self._accumulate_rewards() in step() "
             "(PettingZoo's AECEnv keeps it; last() reads rewards from it)")
    infos = getattr(env, "infos", None)
    live = list(getattr(env, "agents", []) or [])
    for a in live:
        if a not in rewards:
            fail(f"live agent {a!r} has no entry in env.rewards")
        if not isinstance(infos, dict) or not isinstance(infos.get(a), dict):
            fail(f"live agent {a!r} has no info dict in env.infos")
    for a, r in rewards.items():
        if not _is_real(r):
            fail(f"env.rewards[{a!r}] = {r!r} ({type(r).__name__}) is not a real number")
        if not math.isfinite(float(r)):
            fail(f"env.rewards[{a!r}] = {r!r} is not finite; an update on it would be skipped or "
                 "poison the weights")
        if a not in cumulative:
            fail(f"env.rewards has {a!r}, env._cumulative_rewards has not: the reward never "
                 "reaches last(); call self._accumulate_rewards() in step()")
        c = cumulative[a]
        if not (_is_real(c) and math.isfinite(float(c))):
            fail(f"env._cumulative_rewards[{a!r}] = {c!r} is not a finite real number")
        if previous_cumulative is not None and float(r) != 0.0:
            base = float(previous_cumulative.get(a, 0.0))
            expected = {float(r) + base} | ({float(r)} if a == agent else set())
            if not any(math.isclose(float(c), e, rel_tol=1e-9, abs_tol=1e-9) for e in expected):
                fail(f"env._cumulative_rewards[{a!r}] = {c!r} is not the accumulated reward: the "
                     f"total before the step ({base!r}) plus env.rewards[{a!r}] = {r!r}; call "
                     "self._clear_rewards() at the start of step() and self._accumulate_rewards() "
                     "at its end, or last() reports the wrong reward")


# A step slower than this is treated as a hang.
_STEP_SECONDS = 60.0


class _Fail:
    def __init__(self, name: str):
        self.name = name

    def __call__(self, cond: Any, msg: str) -> None:
        if not cond:
            raise AssertionError(f"[check_env {self.name}] {msg}")


def _action_for(env: Any, agent: str, rng: np.random.Generator, sampler: UnicodeText, oracle: float) -> Any:
    """A random action; with probability ``oracle`` the gold answer, so success paths run too."""
    problem = getattr(env, "problem", None)
    if problem is not None and rng.random() < oracle and getattr(problem, "answer", ""):
        return f"The answer is \\boxed{{{problem.answer}}}"
    return sampler.sample()


def random_episode(
    env: Any,
    seed: int,
    *,
    actions: list[Any] | None = None,
    oracle: float = 0.3,
    fail: Callable[[Any, str], None] | None = None,
    reset: bool = True,
) -> list[tuple]:
    """Play one episode with random (or given) actions, checking the AEC contract at every step.

    Returns the trace ``[(agent, obs, reward, terminated, truncated, info, action), ...]``.
    """
    fail = fail or _Fail(str(env))
    rng = np.random.default_rng(seed)
    sampler = UnicodeText(getattr(env, "max_action_chars", 256), seed=seed)
    if reset:
        env.reset(seed=seed)
    horizon = int(getattr(env, "horizon", 1))
    max_iters = 4 * (horizon + 1) * max(1, len(env.possible_agents)) + 8
    pending: dict[str, float] = {a: float(env._cumulative_rewards.get(a, 0.0)) for a in env.agents}
    finished: set[str] = set()
    trace: list[tuple] = []
    given = list(actions) if actions is not None else None
    for i, agent in enumerate(env.agent_iter(max_iters)):
        fail(agent == env.agent_selection, "agent_iter() must yield env.agent_selection")
        fail(agent in env.agents, f"agent {agent!r} is selected but not in env.agents")
        fail(agent not in finished, f"agent {agent!r} acted again after its dead step")
        obs, reward, term, trunc, info = env.last()
        fail(env.observation_space(agent).contains(obs), f"observation of {agent!r} outside its space: {str(obs)[:200]!r}")
        fail(env.observation_space(agent) is env.observation_space(agent), "observation_space must be cached per agent")
        fail(env.action_space(agent) is env.action_space(agent), "action_space must be cached per agent")
        fail(isinstance(term, bool) and isinstance(trunc, bool), "terminated/truncated from last() must be bool")
        fail(term == env.terminations[agent] and trunc == env.truncations[agent], "last() disagrees with terminations/truncations")
        fail(isinstance(info, dict), "info must be a dict")
        fail(math.isfinite(float(reward)), f"non-finite reward {reward!r}")
        fail(
            math.isclose(float(reward), pending.get(agent, 0.0), abs_tol=1e-9),
            f"last() reward {reward} of {agent!r} is not its accumulated reward {pending.get(agent, 0.0)}",
        )
        pending[agent] = 0.0
        if term or trunc:
            action = None
            finished.add(agent)
        elif given is not None:
            fail(i < len(given), "replayed episode is longer than the recorded one")
            action = given[i]
        else:
            action = _action_for(env, agent, rng, sampler, oracle)
            fail(env.action_space(agent).contains(action), "sampled action outside the action space")
        trace.append((agent, copy.deepcopy(obs), float(reward), term, trunc, copy.deepcopy(info), action))
        before = dict(env._cumulative_rewards)
        start = time.monotonic()
        out = env.step(action)
        fail(time.monotonic() - start < _STEP_SECONDS, f"step took over {_STEP_SECONDS}s (a hang)")
        fail(out is None, "step() must return None")
        try:
            check_step_output(env, agent, previous_cumulative=before)
        except EnvContractError as e:
            fail(False, str(e))
        keys = set(env.agents)
        for d in ("rewards", "terminations", "truncations", "infos", "_cumulative_rewards"):
            fail(set(getattr(env, d)) == keys, f"keys of env.{d} {sorted(getattr(env, d))} != agents {sorted(keys)}")
        fail(set(env.agents) <= set(env.possible_agents), "agents must be a subset of possible_agents")
        for a, r in env.rewards.items():
            fail(isinstance(r, (int, float, np.floating)) and math.isfinite(float(r)), f"reward of {a!r} is {r!r}")
            pending[a] = pending.get(a, 0.0) + float(r)
        if action is not None and agent in env.infos and "team_reward" in env.infos[agent]:
            _check_graded_infos(env, fail)  # this action completed a graded turn
    fail(not env.agents, f"episode did not end within {max_iters} steps (horizon {horizon})")
    return trace


def _program_bugs(trace: list[tuple]) -> tuple[set[str], str] | None:
    """The :data:`PROGRAM_BUG_FLAGS` an episode's infos carry, and the first message that
    explains them (``rejected_calls`` or ``error``); None when there are none."""
    flags: set[str] = set()
    detail = ""
    for *_, info, _action in trace:
        if not isinstance(info, dict):
            continue
        flags |= PROGRAM_BUG_FLAGS & set(info.get("flags") or [])
        if not detail:
            rejected = info.get("rejected_calls") or []
            detail = str(rejected[0]) if rejected else ""
        if not detail and flags and info.get("error"):
            detail = str(info["error"])[:300]
    return (flags, detail) if flags else None


def _check_graded_infos(env: Any, fail: Callable[[Any, str], None]) -> None:
    for a in env.agents:
        info = env.infos[a]
        missing = GRADED_INFO_KEYS - set(info)
        fail(not missing, f"info of {a!r} after a graded turn lacks {sorted(missing)}")
        fail(isinstance(info["flags"], list), "info['flags'] must be a list")
        fail(
            math.isclose(float(env.rewards[a]), float(info["team_reward"]), abs_tol=1e-9),
            f"rewards[{a!r}] {env.rewards[a]} != info team_reward {info['team_reward']}",
        )
        fail(
            math.isclose(sum(info["reward_components"].values()), info["team_reward"], abs_tol=1e-6),
            "reward components do not sum to the team reward",
        )
        fail(set(info["attribution"]) <= set(env.possible_agents), "attribution names unknown agents")
        share = sum(info["attribution"].values())
        fail(math.isclose(share, 1.0, abs_tol=1e-6), f"attribution shares sum to {share}, not 1")
        fail(isinstance(info["grade"], dict) and "correct" in info["grade"], "info['grade'] must be GradeResult fields")


def _compare(fail: Callable[[Any, str], None], t1: list[tuple], t2: list[tuple], what: str) -> None:
    fail(len(t1) == len(t2), f"{what}: episodes differ in length ({len(t1)} vs {len(t2)})")
    fields = ("agent", "observation", "reward", "terminated", "truncated", "info", "action")
    for step, (a, b) in enumerate(zip(t1, t2, strict=True)):
        for name, x, y in zip(fields, a, b, strict=True):
            fail(data_equivalence(x, y), f"{what}: {name} differs at step {step}: {str(x)[:120]!r} vs {str(y)[:120]!r}")


def check_env(
    env_or_id: Any,
    n_episodes: int = 3,
    seed: int = 0,
    *,
    pettingzoo_checks: bool = True,
    bad_actions: bool = True,
    **make_kwargs: Any,
) -> None:
    """Check an env (or a registered id, made with ``make_kwargs``) against the marft and PettingZoo contracts.

    Raises:
        AssertionError: naming the env and the first rule it breaks.
    """
    if isinstance(env_or_id, str):
        env_id = env_or_id

        def factory() -> Any:
            return make(env_id, **make_kwargs)
    else:
        if make_kwargs:
            raise TypeError("make_kwargs apply only when an env id is given")
        proto = copy.deepcopy(env_or_id)

        def factory() -> Any:
            return copy.deepcopy(proto)

    env = factory()
    fail = _Fail(env_or_id if isinstance(env_or_id, str) else str(env))

    # Spaces and reset.
    fail(len(env.possible_agents) > 0, "possible_agents is empty")
    env.reset(seed=seed)
    fail(list(env.agents) == list(env.possible_agents), "after reset, agents must equal possible_agents")
    fail(not any(env.terminations.values()) and not any(env.truncations.values()), "terminated right after reset")
    fail(env.agent_selection in env.agents, "agent_selection is not an agent after reset")
    fail(env.last(observe=False)[0] is None, "last(observe=False) must return None as observation")
    for a in env.possible_agents:
        space = env.observation_space(a)
        fail(space is env.observation_space(a), f"observation_space({a!r}) must return the same object")
        fail(space.contains(env.observe(a)), f"observe({a!r}) is outside its observation space")
        if hasattr(env, "messages"):
            msgs = env.messages(a)
            fail(
                isinstance(msgs, list) and msgs and all(isinstance(m.get("content"), str) for m in msgs),
                f"messages({a!r}) must be a non-empty list of {{role, content}} dicts",
            )
            fail(msgs[-1]["role"] == "user", f"messages({a!r}) must end with the user message")
        sampled = env.action_space(a).sample()
        fail(env.action_space(a).contains(sampled), f"action_space({a!r}).sample() is not in the space")

    # Same seed -> same problem; problem_index picks a problem.
    if hasattr(env, "problem") and hasattr(env, "task"):
        env.reset(seed=seed + 1)
        first = env.problem
        env.reset(seed=seed + 1)
        fail(env.problem == first, "reset(seed=s) twice gave different problems")
        env.reset(options={"problem_index": 0})
        fail(env.problem == env.task.get(0), "reset(options={'problem_index': 0}) did not pick problem 0")
        fail(env.num_problems == len(env.task), "num_problems != len(task)")

    # Random-action episodes under the AEC contract.
    bugs = [_program_bugs(random_episode(env, seed + ep, fail=fail)) for ep in range(n_episodes)]
    if bugs and all(bugs):
        flags = sorted(set().union(*(b[0] for b in bugs)))
        detail = next((b[1] for b in bugs if b[1]), "")
        fail(False, f"the program misused team.call on every one of the {n_episodes} episodes "
                    f"(flags {flags}){': ' + detail if detail else ''}; call only the env's roles "
                    f"{list(env.possible_agents)} with {{'role', 'content'}} messages, awaiting each call")

    # Determinism: same seed and actions -> same observations, rewards and infos.
    env_a, env_b = factory(), factory()
    trace_a = random_episode(env_a, seed, fail=fail)
    trace_b = random_episode(env_b, seed, actions=[t[-1] for t in trace_a], fail=fail)
    _compare(fail, trace_a, trace_b, "seeding")

    # Pickling mid-episode: a restored copy continues exactly like the original.
    env_a = factory()
    env_a.reset(seed=seed)
    first_agent = env_a.agent_selection
    env_a.step(_action_for(env_a, first_agent, np.random.default_rng(seed), UnicodeText(64, seed=seed), 0.0))
    try:
        env_p = pickle.loads(pickle.dumps(env_a))
        env_c = copy.deepcopy(env_a)
    except Exception as e:
        fail(False, f"env is not picklable mid-episode: {type(e).__name__}: {e}")
    if env_a.agents:
        trace_a = random_episode(env_a, seed + 7, fail=fail, reset=False)
        actions = [t[-1] for t in trace_a]
        _compare(fail, trace_a, random_episode(env_p, seed + 7, actions=actions, fail=fail, reset=False), "pickle")
        _compare(fail, trace_a, random_episode(env_c, seed + 7, actions=actions, fail=fail, reset=False), "deepcopy")

    # Bad actions from a live agent never raise and are flagged.
    if bad_actions:
        env_x = factory()
        env_x.reset(seed=seed)
        for bad in BAD_ACTIONS:
            if not env_x.agents:
                env_x.reset(seed=seed)
            agent = env_x.agent_selection
            if env_x.terminations[agent] or env_x.truncations[agent]:
                env_x.step(None)
                continue
            start = time.monotonic()
            try:
                env_x.step(copy.copy(bad))
            except Exception as e:
                fail(False, f"step({str(bad)[:40]!r}...) raised {type(e).__name__}: {e}")
            fail(time.monotonic() - start < _STEP_SECONDS, f"step({str(bad)[:40]!r}) took over {_STEP_SECONDS}s")
            if agent in env_x.infos and hasattr(env_x, "max_action_chars"):
                flags = env_x.infos[agent].get("flags", [])
                if bad is None or not isinstance(bad, str) or len(bad) > env_x.max_action_chars:
                    fail(flags, f"bad action {str(bad)[:40]!r} left no flag in info")
        while env_x.agents:  # finish the episode with dead steps / empty actions
            a = env_x.agent_selection
            env_x.step(None if env_x.terminations[a] or env_x.truncations[a] else "")

    # PettingZoo's own checks.
    if pettingzoo_checks:
        # deferred: pettingzoo.test loads only when a check runs
        from pettingzoo.test import api_test, seed_test

        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")  # style advice (agent names, Box spaces) is not a failure
            try:
                api_test(factory(), num_cycles=10)
            except AssertionError as e:
                raise AssertionError(f"[check_env {fail.name}] pettingzoo api_test: {e}") from e
            try:
                seed_test(factory, num_cycles=10)
            except AssertionError as e:
                raise AssertionError(f"[check_env {fail.name}] pettingzoo seed_test: {e}") from e
