"""Q-networks and the actors/critics of the Q-learning families (DQN, C51, DDPG, TD3, SAC).

Plain ``nn.Module`` networks plus ``make_*`` factories wrapping them in the TorchRL modules TorchRL's losses expect
(keys in each factory's docstring). Image observations (uint8 ``[C, H, W]``) get the
:func:`~tdrl.models.conv.image_torso`, vector observations an MLP torso.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torchrl.data import Bounded, Categorical, OneHot, TensorSpec
from torchrl.modules import MLP as TorchRLMLP
from torchrl.modules import DistributionalQValueActor, QValueActor, TanhNormal, ValueOperator

from tdrl.models.acting import Inputs, ObservationModule, Outputs, ProbabilisticPolicy
from tdrl.models.conv import image_torso, is_image_spec
from tdrl.models.nets import flat_obs_size

__all__ = [
    "DuelingHead", "LogStdGaussianParams", "QActor", "QNetwork", "TwinQ",
    "is_image_spec", "make_deterministic_actor", "make_q_actor", "make_q_critic", "make_tanh_gaussian_actor",
    "make_twin_q", "relu_mlp", "stacked_mlp", "vector_torso",
]


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; scales the gradient on the way back (Wang et al. 2016, dueling nets)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


def relu_mlp(in_features: int, out_features: int, hidden_sizes: Sequence[int],
        activate_last: bool = False) -> nn.Module:
    """TorchRL's ReLU ``MLP``: the layers of tdrl's Q networks, heads and torsos."""
    return TorchRLMLP(
        in_features=in_features,
        out_features=out_features,
        num_cells=list(hidden_sizes),
        activation_class=nn.ReLU,
        activate_last_layer=activate_last,
    )


class DuelingHead(nn.Module):
    """Dueling head ``Q = V + (A - mean_a A)``, optionally over atoms, as rlpyt's ``DuelingHeadModel``: one advantage
    bias shared by all actions, the torso's gradient scaled by ``grad_scale`` (two streams backpropagate into it).
    Output ``[*batch, n_actions]``, or ``[*batch, n_atoms, n_actions]`` logits for ``n_atoms > 1``.
    """

    def __init__(self, in_features: int, n_actions: int, hidden_sizes: Sequence[int] = (), n_atoms: int = 1,
            grad_scale: float = 2**-0.5) -> None:
        super().__init__()
        self.n_actions, self.n_atoms, self.grad_scale = n_actions, n_atoms, grad_scale
        hidden = list(hidden_sizes)
        self.advantage_body = relu_mlp(in_features, hidden[-1], hidden[:-1], activate_last=True) if hidden else None
        adv_in = hidden[-1] if hidden else in_features
        self.advantage_out = nn.Linear(adv_in, n_actions * n_atoms, bias=False)
        self.advantage_bias = nn.Parameter(torch.zeros(n_atoms, 1))
        self.value = relu_mlp(in_features, n_atoms, hidden)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if self.grad_scale != 1.0 and features.requires_grad:
            features = _ScaleGrad.apply(features, self.grad_scale)
        lead = features.shape[:-1]
        adv_features = self.advantage_body(features) if self.advantage_body is not None else features
        advantage = self.advantage_out(adv_features).view(*lead, self.n_atoms, self.n_actions)
        advantage = advantage + self.advantage_bias
        value = self.value(features).view(*lead, self.n_atoms, 1)
        q = value + advantage - advantage.mean(-1, keepdim=True)
        return q.squeeze(-2) if self.n_atoms == 1 else q


class QNetwork(nn.Module):
    """Torso + Q head (dueling or an MLP): ``[*batch, n_actions]``, or C51 logits ``[*batch, n_atoms, n_actions]``."""

    def __init__(self, torso: nn.Module, feature_size: int, n_actions: int, head_sizes: Sequence[int] = (),
            dueling: bool = False, n_atoms: int = 1) -> None:
        super().__init__()
        self.torso, self.n_actions, self.n_atoms = torso, n_actions, n_atoms
        if dueling:
            self.head: nn.Module = DuelingHead(feature_size, n_actions, head_sizes, n_atoms=n_atoms)
        else:
            self.head = relu_mlp(feature_size, n_actions * n_atoms, head_sizes)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        out = self.head(self.torso(observation))
        if self.n_atoms > 1 and out.shape[-2:] != (self.n_atoms, self.n_actions):
            out = out.view(*out.shape[:-1], self.n_atoms, self.n_actions)
        return out


def vector_torso(obs_spec: TensorSpec, hidden_sizes: Sequence[int]) -> tuple[nn.Module, int]:
    """The ReLU MLP torso of ``hidden_sizes`` for vector observations and its output width (no layers: identity)."""
    hidden, size = list(hidden_sizes), flat_obs_size(obs_spec)
    if not hidden:
        return nn.Identity(), size
    return relu_mlp(size, hidden[-1], hidden[:-1], activate_last=True), hidden[-1]


class QActor(QValueActor):
    """TorchRL's greedy ``QValueActor`` (categorical actions), acting on tensors too (:mod:`tdrl.models.acting`)."""

    def act(self, observation: torch.Tensor, inputs: Inputs, *, deterministic: bool) -> Outputs:
        values = self.module[0].module(observation)
        action = torch.argmax(values, dim=-1)  # QValueModule's categorical action and chosen value
        return {"action": action, "action_value": values, "chosen_action_value": values.gather(-1, action[..., None])}


