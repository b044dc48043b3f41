"""Hard-timeout grading workers: persistent child processes killed on a wall-clock deadline.

Why: math-verify and sympy can hang or explode in memory on adversarial LaTeX,
and signal-based timeouts inside threads silently zero scores (verl #5635).
So every grading call runs in a separate *process*:

- Workers are fresh interpreters (``python -c ...`` over a pair of pipes), never
  forks of the caller: the caller may hold torch threads or CUDA state, and a
  fresh interpreter does not re-import the caller's ``__main__`` (what the
  ``spawn``/``forkserver`` start methods do), so scripts without a
  ``if __name__ == "__main__"`` guard are safe too.
- Workers are persistent and reused (a call costs one pipe round trip, well
  under a millisecond of overhead), created lazily on first use, never pickled,
  recreated in a forked child, and killed at interpreter exit.
- Two deadlines per call: a soft one inside the worker (``SIGALRM`` raising a
  ``BaseException`` that library ``except Exception`` blocks cannot swallow) keeps
  the worker alive; the hard one in the caller (``poll`` on the pipe, then
  ``SIGKILL``) catches code stuck in C. Either way the call returns a wrong
  answer with ``timed_out=True``; a dead or failing worker returns ``error=...``.
  Both are counted in :data:`stats` and logged; the worker is replaced at once.
- Thread safe: a small pool hands one idle worker to each concurrent caller.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["GradingStats", "WorkerPool", "configure", "get_pool", "shutdown_workers", "stats"]

logger = logging.getLogger("marft_envs.verifiers")

#: Seconds a fresh worker may take to import its libraries before it counts as crashed.
STARTUP_TIMEOUT = 120.0
#: Address-space cap for a worker (MiB); a runaway sympy computation gets MemoryError.
MAX_MEMORY_MB = int(os.environ.get("MARFT_GRADER_MAX_MEMORY_MB", "4096"))


@dataclass
class GradingStats:
    """Process-wide grading counters (thread safe). Read them, log them, reset them.

    ``calls``: grading calls made; ``timeouts``: calls that hit the deadline;
    ``crashes``: calls whose worker died, failed to start, or raised;
    ``restarts``: workers replaced; ``max_seconds``: longest call (wall clock);
    ``total_seconds``: summed wall clock of all calls.
    """

    calls: int = 0
    timeouts: int = 0
    crashes: int = 0
    restarts: int = 0
    max_seconds: float = 0.0
    total_seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, seconds: float, *, timed_out: bool = False, crashed: bool = False) -> None:
        """Count one grading call and its duration (thread-safe)."""
        with self._lock:
            self.calls += 1
            self.timeouts += int(timed_out)
            self.crashes += int(crashed)
            self.total_seconds += seconds
            self.max_seconds = max(self.max_seconds, seconds)

    def record_restart(self) -> None:
        """Count one worker restart (after a kill or a crash)."""
        with self._lock:
            self.restarts += 1

    def as_dict(self) -> dict[str, float]:
        """A consistent snapshot of the counters, for logs and metrics."""
        with self._lock:
            return {
                "calls": self.calls,
                "timeouts": self.timeouts,
                "crashes": self.crashes,
                "restarts": self.restarts,
                "max_seconds": self.max_seconds,
                "total_seconds": self.total_seconds,
            }

    def reset(self) -> None:
        """Zero every counter (e.g. between evaluation runs)."""
        with self._lock:
            self.calls = self.timeouts = self.crashes = self.restarts = 0
            self.max_seconds = self.total_seconds = 0.0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


#: The module-level counters (also exported as ``marft_envs.verifiers.stats``).
stats = GradingStats()


# ---------------------------------------------------------------------------
# Child side
# ---------------------------------------------------------------------------


class _SoftTimeout(BaseException):
    """Raised by SIGALRM in the worker; a BaseException so ``except Exception`` can't eat it."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _SoftTimeout()


def _hook_sleep(seconds: float) -> dict[str, Any]:
    time.sleep(seconds)
    return {"correct": True, "details": {"slept": seconds}}


