"""The batched multi-env collector: env copies in, :class:`~marft_algos.records.RolloutBatch` out.

The records it fills (:class:`~marft_algos.records.Transition`, :class:`~marft_algos.records.Episode`,
:class:`~marft_algos.records.RolloutBatch`) live in :mod:`marft_algos.records`.

:class:`RolloutCollector` drives many env copies through the PettingZoo AEC loop at
once: every env sits at its own ``agent_selection``; dead agents are stepped with
``None``; all pending generation requests across envs go into ONE ``policy.generate``
call (the policy batches by base model/adapter). GRPO groups are G consecutive env
copies reset with the same seed (same problem). Topologies that change the agent order
at run time are followed as the env dictates (we never assume an order). With
``continuous_batching`` the rounds give way to ``policy.generate_stream``: each env's
next request is submitted as soon as its previous action was stepped (docs/engines.md).
With ``set_branching(b > 1)`` each env copy plays a tree of sibling actions instead of one
episode (:mod:`marft_algos.branching`, docs/credit.md).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import marft_envs
from marft_algos.branching import BRANCH_EXPAND, run_tree_chunk
from marft_algos.config import TrainConfig
from marft_algos.records import Episode, RolloutBatch, Transition
from marft_envs.testing import check_step_output

_log = logging.getLogger("marft")

__all__ = [
    "ContextOverflowError",
    "agent_reward_metrics",
    "component_and_route_metrics",
    "overlong_counts",
    "overlong_summary",
    "warn_overlong",
    "RolloutCollector",
    "make_sampling",
    "role_sampling",
    "default_env_fn",
]


def default_env_fn(config: TrainConfig) -> Callable[[], Any]:
    """A factory of env copies: ``marft_envs.make(config.env_id, **config.env_kwargs)`` (a
    ``functools.partial``: picklable, so rollout workers can build the same envs)."""
    return functools.partial(marft_envs.make, config.env_id, **dict(config.env_kwargs))


@dataclass
class _OpenAction:
    """An agent's action left open by a tool call: the ids its next segment continues."""

    context_ids: list[int]  # the segment's prompt ids + its sampled ids
    sampled_ids: list[int]
    tool_messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None  # the schemas given to the template (None: inline/none)
    segment: int
    action_index: int


def role_sampling(env: Any, agent: str, overrides: dict[str, dict[str, Any]] | None = None, *, mode: str = "train") -> dict[str, Any]:
    """``agent``'s sampling settings in ``env``: its profile's (``eval_sampling`` in eval mode,
    falling back to ``sampling``) updated with ``overrides[agent]``."""
    settings: dict[str, Any] = {}
    team = getattr(env, "team", None)
    profile = getattr(team, "profiles", {}).get(agent) if team is not None else None
    if profile is not None:
        base = profile.eval_sampling if mode == "eval" else profile.sampling
        if mode == "eval" and not base:
            base = profile.sampling
        settings.update(base or {})
    settings.update((overrides or {}).get(agent, {}))
    return settings


def make_sampling(settings: dict[str, Any]) -> Any:
    """Build the policy's ``SamplingParams`` from a profile/override dict (unknown keys dropped)."""
    from marft_algos.models import SamplingParams

    if dataclasses.is_dataclass(SamplingParams):
        names = {f.name for f in dataclasses.fields(SamplingParams)}
        settings = {k: v for k, v in settings.items() if k in names}
    if "stop" in settings and settings["stop"] is not None:
        settings["stop"] = list(settings["stop"])
    return SamplingParams(**settings)


def _temperature(sampling: Any) -> float:
    """The temperature whose distribution the sampler's log-probs refer to (greedy: 1)."""
    t = float(getattr(sampling, "temperature", 1.0))
    if getattr(sampling, "greedy", False) or t == 0.0:
        return 1.0
    return t


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _json_safe(dataclasses.asdict(obj))
    if isinstance(obj, np.generic):
        return obj.item()
    return repr(obj)


@dataclass
class _Stepped:
    """What one ``env.step`` left behind, read in the stepping thread right after it."""

    turn: int
    rewards: dict[str, float]
    info: dict[str, Any]
    done: bool
    prompt: list[dict[str, str]] = field(default_factory=list)  # the messages the agent saw (transcripts)


def _action_text(result: Any) -> str:
    """The text an action sends to ``env.step`` ("" when nothing was generated)."""
    return "" if result is None else result.text


def _env_step(env: Any, agent: str, text: str) -> _Stepped:
    """Step ``agent`` of ``env`` with ``text``; snapshot what the record needs."""
    obs = env.observe(agent)
    turn = int(obs.get("turn", 0)) if isinstance(obs, dict) else 0
    prompt = _prompt_messages(env, agent)
    before = dict(getattr(env, "_cumulative_rewards", {}) or {})
    env.step(text)
    # a third-party env whose rewards never reach _cumulative_rewards (or are NaN) would
    # train on zeros or poison the update: fail here, naming the env and the agent
    check_step_output(env, agent, previous_cumulative=before)
    info = dict(env.infos.get(agent, {}) or {})
    trace = getattr(env, "last_trace", None)  # a program env's answered call: role, episode, latency
    if isinstance(trace, dict) and trace and "call" in info and trace.get("call") == info["call"]:
        info["trace"] = dict(trace)  # (kept out of env.infos, which must repeat under a seed)
    return _Stepped(
        turn=turn,
        rewards={a: float(r) for a, r in env.rewards.items()},
        info=info,
        done=bool(env.terminations.get(agent, False) or env.truncations.get(agent, False)),
        prompt=prompt,
    )


