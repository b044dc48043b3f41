"""ValueModel: the critic = the policy's frozen base model + MLP value head(s).

The critic reuses the policy's base model OBJECT (no second copy of the weights, unlike
the reference implementation, which loaded one base per agent plus one for the critic):
its forward runs the base with the policy adapters disabled, or with its own LoRA
adapter ``"__critic__"`` (``critic_lora=...``; role adapters never take a ``__`` name) added to the same peft model. In
``mode="full"`` the policy's frozen reference copy serves as the critic's base.

Value alignment:
    ``values(role, prompts)[b]`` = V(observation) = head(hidden state at the LAST prompt
    token).  ``token_values(role, prompts, responses)[b, j]`` = the value of the state
    *before* response token j is emitted = head(hidden state at the position preceding
    token j), i.e. at ``prompt + response[:j]``; hence ``token_values[:, 0] ==
    values(prompts)``. Positions past a response's length are 0 (see ``mask``).

Heads are fp32 (also under GPU autocast: hidden states are cast to fp32 first).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from marft_algos.models.layout import Layout, build_layout
from marft_algos.models.policy import LoraSettings, TeamPolicy

#: The critic's LoRA adapter name: in the internal ``__`` namespace, which no role adapter takes.
CRITIC_ADAPTER = "__critic__"

__all__ = ["ValueHead", "ValueModel"]

_SHARED = "shared"


class ValueHead(nn.Module):
    """``Linear(h, k) -> GELU -> Linear(k, 1)``, fp32; the last layer starts at zero (V = 0)."""

    def __init__(self, hidden: int, inner: int | None = None) -> None:
        super().__init__()
        inner = inner or hidden
        self.net = nn.Sequential(nn.Linear(hidden, inner), nn.GELU(), nn.Linear(inner, 1))
        nn.init.zeros_(self.net[2].weight)
        nn.init.zeros_(self.net[2].bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Values ``[...]`` from hidden states ``[..., H]`` (computed in fp32)."""
        return self.net(h.float()).squeeze(-1)


