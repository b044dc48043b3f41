"""Advantage estimators: pure functions on tensors or arrays (no models, no trainers).

Every estimator here is a backward recursion over a *chain* of links in execution order.
A link is one action of one agent (action level) or one token (token level). The core is
:func:`chain_gae`; the builders only decide what the successor of each link is and which
discount / lambda applies to each hop.

Notation (one chain of links n = 0..N-1)::

    delta_n = r_n + gamma_n * V'_n * (1 - d_n) - V_n
    A_n     = delta_n + gamma_n * lam_n * (1 - d_n) * A_{n+1}          (A_N = 0)
    R_n     = A_n + V_n                                                 (critic target)

``V'_n`` is the value of the successor of link n (``next_values``), ``gamma_n`` and
``lam_n`` are the discount and GAE lambda of the hop n -> n+1, ``d_n`` is 1 when the
episode terminated at link n (no bootstrap and no credit from links after it, which may
belong to the next episode of a concatenated batch).

Builders
--------
- :func:`action_level_gae` -- action-level MARFT: one chain per episode through every
  executed (turn, agent) action; agent hops inside a turn and turn hops have their own
  gamma/lambda. With the defaults it is the reference implementation's recursion.
- :func:`token_level_backup` -- token-level MARFT: the same chain, one link per token.
- :func:`per_agent_gae` -- IPPO: each agent's own actions form its chain (no chaining
  across agents).
- :func:`grpo_advantages` -- group-relative advantages (global or agent-wise, Dr. MAS).
- :func:`frac_zero_std_groups` -- the share of GRPO groups whose rewards are all equal
  (no signal; TRL's ``frac_reward_zero_std``), for the step's metrics.
- :func:`turn_level_advantages` -- MARS: each agent's own turn-level returns,
  normalised per agent (no critic; for per-agent rewards in games and self-play).

Tree (counterfactual) credit for branching rollouts and GiGPO step groups are in
:mod:`marft_algos.credit`.

:func:`once_per_action` prepares per-transition rewards for the per-link estimators when
an action spans several generated segments (tool calls): a reward repeated on every
segment of an action enters once, at its last segment.

Inputs may be ``torch.Tensor`` or anything ``numpy.asarray`` accepts; :func:`chain_gae`
returns the type of its ``rewards`` argument, the builders return numpy ``float64``
arrays (or lists of them, per action, for tokens).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = [
    "chain_gae",
    "action_level_gae",
    "token_level_backup",
    "per_agent_gae",
    "grpo_advantages",
    "frac_zero_std_groups",
    "turn_level_advantages",
    "episode_segments",
    "once_per_action",
]

ArrayLike = Any  # torch.Tensor | np.ndarray | Sequence[float] | float


def _as_tensor(x: ArrayLike, like: torch.Tensor | None = None) -> torch.Tensor:
    if torch.is_tensor(x):
        t = x
    else:
        t = torch.as_tensor(np.asarray(x, dtype=np.float64))
    if like is not None:
        t = t.to(device=like.device, dtype=like.dtype)
    return t


def chain_gae(
    rewards: ArrayLike,
    values: ArrayLike,
    next_values: ArrayLike,
    discounts: ArrayLike,
    lams: ArrayLike = 1.0,
    terminal: ArrayLike | None = None,
) -> tuple[Any, Any]:
    """Generalised advantage estimation over execution-ordered chains.

    Args:
        rewards: ``r_n``, shape ``[N]`` or ``[B, N]`` (B padded chains; the recursion runs
            over the last dimension, vectorised over the others).
        values: ``V_n``, same shape.
        next_values: ``V'_n``, the value of the successor of link n (any value where there
            is none: it is multiplied by a zero discount or ``terminal``).
        discounts: ``gamma_n`` of the hop n -> n+1 (scalar or broadcastable).
        lams: ``lam_n`` of the hop n -> n+1 (scalar or broadcastable).
        terminal: ``d_n`` in {0, 1}; default all 0. A 1 stops both the bootstrap and the
            backward flow of credit, so several episodes may be concatenated in one chain.

    Returns:
        ``(advantages, returns)`` with ``returns = advantages + values``, both the shape of
        ``rewards``: torch tensors if ``rewards`` is a tensor, else numpy float64 arrays.

    Formula::

        delta_n = r_n + gamma_n * V'_n * (1 - d_n) - V_n
        A_n     = delta_n + gamma_n * lam_n * (1 - d_n) * A_{n+1},   A_N = 0

    Padding: pad a chain *after* its last real link with anything, and set ``d = 1`` (or a
    zero discount) on the last real link; padded outputs are meaningless, mask them.

    Example: three links, undiscounted, reward 1 at the terminal one::

        >>> adv, ret = chain_gae([0.0, 0.0, 1.0], [0.5, 0.5, 0.5], [0.5, 0.5, 0.0], discounts=1.0, terminal=[0, 0, 1])
        >>> adv.tolist(), ret.tolist()
        ([0.5, 0.5, 0.5], [1.0, 1.0, 1.0])
    """
    as_torch = torch.is_tensor(rewards)
    r = _as_tensor(rewards)
    if not r.is_floating_point():
        r = r.double()
    v = _as_tensor(values, r)
    nv = _as_tensor(next_values, r)
    shape = torch.broadcast_shapes(r.shape, v.shape)
    r, v, nv = r.expand(shape), v.expand(shape), nv.expand(shape)
    g = _as_tensor(discounts, r).expand(shape)
    lam = _as_tensor(lams, r).expand(shape)
    not_done = (1.0 - _as_tensor(terminal, r)).expand(shape) if terminal is not None else torch.ones_like(r)

    delta = r + g * nv * not_done - v
    carry = g * lam * not_done  # how much of A_{n+1} flows into A_n
    adv = torch.zeros_like(r)
    n_links = shape[-1] if len(shape) else 0
    running = torch.zeros_like(r[..., 0]) if n_links else None
    for n in range(n_links - 1, -1, -1):  # backward over the chain, vectorised over the batch
        running = delta[..., n] + carry[..., n] * running
        adv[..., n] = running
    ret = adv + v
    if as_torch:
        return adv, ret
    return adv.numpy(), ret.numpy()


def episode_segments(episode_ids: ArrayLike | None, n: int) -> list[tuple[Any, int, int]]:
    """Contiguous runs of equal episode ids -> ``[(episode_id, start, stop), ...]``.

    ``None`` means one episode (id 0). Episodes must be contiguous (an episode id that
    reappears after another one is an error: the chains would be ambiguous).

    Example::

        >>> episode_segments([7, 7, 3], 3)
        [(7, 0, 2), (3, 2, 3)]
    """
    if episode_ids is None:
        return [(0, 0, n)] if n else []
    ids = list(np.asarray(episode_ids).tolist())
    if len(ids) != n:
        raise ValueError(f"episode_ids has {len(ids)} entries for {n} links")
    segs: list[tuple[Any, int, int]] = []
    seen: set[Any] = set()
    start = 0
    for i in range(1, n + 1):
        if i == n or ids[i] != ids[start]:
            if ids[start] in seen:
                raise ValueError(f"episode {ids[start]!r} is not contiguous in execution order")
            seen.add(ids[start])
            segs.append((ids[start], start, i))
            start = i
    return segs


def once_per_action(rewards: Sequence[float], action_keys: Sequence[Any]) -> list[float]:
    """Keep a reward repeated on every segment of an action only on its last segment.

    A tool-calling action is several transitions (segments) that share an action key
    (``Transition.action_key``); the turn's team reward is written on each of them. An
    estimator that sums rewards along a chain of transitions would count it once per
    segment; this keeps it at the action's last segment (0 on the earlier ones), where
    the action ends, as ``Transition.reward`` and ``credited_reward`` already place it.

    Example: an action of three segments (key ``a``), then a one-segment action::

        >>> once_per_action([1.0, 1.0, 1.0, 0.5], ["a", "a", "a", "b"])
        [0.0, 0.0, 1.0, 0.5]
    """
    if len(rewards) != len(action_keys):
        raise ValueError(f"action_keys has {len(action_keys)} entries for {len(rewards)} rewards")
    last = {key: k for k, key in enumerate(action_keys)}
    return [float(r) if last[key] == k else 0.0 for k, (r, key) in enumerate(zip(rewards, action_keys, strict=True))]


def _flat(x: ArrayLike, n: int, name: str) -> np.ndarray:
    a = x.detach().cpu().numpy() if torch.is_tensor(x) else np.asarray(x)
    a = a.astype(np.float64).reshape(-1)
    if a.shape[0] != n:
        raise ValueError(f"{name} has {a.shape[0]} entries, expected {n}")
    return a


def _passthrough_values(
    rewards: np.ndarray,
    values: np.ndarray,
    discounts: np.ndarray | float,
    terminal: np.ndarray,
    tail: float,
    passthrough: np.ndarray,
) -> np.ndarray:
    """Values of one chain with every pass-through link made transparent.

    Backwards, a pass-through link n gets ``V_n = r_n + gamma_n * (1 - d_n) * V_{n+1}``
    (``tail`` after the last link): its own TD error is then 0, so its predecessor's
    bootstrap ``gamma_p * V_n`` is the next real link's value (discounted over both hops,
    plus the skipped link's reward) and the credit flowing back through it is
    ``gamma_n * lam_n * A_{n+1}``: the chain behaves as if the link were not there.
    """
    v = values.copy()
    g = np.broadcast_to(np.asarray(discounts, dtype=np.float64), v.shape)
    for n in range(v.shape[0] - 1, -1, -1):
        if passthrough[n]:
            succ = v[n + 1] if n + 1 < v.shape[0] else tail
            v[n] = rewards[n] + g[n] * (1.0 - terminal[n]) * succ
    return v


def _hop_params(
    turns: np.ndarray,
    gamma_agent: float,
    lam_agent: float,
    gamma_turn: float,
    lam_turn: float,
) -> tuple[np.ndarray, np.ndarray]:
    """gamma/lambda of the hop from each link to the next one of the same episode."""
    same_turn = np.append(turns[1:] == turns[:-1], False)
    gammas = np.where(same_turn, gamma_agent, gamma_turn)
    lams = np.where(same_turn, lam_agent, lam_turn)
    return gammas.astype(np.float64), lams.astype(np.float64)


@dataclass(frozen=True)
class _ChainEpisode:
    """One episode's links ``start:stop`` of a chain and what every hop out of them uses."""

    start: int
    stop: int
    gammas: np.ndarray  # discount of the hop to the next link (agent or turn hop)
    lams: np.ndarray  # GAE lambda of that hop
    done: np.ndarray  # 1 where the episode terminated (no bootstrap, no credit from later links)
    tail: float  # value the last link bootstraps from (a truncated episode's ``last_values``)


