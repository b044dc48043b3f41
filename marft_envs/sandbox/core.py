"""Grader side of the sandbox: isolation detection, process control, the pool.

See the package docstring (``marft_envs.sandbox``) for the design.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import hmac
import json
import logging
import math
import os
import selectors
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import cgroups

__all__ = [
    "LEVELS",
    "ProgramResult",
    "SandboxResult",
    "SandboxUnavailable",
    "TestJob",
    "TestResult",
    "available_levels",
    "describe_isolation",
    "isolation_level",
    "output_drain_bytes",
    "run_many",
    "run_program",
    "run_tests",
]

LEVELS: tuple[str, ...] = ("bwrap", "unshare-net", "rlimits+socket-block")
_RUNNER = str(Path(__file__).with_name("_runner.py"))
_SETUP_FAILED = 97  # the stub's exit status when hardening itself failed
_CGROUP_FAILED = 98  # the wrapper shell could not join the run's cgroups
_PATH = "/usr/local/bin:/usr/bin:/bin"
_MAX_REPORT = 1 << 20  # bytes per checker report frame
_TMPFS_BYTES = 64 * 2**20  # the private /tmp under bwrap is RAM: keep it small
_LAUNCHER = ".marft_start"  # the bwrap command's script, in the work dir


class SandboxUnavailable(RuntimeError):
    """The requested isolation level cannot be used on this machine."""


@dataclass
class TestResult:
    """Verdict of one test unit, as reported by the trusted checker."""

    __test__ = False  # not a pytest class

    index: int
    passed: bool
    error: str | None = None
    duration: float = 0.0


@dataclass
class ProgramResult:
    """Outcome of ``run_program``.

    ``output_truncated``: a stream went past ``max_output`` (its head is kept);
    ``output_overflow``: the program wrote more than :func:`output_drain_bytes` to a stream
    and was killed there (``exit_code`` -9, not ``timed_out``), its heads kept."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    duration: float
    isolation: str
    output_truncated: bool = False
    output_overflow: bool = False

    @property
    def ok(self) -> bool:
        """Exited with status 0 within the timeout."""
        return self.exit_code == 0 and not self.timed_out


@dataclass
class SandboxResult:
    """Outcome of ``run_tests``. ``passed`` is True only if the trusted checker ran
    every test unit to completion and each one passed."""

    passed: bool
    n_tests: int
    n_passed: int
    tests: list[TestResult] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    exit_code: int | None = None
    isolation: str = ""
    duration: float = 0.0
    error: str | None = None
    output_truncated: bool = False

    @property
    def fraction(self) -> float:
        """Share of test units passed (0.0 without units): the partial-credit reward."""
        return self.n_passed / self.n_tests if self.n_tests else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (JSON-safe) for logs and infos."""
        return asdict(self)


@dataclass
class TestJob:
    """One ``run_tests`` call for ``run_many``."""

    __test__ = False  # not a pytest class

    program: str
    tests: str | Sequence[str]
    entry_point: str | None = None
    setup: str = ""
    options: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------ isolation
_detect_lock = threading.Lock()
_available: dict[str, str | None] = {}  # level -> None if usable, else the reason


def _is_root() -> bool:
    return os.geteuid() == 0


_NOBODY = (65534, 65534)  # uid/gid a root grader's fallback sandbox runs as


def _drops_uid(level: str) -> bool:
    """A root grader's program runs as ``_NOBODY`` at every level: as uid 0 (even in a
    user namespace mapped to root) it would own, and so could read, root's 0600 files."""
    return _is_root()


def _sandbox_uid(level: str) -> int:
    """The uid the program runs as, as the host kernel sees it."""
    return _NOBODY[0] if _drops_uid(level) else os.getuid()


_landlock: list[int] = []


def _landlock_abi() -> int:
    """Landlock ABI version of this kernel (0: unavailable); probed once."""
    if not _landlock:
        try:
            abi = ctypes.CDLL(None, use_errno=True).syscall(444, None, 0, 1)
        except (OSError, AttributeError):
            abi = -1
        _landlock.append(max(0, abi))
    return _landlock[0]


_dump_lock = threading.Lock()
_dump_state = {"users": 0, "saved": 1}


