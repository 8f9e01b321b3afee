"""Plain ``nn.Module`` torsos (no TensorDict keys, no specs): :class:`MLP` with orthogonal initialisation (hidden
gain √2, a small gain on a policy head so the initial policy is near uniform) and :class:`ObsNorm`, a running
observation normaliser kept inside the model (rlpyt's ``normalize_observation``) so its statistics travel with the
weights to collector workers and checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["MLP", "ObsNorm", "flat_obs_size"]

_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "silu": nn.SiLU}


def flat_obs_size(observation_spec) -> int:
    """The size of a flat float observation, what an MLP torso reads; images (uint8 ``[C, H, W]``) and other shapes
    raise ``ValueError``."""
    shape = tuple(observation_spec.shape)
    if len(shape) != 1 or observation_spec.dtype == torch.uint8:
        raise ValueError(f"MLPs take flat float observations; this env's are {observation_spec.dtype} {shape} "
                         "(uint8 [C, H, W] images need a convolutional torso, tdrl.models.conv)")
    return shape[0]


class MLP(nn.Sequential):
    """Linear layers with an activation (``tanh``, ``relu``, ``elu``, ``silu``) between them; orthogonally
    initialised, zero biases. ``out_features=None`` ends with the last hidden layer and its activation (a torso);
    ``output_gain`` is the output layer's gain (0.01 for a policy head, 1.0 for a value head). ``nn.Sequential``'s
    forward calls every layer as a module, so hooks (pruning, activation probes) fire.
    """

    def __init__(self, in_features: int, out_features: int | None, hidden_sizes: Sequence[int] = (64, 64),
            activation: str = "tanh", output_gain: float = 1.0) -> None:
        if activation not in _ACTIVATIONS:
            raise ValueError(f"unknown activation '{activation}'; choose one of {sorted(_ACTIVATIONS)}")
        act = _ACTIVATIONS[activation]
        layers: list[nn.Module] = []
        size = in_features
        for width in hidden_sizes:
            layers += [_init(nn.Linear(size, width), math.sqrt(2)), act()]
            size = width
        if out_features is not None:
            layers.append(_init(nn.Linear(size, out_features), output_gain))
        super().__init__(*layers)
        self.out_features = out_features if out_features is not None else size


def _init(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class ObsNorm(nn.Module):
    """Normalise by running mean and variance, then clip: ``clamp((x - mean) / sqrt(var + eps), ±clip)`` (rlpyt:
    ``clip=10``, ``eps=1e-6``). The statistics change only in :meth:`update` (the recipe calls it once per batch),
    never in ``forward``, so collection and training see identical inputs.
    """

    mean: torch.Tensor  # buffers (register_buffer): the running statistics
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, shape: Sequence[int] | int, clip: float = 10.0, eps: float = 1e-6) -> None:
        super().__init__()
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.clip, self.eps = float(clip), float(eps)
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) * torch.rsqrt(self.var + self.eps)).clamp(-self.clip, self.clip)

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Fold a batch ``[..., *shape]`` into the statistics (Chan et al.'s parallel mean/variance)."""
        x = x.reshape(-1, *self.mean.shape).to(torch.float64)
        n = x.shape[0]
        if n == 0:
            return
        batch_mean = x.mean(0)
        batch_var = x.var(0, unbiased=False)
        total = self.count + n
        delta = batch_mean - self.mean.double()
        mean = self.mean.double() + delta * (n / total)
        m2 = self.var.double() * self.count + batch_var * n + delta.pow(2) * self.count * n / total
        self.mean.copy_(mean)
        self.var.copy_(m2 / total)
        self.count.fill_(total)