def _hook_block(seconds: float) -> dict[str, Any]:
    # Deaf to SIGALRM, like code stuck in C: only the caller's hard kill stops it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    try:
        time.sleep(seconds)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
    return {"correct": True, "details": {"slept": seconds}}


def _hook_segfault() -> dict[str, Any]:
    os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(10)
    return {"correct": True}


def _hook_raise(kind: str) -> dict[str, Any]:
    if kind == "memory":
        raise MemoryError("test hook")
    raise RuntimeError("test hook")


def _hook_modules() -> dict[str, Any]:
    return {"correct": True, "details": {"modules": sorted(sys.modules)}}


def _job_table() -> dict[str, Any]:
    # deferred: the grading child loads the graders (sympy, math-verify) after its start-up
    from .mathcore import grade_gsm8k_local, grade_math_local

    return {
        "math": grade_math_local,
        "gsm8k": grade_gsm8k_local,
        "_sleep": _hook_sleep,
        "_block": _hook_block,
        "_segfault": _hook_segfault,
        "_raise": _hook_raise,
        "_modules": _hook_modules,
    }


def _watch_parent(parent: int) -> None:
    # Exit when the caller dies, even if it never closed our pipe (e.g. SIGKILL).
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(0)


def _child_main(read_fd: int, write_fd: int, parent: int) -> None:
    """Worker loop: receive ``(job_id, kind, args, soft_timeout)``, answer ``(job_id, status, payload)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller handles Ctrl-C and kills us
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    rx = Connection(read_fd, writable=False)
    tx = Connection(write_fd, readable=False)
    if MAX_MEMORY_MB > 0:
        try:
            # deferred: Unix only
            import resource

            limit = MAX_MEMORY_MB * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError):
            pass
    logging.basicConfig(level=logging.WARNING, format="[grader %(process)d] %(message)s")
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    try:
        jobs = _job_table()
        # Warm up every path now, so no grading call pays for imports (~1 s).
        jobs["math"]("\\boxed{\\frac{1}{2}}", "(1,2]", None, ("math_verify",))
        jobs["math"]("\\boxed{\\sqrt{2}/2}", "\\frac{1}{\\sqrt{2}}", None, ("sympy",))
    except BaseException as exc:  # noqa: BLE001 - report why we cannot serve
        tx.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    signal.signal(signal.SIGALRM, _on_alarm)
    tx.send(("ready", os.getpid()))
    while True:
        try:
            msg = rx.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        job_id, kind, args, soft = msg
        t0 = time.perf_counter()
        recycle = False
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, max(soft, 1e-3))
                payload = jobs[kind](*args)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            status = "ok"
        except _SoftTimeout:
            status, payload = "timeout", None
        except (MemoryError, RecursionError) as exc:
            status, payload, recycle = "error", f"{type(exc).__name__}: {exc}"[:300], True
        except Exception as exc:  # noqa: BLE001 - any grader bug is an answer, not a crash
            status, payload = "error", f"{type(exc).__name__}: {exc}"[:300]
        try:
            tx.send((job_id, status, payload, time.perf_counter() - t0, recycle))
        except _SoftTimeout:  # a late alarm while replying: reply again
            tx.send((job_id, "timeout", None, time.perf_counter() - t0, True))
        except (OSError, ValueError):
            return


# ---------------------------------------------------------------------------
# Parent side
# ---------------------------------------------------------------------------

_PKG_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The child imports this module WITHOUT running the package __init__ files
# (which may pull in gymnasium, torch, ...): stub packages point at the source
# folders, so start-up only loads the grader (stdlib, sympy, math-verify).
_CHILD_BOOT = """
import sys, types, os.path
root = sys.argv[4]
for name in ("marft_envs", "marft_envs.verifiers"):
    if name not in sys.modules:
        mod = types.ModuleType(name)
        mod.__path__ = [os.path.join(root, *name.split("."))]
        sys.modules[name] = mod