def _chain_episodes(
    rewards: ArrayLike,
    turns: ArrayLike,
    episode_ids: ArrayLike | None,
    terminal: ArrayLike | None,
    last_values: Mapping[Any, float] | None,
    passthrough: ArrayLike | None,
    hops: Mapping[str, float],
) -> tuple[np.ndarray, np.ndarray, list[_ChainEpisode]]:
    """What :func:`action_level_gae` and :func:`token_level_backup` share: the rewards and
    pass-through flags per action as float64, and each episode's hop discounts (``hops``:
    ``gamma_agent, lam_agent, gamma_turn, lam_turn``), terminal flags and bootstrap tail.

    Without ``terminal`` the last action of every episode is terminal, unless the episode
    has a ``last_values`` entry (truncated: its last action bootstraps from that value).
    """
    r = np.asarray(rewards.detach().cpu() if torch.is_tensor(rewards) else rewards, dtype=np.float64).reshape(-1)
    n = r.shape[0]
    tu = _flat(turns, n, "turns")
    term = _flat(terminal, n, "terminal") if terminal is not None else np.zeros(n)
    skip = _flat(passthrough, n, "passthrough") if passthrough is not None else np.zeros(n)
    last = dict(last_values or {})
    episodes = []
    for eid, s, e in episode_segments(episode_ids, n):
        g, lam = _hop_params(tu[s:e], **hops)
        d = term[s:e].copy()
        if eid not in last and terminal is None:
            d[-1] = 1.0
        episodes.append(_ChainEpisode(s, e, g, lam, d, float(last.get(eid, 0.0))))
    return r, skip, episodes


