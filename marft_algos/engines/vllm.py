"""The ``vllm`` engine: an in-process ``vllm.LLM`` colocated with training, one LoRA per role.

Each role's adapter is served as a vLLM LoRA adapter on the unmerged base (merging one
role would change every role), and one ``generate`` call mixes roles: every prompt
carries its own ``LoRARequest``. After an update the changed adapters are exported in
peft format and registered under new ids (:mod:`marft_algos.engines.lora_sync`); the
engine notices a changed adapter by itself (torch's in-place version counters of the
adapter's parameters), so a trainer that never calls :meth:`VLLMEngine.sync_weights`
still samples from the current weights.

Log-probs: vLLM's log-probs come from other kernels than the trainer's forward (on a GPU
in bf16 they differ by up to ~1e-2 per token). By default (``logprob_source="trainer"``)
the engine recomputes the sampled tokens' log-probs with the policy's own forward
(:meth:`~marft_algos.models.policy.TeamPolicy.sequence_logprobs`, no grad) and returns
those, so the exactness contract of :mod:`marft_algos.engines.base` holds exactly; the
gap to vLLM's numbers is kept per role in :meth:`VLLMEngine.metrics`. With
``logprob_source="engine"`` the engine returns vLLM's own log-probs (no extra forward
here; ``logprobs_exact`` is False): the trainer recomputes the old log-probs with its
forward before the update, as it does under bf16, and weights the policy gradient by the
truncated importance ratio ``min(exp(trainer - vLLM), tis_cap)`` per token
(:meth:`marft_algos.trainer.Trainer.tis_weights`), logging the gap per agent.

Supported: ``mode="lora"`` and ``mode="shared"`` on ONE base that vLLM can load (an
alias converted to a folder, a local folder or a Hub id), and ``mode="full"`` only while
the weights are the ones vLLM loaded (an untrained team in ``marft eval``). Not
supported (a clear error): changed full weights (pushing full weights into vLLM's worker
process every step), several bases, and the in-code ``tiny-random`` test model. vLLM's own
imports are lazy: :mod:`marft_algos.engines._vllm_compat` wraps all of them.
"""

from __future__ import annotations

import atexit
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from marft_algos.engines import _vllm_compat as compat
from marft_algos.engines.base import GenerationEngine
from marft_algos.engines.lora_sync import (
    AdapterVersions,
    adapter_fingerprint,
    default_adapter_root,
    export_adapter,
)
from marft_algos.models.aliases import resolve_alias
from marft_algos.models.loading import ensure_cached
from marft_algos.models.sampling import GenRequest, GenResult

if TYPE_CHECKING:
    from marft_algos.models.policy import LoadedBase, TeamPolicy

__all__ = ["VLLMEngine", "model_path_of"]

_LOGPROB_SOURCES = ("trainer", "engine")
_FULL_CHANGED = (
    "the vllm engine cannot serve changed full weights (mode='full'): pushing the full model into vLLM's worker "
    "process after an update is not supported; train with mode='lora'/'shared' or use engine='hf'"
)


def model_path_of(b: LoadedBase) -> str:
    """What vLLM should load for base ``b``: the converted folder of an alias, a local
    folder or a Hub id (raises ``ValueError`` for in-code models vLLM cannot load)."""
    alias = resolve_alias(b.name)
    if alias is not None:
        if alias.kind == "tiny":
            raise ValueError(
                f"the vllm engine cannot load {b.name!r}: it is built in code (tests), not a model folder; "
                "use engine='hf' with it, or a real model (e.g. smollm2-135m)"
            )
        return str(ensure_cached(alias))
    if Path(b.name).expanduser().is_dir():
        return str(Path(b.name).expanduser())
    if b.name.startswith("<"):
        raise ValueError("the vllm engine needs a base it can load by name or path, not a model object")
    return b.name  # a Hub id


