"""marft algorithms: per-role LoRA agents on one base model, batched multi-agent rollouts
and pluggable trainers (GRPO, independent PPO, MARFT), all behind one interface.

    from marft_algos import GRPOConfig, get_algorithm
    spec = get_algorithm("grpo")
    trainer = spec.trainer_cls(GRPOConfig(env_id="arith-duo-v0", steps=50, out_dir="runs/duo"))
    trainer.train()
"""

from __future__ import annotations

from marft_algos.algorithm import Algorithm
from marft_algos.callbacks import Callback
from marft_algos.checkpoint import (
    CheckpointError,
    find_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from marft_algos.config import ConfigError, TrainConfig
from marft_algos.logging import MetricsLogger
from marft_algos.optim import OptimizerSet
from marft_algos.records import Episode, RolloutBatch, Transition
from marft_algos.registry import (
    ALGORITHMS,
    AlgorithmSpec,
    UnknownAlgorithmError,
    get_algorithm,
    lazy_exports,
    list_algorithms,
    register_algorithm,
)
from marft_algos.rollout import RolloutCollector
from marft_algos.seeding import seed_everything
from marft_algos.trainer import Trainer

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "Callback",
    "OptimizerSet",
    "AlgorithmSpec",
    "CheckpointError",
    "ConfigError",
    "Episode",
    "GRPOConfig",
    "GRPOTrainer",
    "IPPOConfig",
    "IPPOTrainer",
    "MARFTActionConfig",
    "MARFTActionTrainer",
    "MARFTConfig",
    "MARFTTokenConfig",
    "MARFTTokenTrainer",
    "MetricsLogger",
    "OpponentPool",
    "RolloutBatch",
    "RolloutCollector",
    "SelfPlaySettings",
    "TrainConfig",
    "Trainer",
    "Transition",
    "UnknownAlgorithmError",
    "EvalResult",
    "evaluate",
    "find_checkpoint",
    "get_algorithm",
    "list_algorithms",
    "load_checkpoint",
    "register_algorithm",
    "save_checkpoint",
    "seed_everything",
    "selfplay_trainer",
]

_LAZY = {
    "GRPOConfig": "marft_algos.algos.grpo",
    "IPPOConfig": "marft_algos.algos.ippo",
    "GRPOTrainer": "marft_algos.algos.grpo",
    "IPPOTrainer": "marft_algos.algos.ippo",
    "MARFTConfig": "marft_algos.algos.marft",
    "MARFTActionConfig": "marft_algos.algos.marft_action",
    "MARFTActionTrainer": "marft_algos.algos.marft_action",
    "MARFTTokenConfig": "marft_algos.algos.marft_token",
    "MARFTTokenTrainer": "marft_algos.algos.marft_token",
    "EvalResult": "marft_algos.evaluation",
    "evaluate": "marft_algos.evaluation",
    "OpponentPool": "marft_algos.selfplay",
    "SelfPlaySettings": "marft_algos.selfplay",
    "selfplay_trainer": "marft_algos.selfplay",
}

# algorithm and evaluation modules import the model stack: they load on first use
__getattr__ = lazy_exports(__name__, _LAZY)
