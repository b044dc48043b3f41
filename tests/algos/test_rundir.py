"""Run directories: lock, fresh runs, resumes that check their settings, clear errors for bad input."""

from __future__ import annotations

import errno
import json
import math
import os
from pathlib import Path

import pytest

from marft_algos.algos.grpo import GRPOConfig
from marft_algos.cli import main
from marft_algos.config import ConfigError
from marft_algos.logging import LogFileError, MetricsLogger, read_metrics
from marft_algos.rundir import LOCK_NAME, RunDirError, RunDirLock

pytest.importorskip("marft_algos.models")

SAMPLING = '{"speaker": {"max_new_tokens": 2}, "listener": {"max_new_tokens": 2}}'
BASE = ["train", "--env", "echo-duo-v0", "--model", "tiny-random", "--set", "num_envs=4", "--set", "progress=false",
        "--set", "plot=false", "--set", f"sampling_overrides={SAMPLING}"]
IPPO = [*BASE, "--algo", "ippo", "--ent-coef", "0.01", "--set", "lr=0.02"]


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# --- the lock ---------------------------------------------------------------------------


def test_lock_refuses_a_second_holder_and_names_its_pid(tmp_path):
    import subprocess
    import sys

    run = tmp_path / "run"
    code = (
        "import sys, time; from marft_algos.rundir import RunDirLock; "
        f"RunDirLock({str(run)!r}).acquire(); print('locked', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirError, match=rf"in use by another run \(pid {proc.pid}\)"):
            RunDirLock(run).acquire()
    finally:
        proc.kill()
        proc.wait()
    with RunDirLock(run), RunDirLock(run):  # free again (the kernel dropped the dead holder's lock); re-entrant
        assert (run / LOCK_NAME).read_text().strip() == str(os.getpid())
    assert not (run / LOCK_NAME).exists()  # released: no lock file left


def test_fresh_run_into_a_used_dir_refuses(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*IPPO, "--steps", "1", "--out", str(out)]) == 0
    before = _snapshot(out)
    assert main([*IPPO, "--steps", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "is not empty" in err and "--resume" in err and "Traceback" not in err
    assert _snapshot(out) == before  # nothing replaced, nothing appended
    f = tmp_path / "afile"
    f.write_text("x")
    assert main([*IPPO, "--steps", "1", "--out", str(f)]) == 2
    assert "is a file" in capsys.readouterr().err


# --- resume: changed settings ------------------------------------------------------------


@pytest.mark.parametrize(
    "change, expect",
    [
        (["--algo", "grpo", "--set", "group_size=2"], 'algo: "ippo" -> "grpo"'),
        (["--env", "arith-duo-v0"], 'env_id: "echo-duo-v0" -> "arith-duo-v0"'),
        (["--set", "lora_r=4"], "lora_r: 8 -> 4"),
        (["--set", "lora_alpha=8", "--seed", "5"], "lora_alpha: 16 -> 8"),
        (["--set", "num_envs=2"], "num_envs: 4 -> 2"),
    ],
)
def test_resume_refuses_settings_that_cannot_change(tmp_path, capsys, change, expect):
    out = tmp_path / "run"
    assert main([*IPPO, "--steps", "1", "--out", str(out)]) == 0
    before = _snapshot(out)
    argv = [*IPPO, "--steps", "2", "--out", str(out), "--resume", *change]
    if "--algo" in change:  # the later --algo wins
        argv = [a for a in argv if a != "--ent-coef" and a != "0.01"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "cannot change on resume" in err and expect in err and "Traceback" not in err
    if "--seed" in change:
        assert "seed: 0 -> 5" in err  # every refused setting, one line each
    assert _snapshot(out) == before  # config.json, metrics, checkpoints untouched


def test_resume_refuses_another_team(tmp_path):
    from helpers.tiny_echo import ENV_KWARGS, PROFILES, letter_policy
    from helpers.tiny_echo import SAMPLING as TINY_SAMPLING

    from marft_algos.algos.grpo import GRPOTrainer
    from marft_algos.rundir import ResumeConfigError

    cfg = dict(env_id="echo-duo-v0", env_kwargs=ENV_KWARGS, model="tiny-random", num_envs=4, group_size=2, steps=1,
               progress=False, tensorboard=False, plot=False, out_dir=str(tmp_path), sampling_overrides=TINY_SAMPLING)
    GRPOTrainer(GRPOConfig(**cfg), policy=letter_policy()).train()
    trio = [*PROFILES[:1], {"role": "echo", "prompt": "Echo it."}, PROFILES[1]]
    other = GRPOTrainer(GRPOConfig(**{**cfg, "env_kwargs": {**ENV_KWARGS, "profiles": trio}}))
    with pytest.raises(ResumeConfigError) as e:
        other.load_checkpoint(tmp_path)
    assert 'team (agents): ["speaker", "listener"] -> ["speaker", "echo", "listener"]' in str(e.value)
    assert other.global_step == 0


def test_resume_applies_a_new_learning_rate(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*IPPO, "--steps", "1", "--out", str(out)]) == 0
    assert main([*IPPO, "--steps", "2", "--out", str(out), "--resume", "--set", "lr=0.5"]) == 0
    printed = capsys.readouterr().out
    assert "changed on resume (applied): lr: 0.02 -> 0.5" in printed
    assert json.loads((out / "config.json").read_text())["lr"] == 0.5
    assert json.loads((out / "config.json").read_text())["algo"] == "ippo"
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["agent/speaker/lr"] == pytest.approx(0.02) and rows[1]["agent/speaker/lr"] == pytest.approx(0.5)


def test_failed_resume_leaves_the_run_dir_as_it_was(tmp_path, capsys):
    # trainer.pt replaced by garbage with a consistent manifest: verification passes, loading fails
    import hashlib

    out = tmp_path / "run"
    assert main([*IPPO, "--steps", "1", "--out", str(out), "--set", "tensorboard=true"]) == 0
    ck = out / "checkpoints" / "step-00000001"
    (ck / "trainer.pt").write_bytes(b"not a torch file")
    manifest = json.loads((ck / "MANIFEST.json").read_text())
    manifest["files"]["trainer.pt"] = {"size": 16, "sha256": hashlib.sha256(b"not a torch file").hexdigest()}
    (ck / "MANIFEST.json").write_text(json.dumps(manifest))
    before = _snapshot(out)
    assert list((out / "tb").glob("events.*"))
    assert main([*IPPO, "--steps", "2", "--out", str(out), "--resume", "--set", "tensorboard=true"]) == 2
    err = capsys.readouterr().err
    assert "cannot resume" in err and "step-00000001: cannot load it" in err and "Traceback" not in err
    assert _snapshot(out) == before  # metrics.jsonl, tb/, config.json as they were


def test_failed_start_leaves_no_stub_dir(tmp_path, capsys, monkeypatch):
    # offline mode: the Hub lookup fails at once instead of after ~45 s of connection retries on a machine without it
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    out = tmp_path / "new"
    assert main([*IPPO, "--steps", "1", "--out", str(out), "--model", "no-such-model-here"]) == 2
    assert "cannot load model 'no-such-model-here'" in capsys.readouterr().err
    assert not out.exists()


# --- metrics.jsonl damage -------------------------------------------------------------------


def test_torn_last_line_is_skipped_and_a_damaged_middle_line_named(tmp_path, caplog):
    log = MetricsLogger(tmp_path, tensorboard=False)
    for step in (1, 2, 3):
        log.log(step, {"team/reward": float(step)})
    log.close()
    path = tmp_path / "metrics.jsonl"
    with open(path, "a") as fh:
        fh.write('{"step": 4, "team/rew')  # a kill mid-write
    with caplog.at_level("WARNING", logger="marft"):
        assert [r["step"] for r in read_metrics(path)] == [1, 2, 3]
    assert "skipped its last line 4" in caplog.text
    log.truncate_after(2)
    assert path.read_text().endswith("\n") and [r["step"] for r in read_metrics(path)] == [1, 2]
    with open(path, "a") as fh:
        fh.write('{"step": 3, "te')
    log.log(3, {"team/reward": 3.0})  # appending after a torn line: the fragment is dropped first
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3]
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{broken", *lines[1:]]) + "\n")
    before = path.read_bytes()
    with pytest.raises(LogFileError, match=r"metrics.jsonl, line 2: not a valid JSON row"):
        read_metrics(path)
    with pytest.raises(LogFileError, match="line 2"):
        log.truncate_after(1)
    assert path.read_bytes() == before  # the file stays as it was


def test_truncate_after_is_atomic(tmp_path, monkeypatch):
    log = MetricsLogger(tmp_path, tensorboard=False)
    for step in (1, 2, 3):
        log.log(step, {"team/reward": float(step)})
    before = (tmp_path / "metrics.jsonl").read_bytes()

    def full_disk(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)  # the disk fills up before the rename
    with pytest.raises(OSError):
        log.truncate_after(1)
    monkeypatch.undo()
    assert (tmp_path / "metrics.jsonl").read_bytes() == before  # never half-written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no temp file left


# --- settings that make no sense, bad types, bad entry points, bad disks ------------------------


@pytest.mark.parametrize(
    "kw, expect",
    [
        ({"lora_alpha": 0}, "lora_alpha must be > 0"),
        ({"lora_alpha": -4}, "lora_alpha must be > 0"),
        ({"max_grad_norm": math.nan}, "max_grad_norm must be a finite number"),
        ({"beta": math.inf}, "beta must be a finite number"),
        ({"steps": 1.5}, "steps must be an integer, got 1.5"),
        ({"steps": math.inf}, "steps must be an integer, got inf"),
        ({"steps": True}, "steps must be an integer"),
        ({"save_every": -1}, "save_every must be >= 0"),
        ({"keep_checkpoints": -2}, "keep_checkpoints must be >= 0"),
        ({"transcript_every": -5}, "transcript_every must be >= 0"),
        ({"env_kwargs": 5}, "env_kwargs must be a dict"),
        ({"lr": "fast"}, "lr must be a number"),
        ({"recovery": {"kl_max": math.nan}}, None),  # GRPO has no recovery: unknown setting
        ({"sampling_overrides": {"speaker": {"temperature": "hot"}}}, "temperature must be a number"),
        ({"device": "gpu7"}, "unknown device 'gpu7'"),
    ],
)
def test_settings_that_make_no_sense_are_refused(kw, expect):
    with pytest.raises((ConfigError, TypeError)) as e:
        GRPOConfig(**kw)
    if expect is not None:
        assert expect in str(e.value)


def test_nested_part_floats_must_be_finite():
    from marft_algos.algos.marft_action import MARFTActionConfig

    with pytest.raises(ConfigError, match="recovery.kl_max must be a finite number"):
        MARFTActionConfig(recovery={"kl_max": math.nan})


@pytest.mark.parametrize(
    "file_text, set_args, expect",
    [
        ('{"steps": 1.5}', [], "steps must be an integer, got 1.5"),
        ('{"steps": 1e400}', [], "steps must be an integer, got inf"),
        ("[1, 2]", [], "must hold a JSON object"),
        ("{}", ["--set", "env_kwargs=5"], "env_kwargs must be a dict"),
        ("{}", ["--set", "max_grad_norm=nan"], "max_grad_norm must be a finite number"),
        ("{}", ["--set", "device=gpu7"], "unknown device 'gpu7'"),
        ("{}", ["--set", "device=cuda:99"], "cuda:99"),
    ],
)
def test_bad_types_in_config_and_set_are_one_line_errors(tmp_path, capsys, file_text, set_args, expect):
    cfg = tmp_path / "c.json"
    cfg.write_text(file_text)
    out = tmp_path / "run"
    assert main([*IPPO, "--out", str(out), "--config", str(cfg), *set_args]) == 2
    err = capsys.readouterr().err
    assert expect in err and "Traceback" not in err and err.count("\n") == 1
    assert not out.exists()


def test_an_algorithm_entry_point_that_does_not_import_is_a_one_line_error(capsys):
    from marft_algos.registry import ALGORITHMS, register_algorithm

    register_algorithm("broken-algo", "no_such_module_xyz:Trainer", "no_such_module_xyz:Config")
    try:
        assert main([*BASE, "--algo", "broken-algo", "--steps", "1"]) == 2
    finally:
        del ALGORITHMS["broken-algo"]
    err = capsys.readouterr().err
    assert "algorithm 'broken-algo' is registered" in err and "No module named 'no_such_module_xyz'" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_full_or_read_only_disk_is_a_one_line_error_naming_the_path(tmp_path, capsys, monkeypatch, code):
    import marft_algos.checkpoint as ckpt_mod

    def failing_save(obj, path, *a, **k):
        raise OSError(code, os.strerror(code))  # what a write() on a full / read-only disk raises

    monkeypatch.setattr(ckpt_mod.torch, "save", failing_save)
    out = tmp_path / "run"
    assert main([*IPPO, "--steps", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"cannot write {out / 'checkpoints' / 'step-00000001'}: {os.strerror(code)}" in err
    assert "Traceback" not in err and err.count("\n") == 1
