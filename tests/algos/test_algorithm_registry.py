"""The algorithm registry: one table of built-in names, lazy imports, names written once."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest

from marft_algos.registry import (
    ALGORITHMS,
    BUILTIN_ALGORITHMS,
    UnknownAlgorithmError,
    algorithm_name,
    get_algorithm,
    list_algorithms,
    register_algorithm,
)


def test_unknown_algorithm_message_is_closed_and_suggests() -> None:
    with pytest.raises(UnknownAlgorithmError) as e:
        get_algorithm("grop")
    msg = str(e.value)
    assert msg.startswith("unknown algorithm 'grop'; did you mean 'grpo'? (available: ")
    assert msg.endswith(")") and msg.count("(") == msg.count(")")


def test_every_builtin_config_knows_its_name_from_the_registry() -> None:
    names = [s.name for s in list_algorithms()]
    assert set(BUILTIN_ALGORITHMS) <= set(names)
    for name in BUILTIN_ALGORITHMS:
        spec = get_algorithm(name)
        assert spec.config_cls.algo == name
        assert spec.config_cls().to_dict()["algo"] == name
        assert spec.trainer_cls.config_cls is spec.config_cls


def test_shared_bases_have_no_algorithm_name() -> None:
    from marft_algos.algos.marft import MARFTConfig
    from marft_algos.config import TrainConfig

    assert MARFTConfig.algo is None  # a base of two algorithms, not an algorithm itself
    assert TrainConfig.algo is None


def test_lookup_imports_only_the_algorithm_asked_for() -> None:
    code = (
        "import sys, marft_algos.registry as r\n"
        "assert not any(m.startswith('marft_algos.algos.') for m in sys.modules), sorted(sys.modules)\n"
        "r.get_algorithm('grpo')\n"
        "assert 'marft_algos.algos.grpo' in sys.modules and 'marft_algos.algos.marft_token' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_third_party_registration_by_class_and_by_string() -> None:
    from marft_algos.algos.grpo import GRPOConfig, GRPOTrainer

    @dataclass
    class MyConfig(GRPOConfig):
        """A third-party variant."""

    class MyTrainer(GRPOTrainer):
        """My GRPO variant."""

        config_cls = MyConfig

    try:
        spec = register_algorithm("my-grpo", MyTrainer)
        assert spec.config_cls is MyConfig and spec.description == "My GRPO variant."
        assert algorithm_name(MyConfig) == "my-grpo" and MyConfig.algo == "my-grpo"
        with pytest.raises(ValueError, match="already registered"):
            register_algorithm("my-grpo", GRPOTrainer)
        register_algorithm("my-grpo-lazy", "marft_algos.algos.grpo:GRPOTrainer", "marft_algos.algos.grpo:GRPOConfig", "lazy")
        assert not ALGORITHMS["my-grpo-lazy"].resolved
        assert get_algorithm("my-grpo-lazy").trainer_cls is GRPOTrainer
        with pytest.raises(TypeError, match="TrainConfig subclass"):
            register_algorithm("bad", MyTrainer, dict)
    finally:
        for name in ("my-grpo", "my-grpo-lazy", "bad"):
            ALGORITHMS.pop(name, None)


def test_no_algorithm_overrides_a_loop_phase() -> None:
    """The loop owns the phases: a registered algorithm's trainer class only names its parts."""
    from marft_algos.trainer import Trainer

    loop = {name for name, v in vars(Trainer).items() if callable(v) and not isinstance(v, type) and not name.startswith("__")}
    for spec in list_algorithms():
        own = {name for klass in spec.trainer_cls.__mro__ if klass is not Trainer and issubclass(klass, Trainer)
               for name in vars(klass)}
        assert not own & loop, f"{spec.name} overrides loop phases {sorted(own & loop)}"
        assert set(vars(spec.trainer_cls)) - {"__module__", "__doc__", "__qualname__", "__firstlineno__", "__static_attributes__"} <= {"config_cls", "algorithm_cls"}
