"""The rollout worker: a spawned process with its own policy copy and collector.

Its policy is a copy of the trainer's (unpickled from ``policy_blob``: the same models,
adapters and engine settings, custom policies included) or, with ``rollout_device`` set or
an engine that cannot be pickled (vLLM), one built from the config (``make_policy`` on
``rollout_device``). It builds a :class:`~marft_algos.rollout.RolloutCollector` on the same env factory, starts from
the trainer's RNG state, then serves tasks in order. A task is one whole batch: the reset
list (problem seeds, group ids) the trainer drew, the first episode id, and the oldest
policy version allowed (``index - max_staleness``). Before each batch the worker waits
until the published weights are recent enough, copies the newest ones in, and plays the
whole batch with them: a GRPO group never mixes policy versions. The batch goes back with
its version and the worker's busy / idle seconds.

Messages to the trainer (its own result queue): ``("ready", pid)``, ``("batch", epoch,
index, version, batch, busy_s, idle_s)``, ``("error", traceback)``. It exits on ``None``
from its task queue, on Ctrl-C, and when the trainer's process is gone (a watchdog thread
notices within half a second, mid-batch included).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import queue
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch

from marft_algos.async_rollout.weights import synced_parameters
from marft_algos.policy_factory import make_policy
from marft_algos.rollout import RolloutCollector
from marft_algos.seeding import set_rng_state
from marft_algos.threads import threads_for

__all__ = ["Task", "watch_parent", "worker_main"]

_POLL_S = 0.02  # waiting for weights: short sleeps
_WATCH_S = 0.5  # the watchdog's period: how long an orphan outlives its trainer, mid-batch included


@dataclass(frozen=True)
class Task:
    """One batch to generate (see the module docstring)."""

    epoch: int
    index: int
    resets: list[dict[str, Any]]
    first_episode_id: int
    min_version: int


def _parent_alive(ppid: int) -> bool:
    return os.getppid() == ppid


def watch_parent(ppid: int, leave: Any, period_s: float = _WATCH_S) -> threading.Thread:
    """Call ``leave()`` once the process ``ppid`` is no longer this one's parent.

    The task loop checks the parent between batches only, so a worker whose trainer was
    killed (SIGKILL, OOM) played its whole current batch first: minutes with a real model.
    A daemon thread polls instead. Not ``PR_SET_PDEATHSIG``: Linux-only, and it fires when
    the spawning *thread* ends, not the process.
    """

    def watch() -> None:
        while _parent_alive(ppid):
            time.sleep(period_s)
        leave()

    thread = threading.Thread(target=watch, name="marft-parent-watchdog", daemon=True)
    thread.start()
    return thread


def _leave(results: Any) -> None:
    """Exit now, flushing no batch nobody will read: the trainer sent the stop (or is gone).

    A batch generated ahead (``max_staleness > 0``) and never read stays buffered; once it
    is larger than a pipe holds (64 KiB: any real model's batch) the queue's feeder thread
    held the exit until the trainer's stop gave up after 5 s and terminated the worker.
    Nothing else needs an orderly exit either (program threads and the loopback server are
    daemon threads, the shared weights are the trainer's): ``os._exit`` skips the
    interpreter's teardown of torch, which alone took seconds on a loaded machine.
    """
    results.cancel_join_thread()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(0)


def worker_main(
    worker: int, config: Any, agents: list[str], roles: list[str], env_fn: Any, group_size: int,
    shared: Any, tasks: Any, results: Any, rng: dict[str, Any], ppid: int, policy_blob: bytes | None = None,
) -> None:
    """Entry point of worker ``worker`` (see the module docstring)."""
    try:
        cfg = config if not config.rollout_device else dataclasses.replace(config, device=config.rollout_device)
        torch.set_num_threads(threads_for("collect", cfg.collect_threads))
        policy = pickle.loads(policy_blob) if policy_blob is not None else make_policy(cfg, agents)
        collector = RolloutCollector(
            env_fn, policy, num_envs=cfg.num_envs, group_size=group_size, seed=cfg.seed, mode="train",
            sampling_overrides=cfg.sampling_overrides, max_context=cfg.max_context, strict_context=cfg.strict_context,
        )
        if callable(getattr(cfg, "branch_collector", None)):
            cfg.branch_collector(collector)  # trees, as the trainer's own collector plays them (branching > 1)
        params = synced_parameters(policy, roles)
        set_rng_state(rng)  # after the policy's own initialisation drew from it
        watch_parent(ppid, lambda: _leave(results))
        results.put(("ready", os.getpid()))
        have = (-1, -1)
        busy = idle = 0.0
        while True:
            t0 = time.perf_counter()
            try:
                task = tasks.get(timeout=0.5)
            except queue.Empty:  # a trainer that is gone: the watchdog ends this process
                idle += time.perf_counter() - t0
                continue
            if task is None:
                return _leave(results)
            while True:  # the weights this batch may use: same epoch, version >= min_version
                epoch, version = shared.stamp()
                if epoch > task.epoch or (epoch == task.epoch and version >= task.min_version):
                    break
                time.sleep(_POLL_S)
            idle += time.perf_counter() - t0
            if epoch > task.epoch:
                continue  # the trainer dropped this task (resume / rollback)
            t1 = time.perf_counter()
            if (epoch, version) != have:
                have = shared.read_into(params)
            collector.next_episode_id = task.first_episode_id
            with torch.no_grad():
                batch = collector.run(task.resets)
            busy += time.perf_counter() - t1
            results.put(("batch", task.epoch, task.index, have[1], batch, busy, idle))
            busy = idle = 0.0
    except KeyboardInterrupt:
        return  # Ctrl-C reaches the whole process group: the trainer stops too
    except BaseException:
        try:
            results.put(("error", traceback.format_exc()))
            results.close()
            results.join_thread()  # the message must leave before the process does
        except Exception:
            pass
        raise SystemExit(1) from None
