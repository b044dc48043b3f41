"""marft_algos.memory: glibc malloc thresholds (process-wide, so tested in a subprocess)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from marft_algos.memory import pin_malloc_thresholds

# A child that frees a large heap tensor mix and reports how much of it stayed resident.
_CHILD = r"""
import sys
import torch
from marft_algos.memory import pin_malloc_thresholds
pin = sys.argv[1] == "1"
if pin:
    assert pin_malloc_thresholds()
def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
base = rss_mb()
# 1 MiB blocks: above glibc's initial mmap threshold, but under the raised dynamic one
# after a big free, so without pinning they land on the heap and stay resident.
big = torch.ones(16 * 2**20 // 4)  # a 16 MiB mmapped block: its free raises the threshold to 16 MiB
del big
blocks = [torch.ones(2**18) for _ in range(400)]  # 400 x 1 MiB
keep = blocks[::50]                              # a few survivors pin the heap top
del blocks
print(rss_mb() - base)
"""


def _resident_after_free(pin: bool) -> int:
    out = subprocess.run([sys.executable, "-c", _CHILD, "1" if pin else "0"], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def test_rejects_a_non_positive_threshold():
    with pytest.raises(ValueError, match="positive"):
        pin_malloc_thresholds(0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_pinned_thresholds_return_freed_memory():
    kept_default, kept_pinned = _resident_after_free(False), _resident_after_free(True)
    assert kept_pinned < 64, (kept_default, kept_pinned)  # only the 8 survivors (+ slack) stay
    assert kept_pinned < kept_default / 2, (kept_default, kept_pinned)