def _env_step_call(env: Any, agent: str, text: str, call: Any = None) -> _Stepped | None:
    """:func:`_env_step`, answering pending call ``call`` of a program env (None: the
    agent selection); None when that call is no longer pending (the episode ended)."""
    if call is not None:
        try:
            agent = env.select_call(call)
        except KeyError:
            return None
        if env.terminations.get(agent, False) or env.truncations.get(agent, False):
            return None
    return _env_step(env, agent, text)


def _prompt_messages(env: Any, agent: str) -> list[dict[str, str]]:
    """The chat messages ``agent`` sees now (JSON-safe), kept for transcripts; [] if the env has none."""
    messages = getattr(env, "messages", None)
    if messages is None:
        return []
    return [{"role": str(m.get("role", "")), "content": str(m.get("content", ""))} for m in messages(agent)]


class RolloutCollector:
    """Drive many env copies through the AEC loop with batched generation.

    Args:
        env_fn: builds one env copy (e.g. ``lambda: marft_envs.make(env_id, **kw)``).
        policy: a ``TeamPolicy`` (``encode``, ``generate``).
        num_envs: env copies stepped at once.
        group_size: G; consecutive blocks of G copies share a reset seed (a problem).
        seed: seeds the generator that draws problem seeds (its state is checkpointed).
        mode: "train" uses each profile's ``sampling``, "eval" its ``eval_sampling``.
        sampling_overrides: {agent: {...}} applied over the profile settings.
        max_context: prompt+response token budget; a prompt that leaves no room for a
            single new token is "overlong": counted, stepped with "" and not trained on;
            otherwise ``max_new_tokens`` is capped to fit (counted as "context_capped").
        agent_to_role: maps env agents to policy roles (default: identity).
        share_prefill: merge identical pending requests (same role, prompt and sampling;
            e.g. the first actions of a GRPO group) into one request with ``n`` samples.
        step_workers: the envs of one generation round are stepped (and so graded)
            concurrently by up to this many threads; 1 steps them one after another.
            Graders run their programs in subprocesses and are thread-safe; envs are
            distinct objects. Records are built in env order afterwards, so results are
            identical to serial stepping (an env must not draw from global RNGs in
            ``step``: PettingZoo envs use their own ``np_random``).
        strict_context: raise :class:`ContextOverflowError` on the first overlong prompt
            instead of warning once per agent and playing "".
        continuous_batching: generate with ``policy.generate_stream``: an env's next
            agent is encoded and submitted as soon as its predecessor's action is done
            (the ``hf`` engine lets it join the running batch) instead of waiting for
            the whole round. Same episodes per env; envs are stepped one at a time
            (``step_workers`` does not apply) and ``share_prefill`` is the engine's (it
            prefills identical prompts that join together once). None (default): the
            engine's ``continuous_batching`` setting (off when it has none).
    """

    def __init__(
        self,
        env_fn: Callable[[], Any],
        policy: Any,
        *,
        num_envs: int,
        group_size: int = 1,
        seed: int = 0,
        mode: str = "train",
        sampling_overrides: dict[str, dict[str, Any]] | None = None,
        max_context: int | None = None,
        agent_to_role: Callable[[str], str] | None = None,
        max_steps_per_episode: int = 10_000,
        share_prefill: bool = True,
        step_workers: int = 8,
        strict_context: bool = False,
        continuous_batching: bool | None = None,
    ) -> None:
        if num_envs % group_size:
            raise ValueError(f"num_envs ({num_envs}) must be a multiple of group_size ({group_size})")
        if mode not in ("train", "eval"):
            raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
        self.env_fn = env_fn
        self.policy = policy
        self.num_envs = num_envs
        self.group_size = group_size
        self.mode = mode
        self.sampling_overrides = dict(sampling_overrides or {})
        self.max_context = max_context
        self.strict_context = bool(strict_context)
        self._warned: set[tuple[str, str]] = set()  # (what, agent): console warnings given once
        self.agent_to_role = agent_to_role or (lambda a: a)
        self.max_steps_per_episode = max_steps_per_episode
        self.share_prefill = share_prefill
        if continuous_batching is None:  # the engine's setting (hf: engine_options.continuous_batching)
            continuous_batching = bool(getattr(getattr(policy, "engine", None), "continuous_batching", False))
        self.continuous_batching = bool(continuous_batching)
        if step_workers < 1:
            raise ValueError(f"step_workers must be >= 1, got {step_workers}")
        self.step_workers = int(step_workers)
        self.envs: list[Any] = [env_fn() for _ in range(num_envs)]
        self.rng = np.random.default_rng(seed)
        self.next_episode_id = 0
        self.next_group_id = 0
        self.episodes_collected = 0
        self._sampling_cache: dict[tuple[str, str], Any] = {}
        self._tools_cache: dict[tuple[str, str], bool] = {}
        self.branching, self.branch_expand, self.branch_depth = 1, "all", 0  # independent episodes

    #: what :mod:`marft_algos.branching` reads of a generation result (it does not import this module)
    action_text = staticmethod(_action_text)
    sampled_temperature = staticmethod(_temperature)

    def set_branching(self, branching: int, expand: str = "all", depth: int = 0) -> None:
        """Play trees instead of independent episodes (:mod:`marft_algos.branching`): ``branching``
        sibling actions per agent turn, every sibling (``expand="all"``) or one at random
        (``"random"``) branching on, at a path's first ``depth`` actions (0: all). 1: today's episodes."""
        if isinstance(branching, bool) or not isinstance(branching, int) or branching < 1:
            raise ValueError(f"branching must be an int >= 1 (1 = independent episodes), got {branching!r}")
        if expand not in BRANCH_EXPAND:
            raise ValueError(f"branch_expand must be one of {list(BRANCH_EXPAND)}, got {expand!r}")
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ValueError(f"branch_depth must be an int >= 0 (0 = every action), got {depth!r}")
        self.branching, self.branch_expand, self.branch_depth = branching, expand, depth

    # --- state (checkpointed: the problem stream continues exactly on resume) --------
    def state_dict(self) -> dict[str, Any]:
        """The problem stream's state (RNG, ids, counts): checkpointed so a resumed run continues it."""
        return {
            "rng": self.rng.bit_generator.state,
            "next_episode_id": self.next_episode_id,
            "next_group_id": self.next_group_id,
            "episodes_collected": self.episodes_collected,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.rng.bit_generator.state = state["rng"]
        self.next_episode_id = int(state["next_episode_id"])
        self.next_group_id = int(state["next_group_id"])
        self.episodes_collected = int(state["episodes_collected"])

    @property
    def possible_agents(self) -> list[str]:
        """The env's agents (= policy roles by default)."""
        return list(self.envs[0].possible_agents)

    # --- sampling settings -----------------------------------------------------------
    def sampling_settings(self, env: Any, agent: str) -> dict[str, Any]:
        """Profile sampling (train or eval) merged with the overrides for ``agent``."""
        return role_sampling(env, agent, self.sampling_overrides, mode=self.mode)

    def _sampling(self, env: Any, agent: str) -> tuple[dict[str, Any], Any]:
        key = (agent, self.mode)
        if key not in self._sampling_cache:
            settings = self.sampling_settings(env, agent)
            self._sampling_cache[key] = (settings, make_sampling(dict(settings)))
        return self._sampling_cache[key]

    # --- collection ----------------------------------------------------------------
    def draw_resets(self, num_groups: int) -> list[dict[str, Any]]:
        """Reset arguments for ``num_groups`` groups of G copies (same seed within a group)."""
        resets = []
        for _ in range(num_groups):
            seed = int(self.rng.integers(2**31 - 1))
            gid = self.next_group_id
            self.next_group_id += 1
            resets += [{"seed": seed, "group_id": gid}] * self.group_size
        return resets

    def collect(self, num_groups: int | None = None) -> RolloutBatch:
        """Collect ``num_groups`` groups (default: fill all env copies once)."""
        num_groups = num_groups if num_groups is not None else self.num_envs // self.group_size
        return self.run(self.draw_resets(num_groups))

    def run(self, resets: Sequence[dict[str, Any]]) -> RolloutBatch:
        """Play one episode per reset spec, ``num_envs`` at a time.

        A reset spec is ``{"seed": int | None, "options": dict | None, "group_id": int}``.
        """
        t0 = time.perf_counter()
        counters: dict[str, float] = defaultdict(float)
        episodes: list[Episode] = []
        for start in range(0, len(resets), self.num_envs):
            chunk = resets[start : start + self.num_envs]
            episodes += self._run_chunk(chunk, counters)
        elapsed = time.perf_counter() - t0
        self.episodes_collected += len(episodes)
        batch = RolloutBatch(episodes=episodes)
        batch.metrics = self._metrics(episodes, counters, elapsed)
        return batch

    def _reset_chunk(self, chunk: Sequence[dict[str, Any]]) -> list[Episode]:
        """Reset one env copy per spec of ``chunk``; their (empty) episodes."""
        episodes: list[Episode] = []
        for env, spec in zip(self.envs, chunk, strict=False):
            env.reset(seed=spec.get("seed"), options=spec.get("options"))
            eid = self.next_episode_id
            self.next_episode_id += 1
            problem = getattr(env, "problem", None)
            episodes.append(
                Episode(
                    episode_id=eid,
                    group_id=int(spec.get("group_id", eid)),
                    seed=spec.get("seed"),
                    problem_id=getattr(problem, "id", None),
                )
            )
        return episodes

    def _run_chunk(self, chunk: Sequence[dict[str, Any]], counters: dict[str, float]) -> list[Episode]:
        if self.branching > 1:  # trees: every path's request in one round (docs/credit.md)

            return run_tree_chunk(self, chunk, counters)
        if self.continuous_batching and callable(getattr(self.policy, "generate_stream", None)):
            return self._run_chunk_stream(chunk, counters)
        episodes = self._reset_chunk(chunk)
        live = list(range(len(chunk)))
        steps = [0] * len(chunk)
        open_actions: dict[tuple[int, str], _OpenAction] = {}  # (env slot, agent) -> its open tool action
        while live:
            requests, owners = [], []
            round_tools: dict[tuple[int, Any], list[dict[str, Any]] | None] = {}  # (env slot, call) -> schemas
            rank: dict[tuple[int, Any], int] = {}  # (env slot, call) -> its place in the env's answer order
            overlong: list[tuple[int, str, list[int], Any]] = []
            still_live = []
            for i in live:
                env, ep = self.envs[i], episodes[i]
                pending = self._advance_to_live_agent(env, ep, counters)
                if pending is None or steps[i] >= self.max_steps_per_episode:
                    self._finish(env, ep)
                    continue
                still_live.append(i)
                from marft_algos.models import GenRequest

                # every pending call of the env (a program's fan-out) joins this round's batch;
                # an env without pending_calls() has one: its agent selection
                calls = self._round_calls(env, pending)
                for k, (call, agent) in enumerate(calls):
                    rank[(i, call)] = k
                    if k:  # a sibling call: encode its messages (selected back below)
                        env.select_call(call)
                    opened = open_actions.get((i, agent)) if k == 0 else None  # a tool action continues in the selected call
                    role, prompt_ids, tools, sampling = self._request_parts(env, agent, opened, counters)
                    round_tools[(i, call)] = tools
                    if sampling is None:
                        overlong.append((i, agent, prompt_ids, call))
                        continue
                    requests.append(GenRequest(role=role, prompt_ids=prompt_ids, sampling=sampling))
                    owners.append((i, agent, prompt_ids, _temperature(sampling), call))
                if len(calls) > 1:
                    env.select_call(calls[0][0])
                    counters["rollout/fanout_calls"] += len(calls) - 1
            live = still_live
            results: list[Any] = []
            if requests:
                t_gen = time.perf_counter()
                results = self._generate(requests, counters)
                counters["perf/generate_s"] += time.perf_counter() - t_gen
            # step the envs together; an env's calls one after another, each answering its own
            # call, recorded in the order answered
            jobs = [(i, agent, prompt_ids, None, 1.0, call) for i, agent, prompt_ids, call in overlong]
            jobs += [(i, agent, prompt_ids, result, temp, call)
                     for (i, agent, prompt_ids, temp, call), result in zip(owners, results, strict=True)]
            if not jobs:
                continue
            jobs.sort(key=lambda job: (job[0], rank[(job[0], job[5])]))  # per env: the selected call first
            stepped = self._step_envs([(self.envs[i], agent, _action_text(result), call) for i, agent, _, result, _, call in jobs])
            for (i, agent, prompt_ids, result, temp, call), outcome in zip(jobs, stepped, strict=True):
                if outcome is None:  # the episode ended before this sibling call was answered
                    counters["rollout/fanout_unanswered"] += 1
                    continue
                self._record_step(episodes[i], (i, agent), prompt_ids, result, outcome, counters, temp, open_actions,
                                  round_tools.get((i, call)))
                steps[i] += 1
        return episodes

    @staticmethod
    def _round_calls(env: Any, agent: str) -> list[tuple[Any, str]]:
        """``(call, agent)`` of every call ``env`` has pending, the selected one first:
        ``env.pending_calls()`` where the env has it (a program's fan-out), else ``(None, agent)``."""
        get = getattr(env, "pending_calls", None)
        calls = list(get()) if callable(get) else []
        if not calls or calls[0][1] != agent:
            return [(None, agent)]
        return [(c, a) for c, a in calls]

    def _record_step(
        self, ep: Episode, key: tuple[int, str], prompt_ids: list[int], result: Any, outcome: Any,
        counters: dict[str, float], temp: float, open_actions: dict[tuple[int, str], _OpenAction], tools: Any,
    ) -> None:
        """Record one stepped action of env slot ``key[0]``; a tool turn leaves the agent's
        action open (``open_actions[key]``) with its exact ids, for the same agent's next segment."""
        opened = open_actions.pop(key, None)
        self._record(ep, key[1], prompt_ids, result, outcome, counters, temperature=temp, opened=opened)
        if outcome.info.get("tool_turn"):  # the same agent continues: keep the exact ids
            tr = ep.transitions[-1]
            open_actions[key] = _OpenAction(
                context_ids=list(prompt_ids) + list(tr.response_ids),
                sampled_ids=list(tr.response_ids),
                tool_messages=[dict(m) for m in outcome.info.get("tool_messages") or []],
                tools=tools,
                segment=tr.segment,
                action_index=tr.action_key[1],
            )

    def _run_chunk_stream(self, chunk: Sequence[dict[str, Any]], counters: dict[str, float]) -> list[Episode]:
        """:meth:`_run_chunk` with continuous batching: each env's next request is
        submitted the moment its previous action is done (``policy.generate_stream``).

        Every env goes through the same steps as in the round-based loop (per env the
        order of actions, prompts and records is the same); only the interleaving across
        envs differs. The env steps run in the engine's callback, one at a time.
        """
        from marft_algos.models import GenRequest

        episodes = self._reset_chunk(chunk)
        steps = [0] * len(chunk)
        open_actions: dict[tuple[int, str], _OpenAction] = {}  # (env slot, agent) -> its open tool action
        owners: dict[int, tuple[str, list[int], float, list[dict[str, Any]] | None]] = {}
        stepping = 0.0

        def step(i: int, agent: str, prompt_ids: list[int], result: Any, temp: float, tools: Any) -> None:
            outcome = _env_step(self.envs[i], agent, _action_text(result))
            self._record_step(episodes[i], (i, agent), prompt_ids, result, outcome, counters, temp, open_actions, tools)
            steps[i] += 1

        def next_request(i: int) -> list[tuple[int, Any]]:
            """Env ``i``'s next generation request ([] when its episode ended); overlong
            prompts are stepped with "" on the way, as in the round-based loop."""
            env, ep = self.envs[i], episodes[i]
            while True:
                agent = self._advance_to_live_agent(env, ep, counters)
                if agent is None or steps[i] >= self.max_steps_per_episode:
                    self._finish(env, ep)
                    return []
                role, prompt_ids, tools, sampling = self._request_parts(env, agent, open_actions.get((i, agent)), counters)
                if sampling is None:
                    step(i, agent, prompt_ids, None, 1.0, tools)
                    continue
                owners[i] = (agent, prompt_ids, _temperature(sampling), tools)
                return [(i, GenRequest(role=role, prompt_ids=prompt_ids, sampling=sampling))]

        def on_done(i: int, result: Any) -> list[tuple[int, Any]]:
            nonlocal stepping
            t = time.perf_counter()
            agent, prompt_ids, temp, tools = owners.pop(i)
            step(i, agent, prompt_ids, result, temp, tools)
            follow = next_request(i)
            stepping += time.perf_counter() - t
            return follow

        first = [req for i in range(len(chunk)) for req in next_request(i)]
        t_gen = time.perf_counter()
        self.policy.generate_stream(first, on_done)
        counters["perf/generate_s"] += time.perf_counter() - t_gen - stepping
        return episodes

    def _tokenizer(self, role: str) -> Any:
        """The tokenizer of ``role`` (None for a policy that does not expose one)."""
        fn = getattr(self.policy, "tokenizer", None)
        return fn(role) if callable(fn) else None

    def _template_tools(self, env: Any, agent: str, role: str) -> list[dict[str, Any]] | None:
        """``agent``'s tool schemas when its chat template renders ``tools=``; else None
        (no tools, or a template that ignores them: the env's messages describe them)."""
        get = getattr(env, "tools", None)
        schemas = [dict(t) for t in get(agent)] if callable(get) else []
        if not schemas:
            return None
        key = (role, repr(schemas))
        if key not in self._tools_cache:
            from marft_algos.models.chat import template_uses_tools

            tok = self._tokenizer(role)
            self._tools_cache[key] = tok is not None and template_uses_tools(tok, schemas)
        return schemas if self._tools_cache[key] else None

    def _prompt_ids(
        self, env: Any, agent: str, role: str, opened: _OpenAction | None, counters: dict[str, float]
    ) -> tuple[list[int], list[dict[str, Any]] | None]:
        """The prompt ids of ``agent``'s next segment and the schemas given to the template.

        A first segment is the chat-templated ``env.messages(agent)`` (with ``tools=`` when
        the template renders them). A tool continuation is the previous segment's prompt +
        its sampled ids + the template's tool-result ids (docs/tools.md, "Contract for
        trainers"): the sampled ids are never decoded and encoded again. A policy without a
        ``tokenizer(role)``, or a template that does not render a conversation as a prefix
        of its continuation, falls back to re-encoding (counted as ``rollout/tool_reencoded``).
        """
        if opened is not None:
            tok = self._tokenizer(role)
            if tok is not None:
                from marft_envs.tools import continuation_ids

                try:
                    extra = continuation_ids(tok, opened.sampled_ids, opened.tool_messages, tools=opened.tools)
                    return opened.context_ids + [int(x) for x in extra], opened.tools
                except ValueError as err:
                    warnings.warn(f"tool continuation of {agent!r} re-encoded from its messages: {err}", RuntimeWarning, stacklevel=2)
            counters["rollout/tool_reencoded"] += 1
        tools = self._template_tools(env, agent, role)
        if tools is None:
            return list(self.policy.encode(role, env.messages(agent))), None
        takes_inline = "inline_tools" in inspect.signature(env.messages).parameters
        msgs = env.messages(agent, inline_tools=False) if takes_inline else env.messages(agent)
        return list(self.policy.encode(role, msgs, tools=tools)), tools

    def _step_envs(self, jobs: list[tuple[Any, str, str, Any]]) -> list[_Stepped | None]:
        """``env.step(text)`` for each ``(env, agent, text, call)``, distinct envs concurrently
        when allowed, the jobs of one env in job order; outcomes in job order (whatever order
        the threads finish in). ``call`` (not None) is selected first; None as the outcome:
        that call was no longer pending (its episode ended)."""
        per_env: dict[int, list[int]] = {}
        for k, job in enumerate(jobs):
            per_env.setdefault(id(job[0]), []).append(k)
        out: list[_Stepped | None] = [None] * len(jobs)

        def run(ks: list[int]) -> None:
            for k in ks:
                out[k] = _env_step_call(*jobs[k])

        workers = min(self.step_workers, len(per_env))
        if workers <= 1:
            for ks in per_env.values():
                run(ks)
            return out
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="marft-env-step") as pool:
            for f in [pool.submit(run, ks) for ks in per_env.values()]:
                f.result()  # re-raises an env's exception here
        return out

    def _generate(self, requests: list[Any], counters: dict[str, float]) -> list[Any]:
        """One ``policy.generate`` call; identical requests (a GRPO group's first actions)
        are merged into one request with ``n`` samples so the policy prefills the prompt once."""
        if not self.share_prefill:
            return list(self.policy.generate(requests))
        merged: dict[tuple, list[int]] = {}
        for k, r in enumerate(requests):
            merged.setdefault((r.role, tuple(r.prompt_ids), repr(r.sampling)), []).append(k)
        if len(merged) == len(requests):
            return list(self.policy.generate(requests))
        firsts = [requests[idx[0]] for idx in merged.values()]
        batched = [dataclasses.replace(r, n=len(idx)) for r, idx in zip(firsts, merged.values(), strict=True)]
        flat = list(self.policy.generate(batched))  # n results per request, in request order
        counters["rollout/shared_prefill_rows"] += len(requests) - len(batched)
        out: list[Any] = [None] * len(requests)
        pos = 0
        for idx in merged.values():
            for k in idx:
                out[k] = flat[pos]
                pos += 1
        return out

    def _advance_to_live_agent(self, env: Any, ep: Episode, counters: dict[str, float]) -> str | None:
        """Step dead agents with None until a live agent is selected; None when the episode ended."""
        while env.agents:
            agent = env.agent_selection
            if env.terminations.get(agent, False) or env.truncations.get(agent, False):
                env.step(None)  # AEC dead step: removes the agent
                ep.dead_steps += 1
                counters["rollout/dead_steps"] += 1
                continue
            return agent
        return None

    def _record(
        self,
        ep: Episode,
        agent: str,
        prompt_ids: list[int],
        result: Any,
        outcome: _Stepped,
        counters: dict[str, float],
        temperature: float = 1.0,
        opened: _OpenAction | None = None,
    ) -> None:
        """Append the transition of one env step to ``ep`` and credit the step's rewards
        (``opened``: the action this step continues after a tool call, if any)."""
        turn = outcome.turn
        if result is None:
            text, response_ids, logprobs, finish, trainable = "", [], [], "overlong", False
        else:
            text = result.text
            response_ids = list(result.token_ids)
            logprobs = [float(x) for x in result.logprobs]
            finish, trainable = result.finish_reason, len(response_ids) > 0
        reward = float(outcome.rewards.get(agent, 0.0))
        info = outcome.info
        done = outcome.done
        flags = list(info.get("flags", []) or [])
        if finish == "overlong":
            flags.append("context_overflow")
        tr = Transition(
            episode_id=ep.episode_id,
            group_id=ep.group_id,
            index=len(ep.transitions),
            turn=turn,
            agent=agent,
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            sampler_logprobs=logprobs,
            temperature=temperature,
            text=text,
            finish_reason=finish,
            reward=reward,
            done=done,
            flags=flags,
            info=_json_safe({k: v for k, v in info.items() if k != "flags"}),
            trainable=trainable,
            segment=opened.segment + 1 if opened is not None else 0,
            action_index=opened.action_index if opened is not None else len(ep.transitions),
        )
        tr.extras["prompt"] = outcome.prompt
        ep.transitions.append(tr)
        # Credit this step's rewards to each agent's latest action (the acting agent's is `tr`);
        # every segment of that action carries the action's total as `action_reward`.
        latest: dict[str, Transition] = {t.agent: t for t in ep.transitions}
        for a, r in outcome.rewards.items():
            if a in latest and r:
                latest[a].credited_reward += float(r)
                key = latest[a].action_key
                for seg in ep.transitions:
                    if seg.agent == a and seg.action_key == key:
                        seg.action_reward += float(r)
        counters["rollout/actions"] += 1
        counters["rollout/tokens"] += len(response_ids)
        if finish == "length":
            counters["rollout/length_stops"] += 1
        elif finish == "context":  # the policy refused: prompt + max_new_tokens over its window
            counters["rollout/overlong"] += 1
            self._overflowed(agent, len(prompt_ids), counters)
            tr.flags.append("context_overflow")
        grade = info.get("grade") or {}
        if isinstance(grade, dict) and grade.get("timed_out"):
            counters["rollout/verifier_timeouts"] += 1
            counters[f"agent/{agent}/verifier_timeouts"] += 1
        if "team_reward" in info and turn not in ep.info.setdefault("graded_turns", []):
            # The turn was graded: credit its team reward to every action of that turn
            # (once per turn, even if the env leaves the info on later steps).
            ep.info["graded_turns"].append(turn)
            team_r = float(info["team_reward"])
            for prev in ep.transitions:
                if prev.turn == turn:
                    prev.team_reward = team_r
            ep.team_return += team_r
            if isinstance(grade, dict) and "correct" in grade:
                ep.correct = bool(grade["correct"])
            elif ep.correct is None:
                ep.correct = team_r > 0

    def _request_parts(self, env: Any, agent: str, open_action: Any, counters: dict[str, float]) -> tuple[str, list[int], Any, Any]:
        """``(role, prompt_ids, tools, sampling)`` of ``agent``'s next generation; ``max_new_tokens``
        is capped to what fits ``max_context`` (counted as ``context_capped``). ``sampling`` is
        None when not even one token fits: a handled, counted case, stepped with "" by the
        caller (never truncate the prompt silently, it would train on a context the agent
        never saw)."""
        role = self.agent_to_role(agent)
        settings, sampling = self._sampling(env, agent)
        prompt_ids, tools = self._prompt_ids(env, agent, role, open_action, counters)
        max_new = int(settings.get("max_new_tokens", getattr(sampling, "max_new_tokens", 256)))
        if self.max_context is not None and len(prompt_ids) + max_new > self.max_context:
            room = self.max_context - len(prompt_ids)
            if room < 1:
                counters["rollout/overlong"] += 1
                self._overflowed(agent, len(prompt_ids), counters)
                return role, prompt_ids, tools, None
            counters["rollout/context_capped"] += 1
            sampling = dataclasses.replace(sampling, max_new_tokens=room) if dataclasses.is_dataclass(sampling) else sampling
        return role, prompt_ids, tools, sampling

    def _overflowed(self, agent: str, prompt_tokens: int, counters: dict[str, float]) -> None:
        """An agent's prompt left no room for a token: count it per agent, warn once, or stop (strict)."""
        counters[f"agent/{agent}/overlong"] += 1
        msg = (
            f"agent {agent!r}: prompt of {prompt_tokens} tokens does not fit max_context={self.max_context}"
        )
        fix = ("raise max_context (up to the model's window), shorten the agent's prompt or its history, "
               "or use a model with a longer context")
        if self.strict_context:
            raise ContextOverflowError(f"{msg} (strict_context): {fix}")
        if ("overlong", agent) not in self._warned:
            self._warned.add(("overlong", agent))
            _log.warning("%s: it plays an empty action, is not trained on, and scores 0; %s "
                         "(counted in rollout/overlong; warned once per agent; strict_context=true stops the run)", msg, fix)

    def _warn_idle(self, acted: set[str], episodes: int) -> None:
        """Warn (once per agent) when an agent of the team never acted in a whole batch."""
        for agent in self.possible_agents:
            if agent not in acted and ("idle", agent) not in self._warned:
                self._warned.add(("idle", agent))
                _log.warning(
                    "agent %r never acted in %d episodes (e.g. a specialist the router never chose): it gets "
                    "no data and is not trained (agent/%s/actions = 0; warned once)", agent, episodes, agent)

    def _finish(self, env: Any, ep: Episode) -> None:
        if ep.correct is None:
            ep.correct = ep.team_return > 0
        ep.info["problem_id"] = ep.problem_id

    def _metrics(self, episodes: list[Episode], counters: dict[str, float], elapsed: float) -> dict[str, float]:
        m: dict[str, float] = {k: float(v) for k, v in counters.items()}
        if not episodes:
            return m
        m["team/reward"] = float(np.mean([ep.team_return for ep in episodes]))
        m["team/accuracy"] = float(np.mean([bool(ep.correct) for ep in episodes]))
        m["team/tokens_per_episode"] = float(np.mean([ep.num_tokens for ep in episodes]))
        m["rollout/episodes"] = float(len(episodes))
        ids = [ep.problem_id for ep in episodes]
        if all(i is not None for i in ids):  # independent units: a GRPO group or a tree shares one problem
            m["rollout/problems"] = float(len(set(ids)))
        m["perf/rollout_s"] = elapsed
        m["perf/rollout_tokens_per_s"] = counters.get("rollout/tokens", 0.0) / max(elapsed, 1e-9)
        by_agent: dict[str, list[Transition]] = defaultdict(list)
        for ep in episodes:
            for t in ep.transitions:
                if not t.shadow:  # a branching tree's shared action counts once, on its owner
                    by_agent[t.agent].append(t)
        self._warn_idle(set(by_agent), len(episodes))
        m.update(component_and_route_metrics(episodes, routed=self._routed()))
        m.update(agent_reward_metrics(episodes))
        for agent in self.possible_agents:
            m[f"agent/{agent}/actions"] = float(len(by_agent.get(agent, ())))
        for agent, trs in by_agent.items():
            m[f"agent/{agent}/response_len"] = float(np.mean([t.num_tokens for t in trs]))
            m[f"agent/{agent}/length_stop_frac"] = float(np.mean([t.finish_reason == "length" for t in trs]))
        return m


    def _routed(self) -> bool:
        """Whether the team's acting order depends on what agents say (a routed topology)."""
        env = getattr(self.envs[0], "unwrapped", self.envs[0]) if self.envs else None
        topology = getattr(getattr(env, "team", None), "topology", None)
        return topology is not None and not getattr(topology, "is_static", True)