class ValueModel:
    """Critic heads on the policy's (frozen) base.

    Args:
        policy_or_base: a :class:`TeamPolicy` (its base object is reused), or a
            ``(model, tokenizer)`` pair / a model for a standalone critic.
        per_agent: one head per role instead of one shared head (shared = one head per
            distinct base: the roles of a heterogeneous team that run on different bases,
            possibly of different hidden sizes, get a head each).
        roles: role names (default: the policy's roles; needed for a bare model with
            ``per_agent=True``).
        head_hidden: width of the head's hidden layer (default: the model's hidden size).
        critic_lora: give the critic its own LoRA adapter ``"__critic__"`` on the shared base
            (``True`` = the policy's LoRA settings); otherwise the base stays frozen.
        seed: seeds the heads' initialisation.
    """

    def __init__(
        self,
        policy_or_base: TeamPolicy | tuple[Any, Any] | nn.Module,
        per_agent: bool = False,
        *,
        roles: Sequence[str] | None = None,
        head_hidden: int | None = None,
        critic_lora: bool | LoraSettings = False,
        seed: int = 0,
    ) -> None:
        self.policy = policy_or_base if isinstance(policy_or_base, TeamPolicy) else None
        self.per_agent = per_agent
        if self.policy is not None:
            self.roles = list(roles or self.policy.roles)
            self.device = self.policy.device
        else:
            model = policy_or_base[0] if isinstance(policy_or_base, tuple) else policy_or_base
            self._model = model
            for p in model.parameters():
                p.requires_grad_(False)
            self.roles = list(roles or [])
            self.device = next(model.parameters()).device
        if per_agent and not self.roles:
            raise ValueError("per_agent=True needs the role names (roles=...)")
        self.critic_adapter: str | None = None
        self._critic_params: list[nn.Parameter] = []
        if critic_lora:
            if self.policy is None or self.policy.mode == "full":
                raise ValueError("critic_lora needs a TeamPolicy in 'lora' or 'shared' mode")
            settings = critic_lora if isinstance(critic_lora, LoraSettings) else None
            # one critic adapter per distinct base
            for role in self.roles:
                self._critic_params.extend(self.policy.add_adapter(role, CRITIC_ADAPTER, settings))
            self._critic_params = list({id(p): p for p in self._critic_params}.values())
            self.critic_adapter = CRITIC_ADAPTER
        # one head per role, or one per distinct base (a heterogeneous team's bases may
        # have different hidden sizes; roles on the same base share their head)
        owner_role: dict[str, str | None] = {}
        for role in self.roles or [None]:
            owner_role.setdefault(self._head_key(role), role)
        heads = {}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for k, role in owner_role.items():
                heads[k] = ValueHead(self._hidden_size(role), head_hidden)
        self.heads = nn.ModuleDict(heads).to(self.device)

    # ------------------------------------------------------------------------------------
    def _owner(self, role: str | None) -> nn.Module:
        """The ``*ForCausalLM`` whose hidden states the critic reads (shared object)."""
        if self.policy is None:
            return self._model
        assert role is not None
        if self.policy.mode == "full":
            ref = self.policy.reference_model(role)
            return ref if ref is not None else self.policy.base_model(role)
        return self.policy.base_model(role)

    def _hidden_size(self, role: str | None) -> int:
        cfg = self._owner(role).config
        return int(getattr(cfg, "hidden_size", None) or cfg.get_text_config().hidden_size)

    def _head_key(self, role: str | None) -> str:
        """``role`` (per agent), else ``"shared"`` for the first base and
        ``"shared-base<k>"`` for the k-th further base of a heterogeneous team."""
        if self.per_agent:
            assert role is not None
            return role
        slot = self.policy.loaded_base(role).slot if (self.policy is not None and role is not None) else 0
        return _SHARED if slot == 0 else f"{_SHARED}-base{slot}"

    def head(self, role: str) -> ValueHead:
        """The value head that scores ``role``'s observations."""
        return self.heads[self._head_key(role)]

    def trainable_parameters(self, role: str | None = None) -> list[nn.Parameter]:
        """Head parameters of ``role`` (all heads when None) + the critic adapter, if any."""
        heads = list(self.heads.values()) if role is None else [self.head(role)]
        params = [p for h in heads for p in h.parameters()]
        return params + list(self._critic_params)

    def parameters(self) -> list[nn.Parameter]:
        """Every trainable parameter (all heads, and the critic adapter if any)."""
        return self.trainable_parameters(None)

    # ------------------------------------------------------------------------------------
    def hidden_states(self, role: str, ids: torch.Tensor, att: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Last-layer hidden states ``[B, L, H]`` of the critic's base (no lm_head): the
        frozen base without grad, or the base with the critic adapter (with grad)."""
        if self.policy is not None:
            return self.policy.hidden_states(role, ids, att, pos, adapter=self.critic_adapter)
        owner = self._owner(role)
        backbone = getattr(owner, owner.base_model_prefix)
        with torch.no_grad():
            return backbone(input_ids=ids, attention_mask=att, position_ids=pos, use_cache=False).last_hidden_state

    def layout(self, role: str, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]) -> Layout:
        """``prompt + response`` rows as a :class:`~marft_algos.models.layout.Layout` (the
        policy's layout of ``role``; pad id 0 for a standalone critic)."""
        if self.policy is not None:
            return self.policy.layout(role, prompts, responses)
        return build_layout(prompts, responses, pad_id=0, device=self.device)

    def values(
        self,
        role: str,
        prompt_ids: Sequence[Sequence[int]],
        token_level: bool = False,
        response_ids: Sequence[Sequence[int]] | None = None,
    ) -> torch.Tensor:
        """V(observation) ``[B]`` from the hidden state at the last prompt token; with
        ``token_level=True`` the per-token values ``[B, T]`` of :meth:`token_values`."""
        if token_level:
            if response_ids is None:
                raise ValueError("token_level=True needs response_ids")
            return self.token_values(role, prompt_ids, response_ids)
        ids, att, pos, _, _, plen, _ = self.layout(role, prompt_ids, [[] for _ in prompt_ids])
        h = self.hidden_states(role, ids, att, pos)[:, plen - 1]
        return self.head(role)(h)

    def token_values(self, role: str, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]) -> torch.Tensor:
        """Per-token values ``[B, T]``: entry j is the value before response token j (from
        the hidden state at the position preceding it); zero past each response's end."""
        ids, att, pos, _, rmask, plen, rlen = self.layout(role, prompt_ids, response_ids)
        if rlen == 0:
            return torch.zeros((len(prompt_ids), 0), device=self.device)
        h = self.hidden_states(role, ids[:, :-1], att[:, :-1], pos[:, :-1])[:, plen - 1 : plen - 1 + rlen]
        return self.head(role)(h) * rmask

    __call__ = values

    # ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Heads (and the critic adapter's weights) as CPU tensors."""
        state: dict[str, Any] = {"heads": {k: v.detach().cpu().clone() for k, v in self.heads.state_dict().items()}}
        if self.critic_adapter is not None:
            state["critic"] = [p.detach().cpu().clone() for p in self._critic_params]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` in place."""
        self.heads.load_state_dict(state["heads"])
        if self.critic_adapter is not None:
            saved = state.get("critic")
            if saved is None or len(saved) != len(self._critic_params):
                raise ValueError("state has no matching critic adapter weights")
            with torch.no_grad():
                for p, v in zip(self._critic_params, saved, strict=True):
                    p.copy_(v.to(p.device))

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``value.pt`` and ``value.json`` to ``directory``; returns it."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), out / "value.pt")
        meta = {"per_agent": self.per_agent, "roles": self.roles, "critic_adapter": self.critic_adapter}
        (out / "value.json").write_text(json.dumps(meta, indent=1))
        return out

    def load(self, directory: str | os.PathLike[str]) -> None:
        """Load what :meth:`save` wrote (the head layout must match); parameters stay trainable."""
        src = Path(directory)
        meta = json.loads((src / "value.json").read_text())
        if bool(meta.get("per_agent")) != self.per_agent:
            raise ValueError(f"saved critic has per_agent={meta.get('per_agent')}, this one {self.per_agent}")
        self.load_state_dict(torch.load(src / "value.pt", map_location="cpu", weights_only=True))
        for p in self.trainable_parameters(None):
            p.requires_grad_(True)
