"""Per-run cgroups (v1 and v2) and the isolation report.

This machine may have only cgroup v1 (or none writable): v2 detection is
checked on fake cgroup trees (plain directories), the real probe is printed.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from marft_envs.sandbox import LEVELS, available_levels, cgroups, describe_isolation, run_program
from marft_envs.sandbox import core as sandbox_core


def _v2_tree(root: Path, controllers: str, enabled: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text(enabled + "\n")
    return root


def _mountinfo_v2(point: Path, root: str = "/") -> str:
    return f"30 23 0:26 {root} {point} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def test_parse_mounts_and_own_paths() -> None:
    info = ("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
            "32 31 0:29 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
            "33 31 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
            "34 31 0:31 / /sys/fs/cgroup/un\\040ified rw - cgroup2 cgroup2 rw\n")
    v1, v2 = cgroups.parse_mounts(info)
    assert v1 == {"pids": ("/", "/sys/fs/cgroup/pids"), "memory": ("/", "/sys/fs/cgroup/memory")}
    assert v2 == ("/", "/sys/fs/cgroup/un ified")
    own_v1, own_v2 = cgroups.parse_own("8:pids:/a\n4:memory:/b/c\n1:name=systemd:/\n0::/d\n")
    assert own_v1["pids"] == "/a" and own_v1["memory"] == "/b/c" and own_v2 == "/d"


def test_v2_delegated_subtree_gets_pids_and_memory(tmp_path: Path) -> None:
    base = _v2_tree(tmp_path / "cg" / "grader", "cpu memory pids")
    plan = cgroups.probe("0::/grader\n", _mountinfo_v2(tmp_path / "cg"), join=False)
    assert [h.version for h in plan.hierarchies] == [2]
    assert plan.hierarchies[0].base == str(base)
    assert plan.where("pids") == "cgroup v2 pids.max"
    assert plan.where("memory") == "cgroup v2 memory.max"
    created = cgroups.create_run_cgroups(plan, "run1", {"pids": 68, "memory": None})
    assert created == [str(base / "run1")]
    assert (base / "run1" / "pids.max").read_text() == "68"
    assert not (base / "run1" / "memory.max").exists()


def test_v2_explicit_dir_and_missing_controllers(tmp_path: Path) -> None:
    _v2_tree(tmp_path / "cg", "cpu hugetlb")
    plan = cgroups.probe("0::/\n", _mountinfo_v2(tmp_path / "cg"), join=False)
    assert plan.hierarchies == () and plan.where("pids") is None
    assert any(n.startswith("pids: controller not available") for n in plan.notes), plan.notes
    mine = _v2_tree(tmp_path / "delegated", "pids")
    plan = cgroups.probe("0::/\n", _mountinfo_v2(tmp_path / "cg"), env_dir=str(mine), join=False)
    assert plan.where("pids") == "cgroup v2 pids.max" and plan.where("memory") is None
    assert any(n.startswith("memory: controller not available") for n in plan.notes)


def test_v2_subtree_control_refused_is_reported(tmp_path: Path) -> None:
    base = tmp_path / "cg"
    base.mkdir()
    (base / "cgroup.controllers").write_text("pids memory\n")
    (base / "cgroup.subtree_control").mkdir()  # unreadable as a file: the write fails
    plan = cgroups.probe("0::/\n", _mountinfo_v2(base), join=False)
    assert plan.hierarchies == ()
    assert any("unreadable" in n for n in plan.notes), plan.notes


def test_v1_hierarchies_win_and_v2_fills_in(tmp_path: Path) -> None:
    (tmp_path / "pids" / "x").mkdir(parents=True)
    _v2_tree(tmp_path / "v2", "memory pids")
    info = (f"32 31 0:29 / {tmp_path / 'pids'} rw - cgroup cgroup rw,pids\n"
            + _mountinfo_v2(tmp_path / "v2"))
    plan = cgroups.probe("8:pids:/x\n0::/\n", info, join=False)
    assert plan.where("pids") == "cgroup v1 pids.max"
    assert plan.where("memory") == "cgroup v2 memory.max"
    assert [h.version for h in plan.hierarchies] == [1, 2]


def test_real_probe_and_report() -> None:
    plan = sandbox_core._cgroup_plan()
    print(f"cgroups: {plan}")
    own_v2 = [ln for ln in Path("/proc/self/cgroup").read_text().splitlines()
              if ln.startswith("0::")]
    if own_v2:  # the v2 path alone, as on a pure-v2 host (cleans up after itself)
        v2 = cgroups.probe(proc_cgroup=own_v2[0] + "\n")
        print(f"cgroup v2 alone: {v2}")
        assert v2.hierarchies or v2.notes
    for level in LEVELS:
        if available_levels()[level] is None:
            report = describe_isolation(level)
            print(f"{level}: {report}")
            assert report["level"] == level and report["nproc_cap"] and report["memory_cap"]
            if plan.where("pids") is None and os.geteuid() == 0:
                # A root grader's program runs as nobody at every level: NPROC applies.
                assert report["nproc_cap"] == "RLIMIT_NPROC (uid 65534)"


def test_root_grader_without_cgroup_still_caps_processes(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    """Before the uid drop at every level, a root grader's program ran as uid 0 in the
    namespace levels, exempt from RLIMIT_NPROC: without a cgroup nothing capped forks.
    Now it runs as nobody there too, so RLIMIT_NPROC caps it and no warning is due."""
    level = next((lv for lv in LEVELS[:2] if available_levels()[lv] is None), None)
    if level is None or os.geteuid() != 0:
        pytest.skip("needs root and a namespace level")
    monkeypatch.setattr(sandbox_core, "_cg_plan",
                        cgroups.CgroupPlan((), ("pids: simulated, no writable cgroup",)))
    monkeypatch.setattr(sandbox_core, "_warned", set())
    report = describe_isolation(level)
    assert report["nproc_cap"] == "RLIMIT_NPROC (uid 65534)"
    assert report["memory_cap"].startswith("RLIMIT_AS per process")
    prog = ("import os, time\nn = 0\nfor _ in range(64):\n    try:\n        pid = os.fork()\n"
            "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n"
            "        os._exit(0)\n    n += 1\nprint('forks', n, flush=True)\n")
    with caplog.at_level(logging.WARNING, logger="marft_envs.sandbox"):
        r = run_program(prog, timeout=10, isolation=level, max_processes=8)
    n = int(r.stdout.split()[1])
    assert n < 8, r.stdout  # the stub itself counts against the cap
    assert not any("no process-count cap" in rec.getMessage() for rec in caplog.records)
    # Probing the levels with the simulated plan neither hangs nor fails.
    done: list[dict] = []
    t = threading.Thread(target=lambda: done.append(available_levels(refresh=True)), daemon=True)
    t.start()
    t.join(120)
    assert done and done[0][level] is None, "probing the levels hung or failed"