from marft_envs.verifiers.worker import _child_main
_child_main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
"""


class _Worker:
    """One child interpreter and its two pipe ends."""

    def __init__(self) -> None:
        c_read, p_write = os.pipe()
        p_read, c_write = os.pipe()
        env = dict(os.environ)
        # The child must import this very package, installed or not.
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env.setdefault(var, "1")
        code = _CHILD_BOOT
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    code,
                    str(c_read),
                    str(c_write),
                    str(os.getpid()),
                    _PKG_ROOT,
                ],
                pass_fds=(c_read, c_write),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        finally:
            os.close(c_read)
            os.close(c_write)
        self.tx = Connection(p_write, readable=False)
        self.rx = Connection(p_read, writable=False)
        self.ready = False

    def wait_ready(self, timeout: float) -> str | None:
        """None when ready, else why it is not."""
        if self.ready:
            return None
        try:
            if not self.rx.poll(timeout):
                return f"worker did not start within {timeout:.0f}s"
            msg = self.rx.recv()
        except (EOFError, OSError):
            return f"worker exited during start-up (exit code {self.proc.poll()})"
        if msg[0] != "ready":
            return f"worker failed to start: {msg[1]}"
        self.ready = True
        return None

    def kill(self, *, reap: bool = True) -> None:
        """SIGKILL and close the pipes; ``reap=False`` leaves the wait to someone else."""
        try:
            self.proc.kill()
        except OSError:
            pass
        self.close_pipes()
        if reap:
            self.reap()

    def reap(self) -> None:
        try:
            self.proc.wait(timeout=5)
        except (subprocess.TimeoutExpired, OSError):
            pass

    def close_pipes(self) -> None:
        """Close our ends of the worker's pipes, leaving the process alone (all that a
        forked child may do: the workers are its parent's)."""
        for conn in (self.tx, self.rx):
            try:
                conn.close()
            except OSError:
                pass


