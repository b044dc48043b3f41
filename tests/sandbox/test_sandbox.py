"""The sandbox API: verdicts, plain-data marshalling, limits, isolation levels, the pool,
and HumanEval correctness (every canonical solution passes; wrong ones do not)."""

from __future__ import annotations

import os
import time

import pytest
from helpers.timing import MARGIN

from marft_envs import sandbox
from marft_envs.sandbox import (
    LEVELS,
    SandboxUnavailable,
    TestJob,
    available_levels,
    isolation_level,
    run_many,
    run_program,
    run_tests,
)
from marft_envs.sandbox import core as sandbox_core

ADD = "def add(a, b):\n    return a + b\n"


def test_isolation_level_reported() -> None:
    lvl = isolation_level()
    avail = available_levels()
    print(f"isolation in force: {lvl}; levels: {avail}")
    assert lvl in LEVELS and avail[lvl] is None
    assert lvl == next(x for x in LEVELS if avail[x] is None)  # the strongest usable


def test_pass_fail_and_per_test_results(level: str) -> None:
    r = run_tests(ADD, ["assert add(1, 2) == 3", "assert add(1, 1) == 3, 'one plus one'",
                        "assert add('a', 'b') == 'ab'"], timeout=5, isolation=level)
    assert (r.passed, r.n_tests, r.n_passed) == (False, 3, 2)
    assert [t.passed for t in r.tests] == [True, False, True]
    assert "one plus one" in (r.tests[1].error or "")
    assert r.isolation == level and r.duration > 0 and not r.timed_out
    ok = run_tests(ADD, "assert add(2, 2) == 4", timeout=5, isolation=level)
    assert ok.passed and ok.fraction == 1.0


def test_candidate_entry_point_setup_and_exceptions() -> None:
    prog = ("def root(x):\n    if x < 0:\n        raise ValueError('negative')\n"
            "    return x ** 0.5\n"
            "class MyErr(Exception):\n    pass\n"
            "def boom():\n    raise MyErr('custom')\n")
    units = ["assert candidate(9) == 3.0",
             "try:\n    candidate(-1)\nexcept ValueError as e:\n    assert 'negative' in str(e)\n"
             "else:\n    raise AssertionError('no error')",
             "assert abs(candidate(2) - math.sqrt(2)) < 1e-12",
             "boom()"]
    r = run_tests(prog, units, entry_point="root", setup="import math", timeout=5)
    assert [t.passed for t in r.tests] == [True, True, True, False]
    assert "MyErr: custom" in (r.tests[3].error or "")


def test_values_are_rebuilt_as_plain_builtins() -> None:
    prog = ("import math\n"
            "def f():\n    return (1, [2.5, float('inf')], {'a': {1, 2}}, b'x', None, True,\n"
            "            10**30, frozenset({1}), 1+2j, -0.0)\n"
            "def g():\n    return float('nan')\n"
            "class Weird:\n    def __eq__(self, other):\n        return True\n"
            "def h():\n    return Weird()\n"
            "def echo(*a, **k):\n    return [a, k]\n")
    units = ["assert f() == (1, [2.5, float('inf')], {'a': {1, 2}}, b'x', None, True, "
             "10**30, frozenset({1}), 1+2j, -0.0)",
             "assert type(f()[6]) is int and type(f()[5]) is bool and type(f()[0]) is int",
             "assert math.isnan(g())",
             "assert h() != 0 and not (h() == h())",
             "assert echo((1, 'x'), [None], k={2: 3.5}) == [((1, 'x'), [None]), {'k': {2: 3.5}}]"]
    r = run_tests(prog, units, setup="import math", timeout=5)
    assert r.passed, [t.error for t in r.tests]


def test_iterators_ranges_and_large_globals() -> None:
    prog = ("TABLE = list(range(100000))\n"
            "SMALL = {'k': (1, 2)}\n"
            "def evens(n):\n    return filter(lambda x: x % 2 == 0, range(n))\n"
            "def rng(n):\n    return range(n)\n"
            "def lookup(i):\n    return TABLE[i]\n")
    units = ["assert list(evens(7)) == [0, 2, 4, 6] and evens(3) != [0, 2]",
             "assert rng(5) == range(5)",
             "assert lookup(99999) == 99999 and SMALL == {'k': (1, 2)}",
             "assert 'TABLE' not in globals()"]  # too large to export; calls still work
    r = run_tests(prog, units, timeout=5)
    assert r.passed, [t.error for t in r.tests]


def test_program_that_does_not_load() -> None:
    r = run_tests("def f(:\n", ["assert f() is None"], timeout=5)
    assert not r.passed and r.n_passed == 0 and "SyntaxError" in (r.error or "")
    r = run_tests("raise RuntimeError('at import')\n", ["assert True"], timeout=5)
    assert not r.passed and "at import" in (r.error or "")


def test_no_units_is_not_a_pass() -> None:
    assert not run_tests(ADD, [], timeout=5).passed


