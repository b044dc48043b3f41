"""Process-memory settings for CPU training.

glibc's ``malloc`` raises its mmap threshold every time a large block is freed (up to
32 MiB), so most activation-sized tensors end up on the heap. There they fragment, and
memory freed between the phases of a step is not handed back to the OS: the peak RSS of a
training step then tracks the allocator's high-water mark rather than the live tensors.
:func:`pin_malloc_thresholds` fixes the mmap and trim thresholds at glibc's initial
128 KiB, so large tensors are mapped and unmapped individually. It lowers the peak (for
the numbers, see ``docs/results.md``) at a cost in time (fresh pages are faulted in on every
allocation). It is a no-op on other C libraries and platforms.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

__all__ = ["DEFAULT_MALLOC_THRESHOLD", "pin_malloc_thresholds"]

#: glibc's initial (and minimum dynamic) mmap threshold
DEFAULT_MALLOC_THRESHOLD = 128 * 1024

# mallopt parameters from glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

log = logging.getLogger("marft")


def pin_malloc_thresholds(threshold: int = DEFAULT_MALLOC_THRESHOLD) -> bool:
    """Fix glibc's mmap and trim thresholds at ``threshold`` bytes for this process.

    Returns True when applied, False (with a warning saying why) where the C library has no
    ``mallopt`` (not glibc, not Linux) or refuses the value; never raises for that. Setting
    the thresholds explicitly also switches off glibc's dynamic threshold, which is the point. It is process-wide and cannot be
    undone short of calling it again with other values, so it is opt-in
    (``TrainConfig.release_freed_memory``) and tested in a subprocess.
    """
    if threshold <= 0:
        raise ValueError(f"threshold must be a positive number of bytes, got {threshold}")
    mallopt = None
    if sys.platform.startswith("linux"):
        try:
            mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
        except (OSError, AttributeError):
            pass
    if mallopt is None:
        log.warning("release_freed_memory: this C library has no mallopt; setting ignored")
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, int(threshold)) == 1 and mallopt(_M_TRIM_THRESHOLD, int(threshold)) == 1
    if not ok:
        log.warning("mallopt refused threshold %d: the allocator keeps its dynamic thresholds", threshold)
    return ok
