"""One gradient update as a small object: loss -> NaN check -> backward -> grad clip -> step -> target update.

:class:`Updater` sums the ``loss_*`` terms it owns, refuses to step on a non-finite loss or gradient (parameters
stay as they were; :class:`NonFiniteLossError` names the key and the update), clips the gradient norm, steps the
optimizer, advances the target networks and returns the detached metrics (with ``grad_norm`` and ``lr``). Several
optimizers with their own cadence (TD3's delayed actor) are several updaters, each owning its ``loss_keys``.

:class:`TargetUpdate` follows rlpyt: ``interval`` counts gradient updates and ``tau`` is the polyak factor (1.0 =
hard copy). It pairs each ``target_X`` child of the loss with ``X`` and updates them tensor by tensor (TorchRL's
TensorDict-level ``SoftUpdate`` costs several times more on CPU).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

__all__ = ["NonFiniteLossError", "TargetUpdate", "Updater"]


class NonFiniteLossError(FloatingPointError):
    """A loss term or gradient is NaN/inf; raised before the optimizer steps, so parameters stay finite.

    Attributes:
        key: the loss key (``"loss_objective"``) or ``"grad_norm"``.
        update: the 0-based gradient update at which it happened.
    """

    def __init__(self, key: str, update: int, value: float) -> None:
        super().__init__(
            f"non-finite {key} = {value} at gradient update {update}; the optimizer did not step, parameters are "
            "unchanged (lower the learning rate, check rewards/observations for NaN, or clip gradients)"
        )
        self.key, self.update, self.value = key, update, value


class TargetUpdate:
    """Target-network update counted in gradient updates: every ``interval`` calls, polyak with ``tau``.

    Args:
        loss_module: a TorchRL loss with target parameters (``DQNLoss(delay_value=True)``, ``SACLoss``, ...).
        interval: gradient updates between target updates (rlpyt ``target_update_interval``).
        tau: polyak factor; 1.0 copies the online parameters (rlpyt ``target_update_tau``).
    """

    def __init__(self, loss_module: Any, *, interval: int = 1, tau: float = 1.0) -> None:
        if interval < 1:
            raise ValueError(f"target update interval must be >= 1 gradient update, got {interval}")
        if not 0.0 < tau <= 1.0:
            raise ValueError(f"target update tau must be in (0, 1], got {tau}")
        self.interval, self.tau = int(interval), float(tau)
        # TorchRL's convention: a child target_X (target_X_params in TorchRL's losses) is the target of the child X
        children = dict(loss_module.named_children())
        self.sources: list[torch.Tensor] = []
        self.targets: list[torch.Tensor] = []
        for name, target in children.items():
            if name.startswith("target_") and name[len("target_"):] in children:
                sources = children[name[len("target_"):]].state_dict(keep_vars=True)
                for key, tensor in target.state_dict(keep_vars=True).items():
                    self.sources.append(sources[key])
                    self.targets.append(tensor)
        if not self.targets:
            raise ValueError(f"{type(loss_module).__name__} has no target networks (children named target_*)")
        with torch.no_grad():  # targets start as copies of their sources, as TorchRL's updaters make them
            for target, source in zip(self.targets, self.sources, strict=True):
                target.copy_(source)
        self.calls = 0
        self.target_updates = 0

    def step(self) -> bool:
        """Count one gradient update; update the targets when the interval is reached. Returns whether it did."""
        self.calls += 1
        if self.calls % self.interval:
            return False
        with torch.no_grad():
            for target, source in zip(self.targets, self.sources, strict=True):
                if self.tau < 1.0 and target.is_floating_point():
                    target.lerp_(source, self.tau)
                else:
                    target.copy_(source)
        self.target_updates += 1
        return True

    def state_dict(self) -> dict[str, int]:
        return {"calls": self.calls, "target_updates": self.target_updates}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.calls, self.target_updates = int(state["calls"]), int(state["target_updates"])


class Updater:
    """Apply one optimisation step from a loss TensorDict and return detached metrics.

    Args:
        optimizer: the optimizer over the parameters these losses train.
        max_grad_norm: clip the global gradient norm to this (rlpyt ``clip_grad_norm``); ``None`` does not clip
            (the norm is still computed, checked and reported as ``grad_norm``).
        target_update: advanced once per step (see :class:`TargetUpdate`).
        loss_keys: the loss terms summed into the objective; default every key starting with ``loss_``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, max_grad_norm: float | None = None,
            target_update: TargetUpdate | None = None, loss_keys: Sequence[str] | None = None) -> None:
        self.optimizer = optimizer
        self.max_grad_norm = max_grad_norm
        self.target_update = target_update
        self.loss_keys = tuple(loss_keys) if loss_keys is not None else None
        self.updates = 0

    @property
    def params(self) -> Iterable[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    @property
    def lr(self) -> float:
        """Learning rate of the first parameter group; setting it sets every group (for linear LR decay)."""
        return float(self.optimizer.param_groups[0]["lr"])

    @lr.setter
    def lr(self, value: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = value

    def step(self, losses: TensorDictBase | Mapping[str, torch.Tensor]) -> TensorDictBase:
        """One update: sum the loss terms, backward, check the loss and the gradient norm, clip, step, target update.

        Raises:
            NonFiniteLossError: a loss term or the gradient norm is NaN/inf (nothing was stepped).
        """
        keys = self.loss_keys or tuple(k for k in losses.keys() if isinstance(k, str) and k.startswith("loss_"))
        if not keys:
            raise KeyError(f"no loss terms to optimise in {sorted(map(str, losses.keys()))}")
        terms = [losses[k] for k in keys]
        total = terms[0].sum() if terms[0].numel() > 1 else terms[0].reshape(())
        for term in terms[1:]:
            total = total + (term.sum() if term.numel() > 1 else term.reshape(()))
        params = self.params
        self._drop_grads()  # zero_grad(set_to_none=True), for exactly these parameters
        total.backward()
        # the norm is always computed: a finite loss can still give NaN/inf gradients, which must not be stepped
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        if not torch.isfinite(total + norm):  # one check (one sync) for both; the slow path tells them apart
            self._raise_if_non_finite(keys, terms, total, norm)
        out = losses.detach() if isinstance(losses, TensorDictBase) else TensorDict(
            {k: v.detach() for k, v in losses.items()}
        )
        if self.max_grad_norm is not None:  # clipping to inf would still rescale every gradient by 1.0
            torch.nn.utils.clip_grads_with_norm_(params, self.max_grad_norm, norm)
        out.set("grad_norm", norm.detach())
        self.optimizer.step()
        if self.target_update is not None:
            self.target_update.step()
        out.set("lr", torch.tensor(self.lr))
        self.updates += 1
        return out

    def _drop_grads(self) -> None:
        for p in self.params:
            p.grad = None

    def _raise_if_non_finite(
        self, keys: Sequence[str], terms: Sequence[torch.Tensor], total: torch.Tensor, norm: torch.Tensor
    ) -> None:
        """Raise for a non-finite loss term (named) or gradient norm, gradients dropped; return if ``total + norm``
        only overflowed."""
        bad = None if torch.isfinite(total) else next(k for k, t in zip(keys, terms, strict=True)
                                                      if not torch.isfinite(t).all())
        if bad is None and torch.isfinite(norm):
            return
        self._drop_grads()
        if bad is not None:
            raise NonFiniteLossError(bad, self.updates, float(terms[keys.index(bad)].detach().sum()))
        raise NonFiniteLossError("grad_norm", self.updates, float(norm))

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"optimizer": self.optimizer.state_dict(), "updates": self.updates}
        if self.target_update is not None:
            state["target_update"] = self.target_update.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
        if self.target_update is not None and "target_update" in state:
            self.target_update.load_state_dict(state["target_update"])
