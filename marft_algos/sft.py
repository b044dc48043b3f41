"""Per-role SFT warm start: train each role's adapter on demonstrations before RL.

``marft sft --env ID --demos FILE|scripted --out RUN``, then ``marft train --init RUN``
(docs/sft.md). Demonstrations are ``(role, prompt ids, response ids)`` samples:

- ``scripted``: episodes played by the env's scripted policy (``env.demo_action(agent)``,
  e.g. a correct calculator call, then the boxed result) through the RL collector
  itself (:class:`~marft_algos.rollout.RolloutCollector`), so every prompt is built
  exactly as the rollout builds it: chat template, tool schemas, and a tool
  continuation's prompt = the previous segment's prompt + its ids + the tool result's ids.
  Only episodes the env grades correct are kept (``only_correct``).
- a JSONL file: one chat turn per line, ``{"agent": ROLE, "messages": [...],
  "response": TEXT}`` (or ``messages`` ending with the ``assistant`` turn, no
  ``response``), optionally ``"tools": [schemas]``; prompts go through
  ``policy.encode`` as the collector's first segments do.

The loss is the project's own masked LM loss, on the same per-role adapters RL trains:
``-mean log p(response token | prompt, earlier response tokens)`` over the assistant
tokens only (the response ids, EOS included so the model learns to stop), computed by
:meth:`TeamPolicy.sequence_logprobs`, the scorer RL uses. TRL's ``SFTTrainer`` was not
used: it trains one model (one active adapter) per trainer on text it re-templates
itself, while here several roles' adapters live on one base and the prompt ids must be
the rollout's ids, tool continuations included (see docs/sft.md).

The run dir is a normal one: ``checkpoints/step-00000000`` (policy, config.json with the
policy's settings, MANIFEST.json) plus ``sft.json`` (settings, demo counts, loss per
epoch and role). ``marft eval --checkpoint RUN`` evaluates it; ``marft train --init RUN``
starts RL from its weights. It is a starting point, not a run to ``--resume``.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

import marft_envs
from marft_algos.algos.grpo import GRPOConfig
from marft_algos.checkpoint import run_config, save_checkpoint
from marft_algos.config import ConfigError
from marft_algos.policy_factory import make_policy
from marft_algos.rollout import RolloutCollector, overlong_counts
from marft_algos.seeding import seed_everything
from marft_envs.tools.chat import literal_ids

__all__ = ["Demo", "SFTConfig", "SFTResult", "demo_lengths", "demos_from_jsonl", "response_ids", "run_sft", "scripted_demos", "sft_train"]


@dataclass
class Demo:
    """One demonstration sample: ``role`` should answer ``prompt_ids`` with ``response_ids``."""

    role: str
    prompt_ids: list[int]
    response_ids: list[int]


@dataclass
class SFTConfig:
    """Settings of ``marft sft`` (the policy fields mean what they mean in ``TrainConfig``)."""

    env_id: str = field(default="arith-calc-duo-v0", metadata={"help": "Registered environment id (its team gives the roles; scripted demos play it)."})
    demos: str = field(default="scripted", metadata={"help": "'scripted' (the env's demo_action) or a JSONL file of per-role chat turns."})
    out_dir: str | None = field(default=None, metadata={"help": "Run directory to write (loadable by marft train --init and marft eval --checkpoint)."})
    env_kwargs: dict[str, Any] = field(default_factory=dict, metadata={"help": "Extra keyword arguments for marft_envs.make."})
    model: str = field(default="smollm2-135m", metadata={"help": "Base model alias, Hub id or path."})
    mode: str = field(default="lora", metadata={"help": "'lora' (one adapter per role), 'shared' or 'full'."})
    lora_r: int = field(default=8, metadata={"help": "LoRA rank (the RL run must use the same)."})
    lora_alpha: int = field(default=16, metadata={"help": "LoRA alpha (the RL run must use the same)."})
    device: str = field(default="auto", metadata={"help": "'auto', 'cpu', 'cuda', ..."})
    dtype: str | None = field(default=None, metadata={"help": "Compute dtype (None: fp32 on CPU, bf16 autocast on GPU)."})
    max_context: int = field(default=2048, metadata={"help": "Prompt + response token limit; longer samples are skipped (counted)."})
    num_demos: int = field(default=64, metadata={"help": "Scripted: episodes played (train split of the env)."})
    only_correct: bool = field(default=True, metadata={"help": "Scripted: keep only episodes the env grades correct."})
    epochs: int = field(default=3, metadata={"help": "Passes over the demonstrations."})
    batch_size: int = field(default=8, metadata={"help": "Samples per optimizer step (one role per step)."})
    lr: float = field(default=2e-4, metadata={"help": "AdamW learning rate of the adapters."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm per step (<= 0: off)."})
    roles: list[str] = field(default_factory=list, metadata={"help": "Roles to train (default: every role with demos); the others keep fresh adapters."})
    seed: int = field(default=0, metadata={"help": "Seed of the demo problems and the sample order (the adapters start from the policy's fixed LoRA init, as in RL)."})

    def __post_init__(self) -> None:

        for name in ("num_demos", "epochs", "batch_size", "lora_r"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"lr must be a positive finite number, got {self.lr}")
        if isinstance(self.roles, str):
            self.roles = [r.strip() for r in self.roles.split(",") if r.strip()]

    def train_config(self) -> Any:
        """The policy settings as a GRPO ``TrainConfig`` (what ``make_policy`` and the run dir's
        config.json hold; an RL run with ``--init`` uses the same model, mode and LoRA shape)."""
        return GRPOConfig(env_id=self.env_id, env_kwargs=dict(self.env_kwargs), model=self.model, mode=self.mode,
                          lora_r=self.lora_r, lora_alpha=self.lora_alpha, device=self.device, dtype=self.dtype,
                          max_context=self.max_context, seed=self.seed, steps=0, out_dir=self.out_dir)


@dataclass
class SFTResult:
    """What :func:`run_sft` did: samples per role, skipped ones, losses, the run dir."""

    demos: dict[str, int]
    skipped: dict[str, int]
    losses: dict[str, list[float]]  # role -> mean token NLL per epoch
    first_loss: dict[str, float]  # role -> mean token NLL before any step
    seconds: float
    out_dir: str | None = None
    checkpoint: str | None = None
    # role -> {"p50", "p90", "max"} of the trained responses' lengths in tokens (EOS included):
    # what RL's max_new_tokens must leave room for (``marft train --init`` warns when it does not)
    response_tokens: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (``sft.json``)."""
        return asdict(self)