def action_level_gae(
    rewards: ArrayLike,
    values: ArrayLike,
    turns: ArrayLike,
    episode_ids: ArrayLike | None = None,
    *,
    gamma_agent: float = 0.99,
    lam_agent: float = 0.95,
    gamma_turn: float = 0.99,
    lam_turn: float = 0.95,
    terminal: ArrayLike | None = None,
    last_values: Mapping[Any, float] | None = None,
    passthrough: ArrayLike | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Action-level MARFT GAE over the chain of executed (turn, agent) actions.

    The links are the actions of one or more episodes, flattened in execution order
    (episodes contiguous). The successor of an action is the next action actually
    executed in the same episode: for the reference's fixed order that is
    ``(t, i) -> (t, i+1)`` and ``(t, N-1) -> (t+1, 0)``; for a DAG or a dynamic route it
    is whatever ran next. A hop to an action of the same turn uses
    ``(gamma_agent, lam_agent)``, a hop to the next turn ``(gamma_turn, lam_turn)``::

        delta_n = r_n + gamma(n) * V_{n+1} * (1 - d_n) - V_n
        A_n     = delta_n + gamma(n) * lam(n) * (1 - d_n) * A_{n+1}
        R_n     = A_n + V_n

    With the defaults (0.99 / 0.95 at every hop) this is exactly the reference
    recursion of the MARFT reference code (arXiv 2504.16129): agent i < N-1 bootstraps from ``V[t, i+1]``, the
    last agent from ``V[t+1, 0] * m[t+1]``.

    Args:
        rewards, values, turns: per action, length L, execution order.
        episode_ids: per action; default: all one episode.
        terminal: per action, 1 where the episode terminated at that action. Default:
            the last action of every episode is terminal.
        last_values: ``{episode_id: V}`` for episodes that were truncated rather than
            terminated: their last action bootstraps from ``V`` with the turn discount.
        passthrough: per action, 1 for an action that is no real link of the chain (not
            trainable: its prompt did not fit the context, so it has no value). Its value
            becomes ``r + gamma * V(next link)``: the predecessor bootstraps from the next
            real link (over both hops' gamma and lambda) and the skipped action's own
            reward still counts, instead of bootstrapping from a value of 0.

    Returns:
        ``(advantages, returns)``, numpy float64 arrays of length L.

    Example: two agents, one turn, the team reward 1 on the second::

        >>> adv, ret = action_level_gae([0.0, 1.0], [0.5, 0.6], turns=[0, 0])
        >>> adv.round(4).tolist()    # A_1 = 1 - 0.6;  A_0 = 0.99*0.6 - 0.5 + 0.99*0.95*A_1
        [0.4702, 0.4]
        >>> # the middle action had no room in the context: V_1 := 0 + 0.99*0.6, so the first
        >>> # action bootstraps from the third (A_0 = 0.99*0.594 - 0.5 + 0.9405*0.9405*0.4)
        >>> action_level_gae([0.0, 0.0, 1.0], [0.5, 0.0, 0.6], [0, 0, 0], passthrough=[0, 1, 0])[0].round(4).tolist()
        [0.4419, 0.3762, 0.4]
    """
    hops = {"gamma_agent": gamma_agent, "lam_agent": lam_agent, "gamma_turn": gamma_turn, "lam_turn": lam_turn}
    r, skip, episodes = _chain_episodes(rewards, turns, episode_ids, terminal, last_values, passthrough, hops)
    n = r.shape[0]
    v = _flat(values, n, "values")
    adv, ret = np.zeros(n), np.zeros(n)
    for ep in episodes:
        s, e = ep.start, ep.stop
        vs = _passthrough_values(r[s:e], v[s:e], ep.gammas, ep.done, ep.tail, skip[s:e]) if skip[s:e].any() else v[s:e]
        nv = np.append(vs[1:], ep.tail)
        adv[s:e], ret[s:e] = chain_gae(r[s:e], vs, nv, ep.gammas, ep.lams, ep.done)
    return adv, ret


def token_level_backup(
    rewards: ArrayLike,
    token_values: Sequence[ArrayLike],
    turns: ArrayLike,
    episode_ids: ArrayLike | None = None,
    *,
    gamma_token: float = 1.0,
    lam_token: float = 1.0,
    gamma_agent: float = 0.99,
    lam_agent: float = 0.95,
    gamma_turn: float = 0.99,
    lam_turn: float = 0.95,
    terminal: ArrayLike | None = None,
    last_values: Mapping[Any, float] | None = None,
    passthrough: ArrayLike | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Token-level MARFT: GAE over one chain of tokens through all executed actions.

    Action k has tokens j = 0..T_k-1 with values ``V_{k,j}`` (the value of the context
    just before token j is emitted). There is no reward inside an action; the action's
    reward arrives on its last token, which bootstraps from the *first-token* value of
    the successor action (the next agent executed, possibly in the next turn)::

        inside an action (j < T_k - 1):
            delta_{k,j} = gamma_token * V_{k,j+1} - V_{k,j}
            A_{k,j}     = delta_{k,j} + gamma_token * lam_token * A_{k,j+1}
        last token (j = T_k - 1), successor action k':
            delta_{k,j} = r_k + gamma(k) * V_{k',0} * (1 - d_k) - V_{k,j}
            A_{k,j}     = delta_{k,j} + gamma(k) * lam(k) * (1 - d_k) * A_{k',0}

    ``gamma(k), lam(k)`` are ``(gamma_agent, lam_agent)`` when k' is in the same turn and
    ``(gamma_turn, lam_turn)`` otherwise, exactly as in :func:`action_level_gae`.

    Defaults: ``gamma_token = lam_token = 1`` -- a token is not a unit of time, so the
    credit of an action's outcome reaches its first token undiminished (inside an action
    the advantage is the Monte-Carlo return to the action boundary minus ``V_{k,j}``).
    The reference implementation applied its single gamma (0.99) and lambda (0.95) per
    token, so credit to early tokens of a 512-token action decayed like 0.99^512 ~ 0.006;
    ``gamma_token=0.99, lam_token=0.95`` (with the agent/turn defaults) reproduces it.

    Args:
        rewards: per action (length L, execution order).
        token_values: per action, a 1-D array of its T_k >= 1 token values.
        turns, episode_ids, terminal, last_values: as in :func:`action_level_gae`.
        passthrough: per action, 1 for an action that is no real link (see
            :func:`action_level_gae`): its token values become the values that make its
            TD errors 0, so the previous action's last token bootstraps from the next
            real action's first token.

    Returns:
        ``(advantages, returns)``: lists of L numpy float64 arrays, one per action, each of
        length T_k (``returns = advantages + token values``).

    Example: agent 0 says 2 tokens, agent 1 one token and gets the team reward 1::

        >>> adv, ret = token_level_backup([0.0, 1.0], [[0.2, 0.4], [0.6]], turns=[0, 0])
        >>> [a.round(4).tolist() for a in adv]   # token discount 1 inside an action
        [[0.7702, 0.5702], [0.4]]
    """
    hops = {"gamma_agent": gamma_agent, "lam_agent": lam_agent, "gamma_turn": gamma_turn, "lam_turn": lam_turn}
    r, skip, episodes = _chain_episodes(rewards, turns, episode_ids, terminal, last_values, passthrough, hops)
    n = r.shape[0]
    if len(token_values) != n:
        raise ValueError(f"token_values has {len(token_values)} actions, rewards {n}")
    tv = [np.asarray(x.detach().cpu() if torch.is_tensor(x) else x, dtype=np.float64).reshape(-1) for x in token_values]
    for k, x in enumerate(tv):
        if x.shape[0] < 1:
            raise ValueError(f"action {k} has no token values (give an empty action one virtual token)")
    adv_out: list[np.ndarray] = [np.zeros(0)] * n
    ret_out: list[np.ndarray] = [np.zeros(0)] * n
    for ep in episodes:
        s, e, g_act, lam_act, d_act, tail = ep.start, ep.stop, ep.gammas, ep.lams, ep.done, ep.tail
        for k in range(e - 1, s - 1, -1):  # pass-through actions: values with zero TD error
            if skip[k]:
                x = tv[k].copy()
                succ = tv[k + 1][0] if k + 1 < e else tail
                x[-1] = r[k] + g_act[k - s] * (1.0 - d_act[k - s]) * succ
                for j in range(x.shape[0] - 2, -1, -1):
                    x[j] = gamma_token * x[j + 1]
                tv[k] = x
        rr, vv, nv, gg, ll, dd = [], [], [], [], [], []
        for k in range(s, e):
            x, T = tv[k], tv[k].shape[0]
            last = k == e - 1
            succ_first = tv[k + 1][0] if not last else tail
            d_last = d_act[k - s]
            rr.append(np.append(np.zeros(T - 1), r[k]))
            vv.append(x)
            nv.append(np.append(x[1:], succ_first))
            gg.append(np.append(np.full(T - 1, gamma_token), g_act[k - s]))
            ll.append(np.append(np.full(T - 1, lam_token), lam_act[k - s]))
            dd.append(np.append(np.zeros(T - 1), d_last))
        a, rt = chain_gae(*(np.concatenate(z) for z in (rr, vv, nv, gg, ll, dd)))
        pos = 0
        for k in range(s, e):
            T = tv[k].shape[0]
            adv_out[k], ret_out[k] = a[pos : pos + T], rt[pos : pos + T]
            pos += T
    return adv_out, ret_out


def per_agent_gae(
    rewards: ArrayLike,
    values: ArrayLike,
    agent_ids: ArrayLike,
    episode_ids: ArrayLike | None = None,
    *,
    gamma: float = 0.99,
    lam: float = 0.95,
    terminal: ArrayLike | None = None,
    last_values: Mapping[Any, float] | Mapping[tuple[Any, Any], float] | None = None,
    passthrough: ArrayLike | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """IPPO: GAE over each agent's own actions, with no chaining across agents.

    Within an episode the successor of agent i's action is agent i's next action; the
    last action of an agent in a terminated episode has no successor::

        delta_k = r_k + gamma * V_{k+1} * (1 - d_k) - V_k
        A_k     = delta_k + gamma * lam * (1 - d_k) * A_{k+1}

    For a single agent this is exactly stable-baselines3's
    ``RolloutBuffer.compute_returns_and_advantage``.

    Args:
        rewards, values, agent_ids: per action, length L, execution order.
        episode_ids: per action (contiguous episodes); default one episode.
        terminal: per action, 1 where that agent's chain terminates; default: the agent's
            last action of each episode.
        last_values: truncated episodes: ``{episode_id: V}`` (all agents) or
            ``{(episode_id, agent_id): V}`` -- the agent's last action bootstraps from V.
        passthrough: per action, 1 for an action that is no real link (see
            :func:`action_level_gae`): the agent's previous action bootstraps from its
            next real one.

    Returns:
        ``(advantages, returns)``, numpy float64 arrays of length L.

    Example: two agents acting twice each; agent "b"'s chains never see agent "a"::

        >>> adv, _ = per_agent_gae([0, 0, 1, 1], [0.5, 0.5, 0.5, 0.5], ["a", "b", "a", "b"], gamma=1.0, lam=1.0)
        >>> adv.tolist()
        [0.5, 0.5, 0.5, 0.5]
    """
    r = np.asarray(rewards.detach().cpu() if torch.is_tensor(rewards) else rewards, dtype=np.float64).reshape(-1)
    n = r.shape[0]
    v = _flat(values, n, "values")
    agents = list(np.asarray(agent_ids).reshape(-1).tolist())
    if len(agents) != n:
        raise ValueError(f"agent_ids has {len(agents)} entries, expected {n}")
    term = _flat(terminal, n, "terminal") if terminal is not None else None
    skip = _flat(passthrough, n, "passthrough") if passthrough is not None else np.zeros(n)
    lv = dict(last_values or {})
    adv, ret = np.zeros(n), np.zeros(n)
    for eid, s, e in episode_segments(episode_ids, n):
        for agent in dict.fromkeys(agents[s:e]):
            idx = np.array([k for k in range(s, e) if agents[k] == agent])
            d = term[idx].copy() if term is not None else np.zeros(len(idx))
            key = (eid, agent) if (eid, agent) in lv else eid
            tail = 0.0
            if key in lv:
                tail = float(lv[key])
            elif term is None:
                d[-1] = 1.0
            vs = _passthrough_values(r[idx], v[idx], gamma, d, tail, skip[idx]) if skip[idx].any() else v[idx]
            nv = np.append(vs[1:], tail)
            a, rt = chain_gae(r[idx], vs, nv, gamma, lam, d)
            adv[idx], ret[idx] = a, rt
    return adv, ret


def grpo_advantages(
    rewards: ArrayLike,
    group_ids: ArrayLike,
    agent_ids: ArrayLike | None = None,
    normalize: str = "group",
    scale_by_std: bool = True,
    eps: float = 1e-6,
    *,
    scale: bool | None = None,
    turn_ids: ArrayLike | None = None,
) -> Any:
    """Group-relative advantages (GRPO), with Dr. MAS agent-wise or AT-GRPO agent x turn statistics.

    For sample k of group g (samples of the same problem)::

        normalize="group":   A_k = (R_k - mean_g(R)) / (std_g(R) + eps)   ("global" before)
        normalize="agent":   A_k = (R_k - mean_{g,i}(R)) / (std_{g,i}(R) + eps)
        normalize="agent_turn": A_k = (R_k - mean_{g,i,u}(R)) / (std_{g,i,u}(R) + eps)
        normalize="none":    A_k =  R_k - mean_g(R)       (centred, never scaled)

    where ``mean_{g,i}`` / ``std_{g,i}`` run over the samples of group g that belong to
    agent i = ``agent_ids[k]``. Dr. MAS: with one global baseline, an agent whose rewards
    sit on a different scale or level (e.g. a verifier that is right more often than the
    solver) shifts the baseline and the step size of the others; agent-wise statistics
    give every agent its own zero-mean, unit-scale signal. AT-GRPO (PettingLLMs) splits each
    agent's cell further by turn u = ``turn_ids[k]``: a sample is compared with the samples
    of the same agent at the same turn of the same problem. ``scale_by_std=False`` keeps
    the centring but drops the division (Dr. GRPO: no per-group difficulty reweighting).
    ``std`` is the unbiased sample std (as TRL); a group (or group x agent cell) of one
    sample has std 0. All-equal groups give exactly 0, never NaN.

    Args:
        rewards: per sample, shape ``[K]``.
        group_ids: per sample group id.
        agent_ids: per sample agent id (required for ``normalize="agent"`` and ``"agent_turn"``).
        scale: alias of ``scale_by_std`` (the trainer's config name).
        turn_ids: per sample turn (required for ``normalize="agent_turn"``).

    Returns:
        advantages, a tensor if ``rewards`` is a tensor, else a numpy float64 array.

    Example: two groups of two samples; the second group has no signal::

        >>> grpo_advantages([1.0, 0.0, 1.0, 1.0], group_ids=[0, 0, 1, 1]).round(4).tolist()
        [0.7071, -0.7071, 0.0, 0.0]
        >>> grpo_advantages([1.0, 0.0, 1.0, 1.0], group_ids=[0, 0, 1, 1], normalize="none").tolist()
        [0.5, -0.5, 0.0, 0.0]

    AT-GRPO: one agent at two turns; each turn has its own baseline::

        >>> grpo_advantages([1.0, 0.0, 3.0, 1.0], [0] * 4, agent_ids=[0] * 4, turn_ids=[0, 0, 1, 1],
        ...                 normalize="agent_turn", scale=False).tolist()
        [0.5, -0.5, 1.0, -1.0]
    """
    if scale is not None:
        scale_by_std = scale
    if normalize == "global":  # the name of "group" before the one vocabulary
        normalize = "group"
    if normalize not in ("group", "agent", "agent_turn", "none"):
        raise ValueError(f"normalize must be 'group', 'agent', 'agent_turn' or 'none', got {normalize!r}")
    if normalize in ("agent", "agent_turn") and agent_ids is None:
        raise ValueError(f"normalize={normalize!r} needs agent_ids")
    if normalize == "agent_turn" and turn_ids is None:
        raise ValueError("normalize='agent_turn' needs turn_ids")
    as_torch = torch.is_tensor(rewards)
    r = (rewards.detach().cpu().numpy() if as_torch else np.asarray(rewards)).astype(np.float64).reshape(-1)
    groups = np.asarray(group_ids.cpu() if torch.is_tensor(group_ids) else group_ids).reshape(-1)
    if groups.shape[0] != r.shape[0]:
        raise ValueError(f"group_ids has {groups.shape[0]} entries for {r.shape[0]} rewards")
    if normalize == "agent":
        agents = np.asarray(agent_ids.cpu() if torch.is_tensor(agent_ids) else agent_ids).reshape(-1)
        keys = list(zip(groups.tolist(), agents.tolist(), strict=True))
    elif normalize == "agent_turn":
        agents = np.asarray(agent_ids.cpu() if torch.is_tensor(agent_ids) else agent_ids).reshape(-1)
        turns = np.asarray(turn_ids.cpu() if torch.is_tensor(turn_ids) else turn_ids).reshape(-1)
        if turns.shape[0] != r.shape[0]:
            raise ValueError(f"turn_ids has {turns.shape[0]} entries for {r.shape[0]} rewards")
        keys = list(zip(groups.tolist(), agents.tolist(), turns.tolist(), strict=True))
    else:
        keys = groups.tolist()
    cells: dict[Any, list[int]] = {}
    for k, key in enumerate(keys):
        cells.setdefault(key, []).append(k)
    adv = np.zeros_like(r)
    for idx in cells.values():
        x = r[idx]
        centred = x - x.mean()
        if normalize != "none" and scale_by_std:
            std = x.std(ddof=1) if len(x) > 1 else 0.0
            centred = centred / (std + eps)
        adv[idx] = centred
    if as_torch:
        return torch.as_tensor(adv, dtype=rewards.dtype if rewards.is_floating_point() else torch.float32, device=rewards.device)
    return adv


def frac_zero_std_groups(rewards: ArrayLike, group_ids: ArrayLike, atol: float = 1e-8) -> float:
    """The fraction of groups whose rewards all agree (std 0): the groups that give GRPO no signal.

    A group is the samples sharing a ``group_ids`` entry; its rewards "agree" when their spread
    (max - min) is at most ``atol``, so a group of one sample counts as zero-std, as in
    :func:`grpo_advantages` (whose advantages are exactly 0 there). Every group counts once,
    whatever its size. An empty batch has no groups: 0.0.

    Example: the first group has signal, the second does not::

        >>> frac_zero_std_groups([1.0, 0.0, 1.0, 1.0], group_ids=[0, 0, 1, 1])
        0.5
    """
    r = (rewards.detach().cpu().numpy() if torch.is_tensor(rewards) else np.asarray(rewards, dtype=np.float64)).reshape(-1)
    groups = np.asarray(group_ids.cpu() if torch.is_tensor(group_ids) else group_ids).reshape(-1)
    if groups.shape[0] != r.shape[0]:
        raise ValueError(f"group_ids has {groups.shape[0]} entries for {r.shape[0]} rewards; give one group id per reward")
    if r.shape[0] == 0:
        return 0.0
    cells: dict[Any, list[float]] = {}
    for g, v in zip(groups.tolist(), r.tolist(), strict=True):
        cells.setdefault(g, []).append(v)
    zero = sum(1 for vs in cells.values() if max(vs) - min(vs) <= atol)
    return zero / len(cells)


def turn_level_advantages(
    rewards: ArrayLike,
    agent_ids: ArrayLike,
    episode_ids: ArrayLike | None = None,
    *,
    gamma: float = 1.0,
    normalize: str = "agent",
    group_ids: ArrayLike | None = None,
    eps: float = 1e-6,
    action_ids: ArrayLike | None = None,
    turn_ids: ArrayLike | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """MARS's turn-level advantages with agent-specific normalisation (no critic).

    Every action k of agent i gets the return of agent i's OWN turns from k on
    (``r_k`` is the reward credited to that action, e.g. ``Transition.credited_reward``;
    the successor of k is agent i's next action in the same episode)::

        G_k = r_k + gamma * G_{next action of the same agent}     (0 after its last one)

    and is then normalised with statistics of ITS agent only, so that in a zero-sum game
    the winner's +1 and the loser's -1 do not cancel in one shared baseline, and an agent
    whose returns sit on another scale does not rescale the others::

        normalize="agent":  A_k = (G_k - mean_i(G)) / (std_i(G) + eps)
        normalize="agent_turn": the same per (agent, turn) cell (AT-GRPO; needs ``turn_ids``)
        normalize="batch":  A_k = (G_k - mean(G))   / (std(G) + eps)
        normalize="none":   A_k =  G_k

    ``mean_i`` / ``std_i`` (population std) run over agent i's actions in the batch, or in
    the action's group when ``group_ids`` is given (one cell per (group, agent): GRPO's
    problems). A cell of one action, or of equal returns, gives 0 (never NaN).

    This is our reading of MARS (arXiv 2510.15414): turn-level credit from the agent's own
    later rewards, agent-specific advantage normalisation.

    Args:
        rewards, agent_ids: per action, length L, execution order.
        episode_ids: per action (contiguous episodes); default one episode.
        gamma: discount between an agent's consecutive turns.
        normalize: ``"agent"``, ``"agent_turn"``, ``"batch"`` or ``"none"``.
        group_ids: per action; statistics per (group, agent) / per group when given.
        action_ids: per entry, the action it belongs to (``Transition.action_key``): the tool
            segments of one action are one turn, undiscounted between them.
        turn_ids: per entry, the env turn (``normalize="agent_turn"``).

    Returns:
        ``(advantages, returns)``: numpy float64 arrays of length L (``returns`` = G).

    Example: Nim, a moves, b moves, a takes the last stone (+1 for a, -1 for b)::

        >>> adv, G = turn_level_advantages([0, 0, 1], ["a", "b", "a"], normalize="none")
        >>> G.tolist()                        # b's -1 is credited to its own action by the caller
        [1.0, 0.0, 1.0]
        >>> adv, G = turn_level_advantages([0, -1, 1], ["a", "b", "a"], gamma=0.5, normalize="none")
        >>> G.tolist()
        [0.5, -1.0, 1.0]

    One action of three tool segments is one turn (the reward sits on its last segment)::

        >>> turn_level_advantages([0, 0, 1], ["a"] * 3, gamma=0.5, normalize="none", action_ids=[7, 7, 7])[1].tolist()
        [1.0, 1.0, 1.0]
    """
    r = np.asarray(rewards.detach().cpu() if torch.is_tensor(rewards) else rewards, dtype=np.float64).reshape(-1)
    n = r.shape[0]
    if normalize not in ("agent", "agent_turn", "batch", "none"):
        raise ValueError(f"normalize must be 'agent', 'agent_turn', 'batch' or 'none', got {normalize!r}")
    if normalize == "agent_turn" and turn_ids is None:
        raise ValueError("normalize='agent_turn' needs turn_ids")
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    agents = list(np.asarray(agent_ids).reshape(-1).tolist())
    if len(agents) != n:
        raise ValueError(f"agent_ids has {len(agents)} entries, expected {n}")
    groups = list(np.asarray(group_ids).reshape(-1).tolist()) if group_ids is not None else [0] * n
    if len(groups) != n:
        raise ValueError(f"group_ids has {len(groups)} entries, expected {n}")
    actions = [tuple(a) if isinstance(a, list) else a for a in action_ids] if action_ids is not None else list(range(n))
    if len(actions) != n:
        raise ValueError(f"action_ids has {len(actions)} entries, expected {n}")
    G = np.zeros(n)
    for _, s, e in episode_segments(episode_ids, n):
        running: dict[Any, tuple[float, Any]] = {}  # agent -> (return from its next entry, that entry's action)
        for k in range(e - 1, s - 1, -1):  # backwards: each agent's own later turns only
            later = running.get(agents[k])
            if later is None:
                G[k] = r[k]
            else:  # a later segment of the same action is the same turn: no discount
                G[k] = r[k] + (1.0 if later[1] == actions[k] else gamma) * later[0]
            running[agents[k]] = (G[k], actions[k])
    if normalize == "none":
        return G.copy(), G
    cells: dict[Any, list[int]] = {}
    turns = list(np.asarray(turn_ids).reshape(-1).tolist()) if turn_ids is not None else [0] * n
    if len(turns) != n:
        raise ValueError(f"turn_ids has {len(turns)} entries, expected {n}")
    for k in range(n):
        key = (groups[k], agents[k]) if normalize == "agent" else (groups[k], agents[k], turns[k]) if normalize == "agent_turn" else groups[k]
        cells.setdefault(key, []).append(k)
    adv = np.zeros(n)
    for idx in cells.values():
        x = G[idx]
        adv[idx] = (x - x.mean()) / (x.std() + eps) if len(x) > 1 else 0.0
    return adv, G
