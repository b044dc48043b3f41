"""The Gymnasium-style registry: make, register, spec, errors, PettingZoo mirror."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import marft_envs
from marft_envs import NameNotFound, RegistryError, TextTeamEnv, VersionNotFound
from marft_envs.registration import EnvSpec, parse_env_id

REPO = Path(__file__).resolve().parents[2]

BUILTIN = {
    "arith-solo-v0", "arith-duo-v0", "arith-trio-v0", "arith-routed-v0",
    "gsm8k-solo-v0", "gsm8k-duo-v0", "gsm8k-trio-v0",
    "math-solo-v0", "math-duo-v0", "math-trio-v0", "math-routed-v0",
    "echo-duo-v0",
}  # fmt: skip


@pytest.fixture
def scratch_ids():
    """Remove the ids a test registers (from both registries)."""
    added: list[str] = []
    yield added
    import pettingzoo

    for env_id in added:
        marft_envs.registry.pop(env_id, None)
        pettingzoo.aec_registry.pop(f"marft/{env_id}", None)


def test_builtin_ids_registered():
    assert BUILTIN <= set(marft_envs.registry)
    for env_id in BUILTIN:
        s = marft_envs.spec(env_id)
        assert s.version == 0 and isinstance(s.entry_point, str) and s.description


def test_make_builds_the_right_team_and_task():
    env = marft_envs.make("arith-trio-v0")
    assert isinstance(env, TextTeamEnv) and env.possible_agents == ["solver_a", "solver_b", "aggregator"]
    assert env.spec.id == "arith-trio-v0" and env.task.name == "arith"
    assert marft_envs.make("echo-duo-v0").possible_agents == ["speaker", "listener"]


def test_make_overrides_and_deep_copies_kwargs(scratch_ids):
    env = marft_envs.make("arith-duo-v0", split="test", digits=2, reward={"format": 0.5}, horizon=3)
    assert env.task.split == "test" and env.task.digits == 2 and env.horizon == 3
    assert env.reward_config.format == 0.5
    # registered kwargs are deep-copied: an entry point mutating them changes nothing
    seen = []

    def mutating_factory(**kwargs):
        kwargs["reward"]["outcome"] = 99.0
        seen.append(kwargs["reward"]["outcome"])
        return TextTeamEnv("arith", **kwargs)

    scratch_ids.append("mutating-v0")
    marft_envs.register("mutating-v0", mutating_factory, kwargs={"reward": {"outcome": 1.0}}, mirror=False)
    marft_envs.make("mutating-v0")
    marft_envs.make("mutating-v0")
    assert marft_envs.spec("mutating-v0").kwargs == {"reward": {"outcome": 1.0}} and seen == [99.0, 99.0]


def test_unknown_reward_key_lists_valid_keys():
    with pytest.raises(ValueError, match=r"unknown reward keys \['fromat'\]; valid keys: \['outcome', 'format'"):
        marft_envs.make("arith-solo-v0", reward={"fromat": 1.0})
    with pytest.raises(ValueError, match="non-negative"):
        marft_envs.make("arith-solo-v0", reward={"cost_per_turn": -1.0})


def test_unknown_task_kwarg_names_the_task():
    with pytest.raises(TypeError, match=r"ArithTask\) has no option 'levels'; its options: split, digits"):
        marft_envs.make("arith-solo-v0", levels=[1])


def test_name_not_found_suggests_close_ids():
    with pytest.raises(NameNotFound, match="Did you mean: 'arith-duo-v0'") as err:
        marft_envs.make("arith-dou-v0")
    assert isinstance(err.value, KeyError) and isinstance(err.value, RegistryError)
    assert "pprint_registry" in str(err.value)
    with pytest.raises(KeyError):
        marft_envs.spec("no-such-thing-v0")


def test_version_not_found_lists_versions():
    with pytest.raises(VersionNotFound, match="no version v7; available: arith-duo-v0"):
        marft_envs.make("arith-duo-v7")


def test_unversioned_id_resolves_to_latest(scratch_ids):
    scratch_ids.extend(["arith-duo-v1"])
    marft_envs.register("arith-duo-v1", "marft_envs.text_env:env", kwargs={"task": "arith", "profiles": "duo"})
    with pytest.warns(UserWarning, match="latest version 'arith-duo-v1'"):
        assert marft_envs.spec("arith-duo").id == "arith-duo-v1"


def test_register_validates(scratch_ids):
    with pytest.raises(marft_envs.Error, match="JSON-serializable"):
        marft_envs.register("bad-v0", "marft_envs.text_env:env", kwargs={"task": object()})
    with pytest.raises(marft_envs.Error, match="module:attr"):
        marft_envs.register("bad-v0", "marft_envs.text_env.env")
    with pytest.raises(marft_envs.Error, match="malformed"):
        parse_env_id("bad id with spaces")
    assert parse_env_id("ns/name-v3") == ("ns", "name", 3)
    scratch_ids.append("dup-v0")
    marft_envs.register("dup-v0", "marft_envs.text_env:env", mirror=False)
    with pytest.warns(UserWarning, match="overriding"):
        marft_envs.register("dup-v0", "marft_envs.text_env:env", mirror=False)


def test_module_prefix_imports_the_module_first():
    # "pkg.module:id" imports pkg.module; a missing module is a clear error
    env = marft_envs.make("marft_envs.envs:arith-solo-v0")
    assert env.possible_agents == ["actor"]
    with pytest.raises(marft_envs.Error, match="could not import 'no_such_pkg'"):
        marft_envs.make("no_such_pkg:thing-v0")


def test_spec_make_and_frozen():
    s = marft_envs.spec("arith-duo-v0")
    assert isinstance(s, EnvSpec) and s.name == "arith-duo" and s.namespace is None
    assert s.make(horizon=2).horizon == 2
    with pytest.raises(AttributeError):
        s.id = "x"  # type: ignore[misc]


def test_pprint_registry(capsys):
    text = marft_envs.pprint_registry(disable_print=True)
    assert all(env_id in text for env_id in BUILTIN) and "===== arith =====" in text
    marft_envs.pprint_registry()
    assert "math-routed-v0" in capsys.readouterr().out


def test_mirrored_into_pettingzoo_registry(scratch_ids):
    import pettingzoo

    if not hasattr(pettingzoo, "aec_registry"):
        pytest.skip("this PettingZoo has no registry")
    for env_id in BUILTIN:
        assert f"marft/{env_id}" in pettingzoo.aec_registry
    env = pettingzoo.make("aec", "marft/arith-duo-v0", split="test")
    assert isinstance(env, TextTeamEnv) and env.task.split == "test"
    scratch_ids.append("mirror-check-v0")
    marft_envs.register("mirror-check-v0", "marft_envs.text_env:env", kwargs={"task": "echo", "profiles": "echo"})
    assert pettingzoo.make("aec", "marft/mirror-check-v0").possible_agents == ["speaker", "listener"]


def test_import_registers_without_loading_data():
    code = (
        "import sys, marft_envs; "
        "assert len(marft_envs.registry) >= 12; "
        "heavy = [m for m in ('marft_envs.tasks.gsm8k', 'marft_envs.tasks.math', 'datasets', 'torch') "
        "if m in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_builtin_table_holds_every_builtin_id_once():
    import marft_envs.envs as envs

    ids = envs.BUILTIN_ENV_IDS
    assert len(ids) == len(set(ids)) and (BUILTIN | set(envs.CODE_ENV_IDS) | set(envs.GAME_ENV_IDS) | set(envs.TOOL_ENV_IDS)
            | set(envs.TEAM_ENV_IDS) == set(ids))


def test_builtin_id_defined_twice_is_an_error():
    import marft_envs.envs as envs

    before = dict(envs._BUILTIN)
    with pytest.raises(marft_envs.Error, match="'code-duo-v0' is defined twice"):
        envs.builtin("code-duo-v0", "marft_envs.envs:make_code_env", kwargs={}, description="again")
    assert envs._BUILTIN == before  # nothing replaced, nothing skipped silently


def test_register_builtin_envs_again_is_silent_and_restores_overrides(scratch_ids, recwarn):
    import marft_envs.envs as envs

    envs.register_builtin_envs()
    assert not [w for w in recwarn if "overriding" in str(w.message)]
    with pytest.warns(UserWarning, match="overriding"):
        marft_envs.register("echo-duo-v0", "marft_envs.text_env:env", kwargs={"task": "arith"})
    with pytest.warns(UserWarning, match="overriding"):
        envs.register_builtin_envs()
    assert marft_envs.spec("echo-duo-v0").kwargs == {"task": "echo", "profiles": "echo"}
