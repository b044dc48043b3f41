"""The python tool and ``run_program`` under a flood of output (issue 28, item 11).

A program that prints more than the drain cap (1 MiB) used to stall until the 5 s
timeout and came back as "ran longer than 5 s" with its output dropped. Now it is killed
at the cap and the head it printed comes back, flagged truncated.
"""

from __future__ import annotations

import pytest

from marft_envs.sandbox import run_program
from marft_envs.tools import resolve_tool, run_tool
from marft_envs.tools.builtin import PYTHON_TIMEOUT

# The attack programs: a flood, then a long sleep (a stalled writer would sit there).
FLOOD_STDOUT = "import sys, time\nsys.stdout.write('head-line\\n' + 'x' * (8 << 20))\nsys.stdout.flush()\ntime.sleep(600)\n"
FLOOD_STDERR = "import sys, time\nprint('printed first', flush=True)\nsys.stderr.write('e' * (8 << 20))\ntime.sleep(600)\n"
FLOOD_LOOP = "while True:\n    print('line of output ' * 8)\n"


def test_a_flood_is_killed_at_the_drain_cap_and_keeps_its_head(level: str) -> None:
    # A generous timeout: the run must end because of the cap, long before it.
    r = run_program(FLOOD_STDOUT, timeout=120, max_output=4096, isolation=level)
    assert not r.timed_out, "the flooding program stalled until the timeout"
    assert r.output_overflow and r.output_truncated
    assert r.stdout.startswith("head-line\nxxx") and len(r.stdout) == 4096
    assert r.duration < 60  # far below the timeout; the real figure is well under a second


def test_a_quiet_program_is_not_flagged() -> None:
    r = run_program("print('hi')", timeout=30)
    assert r.ok and r.stdout == "hi\n" and not r.output_overflow and not r.output_truncated


@pytest.mark.parametrize("code, head", [(FLOOD_STDOUT, "head-line"), (FLOOD_LOOP, "line of output"),
                                        (FLOOD_STDERR, "printed first")])
def test_the_python_tool_returns_the_head_of_a_flood_flagged_truncated(code: str, head: str) -> None:
    out = run_tool(resolve_tool("python"), {"code": code})
    assert f"longer than {PYTHON_TIMEOUT:g} s" not in out.content, out.content[:300]
    assert out.error is None and out.truncated
    assert out.content.startswith("[output truncated: the program printed more than 1 MiB")
    assert head in out.content


def test_the_python_tool_still_reports_a_real_timeout() -> None:
    out = run_tool(resolve_tool("python"), {"code": "import time\nprint('started', flush=True)\ntime.sleep(600)"})
    assert out.error == "tool_timeout" and f"longer than {PYTHON_TIMEOUT:g} s" in out.content
    assert "started" in out.content  # what it printed before the timeout is kept too
