"""One gradient update as a small object: loss -> backward -> clip -> step (skipped if not finite) -> target update.

:class:`Updater` sums the ``loss_*`` terms it owns, clips the gradient norm, steps the optimizer, advances the target
networks and returns the detached metrics (with ``grad_norm`` and ``lr``). Several optimizers with their own cadence
(TD3's delayed actor) are several updaters, each owning its ``loss_keys``.

No value is read back to the host during an update, so a GPU runs updates back to back (and a CUDA graph can replay
one): a NaN/inf loss term or gradient norm is found on the device and that update is skipped there (parameters and
optimizer state unchanged); :meth:`Updater.check_finite`, called by the trainers before every log row and checkpoint,
then raises :class:`NonFiniteLossError` naming the first such term and update. The skip is the ``found_inf`` input
that ``torch.amp.GradScaler`` hands fused optimizers (every recipe's Adam is fused); other optimizers read the flag on
the host (one sync per update).

:class:`TargetUpdate` follows rlpyt: ``interval`` counts gradient updates and ``tau`` is the polyak factor (1.0 =
hard copy). It pairs each ``target_X`` child of the loss with ``X`` and updates them tensor by tensor (TorchRL's
TensorDict-level ``SoftUpdate`` costs several times more on CPU).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

__all__ = ["NonFiniteLossError", "TargetUpdate", "Updater", "a2c_optimizer"]

# optimizers whose fused step takes found_inf (torch.amp.GradScaler's channel) and then leaves all state as it was
# (fused SGD with momentum does not: a skipped first step leaves its new momentum buffer uninitialised)
FOUND_INF_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad)


class NonFiniteLossError(FloatingPointError):
    """A loss term or gradient norm was NaN/inf; that update (and any later non-finite one) was skipped, so
    parameters and optimizer state stay finite.

    Attributes:
        key: the loss key (``"loss_objective"``) or ``"grad_norm"``.
        update: the 0-based gradient update at which it first happened.
        skipped: updates skipped since the previous check.
    """

    def __init__(self, key: str, update: int, value: float, skipped: int = 1) -> None:
        super().__init__(
            f"non-finite {key} = {value} at gradient update {update}; {skipped} update(s) skipped, parameters and "
            "optimizer state unchanged by them (lower the learning rate, check rewards/observations for NaN, or clip "
            "gradients)"
        )
        self.key, self.update, self.value, self.skipped = key, update, value, skipped
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


class _Guard:
    """Device-side record of the first non-finite update since the last check, for one set of loss keys: in-place
    tensor ops only, so it runs inside a captured CUDA graph too. ``count`` (updates since the check) is shared by
    the guards of one updater."""

    def __init__(self, keys: Sequence[str], count: torch.Tensor, values: torch.Tensor) -> None:
        self.keys = (*keys, "grad_norm")
        self.count = count
        self.clean = torch.ones((), dtype=torch.bool, device=count.device)  # no update skipped since the check
        self.at = torch.zeros_like(count)  # count at the first skipped update
        self.values = torch.zeros_like(values)  # its loss terms and gradient norm
        self.skipped = torch.zeros((), device=count.device)

    def record(self, values: torch.Tensor, finite: torch.Tensor, found_inf: torch.Tensor) -> None:
        # while clean, the record follows every update; the first skipped one is the last it follows
        torch.where(self.clean, values, self.values, out=self.values)
        torch.where(self.clean, self.count, self.at, out=self.at)
        self.clean.logical_and_(finite)
        self.skipped.add_(found_inf)

    def read_and_reset(self) -> tuple[bool, int, list[float], int]:
        """``(clean, at, values, skipped)`` in one device-to-host copy; the record starts over."""
        flags = [t.reshape(1).double() for t in (self.clean, self.at, self.skipped)]
        packed = torch.cat([*flags, self.values.double()]).tolist()
        self.clean.fill_(True)
        self.skipped.zero_()
        return bool(packed[0]), int(packed[1]), packed[3:], int(packed[2])


class Updater:
    """Apply one optimisation step from a loss TensorDict and return detached metrics.

    Args:
        optimizer: the optimizer over the parameters these losses train. A fused ``Adam``/``AdamW``/``Adagrad``
            skips a non-finite update on the device; any other reads the skip flag on the host.
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
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.skips_on_device = isinstance(optimizer, FOUND_INF_OPTIMIZERS) and all(
            group.get("fused") for group in optimizer.param_groups)
        self._lr = float(optimizer.param_groups[0]["lr"])  # a tensor lr (CUDA graphs) is read once, here
        self._lr_metric = (self._lr, torch.tensor(self._lr))  # shared by the updates' metrics until the lr changes
        self._guards: dict[tuple[str, ...], _Guard] = {}  # per set of loss keys
        self._count: torch.Tensor | None = None  # updates since the last check, on the device
        self._checked_at = 0  # self.updates at the last check_finite()
        self.updates = 0

    @property
    def lr(self) -> float:
        """Learning rate of the first parameter group; setting it sets every group (for linear LR decay). A tensor
        learning rate (as CUDA graphs need) is filled in place, and read back as the value last set here."""
        lr = self.optimizer.param_groups[0]["lr"]
        return self._lr if isinstance(lr, torch.Tensor) else float(lr)

    @lr.setter
    def lr(self, value: float) -> None:
        self._lr = float(value)
        for group in self.optimizer.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(value)
            else:
                group["lr"] = value

    def step(self, losses: TensorDictBase | Mapping[str, torch.Tensor]) -> TensorDictBase:
        """One update: :meth:`apply`, then :meth:`advance`."""
        out = self.apply(losses)
        self.advance()
        return out

    def apply(self, losses: TensorDictBase | Mapping[str, torch.Tensor]) -> TensorDictBase:
        """The device half of an update: sum the loss terms, backward, clip, step unless a term or the gradient norm
        is NaN/inf (recorded for :meth:`check_finite`). Reads nothing back to the host with a fused optimizer, so
        a CUDA graph may capture it (with the loss); :meth:`advance` must follow each call."""
        keys = self.loss_keys or tuple(k for k in losses.keys() if isinstance(k, str) and k.startswith("loss_"))
        if not keys:
            raise KeyError(f"no loss terms to optimise in {sorted(map(str, losses.keys()))}")
        sums = [term.sum() if term.numel() > 1 else term.reshape(()) for term in (losses[k] for k in keys)]
        total = sums[0]
        for term in sums[1:]:
            total = total + term
        params = self.params
        for p in params:  # zero_grad(set_to_none=True), for exactly these parameters
            p.grad = None
        total.backward()
        # the norm is always computed: a finite loss can still give NaN/inf gradients, which must not be stepped
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        with torch.no_grad():
            values = torch.stack([*sums, norm])
            finite = values.isfinite().all()
            found_inf = torch.where(finite, 0.0, 1.0)  # the skip flag, as fused optimizers take it
        if self.max_grad_norm is not None:  # clipping to inf would still rescale every gradient by 1.0
            torch.nn.utils.clip_grads_with_norm_(params, self.max_grad_norm, norm)
        self._step(finite, found_inf)
        self._record(keys, values, finite, found_inf)
        out = {key: value.detach() for key, value in losses.items()}
        out.update(grad_norm=norm, lr=self._lr_tensor())  # one TensorDict construction: cheaper than detach()+set()
        return TensorDict(out, batch_size=losses.batch_size if isinstance(losses, TensorDictBase) else [])

    def _lr_tensor(self) -> torch.Tensor:
        """The ``lr`` metric: a copy of a tensor learning rate, else one tensor per float value."""
        lr = self.optimizer.param_groups[0]["lr"]
        if isinstance(lr, torch.Tensor):
            return lr.detach().clone()
        if lr != self._lr_metric[0]:
            self._lr_metric = (lr, torch.tensor(float(lr)))
        return self._lr_metric[1]

    def _step(self, finite: torch.Tensor, found_inf: torch.Tensor) -> None:
        if not self.skips_on_device:
            if finite:  # the one host read of an optimizer without a fused step
                self.optimizer.step()
            return
        # as torch.amp.GradScaler.step hands it to a fused optimizer; torch's Optimizer stubs do not declare the
        # found_inf attribute its fused steps read (GradScaler sets and deletes it with the same ignore)
        self.optimizer.found_inf = found_inf  # type: ignore[attr-defined]
        try:
            self.optimizer.step()
        finally:
            del self.optimizer.found_inf  # type: ignore[attr-defined]

    def _record(self, keys: tuple[str, ...], values: torch.Tensor, finite: torch.Tensor,
                found_inf: torch.Tensor) -> None:
        if self._count is None:
            self._count = torch.zeros((), dtype=torch.int64, device=values.device)
        guard = self._guards.get(keys)
        if guard is None:
            guard = self._guards[keys] = _Guard(keys, self._count, values)
        guard.record(values, finite, found_inf)
        self._count.add_(1)

    def advance(self) -> None:
        """The host half of an update: count it and advance the target networks (a skipped update counts too;
        its targets move towards the unchanged parameters)."""
        if self.target_update is not None:
            self.target_update.step()
        self.updates += 1

    def check_finite(self) -> None:
        """Raise :class:`NonFiniteLossError` if an update since the last call had a NaN/inf loss term or gradient
        norm (it was skipped). One device-to-host read: the trainers call it at log rows and checkpoints."""
        reports = [(guard, *guard.read_and_reset()) for guard in self._guards.values()]
        if self._count is not None:
            self._count.zero_()
        base, self._checked_at = self._checked_at, self.updates
        bad = [(at, guard, values, skipped) for guard, clean, at, values, skipped in reports if not clean]
        if not bad:
            return
        at, guard, values, _ = min(bad, key=lambda report: report[0])
        index = next(i for i, v in enumerate(values) if not math.isfinite(v))
        raise NonFiniteLossError(guard.keys[index], base + at, values[index], sum(report[3] for report in bad))

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"optimizer": self.optimizer.state_dict(), "updates": self.updates}
        if self.target_update is not None:
            state["target_update"] = self.target_update.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`, taken on any device: the optimizer moves its state to the parameters'
        device, and a tensor learning rate stays the tensor (and device) it is here."""
        lrs = [group["lr"] for group in self.optimizer.param_groups]
        self.optimizer.load_state_dict(state["optimizer"])
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            if isinstance(lr, torch.Tensor):
                lr.copy_(torch.as_tensor(group["lr"]))
                group["lr"] = lr
        self._lr = float(self.optimizer.param_groups[0]["lr"])
        self.updates = self._checked_at = int(state["updates"])
        if self.target_update is not None and "target_update" in state:
            self.target_update.load_state_dict(state["target_update"])


def a2c_optimizer(parameters: Any, optim: Any) -> torch.optim.Optimizer:
    """The optimizer an :class:`tdrl.config.A2COptimConfig` section names (A2C, IMPALA): RMSprop with A3C's and SB3's
    smoothing alpha 0.99, or fused Adam; ``optim.lr`` and ``optim.eps`` either way."""
    if optim.name == "rmsprop":
        return torch.optim.RMSprop(parameters, lr=optim.lr, alpha=0.99, eps=optim.eps, foreach=True)
    return torch.optim.Adam(parameters, lr=optim.lr, eps=optim.eps, fused=True)
