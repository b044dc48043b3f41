"""Per-run cgroups: the process-count and total-memory caps that rlimits cannot give.

``RLIMIT_NPROC`` does not bind uid 0, and ``RLIMIT_AS`` is per process (a fork
bomb multiplies it), so where it can, the grader puts every run in a fresh
child cgroup with ``pids.max`` and a memory limit:

* cgroup v1: a child of this process's own cgroup in the ``pids`` and
  ``memory`` hierarchies (``pids.max``, ``memory.limit_in_bytes``);
* cgroup v2: a child of a writable, delegated cgroup: ``$MARFT_SANDBOX_CGROUP``
  if set (e.g. a ``systemd-run --user -p Delegate=yes`` scope), else this
  process's own cgroup; ``pids`` is enabled in its ``cgroup.subtree_control``
  (allowed even in a cgroup that holds processes: ``pids`` is a threaded
  controller), ``memory`` too where the kernel allows it (it needs a cgroup
  without processes of its own), then ``pids.max`` / ``memory.max``.

v1 controllers win; v2 fills in what v1 lacks. What is missing, and why, is
kept in :attr:`CgroupPlan.notes` so the sandbox can report it
(:func:`marft_envs.sandbox.describe_isolation`) instead of silently having no cap.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

__all__ = ["CgroupPlan", "Hierarchy", "create_run_cgroups", "parse_mounts", "parse_own", "probe"]

_V1_KNOBS = {"pids": "pids.max", "memory": "memory.limit_in_bytes"}
_V2_KNOBS = {"pids": "pids.max", "memory": "memory.max"}
_PROBE_VALUES = {"pids": "8", "memory": str(64 * 2**20)}
_CONTROLLERS = ("pids", "memory")


@dataclass(frozen=True)
class Hierarchy:
    """A writable parent cgroup and the limit file of each controller it offers."""

    version: int
    base: str
    knobs: dict[str, str]


@dataclass(frozen=True)
class CgroupPlan:
    """The cgroups a run joins, plus why any controller is unavailable."""

    hierarchies: tuple[Hierarchy, ...] = ()
    notes: tuple[str, ...] = ()

    def where(self, controller: str) -> str | None:
        """``"cgroup v2 pids.max"``-style text for ``controller``, None when it has no cap."""
        for h in self.hierarchies:
            if controller in h.knobs:
                return f"cgroup v{h.version} {h.knobs[controller]}"
        return None


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mounts(mountinfo: str) -> tuple[dict[str, tuple[str, str]], tuple[str, str] | None]:
    """``({v1 controller: (mount root, mount point)}, (v2 root, v2 mount point) or None)``
    from the text of ``/proc/self/mountinfo``."""
    v1: dict[str, tuple[str, str]] = {}
    v2: tuple[str, str] | None = None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        root, point = _unescape(fields[3]), _unescape(fields[4])
        if tail[0] == "cgroup2" and v2 is None:
            v2 = (root, point)
        elif tail[0] == "cgroup":
            for opt in tail[2].split(","):
                if opt in _CONTROLLERS:
                    v1.setdefault(opt, (root, point))
    return v1, v2


def parse_own(proc_cgroup: str) -> tuple[dict[str, str], str | None]:
    """``({v1 controller: path}, v2 path or None)`` from ``/proc/self/cgroup``."""
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, ctrls, path = parts
        if hid == "0" and ctrls == "":
            v2 = path
        for c in ctrls.split(","):
            if c:
                v1[c] = path
    return v1, v2


def _join(point: str, root: str, path: str) -> str:
    """Where cgroup ``path`` (as /proc/self/cgroup names it) lies under a mount of ``root``."""
    if root != "/" and (path == root or path.startswith(root.rstrip("/") + "/")):
        path = path[len(root.rstrip("/")):]
    return point.rstrip("/") + "/" + path.strip("/") if path.strip("/") else point


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _try_child(base: str, knobs: dict[str, str], join: bool) -> tuple[dict[str, str], list[str]]:
    """Make a probe child of ``base``, set each knob, optionally check that a process
    can join it; the knobs that worked and notes on those that did not."""
    probe_dir = os.path.join(base, f"marft-probe-{os.getpid()}")
    ok: dict[str, str] = {}
    notes: list[str] = []
    try:
        os.mkdir(probe_dir)
    except OSError as e:
        return {}, [f"cannot create a cgroup under {base}: {e.strerror or e}"]
    try:
        for ctrl, knob in knobs.items():
            try:
                _write(os.path.join(probe_dir, knob), _PROBE_VALUES[ctrl])
                ok[ctrl] = knob
            except OSError as e:
                notes.append(f"{ctrl}: cannot set {knob} under {base}: {e.strerror or e}")
        if ok and join:
            procs = os.path.join(probe_dir, "cgroup.procs")
            r = subprocess.run(["/bin/sh", "-c", 'echo $$ > "$1"', "sh", procs],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, timeout=10, check=False)
            if r.returncode != 0:
                notes.append(f"cannot move a process into a cgroup under {base}: "
                             f"{r.stderr.decode(errors='replace').strip()[-200:]}")
                ok = {}
    finally:
        try:
            os.rmdir(probe_dir)
        except OSError:
            pass
    return ok, notes


def _probe_v2(base: str, wanted: tuple[str, ...], join: bool) -> tuple[dict[str, str], list[str]]:
    try:
        available = _read(os.path.join(base, "cgroup.controllers")).split()
        enabled = _read(os.path.join(base, "cgroup.subtree_control")).split()
    except OSError as e:
        return {}, [f"cgroup v2 at {base} unreadable: {e.strerror or e}"]
    notes: list[str] = []
    usable: list[str] = []
    for ctrl in wanted:
        if ctrl not in available:
            notes.append(f"{ctrl}: controller not available in cgroup v2 at {base} "
                         f"(controllers: {' '.join(available) or 'none'})")
            continue
        if ctrl not in enabled:
            try:
                _write(os.path.join(base, "cgroup.subtree_control"), f"+{ctrl}")
            except OSError as e:
                hint = (" (memory needs a cgroup without processes of its own: point "
                        "MARFT_SANDBOX_CGROUP at an empty delegated cgroup)"
                        if ctrl == "memory" else "")
                notes.append(f"{ctrl}: cannot enable in {base}/cgroup.subtree_control: "
                             f"{e.strerror or e}{hint}")
                continue
        usable.append(ctrl)
    if not usable:
        return {}, notes
    ok, more = _try_child(base, {c: _V2_KNOBS[c] for c in usable}, join)
    return ok, notes + more


def probe(proc_cgroup: str | None = None, mountinfo: str | None = None,
          env_dir: str | None = None, join: bool = True) -> CgroupPlan:
    """Find writable cgroups for per-run caps (reads ``/proc/self/*`` unless given the
    texts; ``env_dir`` defaults to ``$MARFT_SANDBOX_CGROUP``). Creates and removes one
    probe cgroup per hierarchy; ``join`` also checks that a process can enter it."""
    try:
        proc_cgroup = _read("/proc/self/cgroup") if proc_cgroup is None else proc_cgroup
        mountinfo = _read("/proc/self/mountinfo") if mountinfo is None else mountinfo
    except OSError as e:
        return CgroupPlan((), (f"cgroups unreadable: {e}",))
    if env_dir is None:
        env_dir = os.environ.get("MARFT_SANDBOX_CGROUP") or None
    own_v1, own_v2 = parse_own(proc_cgroup)
    mounts_v1, mount_v2 = parse_mounts(mountinfo)
    hierarchies: list[Hierarchy] = []
    notes: list[str] = []
    found: set[str] = set()
    for ctrl in _CONTROLLERS:  # v1: one hierarchy per controller
        if ctrl not in own_v1 or ctrl not in mounts_v1:
            continue
        root, point = mounts_v1[ctrl]
        base = _join(point, root, own_v1[ctrl])
        ok, more = _try_child(base, {ctrl: _V1_KNOBS[ctrl]}, join)
        notes += more
        if ok:
            hierarchies.append(Hierarchy(1, base, ok))
            found.add(ctrl)
    wanted = tuple(c for c in _CONTROLLERS if c not in found)
    if wanted:
        base = env_dir
        if base is None and mount_v2 is not None and own_v2 is not None:
            base = _join(mount_v2[1], mount_v2[0], own_v2)
        if base is None:
            notes.append(f"{', '.join(wanted)}: no cgroup v1 hierarchy and no cgroup v2 "
                         "mount (set MARFT_SANDBOX_CGROUP to a delegated cgroup v2 directory)")
        else:
            ok, more = _probe_v2(base, wanted, join)
            notes += more
            if ok:
                hierarchies.append(Hierarchy(2, base, ok))
    return CgroupPlan(tuple(hierarchies), tuple(notes))


def create_run_cgroups(plan: CgroupPlan, name: str, values: dict[str, int | None]) -> list[str]:
    """One child cgroup ``name`` per hierarchy with the given limits (None: no limit
    for that controller); returns the created directories for the caller to remove
    after the run. On failure nothing is left behind."""
    created: list[str] = []
    try:
        for h in plan.hierarchies:
            knobs = {c: k for c, k in h.knobs.items() if values.get(c) is not None}
            if not knobs:
                continue
            cg = os.path.join(h.base, name)
            os.mkdir(cg)
            created.append(cg)
            for ctrl, knob in knobs.items():
                _write(os.path.join(cg, knob), str(values[ctrl]))
    except BaseException:
        for cg in created:
            try:
                os.rmdir(cg)
            except OSError:
                pass
        raise
    return created