# ------------------------------------------------------------------------------ demos
def _eos_id(policy: Any, role: str) -> int:
    """The id that ends an assistant turn: ``<|im_end|>`` where it is an EOS id, else the tokenizer's EOS."""
    tok = policy.tokenizer(role)
    eos = set(policy.loaded_base(role).eos_ids)
    end = tok.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tok.get_vocab() else None
    if end is not None and end in eos:
        return int(end)
    if tok.eos_token_id is None:
        raise ValueError(f"the tokenizer of role {role!r} has no EOS token: a demonstration could not end")
    return int(tok.eos_token_id)


def response_ids(policy: Any, role: str, text: str) -> list[int]:
    """``text`` as a sampled response: its literal ids, then the end-of-turn id."""
    return literal_ids(policy.tokenizer(role), text) + [_eos_id(policy, role)]


class _ScriptedSampler:
    """A policy for the collector whose "samples" are the env's scripted actions.

    It delegates prompt building (``encode``, ``tokenizer``) to the real policy, so the
    collector builds every prompt exactly as in RL; ``generate`` answers the one pending
    request with ``env.demo_action()`` of the collector's single env."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.env: Any = None
        self.missing: set[str] = set()

    def encode(self, role: str, messages: Any, tools: Any = None) -> list[int]:
        """The real policy's chat encoding."""
        return self.policy.encode(role, messages, tools=tools)

    def tokenizer(self, role: str) -> Any:
        """The real policy's tokenizer."""
        return self.policy.tokenizer(role)

    def generate(self, requests: Sequence[Any], **_: Any) -> list[Any]:
        """The scripted action of the env's selected agent, as ids ending with EOS."""
        # deferred: marft_algos.models loads the model stack (transformers)
        from marft_algos.models import GenResult

        out = []
        for r in requests:
            text = self.env.demo_action(self.env.agent_selection)
            if text is None:
                self.missing.add(self.env.agent_selection)
                text = ""
            ids = response_ids(self.policy, r.role, text)
            out += [GenResult(token_ids=ids, text=text, logprobs=[0.0] * len(ids), finish_reason="eos")] * r.n
        return out


