"""Issue 28 item 14: a training step prints no transformers/peft deprecation warnings.

transformers 5.x deprecates the forward's ``past_key_values`` (now ``cache``) and peft's probe
of ``is_gradient_checkpointing``; both used to warn on every run. A user's console must show
only our own messages.
"""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("marft_algos.models")
from helpers.marft_echo import echo_kwargs, letter_policy  # noqa: E402

from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from marft_algos.models import TeamPolicy, build_tiny_model  # noqa: E402
from marft_algos.models.compat import cache_kwarg  # noqa: E402


def _deprecations(record: list[warnings.WarningMessage]) -> list[str]:
    return [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in record if issubclass(w.category, (FutureWarning, DeprecationWarning))]


def test_lora_team_setup_and_grpo_step_emit_no_deprecation_warning():
    # groups of 2 share a prompt: the prefix-shared KV-cache forward runs in collect and update
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        policy = letter_policy()
        kw = echo_kwargs(num_envs=4, group_size=2, steps=1)
        for key in ("critic_lr", "recovery"):  # GRPO has no critic, no collapse recovery
            kw.pop(key)
        trainer = GRPOTrainer(GRPOConfig(**kw), policy=policy)
        trainer.train_step()
    assert _deprecations(record) == []


def test_cache_kwarg_follows_the_installed_forward():
    import inspect

    model, _ = build_tiny_model(seed=0)
    expected = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    assert cache_kwarg(model) == expected
    policy = TeamPolicy(["a", "b"], base=build_tiny_model(seed=0), seed=0)
    wrapped = policy._bases[0].model  # peft-wrapped: the name comes from the model underneath
    assert wrapped is not model and hasattr(wrapped, "get_base_model")
    assert cache_kwarg(wrapped) == expected
