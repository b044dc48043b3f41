"""DAPO dynamic sampling: groups of episodes that carry no learning signal are replaced.

A group whose advantages would all be 0 (``Algorithm.no_signal``: e.g. every episode of a
GRPO group scored alike) teaches nothing; the collect phase drops such groups and plays
more until the batch is full or ``max_resample_tries`` extra rounds are spent (DAPO,
arXiv 2503.14476). Several ranks play the rounds in lock-step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from marft_algos.records import Episode, RolloutBatch

__all__ = ["resample_groups"]

#: metrics that add up over every rollout round of a step
SUMMED = ("rollout/tokens", "rollout/actions", "perf/rollout_s", "perf/generate_s", "rollout/verifier_timeouts", "rollout/overlong")


def resample_groups(
    batch: RolloutBatch, collector: Any, dist: Any, num_groups: int, no_signal: Callable[[Sequence[Episode]], bool], max_tries: int
) -> RolloutBatch:
    """``batch`` with its no-signal groups replaced by new ones (``num_groups`` over all ranks).

    The reward metrics of the first round (the unbiased sample of the current policy) are
    kept; :data:`SUMMED` add up every round. Adds ``rollout/dynamic_tries``,
    ``rollout/groups_dropped`` and ``rollout/groups_kept``.
    """
    num_groups //= dist.world_size  # this rank's share
    metrics = dict(batch.metrics)
    kept = [g for g in batch.groups().values() if not no_signal(g)]
    dropped, tries = num_groups - len(kept), 0
    # several ranks: rounds in lock-step, each drawing the one global problem list (max need x ranks)
    while (need := int(dist.max([num_groups - len(kept)])[0])) > 0 and tries < max_tries:
        tries += 1
        more = dist.collect(collector, need * dist.world_size)
        for key in SUMMED:
            metrics[key] = metrics.get(key, 0.0) + more.metrics.get(key, 0.0)
        new_groups = list(more.groups().values())
        good = [g for g in new_groups if not no_signal(g)]
        dropped += len(new_groups) - len(good)
        kept += good
    kept = kept[:num_groups]
    metrics.update({"rollout/dynamic_tries": float(tries), "rollout/groups_dropped": float(dropped), "rollout/groups_kept": float(len(kept))})
    metrics["perf/rollout_tokens_per_s"] = metrics.get("rollout/tokens", 0.0) / max(metrics.get("perf/rollout_s", 0.0), 1e-9)
    return RolloutBatch(episodes=[ep for g in kept for ep in g], metrics=metrics)