def scripted_demos(policy: Any, env_fn: Callable[[], Any], n: int, *, seed: int = 0, only_correct: bool = True,
                   max_context: int | None = None) -> tuple[list[Demo], dict[str, Any]]:
    """``n`` episodes of the env's scripted policy through the RL collector; ``(demos, stats)``.

    Every segment of every kept episode is a demo (a tool call and the answer after its
    result are two samples of the same role). A segment whose prompt alone exceeds
    ``max_context`` is stepped with "" (its episode is then usually wrong, and dropped);
    ``stats["overlong_prompts"]`` counts them per role and :func:`run_sft` adds them to its
    ``skipped``. Raises ``ValueError`` when the env has no scripted policy (``demo_action``
    missing or None for every agent)."""
    sampler = _ScriptedSampler(policy)
    col = RolloutCollector(env_fn, sampler, num_envs=1, seed=seed, mode="eval", max_context=max_context,
                           step_workers=1, share_prefill=False, continuous_batching=False)
    sampler.env = col.envs[0]
    if not callable(getattr(sampler.env, "demo_action", None)):
        raise ValueError(f"env {type(sampler.env).__name__} has no demo_action(agent): it offers no scripted "
                         "demonstrations; give --demos FILE.jsonl instead")
    batch = col.collect(n)
    demos: list[Demo] = []
    kept = correct = 0
    for ep in batch.episodes:
        correct += bool(ep.correct)
        if only_correct and not ep.correct:
            continue
        kept += 1
        demos += [Demo(t.agent, list(t.prompt_ids), list(t.response_ids)) for t in ep.transitions
                  if t.trainable and t.agent not in sampler.missing]
    if not demos and sampler.missing:
        raise ValueError(f"the env's task has no scripted demonstrations for {sorted(sampler.missing)} "
                         "(task.demo_action returned None); give --demos FILE.jsonl instead")
    stats = {"episodes": len(batch.episodes), "correct": correct, "kept": kept, "no_demo_roles": sorted(sampler.missing),
             "overlong_prompts": overlong_counts(batch.metrics)}  # the collector's per-agent count
    return demos, stats


def demos_from_jsonl(policy: Any, path: str | Path, roles: Iterable[str]) -> list[Demo]:
    """Demos from a JSONL file of per-role chat turns (see the module docstring); a bad line
    raises ``ValueError`` naming the line and what to write."""
    # deferred: marft_algos.models loads the model stack
    from marft_algos.models.chat import template_uses_tools

    roles = list(roles)
    demos: list[Demo] = []
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"demonstrations file {path} not found (or use --demos scripted)")
    with open(path, encoding="utf-8") as fh:
        for no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{no}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e})") from None
            if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
                raise ValueError(f'{where}: write {{"agent": ROLE, "messages": [{{"role": ..., "content": ...}}], '
                                 '"response": TEXT}')
            agent = row.get("agent")
            if agent not in roles:
                raise ValueError(f"{where}: agent {agent!r} is not a role of this team {roles}")
            messages = [dict(m) for m in row["messages"]]
            response = row.get("response")
            if response is None:
                if not messages or messages[-1].get("role") != "assistant":
                    raise ValueError(f"{where}: give \"response\" or end \"messages\" with the assistant turn")
                response = messages.pop()["content"]
            if not isinstance(response, str) or not all(isinstance(m.get("content"), str) for m in messages):
                raise ValueError(f"{where}: message contents and the response must be strings")
            tools = row.get("tools") or None
            if tools and not template_uses_tools(policy.tokenizer(agent), tools):
                tools = None  # as the collector does: such templates get the tools in the system message
            demos.append(Demo(agent, list(policy.encode(agent, messages, tools=tools)), response_ids(policy, agent, response)))
    if not demos:
        raise ValueError(f"{path} holds no demonstrations")
    return demos


