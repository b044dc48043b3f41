"""kill -9 during a checkpoint save and during a step, then --resume; damaged checkpoint files.

The killed run is a real `python -m marft_algos.cli train` subprocess; it stops at a
pause point (``MARFT_TEST_PAUSE_AT=<point>@<step>``, see marft_algos.callbacks.pause_at)
and is killed with SIGKILL there, so the crash lands at the same place every time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marft_algos.cli import main
from marft_algos.logging import read_metrics

pytest.importorskip("marft_algos.models")

SAMPLING = '{"speaker": {"max_new_tokens": 2}, "listener": {"max_new_tokens": 2}}'
# IPPO with an entropy bonus: the weights move even without reward, so equal metrics mean something
ARGV = ["train", "--env", "echo-duo-v0", "--algo", "ippo", "--model", "tiny-random", "--ent-coef", "0.01",
        "--set", "lr=0.02", "--set", "num_envs=4", "--set", "progress=false", "--set", "plot=false",
        "--set", "tensorboard=false", "--set", "save_every=1", "--set", f"sampling_overrides={SAMPLING}"]
STEPS = 3


def _comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("ref") / "run"
    assert main([*ARGV, "--steps", str(STEPS), "--out", str(out)]) == 0
    return _comparable(read_metrics(out / "metrics.jsonl"))


def _run_until_paused(out: Path, point: str, tmp_path: Path) -> subprocess.Popen:
    marker = tmp_path / "paused"
    env = dict(os.environ, MARFT_TEST_PAUSE_AT=point, MARFT_TEST_PAUSE_AT_FILE=str(marker))
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen([sys.executable, "-m", "marft_algos.cli", *ARGV, "--steps", str(STEPS), "--out", str(out)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 900  # generous: CI machines can be loaded
    while not marker.exists():
        if proc.poll() is not None:
            pytest.fail(f"the run ended before reaching {point}: {proc.stderr.read()[-2000:]}")
        if time.time() > deadline:
            proc.kill()
            pytest.fail(f"the run did not reach {point} in 900 s")
        time.sleep(0.2)
    return proc


@pytest.mark.parametrize(
    "point, resumes_from",
    [
        ("save:trainer@2", 1),   # killed mid-save: trainer.pt written, no manifest
        ("step@2", 1),           # killed after step 2 was logged, before it was saved
        ("save:swap@3", 3),      # killed between the two renames of a same-step re-save
    ],
)
def test_kill_9_then_resume_continues_like_an_uninterrupted_run(tmp_path, capsys, reference, point, resumes_from):
    out = tmp_path / "run"
    proc = _run_until_paused(out, point, tmp_path)
    try:
        # a second run on the same --out refuses (the lock), naming the holder
        assert main([*ARGV, "--steps", str(STEPS), "--out", str(out), "--resume"]) == 2
        err = capsys.readouterr().err
        assert f"in use by another run (pid {proc.pid})" in err
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    if point == "step@2":  # as if the kill also tore the line being written
        with open(out / "metrics.jsonl", "a") as fh:
            fh.write('{"step": 3, "team/rew')
    if point == "save:swap@3":
        assert not (out / "checkpoints" / "step-00000003").exists()
        assert list((out / "checkpoints").glob(".old-step-00000003-*"))
    assert main([*ARGV, "--steps", str(STEPS), "--out", str(out), "--resume"]) == 0
    assert f"at step {resumes_from}" in capsys.readouterr().out
    resumed = _comparable(read_metrics(out / "metrics.jsonl"))
    assert [r["step"] for r in resumed] == [1, 2, 3]
    for a, b in zip(resumed, reference, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert (a[k] is None and b[k] is None) or a[k] == pytest.approx(b[k], abs=1e-6), (a["step"], k, a[k], b[k])
    assert any(r.get("agent/speaker/grad_norm") for r in reference)  # the weights moved: equality means something
    left = [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]
    assert left == []  # no .tmp-* or .old-* after the resumed run
    assert not (out / ".marft.lock").exists()


@pytest.fixture(scope="module")
def one_step_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("one") / "run"
    assert main([*ARGV, "--steps", "1", "--out", str(out)]) == 0
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(run, tmp_path / "run"))


@pytest.mark.parametrize(
    "target, damage, expect",
    [
        ("policy", "truncate", "has the wrong size"),
        ("trainer.pt", "truncate", "file trainer.pt has the wrong size"),
        ("trainer.pt", "flip", "file trainer.pt fails its checksum"),
        ("config.json", "flip", "file config.json fails its checksum"),
        ("MANIFEST.json", "truncate", "MANIFEST.json is corrupt"),
    ],
)
def test_damaged_checkpoint_files_are_a_clear_error_and_nothing_is_overwritten(tmp_path, capsys, one_step_run, target, damage, expect):
    out = _copy(one_step_run, tmp_path)
    ck = out / "checkpoints" / "step-00000001"
    f = next(p for p in sorted((ck / "policy").rglob("*")) if p.is_file() and p.stat().st_size > 64) if target == "policy" else ck / target
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2] if damage == "truncate" else data[:-2] + bytes([data[-2] ^ 1]) + data[-1:])
    before = {str(p): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert main([*ARGV, "--steps", "2", "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "cannot resume: no usable checkpoint" in err and expect in err and "Traceback" not in err
    if target == "policy":
        assert f.name in err
    assert {str(p): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before


def test_manifests_that_lie_never_load_a_corrupt_file(tmp_path, one_step_run):
    from marft_algos.checkpoint import CheckpointError, verify_checkpoint

    out = _copy(one_step_run, tmp_path)
    ck = out / "checkpoints" / "step-00000001"
    good = json.loads((ck / "MANIFEST.json").read_text())
    lies = {
        "no files": {**good, "files": {}},
        "files not a dict": {**good, "files": ["trainer.pt"]},
        "size as text": {**good, "files": {**good["files"], "trainer.pt": {**good["files"]["trainer.pt"], "size": "12"}}},
        "no hash": {**good, "files": {**good["files"], "trainer.pt": {"size": good["files"]["trainer.pt"]["size"]}}},
        "trainer.pt unlisted": {**good, "files": {k: v for k, v in good["files"].items() if k != "trainer.pt"}},
        "escapes the dir": {**good, "files": {**good["files"], "../x": good["files"]["config.json"]}},
        "a list": [good],
        "step as text": {**good, "step": "1"},
    }
    for why, manifest in lies.items():
        (ck / "MANIFEST.json").write_text(json.dumps(manifest))
        with pytest.raises(CheckpointError):
            verify_checkpoint(ck)
        assert main([*ARGV, "--steps", "2", "--out", str(out), "--resume"]) == 2, why
    (ck / "MANIFEST.json").write_text(json.dumps(good))
    assert verify_checkpoint(ck)["step"] == 1
