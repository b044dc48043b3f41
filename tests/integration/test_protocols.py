"""The Protocols of the seams (issue 26): the real parts satisfy them, and so does a scripted
stand-in that inherits from nothing; importing them loads no model stack."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers.scripted import CharPolicy

import marft_envs
from marft_algos.models import TeamPolicy
from marft_algos.protocols import RolloutPolicy, ServedPolicy, TextEnv
from marft_envs.games import NimEnv

REPO = Path(__file__).resolve().parents[2]


def test_the_team_policy_and_a_scripted_stand_in_are_rollout_policies() -> None:
    policy = TeamPolicy(["solver", "checker"], base="tiny-random")
    assert isinstance(policy, ServedPolicy) and isinstance(policy, RolloutPolicy)
    assert isinstance(CharPolicy(), RolloutPolicy)
    assert not isinstance(CharPolicy(), ServedPolicy)  # no tokenizer, no roles: cannot be served
    assert not isinstance(object(), RolloutPolicy)


def test_team_envs_and_games_are_text_envs() -> None:
    for env in (marft_envs.make("arith-duo-v0"), NimEnv()):
        env.reset(seed=0)  # as in PettingZoo, the per-episode attributes exist from the first reset
        assert isinstance(env, TextEnv), type(env)
    assert not isinstance(object(), TextEnv)


def test_importing_the_protocols_loads_no_model_stack() -> None:
    code = ("import sys, marft_algos.protocols; "
            "print([m for m in ('transformers', 'peft', 'marft_algos.models') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
