"""The `marft` command line: train / resume / eval on a tiny model, listing, bad input."""

from __future__ import annotations

import json

import pytest

from marft_algos.cli import main

pytest.importorskip("marft_algos.models")

COMMON = ["--model", "tiny-random", "--set", "num_envs=4", "--set", "progress=false",
          "--set", 'sampling_overrides={"speaker": {"max_new_tokens": 3}, "listener": {"max_new_tokens": 3}}']
TINY = [*COMMON, "--set", "group_size=2"]


def _steps(out):
    return [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_train_grpo_writes_a_run_dir(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--env", "echo-duo-v0", "--algo", "grpo", "--steps", "2", "--out", str(out), *TINY]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and "team/reward" in rows[0] and "agent/speaker/entropy" in rows[0]
    assert (out / "learning_curve.png").is_file() and (out / "checkpoints" / "latest").is_file()
    assert list((out / "tb").glob("events.*"))
    saved = json.loads((out / "config.json").read_text())
    assert saved["algo"] == "grpo" and saved["num_envs"] == 4 and saved["group_size"] == 2


def test_train_resume_and_eval(tmp_path, capsys):
    # IPPO with an entropy bonus: the weights move even when the random tiny model earns no reward
    out = tmp_path / "run"
    ippo = ["train", "--env", "echo-duo-v0", "--algo", "ippo", "--out", str(out), "--ent-coef", "0.01", *COMMON]
    assert main([*ippo, "--steps", "2"]) == 0
    assert main([*ippo, "--steps", "3", "--resume"]) == 0
    assert "resumed from" in capsys.readouterr().out
    assert _steps(out) == [1, 2, 3]
    res = tmp_path / "eval.json"
    assert main(["eval", "--checkpoint", str(out), "--split", "test", "--n", "6", "--num-envs", "3", "--json", str(res)]) == 0
    r = json.loads(res.read_text())
    assert r["n"] == 6 and 0 <= r["ci_low"] <= r["accuracy"] <= r["ci_high"] <= 1 and r["env_id"] == "echo-duo-v0"


def test_resume_a_run_that_has_not_learned_yet(tmp_path):
    out = tmp_path / "run"
    argv = ["train", "--env", "echo-duo-v0", "--algo", "grpo", "--out", str(out), *TINY]
    assert main([*argv, "--steps", "1"]) == 0
    assert main([*argv, "--steps", "2", "--resume"]) == 0


def test_algorithm_flags_and_config_file(tmp_path):
    from marft_algos.cli import build_config, build_parser

    cfg_file = tmp_path / "c.json"
    cfg_file.write_text(json.dumps({"group_size": 8, "num_envs": 16, "lr": 1e-4}))
    args, extra = build_parser().parse_known_args(
        ["train", "--env", "echo-duo-v0", "--algo", "grpo", "--config", str(cfg_file), "--eps-high", "0.3", "--set", "lr=2e-4", "--set", "sampling_overrides.listener.temperature=0.5"]
    )
    cfg = build_config(args, extra)
    assert (cfg.group_size, cfg.num_envs, cfg.eps_high, cfg.lr) == (8, 16, 0.3, 2e-4)
    assert cfg.sampling_overrides == {"listener": {"temperature": 0.5}}


def test_nested_recovery_flags_set_and_config_file(tmp_path):
    from marft_algos.cli import build_config, build_parser

    cfg_file = tmp_path / "c.json"
    cfg_file.write_text(json.dumps({"recovery": {"warmup": 5, "kl_max": None}, "critic_lr": 1e-3}))
    argv = ["train", "--env", "echo-duo-v0", "--algo", "marft-action", "--config", str(cfg_file),
            "--recovery-max-rollbacks", "2", "--set", "recovery.lr_factor=0.25"]
    cfg = build_config(*build_parser().parse_known_args(argv))
    r = cfg.recovery
    assert (r.enabled, r.warmup, r.kl_max, r.max_rollbacks, r.lr_factor, cfg.critic_lr) == (True, 5, None, 2, 0.25, 1e-3)
    off = build_config(*build_parser().parse_known_args(["train", "--algo", "marft-token", "--recovery", "false"]))
    assert off.recovery.enabled is False
    # a pre-release spelling is an unknown option
    from marft_algos.cli import CLIError

    with pytest.raises(CLIError, match="unknown option '--value-lr' for --algo ippo"):
        build_config(*build_parser().parse_known_args(["train", "--algo", "ippo", "--value-lr", "0.01"]))
    # --help lists the nested flags
    from marft_algos.cli import _config_flag_parser
    from marft_algos.registry import get_algorithm

    text = _config_flag_parser(get_algorithm("ippo").config_cls).format_help()
    assert "--critic-lr" in text and "--value-lr" not in text
    assert "--recovery-max-rollbacks" in _config_flag_parser(get_algorithm("marft-action").config_cls).format_help()


@pytest.mark.parametrize(
    "argv, expect",
    [
        (["train", "--env", "echo-duo-v1", "--steps", "1"], "echo-duo-v0"),
        (["train", "--env", "ecoh-duo-v0", "--steps", "1"], "echo-duo"),
        (["train", "--env", "echo-duo-v0", "--algo", "gpro"], "did you mean 'grpo'"),
        (["train", "--env", "echo-duo-v0", "--set", "grop_size=4"], "did you mean 'group_size'"),
        (["train", "--env", "echo-duo-v0", "--set", "group_size=1"], "group_size >= 2"),
        (["train", "--env", "echo-duo-v0", "--grup-size", "4"], "did you mean '--group-size'"),
        (["train", "--env", "echo-duo-v0", "--set", "lr_per_agent.narrator=0.1"], "unknown agents"),
        (["eval", "--checkpoint", "/nonexistent/run"], "no complete checkpoint"),
        (["leaderboard", "--suite", "arith-duo", "--out", "/nonexistent/lb"], "unknown suite 'arith-duo'"),
        (["leaderboard", "--env", "ecoh-duo-v0", "--out", "/nonexistent/lb"], "echo-duo"),
    ],
)
def test_bad_input_is_a_clear_error(argv, expect, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expect in err and "Traceback" not in err


def test_listings(capsys):
    assert main(["list-algos"]) == 0
    out = capsys.readouterr().out
    assert "grpo" in out and "ippo" in out
    assert main(["list-envs"]) == 0
    assert "echo-duo-v0" in capsys.readouterr().out


def test_every_command_has_help(capsys):
    from marft_algos.cli import build_parser

    parser = build_parser()
    subs = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert {"train", "eval", "list-envs", "list-algos", "leaderboard", "quickstart"} <= set(subs.choices)
    for name in subs.choices:
        if name == "train":
            continue  # its -h is its own flag (algorithm options), tested by the docs build
        with pytest.raises(SystemExit) as e:
            main([name, "--help"])
        assert e.value.code == 0
        assert f"usage: marft {name}" in capsys.readouterr().out


def test_quickstart_runs_end_to_end_on_a_tiny_model(tmp_path, capsys):
    out = tmp_path / "qs"
    argv = ["quickstart", "--model", "tiny-random", "--env", "echo-duo-v0", "--steps", "2", "--eval-n", "4", "--out", str(out),
            "--set", "num_envs=4", "--set", "progress=false"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "untrained team" in printed and "trained (2 steps)" in printed
    summary = json.loads((out / "results.json").read_text())
    assert summary["config"]["algo"] == "marft-action" and summary["steps"] == 2
    # the recipe's sampling applies to this env's own roles (no reasoner/actor here)
    assert summary["config"]["sampling_overrides"] == {"speaker": {"temperature": 0.7}, "listener": {"temperature": 0.7}}
    assert summary["before"]["n"] == summary["after"]["n"] == 4
    assert (out / "learning_curve.png").is_file() and (out / "results.txt").read_text().count("\n") >= 3


def test_quickstart_trains_arith_at_its_easy_level_unless_told(tmp_path):
    common = ["quickstart", "--model", "tiny-random", "--steps", "1", "--eval-n", "2", "--set", "num_envs=2", "--set", "progress=false"]
    assert main([*common, "--out", str(tmp_path / "a")]) == 0
    cfg = json.loads((tmp_path / "a" / "results.json").read_text())["config"]
    assert cfg["env_id"] == "arith-duo-v0" and cfg["env_kwargs"] == {"digits": 1, "ops": "+-*"}
    assert main([*common, "--out", str(tmp_path / "b"), "--env-kwargs", "{}"]) == 0
    assert json.loads((tmp_path / "b" / "results.json").read_text())["config"]["env_kwargs"] == {}
    assert main([*common, "--out", str(tmp_path / "c"), "--env-kwargs", "{digits: 1}"]) == 2  # bad JSON: one-line error


def test_quickstart_sampling_leaves_a_tool_role_room_for_a_call():
    """The recipe's actor limit (24) is shorter than a calculator call (34 tokens): a role with tools gets 48."""
    from marft_algos.cli import quickstart_sampling

    assert quickstart_sampling("arith-calc-duo-v0") == {"reasoner": {"max_new_tokens": 64, "temperature": 0.7},
                                                         "actor": {"max_new_tokens": 48, "temperature": 0.7}}
    assert quickstart_sampling("arith-duo-v0")["actor"] == {"max_new_tokens": 24, "temperature": 0.7}
    assert quickstart_sampling("rag-solo-v0") == {"generator": {"temperature": 0.7}}  # the profile's own limit (no cut)


def test_set_takes_a_comma_list_for_list_settings_as_the_tutorial_writes_it():
    """issue 28 item 21: ``--set frozen_agents=editor`` (docs/tutorial/third-party-env.md) was refused."""
    import re
    from pathlib import Path

    from marft_algos.cli import build_config, build_parser

    doc = (Path(__file__).parents[2] / "docs" / "tutorial" / "third-party-env.md").read_text()
    documented = re.search(r"`--set (frozen_agents=[^`]+)`", doc).group(1)
    for setting, want in [(documented, ["editor"]), ("frozen_agents=speaker, listener", ["speaker", "listener"]),
                          ('frozen_agents=["speaker"]', ["speaker"])]:
        args, extra = build_parser().parse_known_args(["train", "--env", "echo-duo-v0", "--algo", "grpo", "--set", setting])
        assert build_config(args, extra).frozen_agents == want


def test_ctrl_c_before_the_first_checkpoint_is_no_dead_end(tmp_path, monkeypatch, capsys):
    """issue 28 item 22: after Ctrl-C before the first checkpoint, --resume found nothing and
    a fresh run refused the directory (only rm -rf helped)."""
    from marft_algos.trainer import Trainer

    out = tmp_path / "run"
    argv = ["train", "--env", "echo-duo-v0", "--algo", "grpo", "--out", str(out), "--steps", "2", *TINY]

    def interrupted(self, *a, **k):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(Trainer, "train_step", interrupted)
        assert main(argv) == 130
    assert (out / "config.json").is_file() and not list(out.glob("checkpoints/step-*"))
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 2
    err = capsys.readouterr().err
    assert "holds no checkpoint" in err and "without --resume" in err
    assert main(argv) == 0  # the same command starts it again in place
    assert "stopped before its first checkpoint" in capsys.readouterr().out
    assert _steps(out) == [1, 2]
    # a dir with files that a run does not write is still refused, and the message says what to do
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    (other / "notes.txt").write_text("mine")
    assert main(["train", "--env", "echo-duo-v0", "--algo", "grpo", "--out", str(other), "--steps", "1", *TINY]) == 2
    assert "files that a run does not write" in capsys.readouterr().err and (other / "notes.txt").is_file()


def test_groups_that_do_not_split_over_ranks_are_refused_before_start_up(tmp_path, monkeypatch, capsys):
    """issue 28 item 22: under torchrun this used to fail at the first step, after the models
    loaded, leaving a run dir that a fresh run refused."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    out = tmp_path / "run"
    argv = ["train", "--env", "echo-duo-v0", "--algo", "grpo", "--out", str(out), "--steps", "1", *COMMON]
    assert main([*argv, "--set", "group_size=2", "--set", "num_envs=6"]) == 2
    err = capsys.readouterr().err
    assert "3 group(s) of episodes per step, which do not split evenly over 2 ranks" in err
    assert "--set num_envs=4" in err and "(rank 0)" in err
    assert not out.exists()