def test_run_program_basics(level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MARFT_PARENT_SECRET", "hunter2")
    prog = ("import os, sys\n"
            "print(os.getcwd())\n"
            "print('SECRET' if 'hunter2' in repr(dict(os.environ)) else 'clean')\n"
            "open('inside.txt', 'w').write('ok')\n"
            "print(open('inside.txt').read())\n"
            "try:\n    input()\nexcept EOFError:\n    print('stdin-closed')\n"
            "sys.stderr.write('to-stderr')\n"
            "sys.exit(3)\n")
    r = run_program(prog, timeout=5, isolation=level)
    lines = r.stdout.split()
    assert r.exit_code == 3 and not r.timed_out and r.isolation == level
    assert lines[1:] == ["clean", "ok", "stdin-closed"] and r.stderr == "to-stderr"
    assert "marft-sbx-" in lines[0] and not os.path.exists(lines[0])  # fresh, removed


def test_run_program_timeout_and_output_cap() -> None:
    t0 = time.monotonic()
    r = run_program("print('start', flush=True)\nwhile True:\n    pass\n", timeout=1.0)
    assert r.timed_out and r.exit_code is not None and r.exit_code < 0
    assert r.stdout.startswith("start") and time.monotonic() - t0 < 1.0 + MARGIN
    r = run_program("print('y' * 100000)", timeout=5, max_output=1000)
    assert len(r.stdout) == 1000 and r.output_truncated and r.exit_code == 0


def test_run_program_ends_when_the_program_exits() -> None:
    prog = ("import os, time\nif os.fork() == 0:\n    time.sleep(30)\n"
            "print('parent done', flush=True)\n")
    r = run_program(prog, timeout=5)
    assert r.exit_code == 0 and not r.timed_out, r  # neither the child's 30 s nor the 5 s timeout


def test_limits_file_size_and_processes() -> None:
    r = run_program("open('big', 'wb').write(b'0' * (3 * 2**20))", timeout=5, max_file_mb=1)
    assert r.exit_code != 0  # SIGXFSZ or EFBIG
    prog = ("import os\nn = 0\n"
            "try:\n    for _ in range(200):\n        if os.fork() == 0:\n"
            "            import time; time.sleep(30); os._exit(0)\n        n += 1\n"
            "except OSError:\n    pass\nprint(n)\n")
    r = run_program(prog, timeout=5, max_processes=16)
    assert r.exit_code == 0 and int(r.stdout) < 200, r


def test_forced_levels_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown isolation"):
        run_tests(ADD, ["assert True"], isolation="chroot")
    fake = dict(available_levels())
    fake["bwrap"] = "bwrap not found on PATH (simulated)"
    monkeypatch.setattr(sandbox_core, "_available", fake)
    with pytest.raises(SandboxUnavailable, match="simulated"):
        run_tests(ADD, ["assert True"], isolation="bwrap")
    if any(fake[x] is None for x in LEVELS):  # without bwrap the next level takes over
        assert isolation_level() != "bwrap"
        assert run_tests(ADD, ["assert add(1, 2) == 3"], timeout=5).passed
    monkeypatch.setenv("MARFT_SANDBOX_ISOLATION", "rlimits+socket-block")
    if fake["rlimits+socket-block"] is None:
        assert isolation_level() == "rlimits+socket-block"


def test_run_many_keeps_order_and_bounds_workers() -> None:
    jobs = [TestJob(ADD, [f"assert add({i}, 1) == {i + 1 if i % 3 else 0}"]) for i in range(9)]
    jobs.append({"program": ADD, "tests": ["assert add(0, 0) == 0"], "timeout": 5})
    res = run_many(jobs, max_workers=3, timeout=5)
    assert [r.passed for r in res] == [i % 3 != 0 for i in range(9)] + [True]
    assert run_many([]) == []


def test_public_names() -> None:
    for name in sandbox.__all__:
        assert hasattr(sandbox, name)
    assert "anti-cheat" in (sandbox.__doc__ or "").lower() or "forge" in (sandbox.__doc__ or "")


def test_humaneval_canonical_solutions_all_pass_wrong_ones_fail() -> None:
    from marft_envs.tasks.code import _he_units, load_humaneval

    rows = load_humaneval()
    assert len(rows) == 164
    good, wrong = [], []
    for i, row in enumerate(rows):
        setup, units = _he_units(i)
        kw = {"tests": list(units), "entry_point": row["entry_point"], "setup": setup}
        good.append({"program": row["prompt"] + row["canonical_solution"], **kw})
        wrong.append({"program": row["prompt"] + "    return None\n", **kw})
    workers = 2 * (os.cpu_count() or 1)
    t0 = time.monotonic()
    res = run_many(good, max_workers=workers, timeout=20)
    dt = time.monotonic() - t0
    failed = [(i, r.error, [t.error for t in r.tests if not t.passed][:2])
              for i, r in enumerate(res) if not r.passed]
    print(f"HumanEval canonical: {164 - len(failed)}/164 passed, {164 / dt:.1f} programs/s "
          f"({workers} workers, isolation {res[0].isolation})")
    assert not failed, failed
    bad = run_many(wrong, max_workers=workers, timeout=20)
    assert [i for i, r in enumerate(bad) if r.passed] == []


def test_humaneval_canonical_at_the_fallback_level() -> None:
    """A root grader's fallback sandbox runs as uid 65534, which may not be able to
    read the interpreter's own directories (a Python under /root): every canonical
    solution must still import what it needs and pass."""
    level = "rlimits+socket-block"
    if available_levels()[level] is not None:
        pytest.skip(f"fallback level refused here: {available_levels()[level]}")
    from marft_envs.tasks.code import _he_units, load_humaneval

    rows = load_humaneval()
    jobs = []
    for i, row in enumerate(rows):
        setup, units = _he_units(i)
        jobs.append({"program": row["prompt"] + row["canonical_solution"], "tests": list(units),
                     "entry_point": row["entry_point"], "setup": setup})
    t0 = time.monotonic()
    res = run_many(jobs, max_workers=2 * (os.cpu_count() or 1), timeout=20, isolation=level)
    print(f"HumanEval canonical at {level}: {sum(r.passed for r in res)}/164, "
          f"{164 / (time.monotonic() - t0):.1f} programs/s")
    assert [(i, r.error) for i, r in enumerate(res) if not r.passed] == []