def agent_reward_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Per-agent reward metrics of a batch, for metrics.jsonl / TensorBoard.

    - ``agent/<a>/reward``: ``a``'s return per episode (every reward credited to its actions,
      :meth:`Episode.agent_return`), averaged over the episodes in which ``a`` acted. For a
      team reward it is the team reward per episode for every role that acted, however many
      calls each made (an orchestrator that speaks three times is not shown a third of it);
      in a game it is the agent's own score.
    - ``agent/<a>/credit``: the reward credited per call (action), averaged over ``a``'s
      calls: what one of its actions earned on average (for a team reward given at the end,
      an agent's non-final calls in an episode earn 0).
    """
    returns: dict[str, list[float]] = defaultdict(list)
    credits: dict[str, list[float]] = defaultdict(list)
    for ep in episodes:
        acted = dict.fromkeys(t.agent for t in ep.transitions)
        for t in ep.transitions:
            if not t.shadow:
                credits[t.agent].append(t.credited_reward)
        for agent in acted:
            returns[agent].append(ep.agent_return(agent))
    out: dict[str, float] = {}
    for agent, vals in returns.items():
        out[f"agent/{agent}/reward"] = float(np.mean(vals))
        out[f"agent/{agent}/credit"] = float(np.mean(credits[agent]))
    return out


def component_and_route_metrics(episodes: Sequence[Episode], routed: bool = False) -> dict[str, float]:
    """Reward components and route choices of a batch, for metrics.jsonl / TensorBoard.

    - ``team/reward/<component>``: per-episode sum of each ``info["reward_components"]``
      entry (outcome, format, costs, partial credit, tool components), averaged over episodes;
    - ``agent/<a>/reward/<component>``: the same components of the grades that ``a``'s own
      actions produced, averaged over ``a``'s actions;
    - ``route/<from>-><to>``: the share of hops from ``from`` (an action followed by another
      in its episode) that went to ``to`` (the executed order: fixed, DAG or routed);
    - ``team/route_unparsed``: the share of episodes with an action flagged ``route_unparsed``
      (a route line the env could not read): logged every step for a ``routed`` team (0 when
      every route was read), and for any team whose actions raised the flag.
    """
    team: dict[str, float] = defaultdict(float)
    per_agent: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    actions: dict[str, int] = defaultdict(int)
    hops: dict[tuple[str, str], int] = defaultdict(int)
    unparsed = 0
    for ep in episodes:
        prev = None
        unparsed += any("route_unparsed" in (t.flags or ()) for t in ep.transitions)
        for t in ep.transitions:
            actions[t.agent] += 1
            comps = t.info.get("reward_components") if isinstance(t.info, dict) else None
            if isinstance(comps, dict):
                for name, v in comps.items():
                    if isinstance(v, (int, float)):
                        team[name] += float(v)
                        per_agent[t.agent][name] += float(v)
            if prev is not None:
                hops[(prev, t.agent)] += 1
            prev = t.agent
    out: dict[str, float] = {}
    n = max(len(episodes), 1)
    for name, v in team.items():
        out[f"team/reward/{name}"] = v / n
    for agent, comps in per_agent.items():
        for name, v in comps.items():
            out[f"agent/{agent}/reward/{name}"] = v / actions[agent]
    leaving: dict[str, int] = defaultdict(int)
    for (a, _), k in hops.items():
        leaving[a] += k
    for (a, b), k in hops.items():
        out[f"route/{a}->{b}"] = k / leaving[a]
    if (routed or unparsed) and episodes:
        out["team/route_unparsed"] = unparsed / len(episodes)
    return out


class ContextOverflowError(RuntimeError):
    """An agent's prompt does not fit ``max_context`` and ``strict_context`` is on."""


def warn_overlong(counters: dict[str, float], history: Sequence[dict[str, float]], max_context: int) -> None:
    """End-of-run warning: how many actions of each agent were played empty (prompt over ``max_context``)."""
    total = int(counters.get("rollout/overlong_total", 0))
    if total:
        actions = sum(h.get("rollout/actions", 0.0) for h in history)
        logging.getLogger("marft").warning(
            "%d of %d actions overflowed max_context=%d and were played as empty actions (%s): raise max_context "
            "or shorten the prompts (see rollout/overlong in metrics.jsonl)",
            total, int(actions), max_context, overlong_summary(counters, "_total"),
        )


def overlong_counts(metrics: dict[str, float], suffix: str = "") -> dict[str, int]:
    """``{"writer": 6, "critic": 2}`` from ``agent/<a>/overlong<suffix>`` counters (agents that overflowed)."""
    tail = f"/overlong{suffix}"
    return {k[len("agent/"):-len(tail)]: int(v) for k, v in metrics.items()
            if k.startswith("agent/") and k.endswith(tail) and v}


def overlong_summary(metrics: dict[str, float], suffix: str = "") -> str:
    """``"writer 6, critic 2"`` from ``agent/<a>/overlong<suffix>`` counters ("" when none overflowed)."""
    return ", ".join(f"{a} {n}" for a, n in overlong_counts(metrics, suffix).items())
