"""What a sandboxed program reads in ``/proc`` about the host (issue 28, item 12).

Under bwrap, pid 1 of the program's pid namespace used to be bwrap itself, its command
line spelling out the host's layout: the interpreter's prefix, the site-packages dirs
covered by tmpfs, the stub's configuration. The attack program below reads it.
"""

from __future__ import annotations

import os
import sys

import pytest

from marft_envs.sandbox import available_levels, run_program
from marft_envs.sandbox import core as sandbox_core

READ_CMDLINES = r"""
def cmdline(pid):
    try:
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
            return f.read().replace(b'\0', b' ').decode('utf-8', 'replace')
    except OSError as e:
        return f'<{type(e).__name__}>'
print('PID1', cmdline(1))
print('SELF', cmdline('self'))
"""


def _host_paths() -> list[str]:
    """Paths that tell the host's layout: the interpreter, its prefix, package dirs."""
    view = sandbox_core._program_view()
    paths = {view.python, os.path.realpath(sys.base_prefix), *view.hidden}
    return sorted(p for p in paths if p not in ("/usr", "/"))


def _read(level: str) -> dict[str, str]:
    r = run_program(READ_CMDLINES, timeout=60, isolation=level)
    assert r.ok, r.stderr[-500:]
    return dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)


@pytest.mark.skipif(available_levels().get("bwrap") is not None, reason="bwrap refused here")
def test_pid_1_under_bwrap_shows_no_host_path() -> None:
    seen = _read("bwrap")
    pid1 = seen["PID1"]
    assert pid1.startswith("bwrap "), pid1
    leaked = [p for p in _host_paths() if p in pid1]
    assert not leaked, f"/proc/1/cmdline shows host paths {leaked}: {pid1[:300]}"
    assert "site-packages" not in pid1 and "--ro-bind" not in pid1 and "sys_path" not in pid1


@pytest.mark.parametrize("level", ["bwrap", "unshare-net"])
def test_the_stub_configuration_is_not_on_a_command_line(level: str) -> None:
    reason = available_levels().get(level)
    if reason is not None:
        pytest.skip(f"{level} refused here: {reason}")
    seen = _read(level)
    for key in ("PID1", "SELF"):
        assert '"limits"' not in seen[key] and "sys_path" not in seen[key], seen[key][:300]