class VLLMEngine(GenerationEngine):
    """Sample with vLLM (see the module docstring).

    Args:
        policy: the team policy (``mode="lora"`` or ``"shared"``, one base).
        gpu_memory_utilization: the fraction of GPU memory vLLM may take (weights, LoRA
            slots and KV cache); the trainer's model, gradients and optimizer state share
            the same GPU, so keep it well below 1 (ignored on CPU).
        max_model_len: prompt + response limit inside vLLM (default: the policy's
            ``max_context`` of the base); it sizes the KV cache.
        enforce_eager: no CUDA graphs (default: on, the safe choice when colocated and
            the only one on CPU).
        dtype: vLLM's compute dtype (default: ``"float32"`` on CPU, ``"bfloat16"`` on CUDA).
        max_num_seqs: most sequences vLLM decodes together (default: the policy's
            ``max_batch``).
        adapter_root: where adapter versions are exported (default
            ``/dev/shm/marft-<pid>-<random>``, a temp folder when ``/dev/shm`` is missing).
        logprob_source: ``"trainer"`` (recompute the returned log-probs with the
            policy's forward) or ``"engine"`` (return vLLM's; the trainer corrects with
            truncated importance sampling, see the module docstring).
        sleep_level: vLLM sleep-mode level used by :meth:`sleep` on CUDA (1: offload the
            weights, drop the KV cache; adapter-only syncs never resend the base).
        **llm_kwargs: passed to ``vllm.LLM`` unchanged (e.g. ``swap_space``).
    """

    name = "vllm"

    def __init__(
        self,
        policy: TeamPolicy,
        *,
        gpu_memory_utilization: float = 0.3,
        max_model_len: int | None = None,
        enforce_eager: bool = True,
        dtype: str | None = None,
        max_num_seqs: int | None = None,
        adapter_root: str | None = None,
        logprob_source: str = "trainer",
        sleep_level: int = 1,
        **llm_kwargs: Any,
    ) -> None:
        super().__init__(policy)
        if logprob_source not in _LOGPROB_SOURCES:
            raise ValueError(
                f"logprob_source must be one of {_LOGPROB_SOURCES}, got {logprob_source!r}: 'trainer' recomputes "
                "the log-probs with the policy's forward, 'engine' keeps vLLM's (truncated importance sampling)"
            )
        if not 0.0 < float(gpu_memory_utilization) <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        if len(policy.loaded_bases) != 1:
            raise ValueError(
                f"the vllm engine serves one base model, this policy has {len(policy.loaded_bases)} "
                f"({[b.name for b in policy.loaded_bases]}); use engine='hf' for heterogeneous teams"
            )
        self.base = policy.loaded_bases[0]
        self.logprob_source = logprob_source
        self.logprobs_exact = logprob_source == "trainer"
        self.sleep_level = int(sleep_level)
        self.lora = policy.mode != "full"
        self.adapters = list(dict.fromkeys(policy.adapter_of(r) or "" for r in policy.roles)) if self.lora else []
        self.on_cuda = policy.device.type == "cuda"
        self.max_model_len = int(max_model_len or self.base.max_context)
        self.settings: dict[str, Any] = dict(
            dtype=dtype or ("bfloat16" if self.on_cuda else "float32"),
            max_model_len=self.max_model_len,
            max_num_seqs=int(max_num_seqs or policy.max_batch),
            enforce_eager=bool(enforce_eager),
            logprobs_mode="processed_logprobs",  # temperature applied, as in the contract
            seed=int(policy.seed),
        )
        if self.lora:
            self.settings.update(
                enable_lora=True,
                # +1: on the CPU build a row without an adapter gets the last slot's adapter;
                # with a spare slot the last slot is empty (and every row here has an adapter)
                max_loras=len(self.adapters) + 1,
                # room for the new versions while the old ones are still registered
                max_cpu_loras=2 * len(self.adapters) + 1,
                max_lora_rank=compat.round_lora_rank(policy.lora.r),
            )
        if self.on_cuda:
            self.settings.update(gpu_memory_utilization=float(gpu_memory_utilization), enable_sleep_mode=True)
        self.settings.update(llm_kwargs)
        self.model_path = model_path_of(self.base)
        self.llm = compat.make_llm(self.model_path, **self.settings)
        self.versions = AdapterVersions(compat.VLLMLoraBackend(self.llm), adapter_root or default_adapter_root())
        atexit.register(self.versions.close)
        self._fingerprints: dict[str, tuple[int, ...]] = {}
        self._asleep = False
        self._gaps: dict[str, list[float]] = defaultdict(list)
        self._full_fingerprint = None if self.lora else adapter_fingerprint(list(self.base.model.parameters()))
        self.sync_weights()

    # ---- weights ----------------------------------------------------------------------
    def _publish(self, adapter: str) -> None:
        params = self.base.adapter_params[adapter]
        path = export_adapter(self.policy, self.base, adapter, self.versions.folder(adapter))
        self.versions.publish(adapter, path)
        self._fingerprints[adapter] = adapter_fingerprint(params)

    def sync_weights(self) -> None:
        """Publish every role's adapter as a new version (also done automatically, for
        the adapters that changed, at the start of every :meth:`generate`)."""
        for adapter in self.adapters:
            self._publish(adapter)

    def _refresh(self) -> None:
        if not self.lora:
            if adapter_fingerprint(list(self.base.model.parameters())) != self._full_fingerprint:
                raise RuntimeError(_FULL_CHANGED)
            return
        for adapter in self.adapters:
            if adapter_fingerprint(self.base.adapter_params[adapter]) != self._fingerprints.get(adapter):
                self._publish(adapter)

    def set_adapter_weights(self, role: str, state: Mapping[str, torch.Tensor]) -> None:
        """Copy ``state`` into ``role``'s adapter in the policy and publish it to vLLM."""
        if not self.lora:
            raise RuntimeError(_FULL_CHANGED)
        self.policy.load_adapter_state_dict(role, state)
        self._publish(self.policy.adapter_of(role) or "")

    def sleep(self) -> None:
        """On CUDA: vLLM sleep mode (``sleep_level``) for the update; nothing on CPU."""
        if self.on_cuda and not self._asleep:
            compat.sleep(self.llm, self.sleep_level)
            self._asleep = True

    def wake_up(self) -> None:
        """Undo :meth:`sleep` (also done by :meth:`generate` when needed)."""
        if self._asleep:
            compat.wake_up(self.llm)
            self._asleep = False

    # ---- generation -------------------------------------------------------------------
    def generate(self, requests: Sequence[GenRequest], *, seed: int | None = None) -> list[GenResult]:
        """One result per request (``n`` consecutive results for ``n > 1``), all roles
        in one vLLM call. A seed gives row ``i`` the vLLM seed ``seed + i``."""
        pol = self.policy
        b = self.base
        self.wake_up()
        self._refresh()
        rows = [r for r in requests for _ in range(max(1, int(r.n)))]
        results: list[GenResult | None] = [None] * len(rows)
        todo: list[int] = []
        for i, r in enumerate(rows):
            s = r.sampling
            if len(r.prompt_ids) == 0:
                raise ValueError(f"empty prompt for role {r.role!r}")
            if len(r.prompt_ids) + s.max_new_tokens > min(b.max_context, self.max_model_len):
                pol.stats["context_overflow"] += 1
                results[i] = GenResult([], "", [], "context")
            elif s.max_new_tokens == 0:
                results[i] = GenResult([], "", [], "length")
            else:
                todo.append(i)
        if todo:
            eos = sorted(b.eos_ids)
            params = [
                compat.make_sampling_params(
                    temperature=0.0 if rows[i].sampling.is_greedy else float(rows[i].sampling.temperature),
                    top_p=1.0 if rows[i].sampling.is_greedy else float(rows[i].sampling.top_p),
                    max_tokens=int(rows[i].sampling.max_new_tokens),
                    stop=rows[i].sampling.stop,
                    stop_token_ids=eos,
                    seed=None if seed is None else (int(seed) + i) % (2**63),
                )
                for i in todo
            ]
            loras = [self.versions.request(pol.adapter_of(rows[i].role) or "") if self.lora else None for i in todo]
            outputs = compat.generate(self.llm, [rows[i].prompt_ids for i in todo], params, loras)
            for i, out in zip(todo, outputs, strict=True):
                ids, lps, text, finish = compat.completion_of(out)
                results[i] = GenResult(ids, text, lps, finish)
                pol.stats["generated_tokens"] += len(ids)
            if self.logprob_source == "trainer":
                self._trainer_logprobs(rows, results, todo)
        pol.stats["requests"] += len(rows)
        return [r for r in results if r is not None]

    @torch.no_grad()
    def _trainer_logprobs(self, rows: list[GenRequest], results: list[GenResult | None], todo: list[int], chunk: int = 16) -> None:
        """Replace vLLM's log-probs by the policy forward's, recording the gap per role."""
        groups: dict[tuple[str, float], list[int]] = defaultdict(list)
        for i in todo:
            res = results[i]
            if res is not None and res.token_ids:
                s = rows[i].sampling
                groups[(rows[i].role, 1.0 if s.is_greedy else float(s.temperature))].append(i)
        for (role, temp), idx in groups.items():
            for start in range(0, len(idx), chunk):
                part = idx[start : start + chunk]
                stats = self.policy.sequence_logprobs(
                    role, [rows[i].prompt_ids for i in part], [results[i].token_ids for i in part], temperature=temp  # type: ignore[union-attr]
                )
                for i, lp, m in zip(part, stats.logprobs, stats.mask, strict=True):
                    res = results[i]
                    assert res is not None
                    mine = lp[m.bool()].float().cpu().tolist()
                    self._gaps[role].extend(abs(a - e) for a, e in zip(mine, res.logprobs, strict=True))
                    results[i] = GenResult(res.token_ids, res.text, mine, res.finish_reason)

    # ---- reporting --------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        """Per role, the max and mean absolute gap between vLLM's and the trainer's
        log-prob of each token sampled since the last call (``engine/logprob_gap_*``);
        the window restarts at every call."""
        out: dict[str, float] = {}
        for role, gaps in self._gaps.items():
            if gaps:
                out[f"engine/logprob_gap_max/{role}"] = max(gaps)
                out[f"engine/logprob_gap_mean/{role}"] = math.fsum(gaps) / len(gaps)
        self._gaps.clear()
        return out

    def describe(self) -> dict[str, Any]:
        """The engine's name, model and vLLM settings."""
        return {"engine": self.name, "model": self.model_path, "logprob_source": self.logprob_source, **self.settings}

    def close(self) -> None:
        """Delete the exported adapters (the ``vllm.LLM`` is freed with the engine)."""
        self.versions.close()
