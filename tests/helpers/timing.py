"""Wall-clock slack for the tests that check a bound on time (a timeout kept, no hang, no
super-linear blow-up): generous, so that the suite does not flake on a loaded 2-core machine,
yet far below what the failure each bound guards against would take (a 30 s sleep not cut,
an infinite loop not killed, quadratic parsing of megabytes).

``MARFT_TIMING_MARGIN`` (seconds) overrides the default.
"""

from __future__ import annotations

import os

#: seconds allowed beyond a timeout (kill, reap, clean-up, a busy scheduler) or for an
#: operation that should take milliseconds
MARGIN = float(os.environ.get("MARFT_TIMING_MARGIN", "10.0"))