def make_q_actor(specs, *, hidden_sizes: Sequence[int] = (64, 64), dueling: bool = False, n_atoms: int = 1,
        v_min: float = -10.0, v_max: float = 10.0) -> QActor | DistributionalQValueActor:
    """Greedy Q-value actor for DQN (``n_atoms == 1``, a :class:`QActor` writing ``action``, ``action_value`` and
    ``chosen_action_value``) or C51 (TorchRL's ``DistributionalQValueActor``; ``action_value`` holds log-probabilities
    ``[*batch, n_atoms, n_actions]`` over atoms ``v_min..v_max``).

    ``hidden_sizes`` are the MLP torso of vector observations; images get :func:`~tdrl.models.conv.image_torso` (rlpyt's
    Atari model: :class:`AtariConv` and one 512-wide hidden layer; MinAtar's for small images). Raises
    ``ValueError`` for continuous actions or bad atom settings.
    """
    if not isinstance(specs.action_spec, (Categorical, OneHot)) or len(specs.action_spec.shape) > 0:
        raise ValueError(
            f"DQN needs a single discrete action, but this env's action space is {type(specs.action_spec).__name__}"
            f"{tuple(specs.action_spec.shape)}; use SAC, TD3 or DDPG for continuous actions"
        )
    if n_atoms < 1 or (n_atoms > 1 and not v_max > v_min):
        raise ValueError(f"need n_atoms >= 1 and v_max > v_min, got n_atoms={n_atoms}, [{v_min}, {v_max}]")
    n_actions = int(specs.action_spec.space.n)
    obs_spec = specs.observation_spec
    torso: nn.Module
    if is_image_spec(obs_spec):
        conv, hidden_size = image_torso(obs_spec.shape)
        torso, feature_size = conv, conv.output_size
        head_sizes: Sequence[int] = (hidden_size,)
    else:
        torso, feature_size = vector_torso(obs_spec, hidden_sizes)
        head_sizes = ()
    net = QNetwork(torso, feature_size, n_actions, head_sizes, dueling=dueling, n_atoms=n_atoms)
    action_spec = Categorical(n_actions, shape=(), dtype=torch.int64)
    if n_atoms == 1:
        return QActor(net, in_keys=["observation"], spec=action_spec)
    support = torch.linspace(v_min, v_max, n_atoms)
    return DistributionalQValueActor(net, in_keys=["observation"], spec=action_spec, support=support)


# --- Continuous actions -----------------------------------------------------------------------------------


