"""Which reward components are costs (for the learning-curve plot and the compare view).

A team reward is a sum of components (``info["reward_components"]``; see
``marft_envs.rewards``). The built-in costs (``chars``, ``tokens``, ``turn``, the tool
components, a dialogue's ``turn_cost``) are configured as non-negative weights and enter
the reward negated, and a user's program may return its own (``{"outcome": 1, "api": -0.2}``).
No list of names can know them all, so a component is a cost when

- its values are never positive and some are negative (its weight is negative: it only
  ever lowers the reward; a zero-weight cost, all zeros, is left out), or
- its name contains ``cost`` (``api_cost``, ``cost/latency``), or
- the caller marks its name as a cost (``marked``).

A cost is shown as a positive number: minus the component.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["cost_components", "is_cost"]


def is_cost(name: str, values: Iterable[float], marked: Iterable[str] = ()) -> bool:
    """Whether component ``name`` with observed ``values`` is a cost (see the module docstring)."""
    if name in set(marked) or "cost" in name.lower():
        return True
    vals = [float(v) for v in values]
    return bool(vals) and max(vals) <= 0.0 and min(vals) < 0.0


def cost_components(values: Mapping[str, Iterable[float]], marked: Iterable[str] = ()) -> list[str]:
    """The names of ``values`` (component -> its observed values) that are costs, in the given order."""
    marked = list(marked)
    return [name for name, vals in values.items() if is_cost(name, vals, marked)]