def demo_lengths(demos: Sequence[Demo]) -> dict[str, dict[str, int]]:
    """Per role, the 50th and 90th percentile and the maximum of the demos' response lengths
    in tokens (nearest rank)."""
    by_role: dict[str, list[int]] = defaultdict(list)
    for d in demos:
        by_role[d.role].append(len(d.response_ids))

    def rank(q: float, lengths: list[int]) -> int:
        return lengths[max(0, math.ceil(q * len(lengths)) - 1)]

    return {role: {"p50": rank(0.5, ls), "p90": rank(0.9, ls), "max": ls[-1]} for role, ls in ((r, sorted(v)) for r, v in by_role.items())}


# ------------------------------------------------------------------------------ training
def _nll(policy: Any, role: str, batch: Sequence[Demo]) -> Any:
    """Mean NLL per response token of ``batch`` under ``role`` (the masked LM loss)."""
    stats = policy.sequence_logprobs(role, [d.prompt_ids for d in batch], [d.response_ids for d in batch])
    return -(stats.logprobs * stats.mask).sum() / stats.mask.sum().clamp(min=1)


def sft_train(policy: Any, demos: Sequence[Demo], *, epochs: int = 3, batch_size: int = 8, lr: float = 2e-4,
              max_grad_norm: float = 1.0, seed: int = 0,
              log: Callable[[str], None] | None = None) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Train each role's adapter on its demos (masked LM loss, AdamW; one role per step, roles
    that share parameters share an optimizer). Returns ``(loss before, loss per epoch)`` per role."""
    by_role: dict[str, list[Demo]] = defaultdict(list)
    for d in demos:
        by_role[d.role].append(d)
    optims: dict[tuple[int, ...], Any] = {}
    optim_of: dict[str, Any] = {}
    for role in by_role:
        params = policy.trainable_parameters(role)
        key = tuple(sorted(id(p) for p in params))
        if key not in optims:
            optims[key] = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
        optim_of[role] = optims[key]
    rng = random.Random(seed)
    before: dict[str, float] = {}
    with torch.no_grad():
        for role, ds in by_role.items():
            before[role] = float(sum(_nll(policy, role, ds[i:i + batch_size]).item() * len(ds[i:i + batch_size])
                                     for i in range(0, len(ds), batch_size)) / len(ds))
    losses: dict[str, list[float]] = {r: [] for r in by_role}
    for epoch in range(epochs):
        for role in by_role:
            rng.shuffle(by_role[role])
        steps = [(role, ds[i:i + batch_size]) for role, ds in by_role.items() for i in range(0, len(ds), batch_size)]
        rng.shuffle(steps)
        sums: dict[str, float] = defaultdict(float)
        for role, batch in steps:
            policy.set_train_role(role)
            opt = optim_of[role]
            opt.zero_grad(set_to_none=True)
            loss = _nll(policy, role, batch)
            loss.backward()
            if max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(role), max_grad_norm)
            opt.step()
            sums[role] += float(loss.item()) * len(batch)
        for role, ds in by_role.items():
            losses[role].append(sums[role] / len(ds))
        if log is not None:
            log(f"epoch {epoch + 1}/{epochs}: " + ", ".join(f"{r} {v[-1]:.4f}" for r, v in losses.items()))
    policy.set_train_role(None)
    return before, losses


class _Saved:
    """What :func:`marft_algos.checkpoint.save_checkpoint` reads of a trainer."""

    def __init__(self, policy: Any, config: Any, agents: list[str], state: dict[str, Any]) -> None:
        self.policy, self.config, self.agents, self._state = policy, config, agents, state
        self.global_step = 0

    def state_dict(self) -> dict[str, Any]:
        """The SFT record (no optimizer state: RL starts its own)."""
        return {"sft": self._state}


def run_sft(config: SFTConfig, *, policy: Any = None, log: Callable[[str], None] | None = print) -> SFTResult:
    """``marft sft``: build the team's policy, gather the demos, train, write the run dir."""
    t0 = time.perf_counter()
    seed_everything(config.seed)
    env_id, env_kwargs = config.env_id, dict(config.env_kwargs)
    agents = list(marft_envs.make(env_id, **env_kwargs).possible_agents)
    tcfg = config.train_config()
    policy = policy if policy is not None else make_policy(tcfg, agents)
    stats: dict[str, Any] = {}
    if config.demos == "scripted":
        demos, stats = scripted_demos(policy, lambda: marft_envs.make(env_id, **env_kwargs), config.num_demos,
                                      seed=config.seed, only_correct=config.only_correct, max_context=config.max_context)
    else:
        demos = demos_from_jsonl(policy, config.demos, agents)
    if config.roles:
        unknown = sorted(set(config.roles) - set(agents))
        if unknown:

            raise ConfigError(f"roles {unknown} are not agents of {env_id} ({agents})")
        demos = [d for d in demos if d.role in set(config.roles)]
    skipped: dict[str, int] = defaultdict(int, {r: k for r, k in stats.get("overlong_prompts", {}).items()
                                                 if not config.roles or r in config.roles})
    fit = []
    for d in demos:
        if len(d.prompt_ids) + len(d.response_ids) > config.max_context:
            skipped[d.role] += 1
        else:
            fit.append(d)
    if not fit:
        raise ValueError(f"no demonstration to train on ({len(demos)} gathered, {sum(skipped.values())} over "
                         f"max_context={config.max_context}; scripted stats {stats})")
    counts: dict[str, int] = defaultdict(int)
    for d in fit:
        counts[d.role] += 1
    if log is not None:
        log(f"sft: {len(fit)} demos " + ", ".join(f"{r} {k}" for r, k in counts.items()) + (f"; scripted {stats}" if stats else ""))
        log("sft: response tokens (p50/p90/max) " + ", ".join(f"{r} {v['p50']}/{v['p90']}/{v['max']}" for r, v in demo_lengths(fit).items())
            + ": give RL a max_new_tokens of at least the p90")
    before, losses = sft_train(policy, fit, epochs=config.epochs, batch_size=config.batch_size, lr=config.lr,
                               max_grad_norm=config.max_grad_norm, seed=config.seed, log=log)
    result = SFTResult(demos=dict(counts), skipped=dict(skipped), losses=losses, first_loss=before,
                       seconds=round(time.perf_counter() - t0, 3), out_dir=config.out_dir, response_tokens=demo_lengths(fit))
    if config.out_dir:
        out = Path(config.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        record = {"config": asdict(config), "result": result.to_dict(), "scripted": stats}
        ckpt = save_checkpoint(_Saved(policy, tcfg, agents, record), out / "checkpoints", keep=1)
        result.checkpoint = str(ckpt)

        (out / "config.json").write_text(json.dumps(run_config(tcfg), indent=2, sort_keys=True))
        (out / "sft.json").write_text(json.dumps({**record, "result": result.to_dict()}, indent=2, sort_keys=True))
    return result
