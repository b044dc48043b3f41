"""A resume sees a changed env (issue 28 item 17): the registered kwargs merged with the
user's ``env_kwargs`` and the source of the env's / program's module are recorded in
config.json and compared on resume; a step target below the checkpoint's is an error."""

from __future__ import annotations

import contextlib
import json

import pytest

pytest.importorskip("marft_algos.models")

import marft_envs  # noqa: E402
from marft_algos.algos.grpo import GRPOConfig  # noqa: E402
from marft_algos.checkpoint import run_config  # noqa: E402
from marft_algos.cli import main  # noqa: E402
from marft_algos.rundir import ENV_RECORD_KEY, ResumeConfigError, resume_changes  # noqa: E402

ENV_ID = "resumetest-echo-v0"
TINY = ["--model", "tiny-random", "--set", "num_envs=4", "--set", "group_size=2", "--set", "progress=false",
        "--set", 'sampling_overrides={"speaker": {"max_new_tokens": 2}, "listener": {"max_new_tokens": 2}}']


def _register(**extra):
    """(Re-)register the test's env id; re-registering warns that it overrides."""
    with pytest.warns(UserWarning, match="overriding") if ENV_ID in marft_envs.registry else contextlib.nullcontext():
        marft_envs.register(ENV_ID, "marft_envs.text_env:env", kwargs={"task": "echo", "profiles": "echo", **extra})


def test_resume_refuses_an_env_id_re_registered_with_other_kwargs(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--env", ENV_ID, "--algo", "grpo", "--out", str(out), *TINY]
    _register()
    assert main([*argv, "--steps", "1"]) == 0
    saved = json.loads((out / "config.json").read_text())
    assert saved[ENV_RECORD_KEY]["kwargs"] == {"task": "echo", "profiles": "echo"}  # the saved env_kwargs is {}
    assert saved["env_kwargs"] == {}
    _register(vocabulary=["x", "y"])  # the same id, other data
    capsys.readouterr()
    assert main([*argv, "--steps", "2", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "the environment changed since the checkpoint" in err and '"vocabulary": ["x", "y"]' in err
    assert "another --out" in err and "Traceback" not in err
    _register()  # back as it was: the resume goes on, and the run's config.json still loads as --config
    assert main([*argv, "--steps", "2", "--resume"]) == 0
    assert main(["train", "--env", ENV_ID, "--algo", "grpo", "--config", str(out / "config.json"), "--steps", "1",
                 "--out", str(tmp_path / "again"), *TINY]) == 0


PROGRAM = '''
def program(team, problem):
    reply = team.call("solver", problem.prompt)
    return team.grade(reply)
'''


def test_resume_sees_a_changed_program(tmp_path, monkeypatch):
    mod = tmp_path / "resume_prog_mod.py"
    mod.write_text(PROGRAM)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = GRPOConfig(env_id="workflow-example-v0", env_kwargs={"program": "resume_prog_mod:program", "roles": ["solver"]},
                        model="tiny-random", num_envs=4, group_size=2)
    saved = run_config(config)
    assert set(saved[ENV_RECORD_KEY]["sources"]) == {"resume_prog_mod"}  # marft's own modules are not hashed
    resume_changes(saved, config)  # unchanged: fine
    mod.write_text(PROGRAM.replace("problem.prompt", "problem.prompt + ' Think.'"))
    with pytest.raises(ResumeConfigError, match="env source of module resume_prog_mod"):
        resume_changes(saved, config)


def test_resume_to_a_step_below_the_checkpoint_is_an_error(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--env", "echo-duo-v0", "--algo", "grpo", "--out", str(out), *TINY]
    assert main([*argv, "--steps", "2"]) == 0
    capsys.readouterr()
    assert main([*argv, "--steps", "1", "--resume"]) == 2  # used to say "applied" and do nothing
    captured = capsys.readouterr()
    assert "already at step 2" in captured.err and "--steps above 2" in captured.err
    assert "applied" not in captured.out
