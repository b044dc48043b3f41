"""Credit assignment in closed form: tree (counterfactual) values and GiGPO step groups.

Pure functions on plain Python/numpy data (no models, no trainers); the estimators of
GRPO and MARFT call them on a batch collected with ``branching > 1``
(:mod:`marft_algos.branching`) or with ``step_group_weight > 0`` (docs/credit.md).

Tree credit
-----------
A branching rollout is a tree per problem: a *node* is a state where an agent is about
to act (identified by the action that led to it; the problem's reset state is the root),
its *children* are the sibling actions sampled there from the same observation, and every
root-to-leaf *path* is one finished episode. For an action ``a`` below node ``s``::

    Q(a) = mean over the leaves l below a of  R_l(a)              (its Monte-Carlo value)
    V(s) = mean over the children c of s  of  Q(c)                (the node's value)
    A(a) = Q(a) - V(s)                                            (counterfactual credit)

``R_l(a)`` is the return of leaf ``l`` seen from ``a`` (the episode's team return, or
the return-to-go from ``a`` on). ``A(a)`` is the credit of the acting agent's choice
with its predecessors held fixed: every sibling shares the same history, so whatever the
predecessors did cancels. With ``scale`` it is divided by the siblings' sample std (GRPO's
per-group normalisation, one group per (node, agent)). A node with one child gives 0.

Step groups (GiGPO)
-------------------
Within a group of episodes (one problem), actions taken from the same observation form a
step group and share a baseline::

    A_step(k) = (G_k - mean_{step group}(G)) / (std_{step group}(G) + eps)

``G_k`` is the action's return from that step on; a step group of one action gives 0.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["TreeCredit", "leaf_returns_to_go", "observation_key", "step_group_advantages", "tree_credit"]


@dataclass
class TreeCredit:
    """The tree statistics of one or more trees (keys: action ids and node ids).

    Attributes:
        q: ``Q(a)`` per action: the mean of its leaves' returns.
        v: ``V(s)`` per node: the mean of its children's ``Q``.
        advantage: ``A(a) = Q(a) - V(parent)`` (divided by the siblings' std with ``scale``).
        parent: the node each action was taken at.
        children: the actions of each node, in first-seen order.
        leaves: how many leaves lie below each action.
    """

    q: dict[Hashable, float] = field(default_factory=dict)
    v: dict[Hashable, float] = field(default_factory=dict)
    advantage: dict[Hashable, float] = field(default_factory=dict)
    parent: dict[Hashable, Hashable] = field(default_factory=dict)
    children: dict[Hashable, list[Hashable]] = field(default_factory=dict)
    leaves: dict[Hashable, int] = field(default_factory=dict)


def tree_credit(
    paths: Sequence[Sequence[tuple[Hashable, Hashable]]],
    returns: Sequence[float | Sequence[float]],
    *,
    scale: bool = False,
    eps: float = 1e-6,
) -> TreeCredit:
    """Tree values and counterfactual advantages from the root-to-leaf paths of a tree.

    Args:
        paths: per leaf, its path as ``(node, action)`` pairs in execution order: ``node``
            identifies the state the action was taken at (equal for siblings, e.g. the
            previous action's id, or ``(tree, None)`` at the root), ``action`` identifies
            the action (equal wherever two leaves share it).
        returns: per leaf, its return (one number for every action of the path), or one
            number per path entry (e.g. the return-to-go from that action on).
        scale: divide each advantage by the sample std (ddof 1) of its siblings' ``Q`` (+ eps).

    Returns:
        a :class:`TreeCredit`.

    Example: two speaker actions at the root, two listener actions under each; the
    speaker's choice decides the outcome::

        >>> root, x, y = ("t", None), "x", "y"
        >>> paths = [[(root, x), (x, "x1")], [(root, x), (x, "x2")], [(root, y), (y, "y1")], [(root, y), (y, "y2")]]
        >>> tc = tree_credit(paths, [1.0, 1.0, 0.0, 0.0])
        >>> tc.advantage["x"], tc.advantage["y"], tc.advantage["x1"], tc.advantage["y2"]
        (0.5, -0.5, 0.0, 0.0)
    """
    if len(paths) != len(returns):
        raise ValueError(f"returns has {len(returns)} entries for {len(paths)} paths (one per leaf)")
    sums: dict[Hashable, float] = {}
    out = TreeCredit()
    for path, ret in zip(paths, returns, strict=True):
        per_step = list(ret) if isinstance(ret, (Sequence, np.ndarray)) else [float(ret)] * len(path)
        if len(per_step) != len(path):
            raise ValueError(f"a path of {len(path)} actions has {len(per_step)} returns")
        for (node, action), r in zip(path, per_step, strict=True):
            known = out.parent.setdefault(action, node)
            if known != node:
                raise ValueError(f"action {action!r} appears under two nodes ({known!r} and {node!r})")
            if action not in out.leaves:
                out.children.setdefault(node, []).append(action)
            sums[action] = sums.get(action, 0.0) + float(r)
            out.leaves[action] = out.leaves.get(action, 0) + 1
    out.q = {a: sums[a] / out.leaves[a] for a in sums}
    for node, kids in out.children.items():
        qs = np.array([out.q[a] for a in kids], dtype=np.float64)
        out.v[node] = float(qs.mean())
        centred = qs - qs.mean()
        sd = qs.std(ddof=1) if len(qs) > 1 else 0.0
        if scale and sd + eps > 0:  # a lone child or equal siblings: 0, never 0/0
            centred = centred / (sd + eps)
        for a, adv in zip(kids, centred.tolist(), strict=True):
            out.advantage[a] = float(adv)
    return out


def observation_key(agent: str, prompt_ids: Sequence[int]) -> str:
    """A hash of what ``agent`` saw (its prompt ids): equal observations give equal keys."""
    h = hashlib.blake2b(digest_size=16)
    h.update(agent.encode())
    h.update(np.asarray(list(prompt_ids), dtype=np.int64).tobytes())
    return h.hexdigest()


def step_group_advantages(
    step_returns: Sequence[float],
    obs_keys: Sequence[Hashable],
    group_ids: Sequence[Hashable] | None = None,
    *,
    scale: bool = True,
    eps: float = 1e-6,
) -> np.ndarray:
    """GiGPO step-level advantages: actions from the same observation share a baseline.

    Args:
        step_returns: ``G_k`` per action (its return from that step on).
        obs_keys: per action, the key of the observation it was taken from
            (:func:`observation_key`).
        group_ids: per action, its group (problem); step groups never cross groups.
        scale: divide by the step group's sample std (ddof 1) + eps.

    Returns:
        numpy float64 array, one advantage per action (0 in a step group of one).

    Example: three actions from observation "s" (returns 1, 0, 0.5), one from "u"::

        >>> step_group_advantages([1.0, 0.0, 0.5, 1.0], ["s", "s", "s", "u"], scale=False).tolist()
        [0.5, -0.5, 0.0, 0.0]
    """
    g = np.asarray(step_returns, dtype=np.float64).reshape(-1)
    n = g.shape[0]
    keys = list(obs_keys)
    groups = list(group_ids) if group_ids is not None else [0] * n
    if len(keys) != n or len(groups) != n:
        raise ValueError(f"obs_keys ({len(keys)}) and group_ids ({len(groups)}) need one entry per return ({n})")
    cells: dict[tuple[Any, Any], list[int]] = {}
    for k, key in enumerate(zip(groups, keys, strict=True)):
        cells.setdefault(key, []).append(k)
    adv = np.zeros(n)
    for idx in cells.values():
        if len(idx) < 2:
            continue
        x = g[idx]
        centred = x - x.mean()
        sd = x.std(ddof=1)
        if scale and sd + eps > 0:
            centred = centred / (sd + eps)
        adv[idx] = centred
    return adv


def leaf_returns_to_go(rewards: Sequence[float], discounts: Sequence[float]) -> list[float]:
    """``R_k = r_k + gamma_k * R_{k+1}`` along one path (``discounts[k]``: the hop k -> k+1).

    Example::

        >>> leaf_returns_to_go([0.0, 0.0, 1.0], [0.5, 0.5, 0.0])
        [0.25, 0.5, 1.0]
    """
    out = [0.0] * len(rewards)
    running = 0.0
    for k in range(len(rewards) - 1, -1, -1):
        running = float(rewards[k]) + (float(discounts[k]) * running if k + 1 < len(rewards) else 0.0)
        out[k] = running
    return out

