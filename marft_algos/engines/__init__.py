"""Generation engines: who samples the team's actions.

:class:`GenerationEngine` is the interface (generate requests -> sampled token ids,
per-token log-probs and finish reasons; push new adapter weights for a role; release and
reacquire memory around an update). Engines are looked up by name:

- ``"hf"`` (:class:`~marft_algos.engines.hf.HFEngine`, the default and the reference):
  the KV-cached multi-adapter decode loop on the policy's own transformers model.
- ``"vllm"`` (:class:`~marft_algos.engines.vllm.VLLMEngine`): an in-process
  ``vllm.LLM`` with one LoRA adapter per role (needs the optional vLLM package;
  ``docs/engines.md``).

A :class:`~marft_algos.models.policy.TeamPolicy` builds its engine from a name,
``TeamPolicy(..., engine="hf")``, through :func:`get_engine`; ``TeamPolicy.generate``
delegates to it. ``TrainConfig.engine`` / ``engine_options`` (and ``--engine`` of
``marft eval``) pass a name and its options through to the policy. Third-party engines
call :func:`register_engine`.
"""

from marft_algos.engines.base import GenerationEngine
from marft_algos.engines.registry import (
    EngineNotFound,
    available_engines,
    check_engine_options,
    get_engine,
    register_engine,
)

__all__ = ["EngineNotFound", "GenerationEngine", "available_engines", "check_engine_options", "get_engine", "register_engine"]