class WorkerPool:
    """Up to ``size`` persistent workers shared by all threads of this process."""

    def __init__(self, size: int) -> None:
        self.size = max(1, int(size))
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._count = 0
        self._closed = False
        self._job = 0
        self.pid = os.getpid()

    # -- worker bookkeeping -------------------------------------------------
    def _acquire(self) -> _Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("grading worker pool is shut down")
                if self._idle:
                    return self._idle.pop()  # LIFO: the warmest worker
                if self._count < self.size:
                    self._count += 1
                    break
                self._cond.wait()
        try:
            worker = _Worker()
        except BaseException:
            self._free_slot()
            raise
        with self._cond:
            self._all.add(worker)
        return worker

    def _free_slot(self) -> None:
        """A worker that was counted could not start: its slot is free for a waiting thread."""
        with self._cond:
            self._count -= 1
            self._cond.notify()

    def _release(self, worker: _Worker) -> None:
        with self._cond:
            if self._closed:
                worker.kill()
                return
            self._idle.append(worker)
            self._cond.notify()

    def _replace(self, worker: _Worker) -> None:
        """Kill ``worker`` now; reap it and start its successor in the background.

        The caller returns right after the kill: on a loaded machine the fork
        and exec of a fresh interpreter must not eat into its deadline.
        """
        worker.kill(reap=False)
        stats.record_restart()
        with self._cond:
            self._all.discard(worker)
        threading.Thread(
            target=self._respawn, args=(worker,), name="marft-grader-respawn", daemon=True
        ).start()

    def _respawn(self, dead: _Worker) -> None:
        dead.reap()
        try:
            fresh = _Worker()
        except Exception as exc:  # noqa: BLE001 - e.g. out of file descriptors
            logger.error("could not restart a grading worker: %s", exc)
            self._free_slot()
            return
        with self._cond:
            self._all.add(fresh)
        self._release(fresh)

    def _next_job(self) -> int:
        with self._cond:
            self._job += 1
            return self._job

    # -- the call -------------------------------------------------------------
    def call(self, kind: str, args: tuple[Any, ...], timeout: float) -> tuple[str, Any, float]:
        """Run job ``kind(*args)`` in a worker within ``timeout`` seconds of wall clock.

        Returns ``(status, payload, seconds)``; status is ``"ok"`` (payload = the
        job's dict), ``"timeout"`` or ``"error"`` (payload = a message). Never
        raises for worker failures and never waits past the deadline (plus the
        one-off start-up of a fresh worker, bounded by ``STARTUP_TIMEOUT``).
        """
        timeout = float(timeout)
        if timeout != timeout:  # NaN: fall back to a sane budget rather than wait forever
            timeout = 5.0
        timeout = min(max(timeout, 1e-3), 24 * 3600.0)
        # Soft deadline inside the worker leaves room to answer before the hard kill.
        soft = timeout - min(0.5, 0.2 * timeout)
        for attempt in (0, 1):
            try:
                worker = self._acquire()
            except Exception as exc:  # noqa: BLE001
                return "error", f"no grading worker: {type(exc).__name__}: {exc}", 0.0
            try:
                problem = worker.wait_ready(STARTUP_TIMEOUT)
            except BaseException:
                self._replace(worker)  # interrupted while waiting: don't leak the slot
                raise
            if problem is not None:
                self._replace(worker)
                return "error", problem, 0.0
            job = self._next_job()
            t0 = time.perf_counter()
            try:
                worker.tx.send((job, kind, args, soft))
            except (OSError, ValueError):
                # Died while idle (killed from outside): not this input's fault, retry once.
                self._replace(worker)
                if attempt == 0:
                    continue
                return "error", "grading worker died before the call", time.perf_counter() - t0
            try:
                if worker.rx.poll(timeout):
                    reply = worker.rx.recv()
                else:
                    reply = None
            except (EOFError, OSError):
                code = worker.proc.poll()
                if code is None:
                    try:
                        code = worker.proc.wait(timeout=1)
                    except subprocess.TimeoutExpired:
                        code = None
                self._replace(worker)
                return (
                    "error",
                    f"grading worker crashed (exit code {code})",
                    time.perf_counter() - t0,
                )
            except BaseException:
                # KeyboardInterrupt etc.: the worker state is unknown, drop it.
                self._replace(worker)
                raise
            seconds = time.perf_counter() - t0
            if reply is None:
                self._replace(worker)
                return "timeout", "hard", seconds
            reply_job, status, payload, _inner, recycle = reply
            if reply_job != job:  # cannot happen by protocol; never trust a confused worker
                self._replace(worker)
                return "error", "grading worker replied out of turn", seconds
            if recycle:
                self._replace(worker)
            else:
                self._release(worker)
            return status, ("soft" if status == "timeout" else payload), seconds
        return "error", "unreachable", 0.0

    def close(self) -> None:
        """Kill every worker and refuse new calls; waiting callers wake up and fail."""
        with self._cond:
            self._closed = True
            workers = list(self._all)
            self._all.clear()
            self._idle.clear()
            self._cond.notify_all()
        for worker in workers:
            worker.kill()

    def forget_after_fork(self) -> None:
        """In a forked child: close this pool's copies of the workers' pipes without
        killing the workers (they are the parent's); the child starts a fresh pool."""
        for worker in list(self._all):
            worker.close_pipes()


_POOL: WorkerPool | None = None
_POOL_LOCK = threading.Lock()
_POOL_SIZE = max(1, min(4, os.cpu_count() or 1))


def get_pool() -> WorkerPool:
    """The process-wide pool, created on first use (and anew in a forked child)."""
    global _POOL
    pool = _POOL
    if pool is not None and pool.pid == os.getpid():
        return pool
    with _POOL_LOCK:
        if _POOL is None or _POOL.pid != os.getpid():
            _POOL = WorkerPool(_POOL_SIZE)
        return _POOL


def configure(*, pool_size: int | None = None) -> None:
    """Set the number of grading workers (default ``min(4, cpu_count)``); restarts the pool."""
    global _POOL_SIZE
    if pool_size is not None:
        _POOL_SIZE = max(1, int(pool_size))
        shutdown_workers()


def shutdown_workers() -> None:
    """Kill all grading workers of this process (a later call starts new ones)."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None and pool.pid == os.getpid():
        pool.close()


def _after_fork_in_child() -> None:
    global _POOL, _POOL_LOCK
    pool = _POOL
    _POOL = None
    _POOL_LOCK = threading.Lock()
    stats._lock = threading.Lock()
    if pool is not None:
        pool.forget_after_fork()


atexit.register(shutdown_workers)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
