"""CPU threads per training phase: decode prefers one thread, the update two.

On a CPU, ``generate`` (small matmuls, one token at a time) runs fastest on ONE intra-op
thread and collapses with two as soon as another process competes for the cores; the
update's large matmuls gain from two on an idle machine (issue 28 item 15). Measured with
``python benchmarks/threads.py`` (SmolLM2-135M, decode 8 rows x 64 + 32 tokens, one update
over them) on a 2-core machine at load average ~7.5, side by side:

=======  ===============  ============  ==============
threads  OMP_WAIT_POLICY  decode tok/s  update s
=======  ===============  ============  ==============
1        passive          32.4          15.9
1        active           21.0          13.8
2        passive           9.7 (0.30x)  19.8 (1.24x)
2        active            2.3 (0.07x)  65.9 (4.1x)
=======  ===============  ============  ==============

Decode on two threads collapses under load (3.3x slower; 14x with spinning OpenMP
threads) while the update loses only 1.24x there and gains ~1.7x when idle (the issue's
figures), so collect runs on 1 thread and the update on 2; ``OMP_WAIT_POLICY=PASSIVE``
(set before torch is imported) keeps two threads from spinning against other processes.
The trainer wraps its phases in :func:`phase_threads`::

    with phase_threads("collect", config.collect_threads):   # Trainer.collect
        ...
    with phase_threads("update", config.update_threads):     # Trainer.update
        ...

A setting of 0 means the phase's default (:data:`DEFAULT_THREADS`, never more than the
cores this process may use, nor more than the thread count in force when the user pinned
it with ``OMP_NUM_THREADS`` / ``torch.set_num_threads``). On CUDA nothing changes (the
threads only feed kernel launches).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["DEFAULT_THREADS", "LAST_PHASE_THREADS", "available_cores", "phase_threads", "threads_for", "torch_threads"]

#: intra-op threads per phase when the config leaves it at 0
DEFAULT_THREADS: dict[str, int] = {"collect": 1, "update": 2}

#: the thread count each phase last ran with (``perf/threads_<phase>``, marft_algos.perf_stats)
LAST_PHASE_THREADS: dict[str, int] = {}


def available_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threads_for(phase: str, setting: int = 0) -> int:
    """The thread count for ``phase``: ``setting`` if > 0, else the phase's default, capped
    by the available cores and by a user's ``OMP_NUM_THREADS``."""
    if phase not in DEFAULT_THREADS:
        raise ValueError(f"unknown phase {phase!r}; use one of {sorted(DEFAULT_THREADS)}")
    if setting < 0:
        raise ValueError(f"{phase} threads must be >= 0 (0 = the default {DEFAULT_THREADS[phase]}), got {setting}")
    if setting > 0:
        return setting
    n = min(DEFAULT_THREADS[phase], available_cores())
    pinned = os.environ.get("OMP_NUM_THREADS", "")
    if pinned.isdigit() and int(pinned) > 0:
        n = min(n, int(pinned))
    return max(1, n)


@contextmanager
def torch_threads(n: int) -> Iterator[int]:
    """Run the block with ``n`` torch intra-op threads; the previous count is restored after."""
    before = torch.get_num_threads()
    if n != before:
        torch.set_num_threads(n)
    try:
        yield n
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


@contextmanager
def phase_threads(phase: str, setting: int = 0, device: str | torch.device = "cpu") -> Iterator[int]:
    """:func:`torch_threads` with :func:`threads_for` ``(phase, setting)`` on a CPU device;
    on another device the thread count is left alone."""
    if torch.device(device).type != "cpu":
        yield torch.get_num_threads()
        return
    with torch_threads(threads_for(phase, setting)) as n:
        LAST_PHASE_THREADS[phase] = n
        yield n