@contextmanager
def _grader_undumpable(active: bool) -> Iterator[None]:
    """While a sandbox without a pid namespace runs, make this (grader) process
    non-dumpable: its ``/proc`` entries (environ, mem, fd) then belong to root and
    need CAP_SYS_PTRACE, so a same-uid program cannot read secrets from them. The
    previous setting comes back when the last such run ends (core dumps and
    debuggers work again between gradings)."""
    if not active:
        yield
        return

    libc = ctypes.CDLL(None, use_errno=True)
    with _dump_lock:
        if _dump_state["users"] == 0:
            _dump_state["saved"] = max(0, libc.prctl(3, 0, 0, 0, 0))  # PR_GET_DUMPABLE
            libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
        _dump_state["users"] += 1
    try:
        yield
    finally:
        with _dump_lock:
            _dump_state["users"] -= 1
            if _dump_state["users"] == 0 and _dump_state["saved"] == 1:
                libc.prctl(4, 1, 0, 0, 0)


_warned: set[str] = set()


def _warn_once(msg: str, *args: Any) -> None:
    key = msg % args
    if key not in _warned:
        _warned.add(key)
        logging.getLogger("marft_envs.sandbox").warning(msg, *args)


def describe_isolation(level: str | None = None) -> dict[str, str]:
    """What guards the host at ``level`` (default: the level in force): network,
    filesystem, user, process-count and memory caps. A missing cap reads ``"none
    (why)"`` so that a report says so instead of silently having none."""
    return _describe(_check_level(level) if level else isolation_level())


def _describe(level: str) -> dict[str, str]:
    # No level check here: runs started while the levels are being probed call this.
    plan = _cgroup_plan()
    uid = _sandbox_uid(level)
    ll = _landlock_abi()
    view = "empty root: interpreter and stdlib read-only (no site-packages), "
    if level == "bwrap":
        net, fs = "empty network namespace", view + "private /tmp, work dir writable"
        user = "user namespace, all capabilities dropped"
    elif level == "unshare-net":
        net, fs = "empty network namespace", view + "private /tmp, work dir writable (chroot)"
        user = "user namespace, all capabilities dropped"
    else:
        net = "seccomp: only AF_UNIX sockets"
        fs = ("Landlock: writes only in the work dir, reads only in the interpreter's "
              "stdlib view and the work dir" if ll else
              "file permissions only (no Landlock in this kernel): world-readable files, "
              "data sets included, stay readable")
        user = (f"uid {uid} (dropped from root; grader made non-dumpable)" if _drops_uid(level)
                else f"uid {uid} (grader made non-dumpable)")
    if _drops_uid(level) and level != "rlimits+socket-block":
        user = f"uid {uid} (dropped from root), own pid namespace, no capabilities"
    nproc = plan.where("pids")
    if nproc is None:
        why = "; ".join(n for n in plan.notes if n.startswith("pids")) or "no writable pids cgroup"
        nproc = (f"RLIMIT_NPROC (uid {uid})" if uid != 0
                 else f"none (uid 0 is exempt from RLIMIT_NPROC; {why})")
    memory = plan.where("memory") or "RLIMIT_AS per process only (no total cap)"
    return {"level": level, "network": net, "filesystem": fs, "user": user,
            "nproc_cap": nproc, "memory_cap": memory}


def _probe(level: str) -> str | None:
    if level == "bwrap" and shutil.which("bwrap") is None:
        return "bwrap not found on PATH (apt-get install bubblewrap)"
    if level == "unshare-net" and shutil.which("unshare") is None:
        return "unshare(1) not found"
    try:
        r = _run_program(
            "import socket\n"
            "try:\n    socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
            "    print('socket-open')\nexcept OSError:\n    print('socket-blocked')\n",
            level=level, timeout=20.0, memory_mb=512, cpu_seconds=None, max_file_mb=1,
            max_processes=16, max_output=4096)
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    if r.exit_code != 0 or "socket-" not in r.stdout:
        return (f"probe failed (exit {r.exit_code}, timed_out={r.timed_out}): "
                f"{r.stderr.strip()[-300:]}")
    if level == "rlimits+socket-block" and "socket-blocked" not in r.stdout:
        return "seccomp socket filter not in force"
    return None


def available_levels(refresh: bool = False) -> dict[str, str | None]:
    """``{level: None if usable here else the reason}``, probed once per process."""
    with _detect_lock:
        if refresh or not _available:
            for level in LEVELS:
                _available[level] = _probe(level)
        return dict(_available)


def isolation_level() -> str:
    """The strongest level usable here (``MARFT_SANDBOX_ISOLATION`` forces one)."""
    forced = os.environ.get("MARFT_SANDBOX_ISOLATION")
    if forced:
        return _check_level(forced)
    avail = available_levels()
    for level in LEVELS:
        if avail[level] is None:
            return level
    raise SandboxUnavailable("no isolation level works here: " + json.dumps(avail))