def _bounds(specs) -> tuple[torch.Tensor, torch.Tensor]:
    spec = specs.action_spec
    if not isinstance(spec, Bounded) or not spec.dtype.is_floating_point:
        raise ValueError(
            f"this algorithm needs a bounded continuous (Box) action space, but the env's is "
            f"{type(spec).__name__}{tuple(spec.shape)}; use DQN for discrete actions"
        )
    return spec.space.low.float(), spec.space.high.float()


class _ScaledTanh(nn.Module):
    """``low + (tanh(x) + 1) / 2 * (high - low)``: squashes an unbounded output into the action box."""

    loc: torch.Tensor  # buffers (register_buffer)
    half_range: torch.Tensor

    def __init__(self, low: torch.Tensor, high: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("loc", (high + low) / 2)
        self.register_buffer("half_range", (high - low) / 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.loc + self.half_range * torch.tanh(x)


class _StateActionValue(nn.Module):
    """``Q(s, a)`` as an MLP on the concatenation ``[s, a]`` (rlpyt's ``QofMuMlpModel``)."""

    def __init__(self, obs_dim: int, action_dim: int, hidden_sizes: Sequence[int] = (256, 256)) -> None:
        super().__init__()
        self.net = relu_mlp(obs_dim + action_dim, 1, hidden_sizes)

    def forward(self, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([observation, action], -1))


def stacked_mlp(params: Sequence[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Evaluate ``n`` ReLU MLPs with stacked parameters on one input: ``[*, in]`` -> ``[n, *, out]``.

    ``params`` alternates weights ``[n, in, out]`` and biases ``[n, 1, out]``; each layer is one ``baddbmm`` for all
    ``n`` networks (bias fused into the matmul, unlike a vmapped ``nn.Linear`` on CPU).
    """
    n = params[0].shape[0]
    lead = x.shape[:-1]
    h = x.reshape(1, -1, x.shape[-1]).expand(n, -1, -1)
    last = len(params) // 2 - 1
    for i in range(0, len(params), 2):
        h = torch.baddbmm(params[i + 1], h, params[i])
        if i // 2 < last:
            h = torch.relu(h)
    return h.reshape(n, *lead, h.shape[-1])


class TwinQ(nn.Module):
    """``n_critics`` critics ``Q_i(s, a)`` (ReLU MLPs on ``[s, a]``) as one module with stacked parameters:
    ``forward(observation, action)`` is ``[n_critics, *batch, 1]``.

    tdrl's TD3, DDPG and SAC losses run all critics as one batched matmul per layer, with online, target or
    detached parameters, without swapping module state. Each member is initialised like an independent
    ``nn.Linear`` stack. With ``action_low``/``action_high`` the critics read actions rescaled to [-1, 1].
    """

    action_loc: torch.Tensor  # buffers (register_buffer)
    action_scale: torch.Tensor

    def __init__(self, obs_dim: int, action_dim: int, hidden_sizes: Sequence[int] = (256, 256), n_critics: int = 2,
            action_low: torch.Tensor | None = None, action_high: torch.Tensor | None = None) -> None:
        super().__init__()
        low = torch.full((action_dim,), -1.0) if action_low is None else torch.as_tensor(action_low).float()
        high = torch.full((action_dim,), 1.0) if action_high is None else torch.as_tensor(action_high).float()
        self.register_buffer("action_loc", (high + low) / 2)
        self.register_buffer("action_scale", (high - low) / 2)
        sizes = [obs_dim + action_dim, *hidden_sizes, 1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
            layers = [nn.Linear(fan_in, fan_out) for _ in range(n_critics)]  # nn.Linear's own initialisation
            self.weights.append(nn.Parameter(torch.stack([layer.weight.detach().T for layer in layers]).contiguous()))
            self.biases.append(nn.Parameter(torch.stack([layer.bias.detach()[None] for layer in layers])))
        self.n_critics = n_critics

    def flat_params(self) -> list[torch.Tensor]:
        """``[w0, b0, w1, b1, ...]``: the layout :func:`stacked_mlp` takes."""
        return [t for pair in zip(self.weights, self.biases, strict=True) for t in pair]

    def inputs(self, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """``[observation, action rescaled from [low, high] to [-1, 1]]``: what the MLPs read."""
        return torch.cat([observation, (action - self.action_loc) / self.action_scale], -1)

    def forward(self, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return stacked_mlp(self.flat_params(), self.inputs(observation, action))


def make_twin_q(
    specs, *, hidden_sizes: Sequence[int] = (256, 256), n_critics: int = 2, normalize_action: bool = True
) -> TwinQ:
    """Stacked critics for tdrl's SAC/TD3/DDPG losses (a plain module: no keys), ``hidden_sizes`` each;
    ``normalize_action`` feeds actions rescaled to [-1, 1] (as SB3's critics see them) rather than in env units.
    Discrete actions raise ``ValueError``."""
    low, high = _bounds(specs)
    bounds = (low, high) if normalize_action else (None, None)
    return TwinQ(flat_obs_size(specs.observation_spec), low.numel(), hidden_sizes, n_critics, *bounds)


def make_q_critic(specs, *, hidden_sizes: Sequence[int] = (256, 256)) -> ValueOperator:
    """``Q(s, a)`` critic for TorchRL's losses: ``observation``, ``action`` -> ``state_action_value``."""
    low, _ = _bounds(specs)
    net = _StateActionValue(flat_obs_size(specs.observation_spec), low.numel(), hidden_sizes)
    return ValueOperator(net, in_keys=["observation", "action"], out_keys=["state_action_value"])


def make_deterministic_actor(specs, *, hidden_sizes: Sequence[int] = (256, 256)) -> ObservationModule:
    """Deterministic policy ``mu(s)`` squashed into the action box (rlpyt's ``MuMlpModel``): ``observation`` ->
    ``action``; exploration noise is a separate module (:func:`tdrl.models.exploration.make_gaussian_noise`).
    """
    low, high = _bounds(specs)
    mlp = relu_mlp(flat_obs_size(specs.observation_spec), low.numel(), hidden_sizes)
    net = nn.Sequential(mlp, _ScaledTanh(low, high))
    return ObservationModule(net)


class LogStdGaussianParams(nn.Module):
    """Split ``[*, 2 * d]`` into ``loc`` and ``scale = exp(clamp(log_std, min, max))``: SAC's usual parametrisation
    (Haarnoja et al.'s code, SB3), which TorchRL's ``NormalParamExtractor`` lacks."""

    def __init__(self, log_std_min: float = -20.0, log_std_max: float = 2.0) -> None:
        super().__init__()
        self.log_std_min, self.log_std_max = log_std_min, log_std_max

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc, log_std = self.loc_log_std(x)
        return loc, log_std.exp()

    def loc_log_std(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``loc`` and the clamped log-std, before its ``exp`` (SAC's log-probability reads it directly)."""
        loc, log_std = x.chunk(2, -1)
        return loc, log_std.clamp(self.log_std_min, self.log_std_max)


def make_tanh_gaussian_actor(specs, *, hidden_sizes: Sequence[int] = (256, 256)) -> ProbabilisticPolicy:
    """Tanh-squashed Gaussian policy for SAC: ``observation`` -> ``loc``, ``scale``, ``action`` (a ``TanhNormal``
    sample in the action box; its deterministic sample under DETERMINISTIC exploration), the scale from a clamped
    log-std (:class:`LogStdGaussianParams`). Discrete actions raise ``ValueError``.
    """
    low, high = _bounds(specs)
    mlp = relu_mlp(flat_obs_size(specs.observation_spec), 2 * low.numel(), hidden_sizes)
    net = nn.Sequential(mlp, LogStdGaussianParams())
    return ProbabilisticPolicy(net, ["loc", "scale"], specs.action_spec, TanhNormal, {"low": low, "high": high},
                               return_log_prob=False)
