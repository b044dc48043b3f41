"""The trainer's side of asynchronous rollouts: workers, tasks, versions, faults.

:class:`AsyncRollout` is a loop callback (stops the workers when the run ends,
checkpoints what was in flight, adds the trainer's idle fraction) plus the method
:meth:`AsyncRollout.next_batch`, which :meth:`marft_algos.trainer.Trainer.collect` calls
instead of its own collector when ``rollout_workers > 0``. It publishes the trainer's
weights there, at the start of each step's collect: after the last update and every
callback that changes weights (self-play's opponent), as a synchronous collect sees them.

Batches are indexed by the training step that will consume them. At step ``s`` the
trainer issues the tasks ``s .. s + max_staleness`` (a bounded queue: at most
``max_staleness + 1`` whole batches in flight) and waits for batch ``s``. Task ``i`` goes
to worker ``i % rollout_workers`` and may be generated with weights of version
``>= i - max_staleness``: with ``max_staleness=0`` a worker waits for the newest weights,
so the run is the synchronous one; with ``k`` the worker generates batch ``s + k`` while the
trainer updates on batch ``s``.

The problem stream stays the trainer's: it draws each task's resets from a look-ahead copy
of its collector's state, and its collector moves to the state after batch ``s`` only when
batch ``s`` is consumed. A checkpoint therefore resumes after the last *trained* batch:
the batches in flight at that moment are dropped and generated again from the same
problems (``rollout/dropped_batches`` counts them; also a rollback's).

Faults: a worker that raises sends its traceback and the run stops with it; a worker that
dies (killed, out of memory) is restarted ``rollout_restarts`` times (its batches are
generated again) and otherwise stops the run with its exit status; no batch within
``rollout_timeout_s`` stops the run too. Every wait polls with a timeout: never a hang.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import signal
import time
import weakref
from typing import Any

import torch
import torch.multiprocessing as tmp

from marft_algos.async_rollout.weights import SharedWeights, synced_parameters
from marft_algos.async_rollout.worker import Task, worker_main
from marft_algos.callbacks import Callback
from marft_algos.config import ConfigError
from marft_algos.seeding import rng_state

__all__ = ["AsyncRollout", "RolloutWorkerError"]

log = logging.getLogger("marft")

_POLL_S = 0.5


class RolloutWorkerError(RuntimeError):
    """A rollout worker failed, died or stopped delivering; the message says which and why."""


def _exit_status(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (out of memory? see `dmesg`)" if name == "SIGKILL" else ""
        return f"killed by {name}{hint}"
    return f"exit code {code}"


def _stop_workers(procs: list[Any], tasks: list[Any], results: list[Any]) -> None:
    """Stop these worker processes: a stop message, then terminate, then kill; close their queues.

    A module function over the pool's own lists (restarts replace their items in place), so
    that the pool's finalizer can run it without holding the pool: a pool dropped without
    ``stop()`` (a trainer used through ``train_step`` and discarded) or left at interpreter
    exit still stops its workers, and the exit never waits on a worker blocked on its queue.
    """
    live = [p for p in procs if p is not None]
    for q in tasks:
        try:
            if q is not None:
                q.put(None)
        except Exception:
            pass
    deadline = time.monotonic() + 5.0
    for p in live:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in live:
        if p.is_alive():
            p.terminate()
            p.join(2.0)
        if p.is_alive():
            p.kill()
            p.join(2.0)
    for q in tasks + results:
        if q is not None:
            q.cancel_join_thread()  # never block the exit on a queue a dead process held
            q.close()


class AsyncRollout(Callback):
    """Rollout workers feeding a trainer (see the module docstring)."""

    state_key = "async_rollout"

    def __init__(self, trainer: Any) -> None:
        c = trainer.config
        if trainer.dist.active:
            raise ConfigError(
                "rollout_workers > 0 under a launcher (torchrun) is not supported: each rank would start its own "
                "workers; run one trainer process with rollout_workers, or rollout_workers=0 for data-parallel training"
            )
        if getattr(c, "dynamic_sampling", False):
            raise ConfigError("dynamic_sampling resamples groups inside the trainer's step: it needs rollout_workers=0")
        try:
            pickle.dumps(trainer.env_fn)
        except Exception as e:
            raise ConfigError(
                f"rollout_workers > 0 sends the env factory to worker processes, but it cannot be pickled ({e}): "
                "pass a module-level function or functools.partial as env_fn (the default, built from env_id, is one)"
            ) from None
        self.trainer = weakref.proxy(trainer)
        self.n = c.rollout_workers
        self.k = c.max_staleness
        self.timeout = c.rollout_timeout_s
        self.restarts_left = c.rollout_restarts
        self.procs: list[Any] = []
        self.tasks: list[Any] = []
        self.results: list[Any] = []
        self.shared: SharedWeights | None = None
        self.params: list[Any] = []
        self.epoch = 0
        self.expected: int | None = None  # the step whose batch comes next; None: reset first
        self.next_index = 0  # first index not yet issued
        self.outstanding: dict[int, Task] = {}
        self.after: dict[int, dict[str, Any]] = {}  # collector state after each issued task's draws
        self.buffer: dict[int, tuple] = {}
        self.lookahead: dict[str, Any] = {}
        self.wait_s = 0.0
        self._finalizer: Any = None  # stops the workers when the pool is dropped or at exit (see _stop_workers)

    # ---- lifecycle ---------------------------------------------------------------------
    @property
    def started(self) -> bool:
        """Are the worker processes running?"""
        return bool(self.procs)

    def start(self) -> None:
        """Spawn the workers and wait until each has built its policy (``rollout_timeout_s``)."""
        t = self.trainer
        self.ctx = tmp.get_context("spawn")
        self.params = synced_parameters(t.policy, t.trainable_agents())
        self.shared = SharedWeights(self.params, self.ctx)
        self.procs, self.tasks, self.results = [None] * self.n, [None] * self.n, [None] * self.n
        self._finalizer = weakref.finalize(self, _stop_workers, self.procs, self.tasks, self.results)
        for w in range(self.n):
            self._spawn(w)
        for w in range(self.n):
            self._await_ready(w)
        self.expected = None

    def _spawn(self, w: int) -> None:

        t = self.trainer
        rng = rng_state()
        if w:  # several workers: each its own sampling stream

            g = torch.Generator().manual_seed(t.config.seed * 1000 + w)
            rng = {**rng, "torch": g.get_state()}
        self.tasks[w], self.results[w] = self.ctx.Queue(), self.ctx.Queue()
        args = (w, t.config, list(t.agents), list(t.trainable_agents()), t.env_fn, t.algorithm.group_size,
                self.shared, self.tasks[w], self.results[w], rng, os.getpid(), self._policy_blob())
        self.procs[w] = self.ctx.Process(target=worker_main, args=args, name=f"marft-rollout-{w}", daemon=False)
        self.procs[w].start()

    def _policy_blob(self) -> bytes | None:
        """The trainer's policy, pickled for the workers' copies; None: they build one from the
        config (``rollout_device`` set, or a policy that cannot be pickled, e.g. a vLLM engine)."""
        if self.trainer.config.rollout_device:
            return None
        try:
            return pickle.dumps(self.trainer.policy)
        except Exception as e:
            log.info("rollout workers build their policy from the config (the trainer's cannot be pickled: %s)", e)
            return None

    def _await_ready(self, w: int) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            msg = self._get(w, deadline, f"to start (build its policy and {self.trainer.config.num_envs} envs)")
            if msg is not None and msg[0] == "ready":
                return

    def stop(self) -> None:
        """Stop every worker (a stop message, then terminate, then kill); idempotent."""
        if self._finalizer is not None:
            self._finalizer()  # runs _stop_workers once, then is dead
            self._finalizer = None
        self.procs, self.tasks, self.results = [], [], []
        if self.outstanding:  # what was in flight is dropped: a later start issues it again
            self._count("rollout/dropped_batches", len(self.outstanding))
        self._clear()
        self.expected = None

    def _clear(self) -> None:
        self.outstanding.clear()
        self.after.clear()
        self.buffer.clear()

    def _count(self, key: str, n: float = 1.0) -> None:
        try:
            self.trainer.counters[key] += n
        except ReferenceError:  # the trainer is gone (stop at exit)
            pass

    # ---- the trainer's side of a step ---------------------------------------------------
    def publish(self) -> None:
        """Share the trainer's current weights as version ``global_step`` of this epoch."""
        if self.shared is not None:
            self.shared.publish(self.params, self.epoch, self.trainer.global_step)

    def reset(self) -> None:
        """Drop every batch in flight (counted) and restart the pipeline at the trainer's step."""
        t = self.trainer
        if self.outstanding:
            self._count("rollout/dropped_batches", len(self.outstanding))
        self._clear()
        self.epoch += 1
        self.lookahead = t.collector.state_dict()
        self.next_index = self.expected = t.global_step
        self.publish()

    def _issue(self, upto: int, num_groups: int) -> None:
        col = self.trainer.collector
        saved = col.state_dict()
        try:
            while self.next_index <= upto:
                i = self.next_index
                col.load_state_dict(self.lookahead)
                resets = col.draw_resets(num_groups)
                first = col.next_episode_id
                col.next_episode_id += len(resets)
                col.episodes_collected += len(resets)
                self.lookahead = self.after[i] = col.state_dict()
                task = Task(self.epoch, i, resets, first, max(0, i - self.k))
                self.outstanding[i] = task
                self.tasks[i % self.n].put(task)
                self.next_index += 1
        finally:
            col.load_state_dict(saved)

    def next_batch(self) -> Any:
        """The batch of the trainer's current step, from the workers (starts them on first use)."""
        t = self.trainer
        if not self.started:
            self.start()
        s, groups = t.global_step, t.groups_this_step()
        issued = self.outstanding.get(s)
        if self.expected != s or (issued is not None and len(issued.resets) != groups * t.algorithm.group_size):
            self.reset()  # first batch, a resume or rollback, or another batch size asked for this step
        else:  # the weights as a synchronous collect would see them: after the update and
            # every callback (self-play loads its opponent in on_collect_start)
            self.publish()
        self._issue(s + self.k, groups)
        t0 = time.perf_counter()
        _, _, _, version, batch, busy, idle = self._result(s)
        self.wait_s = time.perf_counter() - t0
        t.collector.load_state_dict(self.after.pop(s))
        self.outstanding.pop(s)
        self.expected = s + 1
        staleness = s - version
        t.behaviour.stale = staleness > 0  # decoupled PPO against the proximal policy (marft_algos.behaviour)
        batch.metrics.update({
            "rollout/staleness": float(staleness), "rollout/staleness_max": float(staleness),
            "rollout/policy_version": float(version), "perf/trainer_wait_s": self.wait_s,
            "perf/worker_idle_frac": idle / (idle + busy) if idle + busy > 0 else 0.0,
        })
        return batch

    def _result(self, index: int) -> tuple:
        w = index % self.n
        deadline = time.monotonic() + self.timeout
        while index not in self.buffer:
            msg = self._get(w, deadline, f"to deliver the batch of step {index + 1}")
            if msg is not None and msg[0] == "restarted":  # a new worker: a full timeout for the batch again
                deadline = time.monotonic() + self.timeout
            if msg is None or msg[0] != "batch":
                continue
            _, epoch, i = msg[:3]
            if epoch == self.epoch and i in self.outstanding:
                self.buffer[i] = msg
        return self.buffer.pop(index)

    def _get(self, w: int, deadline: float, doing: str) -> tuple | None:
        """The next message of worker ``w``; handles its death, failure and the deadline."""
        try:
            msg = self.results[w].get(timeout=_POLL_S)
        except queue.Empty:
            proc = self.procs[w]
            if not proc.is_alive():
                self._died(w, proc)
                return ("restarted",)
            if time.monotonic() > deadline:
                self.stop()
                raise RolloutWorkerError(
                    f"rollout worker {w} (pid {proc.pid}) is alive but took more than rollout_timeout_s="
                    f"{self.timeout:g} s {doing}; raise rollout_timeout_s if generation is that slow"
                ) from None
            return None
        if msg[0] == "error":
            self.stop()
            raise RolloutWorkerError(f"rollout worker {w} failed; its traceback:\n{msg[1]}")
        return msg

    def _died(self, w: int, proc: Any) -> None:
        status = _exit_status(proc.exitcode)
        try:  # a worker that raised sent its traceback just before it exited
            msg = self.results[w].get(timeout=_POLL_S)
            if msg[0] == "error":
                self.stop()
                raise RolloutWorkerError(f"rollout worker {w} failed; its traceback:\n{msg[1]}")
        except (queue.Empty, OSError, EOFError):
            pass
        if self.restarts_left <= 0:
            self.stop()
            raise RolloutWorkerError(
                f"rollout worker {w} (pid {proc.pid}) died: {status}. The run stops here (rollout_restarts="
                f"{self.trainer.config.rollout_restarts}); set rollout_restarts > 0 to restart dead workers, "
                "and resume from the last checkpoint"
            )
        self.restarts_left -= 1
        self._count("rollout/worker_restarts")
        log.warning("rollout worker %d (pid %s) died: %s; restarting it (%d restarts left)", w, proc.pid, status, self.restarts_left)
        for q in (self.tasks[w], self.results[w]):  # the dead process may hold their locks: new queues
            q.cancel_join_thread()
            q.close()
        self._spawn(w)
        self._await_ready(w)
        for i in sorted(self.outstanding):  # its batches are generated again
            if i % self.n == w and i not in self.buffer:
                self.tasks[w].put(self.outstanding[i])

    # ---- loop callback hooks ------------------------------------------------------------
    def on_step_end(self, trainer: Any, metrics: dict[str, float], batch: Any) -> None:
        """Add ``perf/trainer_idle_frac``: the share of the step the trainer waited for its batch."""
        step_s = metrics.get("perf/step_s", 0.0)
        metrics["perf/trainer_idle_frac"] = self.wait_s / step_s if step_s > 0 else 0.0

    def close(self, trainer: Any) -> None:
        """Stop the workers when :meth:`Trainer.train` returns or raises (Ctrl-C included)."""
        self.stop()

    def state_dict(self) -> dict[str, Any]:
        """The number of batches in flight: a resume drops them (and counts them)."""
        return {"in_flight": len(self.outstanding)}

    def load_state_dict(self, state: dict[str, Any] | None, parts: frozenset[str]) -> None:
        """Count the checkpoint's in-flight batches as dropped; the pipeline restarts at the next step."""
        if state:
            self._count("rollout/dropped_batches", int(state.get("in_flight", 0)))
        self.expected = None