def _check_level(level: str) -> str:
    if level not in LEVELS:
        raise ValueError(f"unknown isolation level {level!r}; choose from {LEVELS}")
    reason = available_levels()[level]
    if reason is not None:
        raise SandboxUnavailable(f"isolation {level!r} unavailable: {reason}")
    return level


# ------------------------------------------------------------------- cgroups
_cg_lock = threading.Lock()
_cg_plan: cgroups.CgroupPlan | None = None  # probed once per process


def _cgroup_plan() -> cgroups.CgroupPlan:
    """Writable cgroups for per-run ``pids``/memory caps (see ``sandbox.cgroups``)."""
    global _cg_plan
    with _cg_lock:
        if _cg_plan is None:
            _cg_plan = cgroups.probe()
        return _cg_plan


def _cgroup_pids(cg: str) -> list[int]:
    try:
        with open(os.path.join(cg, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


# -------------------------------------------------------------- process control
def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(b")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(name))
    return kids


def _descendants(pid: int) -> list[int]:
    kids, out, todo = _children_map(), [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _kill(proc: subprocess.Popen, cgs: Sequence[str] = (), scan: bool = True) -> None:
    """SIGKILL the whole tree: the process group, descendants found in ``/proc``
    (``scan``), every process in the run's cgroups."""
    for _ in range(50):
        victims = _descendants(proc.pid) if scan else []
        for cg in cgs:
            victims += _cgroup_pids(cg)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if proc.poll() is None:
            try:
                proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                continue
        if not victims and not any(_cgroup_pids(cg) for cg in cgs):
            break
        time.sleep(0.002)


def output_drain_bytes(max_output: int) -> int:
    """Bytes of one stream read (the first ``max_output`` kept) before the grader stops
    reading it: ``run_program`` then kills the program (``output_overflow``)."""
    return max(16 * max_output, 1 << 20)


class _Capture:
    """Keeps the first ``cap`` bytes of a stream; drains and drops the rest."""

    def __init__(self, cap: int) -> None:
        self.cap, self.buf, self.truncated = cap, bytearray(), False
        self.seen, self.drain = 0, output_drain_bytes(cap)

    @property
    def overflow(self) -> bool:
        """The writer went past the drain cap (it would now block on a full pipe)."""
        return self.seen >= self.drain

    def feed(self, data: bytes) -> bool:
        """Keep the head; False (stop reading: the writer then blocks on a full pipe
        instead of burning the grader's CPU) once ``drain`` bytes went by."""
        self.seen += len(data)
        room = self.cap - len(self.buf)
        if len(data) > room:
            self.truncated = True
        if room > 0:
            self.buf += data[:room]
        return self.seen < self.drain

    def text(self) -> str:
        return self.buf.decode("utf-8", "replace")


def _limits(timeout: float, memory_mb: int | None, cpu_seconds: float | None,
            max_file_mb: int | None, max_processes: int | None, level: str) -> dict:
    nproc = max_processes
    if nproc is not None and _cgroup_plan().where("pids") is not None:
        nproc = None  # the run's own pids cgroup caps it exactly; no /proc scan per run
    elif nproc is not None and (level == "rlimits+socket-block" or _drops_uid(level)):
        # No user namespace: NPROC counts every task of the sandbox's uid on the host.
        nproc += _tasks_of_uid(_sandbox_uid(level))
    cpu = cpu_seconds if cpu_seconds is not None else math.ceil(timeout) + 1
    return {"as": memory_mb * 2**20 if memory_mb else None,
            "cpu": int(math.ceil(cpu)) if cpu else None,
            "fsize": max_file_mb * 2**20 if max_file_mb is not None else None,
            "nproc": nproc, "nofile": 256}


def _tasks_of_uid(uid: int) -> int:
    # /proc/<pid>/status, not the owner of /proc/<pid>: that reads as root for
    # non-dumpable processes (every sandbox after its uid drop).
    n = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            n += len(os.listdir(f"/proc/{name}/task"))
                        break
        except (OSError, ValueError, IndexError):
            pass
    return n


_NO_SITE = True  # -S: skip site.py (.pth processing costs ~40 ms per start)


def _python_flags() -> list[str]:
    return ["-I", "-S"] if _NO_SITE else ["-I"]


def _site_paths() -> list[str]:
    """The grader's import directories (stdlib and site-packages, no .pth hooks), so
    that programs and tests still find installed packages under ``-S``."""
    return [p for p in sys.path if p and os.path.isdir(p)] if _NO_SITE else []


@dataclass(frozen=True)
class _View:
    """What a sandboxed program may read: the interpreter and its standard library.

    ``roots`` are exposed read-only (``/usr``, ``/lib*``, the interpreter's prefix);
    ``hidden`` are the package directories beneath them (``site-packages``,
    ``dist-packages``: data sets such as HumanEval's ship there), covered by an empty
    tmpfs; ``links`` are top-level symlinks (``/lib -> usr/lib``) recreated as such.
    ``python`` is the base interpreter (never a venv's, which would add its packages)
    and ``path`` its standard-library ``sys.path``: the program gets no third-party
    package, so nothing it imports or opens holds test data.
    """

    roots: tuple[str, ...]
    hidden: tuple[str, ...]
    links: tuple[tuple[str, str], ...]
    python: str
    path: tuple[str, ...]


_view_cache: list[_View] = []


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _program_view() -> _View:
    """The read-only view of the host given to programs (computed once)."""
    if _view_cache:
        return _view_cache[0]

    python = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    prefixes = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)}
    roots: set[str] = set()
    links: list[tuple[str, str]] = []
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            links.append((top, os.readlink(top)))
        elif os.path.isdir(top):
            roots.add(top)
    for extra in prefixes | {os.path.dirname(python)}:
        if not any(_under(extra, r) for r in roots):
            roots.add(extra)
    stdlib = {os.path.realpath(sysconfig.get_paths(vars={"base": p, "platbase": p})[k])
              for p in prefixes for k in ("stdlib", "platstdlib")}
    pkg_dirs: set[str] = set()
    for k in ("purelib", "platlib"):
        for p in prefixes:
            pkg_dirs.add(sysconfig.get_paths(vars={"base": p, "platbase": p})[k])
    for r in roots:
        for pat in ("lib*/python*/*-packages", "local/lib*/python*/*-packages",
                    "lib*/python3*/dist-packages"):
            pkg_dirs.update(glob.glob(os.path.join(r, pat)))
    hidden = sorted({os.path.realpath(d) for d in pkg_dirs if os.path.isdir(d)
                     and any(_under(os.path.realpath(d), r) for r in roots)})
    # The interpreter's own sys.path under -I -S is its standard library: keep the
    # entries that exist (python3XX.zip usually does not) and are not package dirs.
    path = [p for p in (os.path.realpath(q) for q in sys.path if q)
            if os.path.isdir(p) and any(_under(p, s) for s in stdlib)
            and not any(_under(p, h) for h in hidden)]
    view = _View(tuple(sorted(roots)), tuple(hidden), tuple(links), python,
                 tuple(dict.fromkeys(path)))
    _view_cache.append(view)
    return view


_reads_cache: list[list[list[str]]] = []


def _landlock_reads(view: _View) -> list[list[str]]:
    """Landlock read rules for ``view`` (``[path, kind]``): a root without package dirs
    beneath is one ``"tree"``; one with some is split into its entries, recursively,
    leaving the package dirs out (their names stay listable, their files unreadable)."""
    if _reads_cache:
        return _reads_cache[0]
    rules: list[list[str]] = []

    def split(d: str) -> None:
        if d in view.hidden:
            return
        if not any(_under(h, d) for h in view.hidden):
            rules.append([d, "tree"])
            return
        rules.append([d, "list"])
        try:
            names = sorted(os.listdir(d))
        except OSError:
            return
        for name in names:
            p = os.path.join(d, name)
            if os.path.islink(p):
                continue  # its target is covered where it lies (or stays unreadable)
            if os.path.isdir(p):
                split(p)
            elif os.path.isfile(p):
                rules.append([p, "file"])

    for r in view.roots:
        split(r)
    _reads_cache.append(rules)
    return rules


def _stub_command(level: str, workdir: str, cfg_path: str, runner: str) -> tuple[list[str], list[str] | None]:
    """The command that starts the stub, and for bwrap the options to pass on a file
    descriptor (``--args``): pid 1 of the sandbox is bwrap, and the program can read its
    command line, so it must name no host path (only ``/bin/sh`` and a launcher script
    in the work dir, which execs the stub)."""
    view = _program_view()
    stub = [view.python, *_python_flags(), "-u", runner, "stub", "@" + cfg_path]
    if level == "bwrap":
        # An empty root: only the interpreter, its stdlib and shared libraries, read-only.
        cmd = ["bwrap"]
        for r in view.roots:
            cmd += ["--ro-bind", r, r]
        for link, target in view.links:
            cmd += ["--symlink", target, link]
        for h in view.hidden:
            cmd += ["--tmpfs", h, "--remount-ro", h]
        cmd += ["--size", str(_TMPFS_BYTES), "--tmpfs", "/tmp",
                "--bind", workdir, workdir, "--proc", "/proc", "--dev", "/dev",
                "--chdir", workdir, "--die-with-parent", "--new-session", "--clearenv",
                "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                "--unshare-cgroup-try", "--cap-drop", "ALL"]
        if _drops_uid(level):
            # Real root: no user namespace (it would map the program to uid 0 outside);
            # the runner keeps only what it needs to chown the work dir and drop to nobody.
            cmd += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                    "--cap-add", "CAP_CHOWN"]
        else:
            cmd += ["--unshare-user"]
        for k, v in _clean_env(workdir).items():
            cmd += ["--setenv", k, v]
        with open(os.path.join(workdir, _LAUNCHER), "w", encoding="utf-8") as f:
            f.write("exec " + " ".join(shlex.quote(a) for a in stub) + "\n")
        return ["bwrap", "--args", "{fd}", "/bin/sh", _LAUNCHER], cmd[1:]
    if level == "unshare-net":
        user = [] if _drops_uid(level) else ["--user", "--map-root-user"]
        return ["unshare", *user, "--net", "--pid", "--ipc", "--uts", "--fork",
                "--kill-child", "--mount", "--mount-proc"] + stub, None
    return stub, None


def _clean_env(workdir: str) -> dict[str, str]:
    # Nothing inherited: secrets in the parent's environment never reach the program.
    return {"PATH": _PATH, "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}


class _Run:
    """One sandboxed stub process (plus its temp dir and cgroup), cleaned up on exit."""

    def __init__(self, program: str, *, level: str, serve: bool, timeout: float,
                 memory_mb: int | None, cpu_seconds: float | None, max_file_mb: int | None,
                 max_processes: int | None, files: Mapping[str, str] | None = None) -> None:
        self.level = level
        self.cgs: list[str] = []
        self.proc: subprocess.Popen | None = None
        self.req_r = self.req_w = self.resp_r = self.resp_w = -1
        self.workdir = tempfile.mkdtemp(prefix="marft-sbx-")
        self.rootdir: str | None = None  # mount point of the new root (unshare-net)
        # No pid namespace at the fallback level: the program could see this process.
        self._undump: Any = _grader_undumpable(level == "rlimits+socket-block")
        self._undump.__enter__()
        try:
            self._start(program, serve, files, _limits(timeout, memory_mb, cpu_seconds,
                                                       max_file_mb, max_processes, level),
                        memory_mb, max_processes)
        except BaseException:
            self.close()  # no work dir, cgroup or pipe outlives a failed start
            raise

    def _start(self, program: str, serve: bool, files: Mapping[str, str] | None,
               limits: dict, memory_mb: int | None, max_processes: int | None) -> None:
        os.chmod(self.workdir, 0o755)
        prog_path = os.path.join(self.workdir, "program.py")
        with open(prog_path, "w", encoding="utf-8") as f:
            f.write(program)
        for rel, text in (files or {}).items():
            dest = os.path.realpath(os.path.join(self.workdir, rel))
            if not dest.startswith(self.workdir + os.sep):
                raise ValueError(f"file {rel!r} escapes the work dir")
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "w", encoding="utf-8") as f:
                f.write(text)
        level = self.level
        view = _program_view()
        # The runner travels in the work dir: its own location (a checkout, a venv) is
        # not part of the program's view.
        runner = os.path.join(self.workdir, ".marft_runner.py")
        shutil.copyfile(_RUNNER, runner)
        cfg: dict[str, Any] = {
            "workdir": self.workdir, "program": prog_path, "serve": serve,
            "module_name": "solution" if serve else "__main__", "limits": limits,
            "drop_caps": level == "unshare-net" and not _drops_uid(level),
            "block_setsid": level == "rlimits+socket-block",
            "block_ipc": level == "rlimits+socket-block",
            "drop_to": list(_NOBODY) if _drops_uid(level) else None,
            "sys_path": list(view.path),
        }
        if level == "unshare-net":
            self.rootdir = tempfile.mkdtemp(prefix="marft-root-")
            cfg["new_root"] = {"at": self.rootdir, "roots": list(view.roots),
                               "hidden": list(view.hidden), "links": list(view.links),
                               "tmpfs_bytes": _TMPFS_BYTES}
        if level == "rlimits+socket-block" and _landlock_abi() > 0:
            cfg["landlock"] = {"reads": _landlock_reads(view)}
        pass_fds: tuple[int, ...] = ()
        if serve:
            self.req_r, self.req_w = os.pipe()
            self.resp_r, self.resp_w = os.pipe()
            cfg.update(req=self.req_r, resp=self.resp_w)
            pass_fds = (self.req_r, self.resp_w)
        # The configuration travels in a file the stub reads and deletes, not on its
        # command line (which the program can read in /proc).
        cfg_path = os.path.join(self.workdir, ".marft_stub.json")
        with open(os.open(cfg_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as f:
            json.dump(cfg, f)
        cmd, bwrap_args = _stub_command(level, self.workdir, cfg_path, runner)
        args_file = None
        if bwrap_args is not None:
            args_file = tempfile.TemporaryFile()  # bwrap reads its options from it (--args)
            args_file.write(b"".join(a.encode() + b"\0" for a in bwrap_args))
            args_file.flush()
            args_file.seek(0)
            cmd = [a.replace("{fd}", str(args_file.fileno())) for a in cmd]
            pass_fds = (*pass_fds, args_file.fileno())
        values = {"pids": max_processes + 4 if max_processes else None,
                  "memory": (memory_mb + 256) * 2**20 if memory_mb else None}
        plan = _cgroup_plan()
        if max_processes and plan.where("pids") is None and _sandbox_uid(level) == 0:
            _warn_once("sandbox: no process-count cap at %s (%s); see describe_isolation()",
                       level, _describe(level)["nproc_cap"])
        self.cgs = cgroups.create_run_cgroups(plan, f"marft-{uuid.uuid4().hex[:12]}", values)
        if self.cgs:
            # The shell joins the cgroups before exec: no fork can happen outside them.
            cmd = ["/bin/sh", "-c",
                   f'while [ "$1" != -- ]; do echo $$ > "$1" || exit {_CGROUP_FAILED}; '
                   'shift; done; shift; exec "$@"', "sh",
                   *[os.path.join(cg, "cgroup.procs") for cg in self.cgs], "--", *cmd]
        try:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                cwd=self.workdir, env=_clean_env(self.workdir), pass_fds=pass_fds,
                start_new_session=True)
        finally:
            if args_file is not None:
                args_file.close()
        if serve:  # the grader keeps no end that the program uses
            os.close(self.req_r)
            os.close(self.resp_w)
            self.req_r = self.resp_w = -1

    def close(self) -> None:
        if self.proc is not None:
            _kill(self.proc, self.cgs)
            for s in (self.proc.stdout, self.proc.stderr):
                if s is not None:
                    s.close()
        for fd in (self.req_r, self.req_w, self.resp_r, self.resp_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.req_r = self.req_w = self.resp_r = self.resp_w = -1
        for cg in self.cgs:
            for _ in range(200):
                try:
                    os.rmdir(cg)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    for pid in _cgroup_pids(cg):
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except OSError:
                            pass
                    time.sleep(0.005)
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self.rootdir is not None:  # an empty dir on the host (mounts were private)
            shutil.rmtree(self.rootdir, ignore_errors=True)
        if self._undump is not None:  # after the kill: nothing of the run is left
            self._undump.__exit__(None, None, None)
            self._undump = None


def _pump(sel: selectors.BaseSelector, deadline: float, handlers: dict[int, Any],
          until: Any) -> bool:
    """Read ready fds into their handlers until ``until()`` or the deadline.
    Returns False on deadline."""
    while not until():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if not sel.get_map():
            time.sleep(min(left, 0.005))
            continue
        for key, _ in sel.select(min(left, 0.1)):
            fd = key.fd
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if handlers[fd](data) is False or not data:
                sel.unregister(fd)
    return True


# ------------------------------------------------------------------ public API
def run_program(program: str, *, timeout: float = 10.0, memory_mb: int | None = 1024,
                cpu_seconds: float | None = None, max_file_mb: int | None = 16,
                max_processes: int | None = 64, max_output: int = 64 * 1024,
                files: Mapping[str, str] | None = None,
                isolation: str | None = None) -> ProgramResult:
    """Run ``program`` as ``__main__`` in a fresh sandbox; stdin is closed.

    ``files`` are extra text files written into the work dir first. The exit code
    is negative when a signal ended the process (e.g. -9 after the timeout).
    """
    level = _check_level(isolation) if isolation else isolation_level()
    return _run_program(program, level=level, timeout=timeout, memory_mb=memory_mb,
                        cpu_seconds=cpu_seconds, max_file_mb=max_file_mb,
                        max_processes=max_processes, max_output=max_output, files=files)


def _run_program(program: str, *, level: str, timeout: float, memory_mb: int | None,
                 cpu_seconds: float | None, max_file_mb: int | None,
                 max_processes: int | None, max_output: int,
                 files: Mapping[str, str] | None = None) -> ProgramResult:
    t0 = time.monotonic()
    deadline = t0 + timeout
    out, err = _Capture(max_output), _Capture(max_output)
    run = _Run(program, level=level, serve=False, timeout=timeout, memory_mb=memory_mb,
               cpu_seconds=cpu_seconds, max_file_mb=max_file_mb,
               max_processes=max_processes, files=files)
    try:
        proc = run.proc
        assert proc is not None and proc.stdout is not None and proc.stderr is not None
        with selectors.DefaultSelector() as sel:
            handlers = {}
            for stream, cap in ((proc.stdout, out), (proc.stderr, err)):
                os.set_blocking(stream.fileno(), False)
                sel.register(stream.fileno(), selectors.EVENT_READ)
                handlers[stream.fileno()] = cap.feed
            exited: list[float] = []

            def ended() -> bool:
                # Done at EOF after exit; a background child that keeps the pipes open
                # gets 0.1 s of grace after the program itself exits, then is killed.
                # A flood past the drain cap ends the run now: the writer would only
                # block on the full pipe until the timeout, and its head is already kept.
                if out.overflow or err.overflow:
                    return True
                if proc.poll() is None:
                    return False
                if not exited:
                    exited.append(time.monotonic())
                return not sel.get_map() or time.monotonic() - exited[0] > 0.1

            finished = _pump(sel, deadline, handlers, ended)
    finally:
        run.close()
    assert run.proc is not None
    return ProgramResult(exit_code=run.proc.returncode, stdout=out.text(), stderr=err.text(),
                         timed_out=not finished, duration=time.monotonic() - t0,
                         isolation=level, output_truncated=out.truncated or err.truncated,
                         output_overflow=out.overflow or err.overflow)


def run_tests(program: str, tests: str | Sequence[str], *, entry_point: str | None = None,
              setup: str = "", timeout: float = 10.0, memory_mb: int | None = 1024,
              cpu_seconds: float | None = None, max_file_mb: int | None = 16,
              max_processes: int | None = 64, max_output: int = 64 * 1024,
              candidate_name: str = "candidate",
              isolation: str | None = None) -> SandboxResult:
    """Grade ``program`` against ``tests`` in a fresh sandbox.

    ``tests`` is one unit of test code or a list of units; each unit passes when
    it runs to the end without an exception. Units run in order in one namespace
    (``setup`` first) of the trusted checker process, where the program's
    top-level names are proxies and ``candidate_name`` is bound to ``entry_point``.
    ``timeout`` is the wall-clock budget of the whole run (load + all units).
    """
    units = [tests] if isinstance(tests, str) else list(tests)
    level = _check_level(isolation) if isolation else isolation_level()
    t0 = time.monotonic()
    deadline = t0 + timeout
    out, err, cerr = _Capture(max_output), _Capture(max_output), _Capture(8192)
    results: dict[int, TestResult] = {}
    state: dict[str, Any] = {"done": False, "error": None, "buf": b"", "seq": 0,
                             "tampered": False}
    key = os.urandom(32)
    run = _Run(program, level=level, serve=True, timeout=timeout, memory_mb=memory_mb,
               cpu_seconds=cpu_seconds, max_file_mb=max_file_mb,
               max_processes=max_processes)
    checker: subprocess.Popen | None = None
    res_r = res_w = -1
    finished = True
    try:
        res_r, res_w = os.pipe()
        checker = subprocess.Popen(
            [sys.executable, *_python_flags(), _RUNNER, "checker", str(run.req_w), str(run.resp_r),
             str(res_w)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, env={"PATH": _PATH, "LANG": "C.UTF-8"},
            pass_fds=(run.req_w, run.resp_r, res_w), start_new_session=True)
        os.close(res_w)
        res_w = -1
        os.close(run.req_w)
        os.close(run.resp_r)
        run.req_w = run.resp_r = -1
        spec = {"units": units, "setup": setup, "entry_point": entry_point,
                "candidate_name": candidate_name,
                "timeout": max(0.05, deadline - time.monotonic() - 0.05),
                "checker_memory": 4 * 2**30, "sys_path": _site_paths(), "key": key.hex()}
        assert checker.stdin is not None
        try:
            checker.stdin.write(json.dumps(spec).encode())
            checker.stdin.close()
        except BrokenPipeError:
            pass

        def on_result(data: bytes) -> None:
            if not data:
                state["done"] = state["done"] or "eof"
                return
            if state["tampered"]:
                return  # drain and ignore
            buf = state["buf"] + data
            while len(buf) >= 4:
                n = int.from_bytes(buf[:4], "big")
                if n > _MAX_REPORT:
                    buf = b""
                    _tampered()
                    break
                if len(buf) < 4 + n:
                    break
                frame, buf = buf[4:4 + n], buf[4 + n:]
                ev = _verify(frame)
                if ev is None:
                    _tampered()
                    break
                state["seq"] += 1
                if ev["event"] == "test":
                    i = ev["index"]
                    results[i] = TestResult(i, ev["passed"] is True, ev["error"],
                                            float(ev["duration"]))
                elif ev["event"] == "load_failed":
                    state["error"] = str(ev["error"])
                elif ev["event"] == "done":
                    state["done"] = True
                    state["timed_out"] = bool(ev.get("timed_out"))
            state["buf"] = buf

        def _verify(frame: bytes) -> dict | None:
            """The checker's event if its MAC and sequence number are right, else None."""
            try:
                outer = json.loads(frame)
                body = str(outer["body"])
                mac = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
                if not hmac.compare_digest(mac, str(outer["mac"])):
                    return None
                ev = json.loads(body)
                return ev if isinstance(ev, dict) and ev.get("seq") == state["seq"] else None
            except (ValueError, TypeError, KeyError, UnicodeDecodeError):
                return None

        def _tampered() -> None:
            # A frame that is not the checker's (forged through /proc/<pid>/fd without
            # namespaces, or replayed): the whole run fails.
            state["tampered"] = True
            state["done"] = state["done"] or "tampered"
            state["buf"] = b""

        proc = run.proc
        assert proc is not None and proc.stdout is not None and proc.stderr is not None
        assert checker.stderr is not None
        with selectors.DefaultSelector() as sel:
            handlers = {res_r: on_result}
            for stream, cap in ((proc.stdout, out), (proc.stderr, err),
                                (checker.stderr, cerr)):
                os.set_blocking(stream.fileno(), False)
                handlers[stream.fileno()] = cap.feed
            for fd in handlers:
                sel.register(fd, selectors.EVENT_READ)
            finished = _pump(sel, deadline, handlers, lambda: state["done"])
            if finished:  # let the program's last output arrive (it exits on EOF)
                _pump(sel, min(deadline, time.monotonic() + 0.05), handlers,
                      lambda: not sel.get_map())
    finally:
        if checker is not None:
            _kill(checker, scan=False)  # trusted: no children
            if checker.stderr is not None:
                checker.stderr.close()
        for fd in (res_r, res_w):
            if fd >= 0:
                os.close(fd)
        run.close()
    if state["tampered"]:
        results.clear()
    tests_out = [results.get(i, TestResult(i, False, "timeout" if not finished else
                                           "not run (checker failed)"))
                 for i in range(len(units))]
    n_passed = sum(t.passed for t in tests_out)
    error = state["error"]
    if state["tampered"]:
        error = "checker reports failed authentication (tampering)"
    if state["done"] is not True and error is None:
        error = "timeout" if not finished else ("checker failed: " + cerr.text()[-500:])
    timed_out = not finished or bool(state.get("timed_out"))
    assert run.proc is not None
    if run.proc.returncode in (_SETUP_FAILED, _CGROUP_FAILED) and error is None:
        error = "sandbox setup failed: " + err.text()[-500:]
    return SandboxResult(
        passed=(state["done"] is True and not state["tampered"] and bool(units)
                and n_passed == len(units)),
        n_tests=len(units), n_passed=n_passed, tests=tests_out, stdout=out.text(),
        stderr=err.text(), timed_out=timed_out, exit_code=run.proc.returncode,
        isolation=level, duration=time.monotonic() - t0, error=error,
        output_truncated=out.truncated or err.truncated)


def run_many(jobs: Iterable[TestJob | Mapping[str, Any]], *, max_workers: int | None = None,
             **defaults: Any) -> list[SandboxResult]:
    """Grade a batch concurrently in a bounded thread pool (each job is its own
    sandbox process); results come back in job order. ``defaults`` are
    ``run_tests`` keyword arguments applied to every job (a job's own win)."""
    norm: list[dict[str, Any]] = []
    for job in jobs:
        if isinstance(job, TestJob):
            d = {"program": job.program, "tests": job.tests, "entry_point": job.entry_point,
                 "setup": job.setup, **job.options}
        else:
            d = dict(job)
        norm.append({**defaults, **d})
    if not norm:
        return []
    workers = max(1, min(max_workers or os.cpu_count() or 1, len(norm)))
    if workers == 1:
        return [run_tests(**d) for d in norm]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="marft-sandbox") as ex:
        return list(ex.map(lambda d: run_tests(**d), norm))
