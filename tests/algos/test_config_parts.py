"""Config parts, one vocabulary, nested recovery settings; pre-release spellings are unknown settings."""

from __future__ import annotations

import dataclasses
import json

import pytest

from marft_algos.algos.grpo import GRPOConfig
from marft_algos.algos.ippo import IPPOConfig
from marft_algos.algos.marft_action import MARFTActionConfig
from marft_algos.algos.marft_token import MARFTTokenConfig
from marft_algos.config import (
    ConfigError,
    CriticConfig,
    PPOLossConfig,
    RecoveryConfig,
    apply_overrides,
    config_from_dict,
)


def _names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_shared_parts_are_defined_once_and_used_by_every_algorithm() -> None:
    ppo, critic = _names(PPOLossConfig), _names(CriticConfig)
    for cls in (GRPOConfig, IPPOConfig, MARFTActionConfig, MARFTTokenConfig):
        assert issubclass(cls, PPOLossConfig) and ppo <= _names(cls)
    for cls in (IPPOConfig, MARFTActionConfig, MARFTTokenConfig):
        assert issubclass(cls, CriticConfig) and critic <= _names(cls)
    # one help text per shared field, whatever the algorithm's default
    assert GRPOConfig.__dataclass_fields__["eps_high"].metadata == PPOLossConfig.__dataclass_fields__["eps_high"].metadata
    assert (GRPOConfig().eps_high, IPPOConfig().eps_high, IPPOConfig().value_loss, MARFTActionConfig().value_loss) == (0.28, 0.2, "mse", "huber")


def test_one_normalisation_vocabulary_with_per_algorithm_subsets() -> None:
    assert GRPOConfig().normalize_advantages == "group"
    assert IPPOConfig().normalize_advantages == "agent"
    assert MARFTActionConfig().normalize_advantages == "none"
    assert IPPOConfig(normalize_advantages="batch").normalize_advantages == "batch"
    with pytest.raises(ConfigError, match="normalize_advantages must be one of"):
        GRPOConfig(normalize_advantages="batch")
    with pytest.raises(ConfigError, match="vocabulary"):
        MARFTActionConfig(normalize_advantages="whiten")


#: spellings of the unreleased pre-0.1.0 code: unknown settings now, like any typo
PRE_RELEASE = [
    (IPPOConfig, "value_lr", 0.5),
    (IPPOConfig, "team_reward", False),
    (GRPOConfig, "normalize", "agent"),
    (MARFTActionConfig, "recovery_warmup", 1),
    (MARFTTokenConfig, "recovery_kl_max", None),
]


@pytest.mark.parametrize(("cls", "old", "value"), PRE_RELEASE)
def test_pre_release_names_are_unknown_settings(cls, old, value) -> None:
    with pytest.raises(TypeError, match=old):
        cls(**{old: value})
    with pytest.raises(ConfigError, match=f"unknown {cls.__name__} settings \\['{old}'\\]"):
        config_from_dict(cls, {old: value})
    with pytest.raises(ConfigError, match=f"unknown setting '{old}'"):
        apply_overrides(cls, {}, [f"{old}={json.dumps(value)}"])
    with pytest.raises(AttributeError):
        getattr(cls(), old)


def test_recovery_is_nested() -> None:
    c = MARFTActionConfig(recovery={"max_rollbacks": 5, "kl_max": None})
    assert isinstance(c.recovery, RecoveryConfig) and c.recovery.max_rollbacks == 5 and c.recovery.kl_max is None
    assert MARFTActionConfig(recovery=False).recovery == RecoveryConfig(enabled=False)
    with pytest.raises(ConfigError, match="unknown recovery settings"):
        MARFTActionConfig(recovery={"max_rolbacks": 1})
    with pytest.raises(ConfigError, match="recovery.lr_factor"):
        MARFTActionConfig(recovery={"lr_factor": 0.0})


def test_set_overrides_dotted_and_nested_keys() -> None:
    data = apply_overrides(MARFTTokenConfig, {}, ["recovery.max_rollbacks=3", "recovery.entropy_max=none", "eps_low=0.1"])
    c = config_from_dict(MARFTTokenConfig, data)
    assert (c.recovery.max_rollbacks, c.recovery.entropy_max, c.eps_low) == (3, None, 0.1)
    assert config_from_dict(MARFTTokenConfig, apply_overrides(MARFTTokenConfig, {}, ["recovery=false"])).recovery.enabled is False
    with pytest.raises(ConfigError, match="did you mean recovery.max_rollbacks"):
        apply_overrides(MARFTTokenConfig, {}, ["recovery.max_rolbacks=3"])
    with pytest.raises(ConfigError, match="true/false or a JSON dict"):
        apply_overrides(MARFTTokenConfig, {}, ["recovery=maybe"])


def test_config_json_round_trips_and_a_pre_release_one_is_refused(tmp_path) -> None:
    c = MARFTActionConfig(recovery={"warmup": 3, "kl_max": None}, critic_lr=0.01, eps_low=0.1)
    path = tmp_path / "config.json"
    c.save(path)
    assert json.loads(path.read_text())["recovery"]["warmup"] == 3
    assert MARFTActionConfig.load(path) == c
    # a config.json written by the unreleased code (flat recovery_*) names what is valid
    path.write_text(json.dumps({"algo": "marft-action", "recovery_warmup": 3, "critic_lr": 0.01}))
    with pytest.raises(ConfigError, match=r"unknown MARFTActionConfig settings \['recovery_warmup'\]; valid settings: .*'recovery'"):
        MARFTActionConfig.load(path)
