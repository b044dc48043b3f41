"""Helpers that replaced code written twice (issue 26): the benchmarks' fresh-process row,
the learning-curve options passed through, the program env's second checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # `benchmarks` importable, as the scripts do

from benchmarks._common import child_row  # noqa: E402
from marft_algos.plotting import COST_PANEL, learning_curve_figure, plot_learning_curve  # noqa: E402


def test_child_row_runs_the_script_again_with_the_flag_and_reads_its_last_line(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text("import json, os, sys\nprint('progress')\n"
                      "print(json.dumps({'argv': sys.argv[1:], 'env': os.environ.get('CHILD_X')}))\n")
    row = child_row(str(script), ["--a", "1"], "--mode", "m", env={"CHILD_X": "y", "PATH": "/usr/bin:/bin"})
    assert row == {"argv": ["--a", "1", "--mode", "m"], "env": "y"}


def test_child_row_raises_with_the_childs_stderr_when_it_fails(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text("import sys\nsys.exit('no memory left')\n")
    with pytest.raises(subprocess.CalledProcessError) as e:
        child_row(str(script), [], "--mode", "m")
    assert "no memory left" in e.value.stderr


def test_learning_curve_options_pass_through_to_the_panels(tmp_path: Path) -> None:
    rows = [{"step": s, "team/reward": 0.5, "team/reward/wait": 0.3} for s in range(1, 4)]
    fig = learning_curve_figure(rows, title="my run", cost_components=["wait"])
    try:
        assert [ax.get_title() for ax in fig.axes] == ["my run", COST_PANEL]
    finally:
        plt.close(fig)
    with pytest.raises(TypeError, match="cost_component"):  # a misspelt option is an error, not ignored
        learning_curve_figure(rows, cost_component=["wait"])
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(f'{{"step": {s}, "team/reward": 0.5, "team/reward/wait": 0.3}}\n' for s in range(1, 4)))
    assert plot_learning_curve(metrics, tmp_path / "c.png", cost_components=["wait"], smooth=2).exists()


@pytest.mark.parametrize(("option", "value", "message"), [
    ("program_timeout_s", 0, "program_timeout_s must be > 0"),
    ("reward_grace_s", -1.0, "reward_grace_s must be >= 0"),
    ("fanout_window_s", float("nan"), "fanout_window_s must be >= 0"),
])
def test_program_env_rejects_bad_seconds(option: str, value: float, message: str) -> None:
    from marft_envs.program_env import ProgramEnv, example_program

    with pytest.raises(ValueError, match=message):
        ProgramEnv(example_program, ["solver", "checker"], **{option: value})


def test_program_env_passes_the_workflow_options_through() -> None:
    from marft_envs.program_env import ProgramEnv, example_program

    env = ProgramEnv(example_program, ["solver", "checker"], max_calls=3, max_action_chars=100)
    assert (env.max_calls, env.max_action_chars, env.program_timeout_s) == (3, 100, 120.0)
    with pytest.raises(ValueError, match="max_calls"):
        ProgramEnv(example_program, ["solver", "checker"], max_calls=0)
