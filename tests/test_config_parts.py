"""Config parts, one vocabulary, nested recovery settings, and the deprecated old names."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest

from marft_algos.algos.marft_action import MARFTActionConfig  # noqa: E402
from marft_algos.algos.marft_token import MARFTTokenConfig  # noqa: E402
from marft_algos.config import (
    ConfigError,
    CriticConfig,
    GRPOConfig,
    IPPOConfig,
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


@pytest.mark.parametrize(
    ("cls", "old", "new"),
    [
        (IPPOConfig, {"value_lr": 0.5}, {"critic_lr": 0.5}),
        (IPPOConfig, {"team_reward": False}, {"reward_source": "agent"}),
        (IPPOConfig, {"team_reward": True}, {"reward_source": "team"}),
        (IPPOConfig, {"normalize_advantages": False}, {"normalize_advantages": "none"}),
        (IPPOConfig, {"normalize_advantages": True}, {"normalize_advantages": "agent"}),
        (GRPOConfig, {"normalize": "global"}, {"normalize_advantages": "group"}),
        (GRPOConfig, {"normalize": "agent"}, {"normalize_advantages": "agent"}),
        (GRPOConfig, {"normalize_advantages": "global"}, {"normalize_advantages": "group"}),
    ],
)
def test_old_names_work_with_a_deprecation_warning(cls, old, new) -> None:
    with pytest.warns(DeprecationWarning, match="deprecated"):
        built = cls(**old)
    assert {k: getattr(built, k) for k in new} == new
    with pytest.warns(DeprecationWarning):
        loaded = config_from_dict(cls, dict(old))
    assert loaded == built


def test_recovery_is_nested_and_old_flat_names_map_into_it() -> None:
    c = MARFTActionConfig(recovery={"max_rollbacks": 5, "kl_max": None})
    assert isinstance(c.recovery, RecoveryConfig) and c.recovery.max_rollbacks == 5 and c.recovery.kl_max is None
    assert MARFTActionConfig(recovery=False).recovery == RecoveryConfig(enabled=False)
    with pytest.warns(DeprecationWarning, match="recovery.warmup"):
        old = MARFTActionConfig(recovery=True, recovery_warmup=1, recovery_reward_drop=None)
    assert old.recovery == RecoveryConfig(warmup=1, reward_drop=None)
    with pytest.warns(DeprecationWarning):
        assert old.recovery_warmup == 1  # attribute access of the old name
    with pytest.warns(DeprecationWarning):
        old.recovery_max_rollbacks = 7
    assert old.recovery.max_rollbacks == 7
    with pytest.raises(ConfigError, match="unknown recovery settings"):
        MARFTActionConfig(recovery={"max_rolbacks": 1})
    with pytest.raises(ConfigError, match="recovery.lr_factor"):
        MARFTActionConfig(recovery={"lr_factor": 0.0})


def test_set_overrides_dotted_nested_and_deprecated_keys() -> None:
    data = apply_overrides(MARFTTokenConfig, {}, ["recovery.max_rollbacks=3", "recovery.entropy_max=none", "eps_low=0.1"])
    c = config_from_dict(MARFTTokenConfig, data)
    assert (c.recovery.max_rollbacks, c.recovery.entropy_max, c.eps_low) == (3, None, 0.1)
    assert config_from_dict(MARFTTokenConfig, apply_overrides(MARFTTokenConfig, {}, ["recovery=false"])).recovery.enabled is False
    with pytest.warns(DeprecationWarning):
        data = apply_overrides(MARFTTokenConfig, {}, ["recovery_warmup=4", "recovery_kl_max=none"])
    assert config_from_dict(MARFTTokenConfig, data).recovery == RecoveryConfig(warmup=4, kl_max=None)
    with pytest.warns(DeprecationWarning):
        data = apply_overrides(IPPOConfig, {}, ["value_lr=0.01", "team_reward=false"])
    assert (config_from_dict(IPPOConfig, data).critic_lr, config_from_dict(IPPOConfig, data).reward_source) == (0.01, "agent")
    with pytest.raises(ConfigError, match="did you mean recovery.max_rollbacks"):
        apply_overrides(MARFTTokenConfig, {}, ["recovery.max_rolbacks=3"])
    with pytest.raises(ConfigError, match="true/false or a JSON dict"):
        apply_overrides(MARFTTokenConfig, {}, ["recovery=maybe"])


def test_old_checkpoint_config_json_still_loads(tmp_path) -> None:
    # the config.json of a run saved before the rename (flat recovery_*, value_lr, bool switches)
    old = {"algo": "marft-action", "recovery": True, "recovery_warmup": 3, "recovery_kl_max": None, "critic_lr": 0.01, "eps_low": 0.1}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(old))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c = MARFTActionConfig.load(path)
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    assert c.recovery == RecoveryConfig(warmup=3, kl_max=None) and c.critic_lr == 0.01 and c.eps_low == 0.1
    # and a new one round-trips with the nested dict
    c.save(path)
    assert json.loads(path.read_text())["recovery"]["warmup"] == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert MARFTActionConfig.load(path) == c
