"""Asynchronous rollouts: worker processes generate batches while the trainer updates.

``rollout_workers = N`` (config) starts N spawned processes, each with its own copy of
the policy (built from the config, on ``rollout_device``) and its own env copies. The
trainer shares its trained weights with them through shared memory after every update,
tagged with a version (:mod:`~marft_algos.async_rollout.weights`); a worker plays each
batch whole with one version (:mod:`~marft_algos.async_rollout.worker`); the trainer
issues the batches, bounds their staleness by ``max_staleness`` and handles faults
(:mod:`~marft_algos.async_rollout.pool`). A stale batch is trained with AReaL's decoupled
PPO objective (:mod:`marft_algos.behaviour`). User guide: ``docs/async.md``.
"""

from marft_algos.async_rollout.pool import AsyncRollout, RolloutWorkerError
from marft_algos.async_rollout.weights import SharedWeights, synced_parameters
from marft_algos.async_rollout.worker import Task, worker_main

__all__ = ["AsyncRollout", "RolloutWorkerError", "SharedWeights", "Task", "synced_parameters", "worker_main"]
