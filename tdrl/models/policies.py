"""Actor-critic factories for policy-gradient algorithms, built from env specs.

The actor writes ``action``, ``action_log_prob`` and its distribution parameters: a ``Categorical`` over logits for
discrete actions, for continuous ones a Gaussian with a state-independent learned log-std (rlpyt's
``MujocoFfModel``), ``"normal"`` or ``"tanh_normal"`` (squashed into the action bounds). The critic writes
``state_value``.

:func:`make_recurrent_actor_critic` puts TorchRL's ``LSTMModule`` between an MLP embedding and the heads (rlpyt's
``MujocoLstmModel``). It reads ``is_init`` and ``("recurrent_state", "h" | "c")`` and writes ``("next",
"recurrent_state", "h" | "c")``, the convention tdrl's collectors follow; under ``set_recurrent_mode(True)`` a
``[B, T]`` batch is replayed as B sequences from the state stored at t=0. Recurrent actors have no ``act``.

Image observations (uint8 ``[C, H, W]`` frames, e.g. Atari's 4 stacked 84x84 frames) get
:func:`make_conv_actor_critic`, which :func:`make_actor_critic` picks by itself: one convolutional torso shared by
the policy and value heads (CleanRL's and SB3's ``CnnPolicy`` for PPO on Atari).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch
from tensordict.nn import InteractionType, TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.modules import IndependentNormal, LSTMModule, ProbabilisticActor, TanhNormal

from tdrl.envs.make import EnvSpecs
from tdrl.models.acting import ObservationModule, ProbabilisticPolicy
from tdrl.models.conv import image_torso, is_image_spec
from tdrl.models.nets import MLP, ObsNorm, flat_obs_size
from tdrl.utils.errors import UserError
from tdrl.utils.keys import RECURRENT_KEYS

__all__ = ["ActorCritic", "actor_critic_from", "make_actor_critic", "make_conv_actor_critic",
           "make_recurrent_actor_critic"]

Distribution = Literal["auto", "categorical", "normal", "tanh_normal"]


class ActorCritic(nn.Module):
    """Container of a policy-gradient agent's modules (one ``state_dict`` for checkpoints): ``actor``, ``critic``,
    ``greedy`` (the deterministic actor, sharing its parameters), ``obs_norm`` and ``recurrent``. Feed-forward models
    also compute on plain tensors (:meth:`distribution`, :meth:`value`, both at once :meth:`distribution_and_value`)
    for the losses. ``shared``: ``(torso, policy_head, value_head)`` of a model whose actor is ``policy_head(torso(x))``
    and critic ``value_head(torso(x))`` (:func:`make_conv_actor_critic`), so a loss runs the torso once.
    """

    greedy: ProbabilisticActor
    shared: tuple[nn.Module, nn.Module, nn.Module] | None

    def __init__(self, actor: ProbabilisticActor, critic: TensorDictModule, greedy: ProbabilisticActor,
                 obs_norm: ObsNorm | None, recurrent: bool,
                 shared: tuple[nn.Module, nn.Module, nn.Module] | None = None) -> None:
        super().__init__()
        self.actor, self.critic, self.obs_norm = actor, critic, obs_norm
        self.recurrent = recurrent
        self.__dict__["greedy"] = greedy  # not a submodule: its parameters are the actor's
        self.__dict__["shared"] = shared  # plain references: the actor and critic register these parameters

    def distribution(self, observation: torch.Tensor) -> torch.distributions.Distribution:
        """The actor's action distribution at ``observation`` (feed-forward models)."""
        if self.recurrent:
            raise NotImplementedError("recurrent models need their state: call .actor on a TensorDict")
        return self.actor.distribution(self.actor.params(observation))

    def value(self, observation: torch.Tensor) -> torch.Tensor:
        """``V(observation)`` of shape ``[..., 1]`` (feed-forward models)."""
        if self.recurrent:
            raise NotImplementedError("recurrent models need their state: call .critic on a TensorDict")
        return self.critic.module(observation)

    def distribution_and_value(self, observation: torch.Tensor) -> tuple[torch.distributions.Distribution,
                                                                           torch.Tensor]:
        """:meth:`distribution` and :meth:`value` at ``observation``; a shared torso runs once."""
        if self.shared is None:
            return self.distribution(observation), self.value(observation)
        torso, policy_head, value_head = self.shared
        features = torso(observation)
        actor: Any = self.actor  # a ProbabilisticPolicy (feed-forward)
        return actor.distribution(actor.named_params(policy_head(features))), value_head(features)


class _GaussianHead(nn.Module):
    """``x -> (loc, scale)`` with a state-independent learned log standard deviation."""

    def __init__(self, loc_net: nn.Module, action_dim: int, init_log_std: float = 0.0) -> None:
        super().__init__()
        self.loc_net = loc_net
        self.log_std = nn.Parameter(torch.full((action_dim,), float(init_log_std)))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc = self.loc_net(x)
        return loc, self.log_std.exp().expand_as(loc)


def _resolve_distribution(specs: EnvSpecs, distribution: Distribution) -> str:
    if distribution == "auto":
        return "categorical" if specs.discrete else "tanh_normal"
    if specs.discrete != (distribution == "categorical"):
        kind = "discrete" if specs.discrete else "continuous"
        raise UserError(f"distribution '{distribution}' does not fit this env's {kind} action space "
                        f"(shape {tuple(specs.action_spec.shape)}); use model.distribution=auto")
    return distribution


def _probabilistic_actor(net: nn.Module, specs: EnvSpecs, dist: str, interaction: InteractionType,
                        recurrent: bool = False) -> ProbabilisticActor:
    """A :class:`ProbabilisticPolicy` over ``net`` (it acts on tensors); over a recurrent TensorDict module, TorchRL's
    ``ProbabilisticActor`` (collectors run it on TensorDicts)."""
    kwargs: dict[str, torch.Tensor]  # the distribution's extra arguments
    if dist == "categorical":
        keys, cls, kwargs = ["logits"], torch.distributions.Categorical, {}
    elif dist == "normal":
        keys, cls, kwargs = ["loc", "scale"], IndependentNormal, {}
    else:
        keys, cls = ["loc", "scale"], TanhNormal
        kwargs = {"low": specs.action_spec.space.low, "high": specs.action_spec.space.high}
    if recurrent:
        return ProbabilisticActor(net, in_keys=keys, spec=specs.action_spec, distribution_class=cls,
                                  distribution_kwargs=kwargs, return_log_prob=True,
                                  default_interaction_type=interaction)
    return ProbabilisticPolicy(net, keys, specs.action_spec, cls, kwargs, default_interaction_type=interaction)


def _policy_head(in_features: int, specs: EnvSpecs, dist: str, hidden: Sequence[int], activation: str,
                 init_log_std: float) -> tuple[nn.Module, list[str]]:
    if dist == "categorical":
        return MLP(in_features, specs.n_actions, hidden, activation, output_gain=0.01), ["logits"]
    loc_net = MLP(in_features, specs.n_actions, hidden, activation, output_gain=0.01)
    return _GaussianHead(loc_net, specs.n_actions, init_log_std), ["loc", "scale"]


def make_actor_critic(specs: EnvSpecs, *, hidden_sizes: Sequence[int] = (64, 64), activation: str = "tanh",
        distribution: Distribution = "auto", init_log_std: float = 0.0,
        normalize_observation: bool = False) -> ActorCritic:
    """Feed-forward actor and critic MLPs (separate networks, ``hidden_sizes`` each) for flat observations; for
    image observations (uint8 ``[C, H, W]``), :func:`make_conv_actor_critic` (``hidden_sizes`` and ``activation``
    do not apply).

    ``distribution``: ``auto`` (categorical for discrete, tanh_normal for continuous actions) or an explicit one that
    fits the action space; ``init_log_std`` of Gaussian policies; ``normalize_observation`` reads observations through
    a shared running :class:`ObsNorm` (not images).

    Raises:
        ValueError: multi-dimensional non-image observations, a distribution that does not fit the actions, or
            ``normalize_observation`` with images.
    """
    if is_image_spec(specs.observation_spec):
        if normalize_observation:
            raise UserError("model.normalize_observation=true normalises vector observations; image observations "
                            "are scaled to [0, 1] inside the model")
        return make_conv_actor_critic(specs, distribution=distribution, init_log_std=init_log_std)
    obs_size = flat_obs_size(specs.observation_spec)
    dist = _resolve_distribution(specs, distribution)
    obs_norm = ObsNorm(obs_size) if normalize_observation else None
    pre = [obs_norm] if obs_norm is not None else []
    head, _ = _policy_head(obs_size, specs, dist, hidden_sizes, activation, init_log_std)
    policy_net = nn.Sequential(*pre, head) if pre else head
    value_net = MLP(obs_size, 1, hidden_sizes, activation, output_gain=1.0)
    critic = ObservationModule(nn.Sequential(*pre, value_net) if pre else value_net, "state_value")
    actor = _probabilistic_actor(policy_net, specs, dist, InteractionType.RANDOM)
    greedy = _probabilistic_actor(policy_net, specs, dist, InteractionType.DETERMINISTIC)
    return ActorCritic(actor, critic, greedy, obs_norm, recurrent=False)


def make_conv_actor_critic(specs: EnvSpecs, *, distribution: Distribution = "auto",
        init_log_std: float = 0.0) -> ActorCritic:
    """Image observations: one convolutional torso (:func:`~tdrl.models.conv.image_torso`: the Nature-DQN
    convolutions and a 512-wide ReLU layer for Atari frames, MinAtar's for small images), shared by a linear
    policy head and a linear value head. Initialised as CleanRL's and SB3's Atari actor-critic: orthogonal weights,
    gain √2 in the torso, 0.01 on the policy head, 1 on the value head, zero biases. Frames stay uint8 up to the
    model, which scales them to ``[0, 1]`` on its own device. Other arguments as :func:`make_actor_critic`.
    """
    dist = _resolve_distribution(specs, distribution)
    conv, hidden = image_torso(specs.observation_spec.shape)
    for layer in conv.modules():
        if isinstance(layer, nn.Conv2d) and layer.bias is not None:
            nn.init.orthogonal_(layer.weight, math.sqrt(2))
            nn.init.zeros_(layer.bias)
    torso = nn.Sequential(conv, MLP(conv.output_size, None, (hidden,), "relu"))
    policy_head, _ = _policy_head(hidden, specs, dist, (), "relu", init_log_std)
    value_head = MLP(hidden, 1, (), output_gain=1.0)
    critic = ObservationModule(nn.Sequential(torso, value_head), "state_value")
    policy_net = nn.Sequential(torso, policy_head)
    actor = _probabilistic_actor(policy_net, specs, dist, InteractionType.RANDOM)
    greedy = _probabilistic_actor(policy_net, specs, dist, InteractionType.DETERMINISTIC)
    return ActorCritic(actor, critic, greedy, None, recurrent=False, shared=(torso, policy_head, value_head))


def make_recurrent_actor_critic(specs: EnvSpecs, *, hidden_sizes: Sequence[int] = (64,), lstm_size: int = 64,
        activation: str = "tanh", distribution: Distribution = "auto", init_log_std: float = 0.0,
        normalize_observation: bool = False) -> ActorCritic:
    """MLP embedding (``hidden_sizes``) -> LSTM core (``lstm_size``, shared) -> policy and value heads, with stored
    recurrent state; other arguments as :func:`make_actor_critic`.
    """
    obs_size = flat_obs_size(specs.observation_spec)
    dist = _resolve_distribution(specs, distribution)
    obs_norm = ObsNorm(obs_size) if normalize_observation else None
    torso = MLP(obs_size, None, hidden_sizes, activation)
    embed = TensorDictModule(nn.Sequential(obs_norm, torso) if obs_norm is not None else torso,
                             ["observation"], ["embed"])
    core = LSTMModule(
        input_size=torso.out_features,
        hidden_size=lstm_size,
        in_keys=["embed", *RECURRENT_KEYS],
        out_keys=["features", *[("next", *k) for k in RECURRENT_KEYS]],
    )
    head, head_keys = _policy_head(lstm_size, specs, dist, (), activation, init_log_std)
    policy_module = TensorDictSequential(embed, core, TensorDictModule(head, ["features"], head_keys))
    value_head = TensorDictModule(MLP(lstm_size, 1, (), activation, output_gain=1.0), ["features"], ["state_value"])
    critic = TensorDictSequential(embed, core, value_head)
    actor = _probabilistic_actor(policy_module, specs, dist, InteractionType.RANDOM, recurrent=True)
    greedy = _probabilistic_actor(policy_module, specs, dist, InteractionType.DETERMINISTIC, recurrent=True)
    return ActorCritic(actor, critic, greedy, obs_norm, recurrent=True)


def actor_critic_from(specs: EnvSpecs, model: Any) -> ActorCritic:
    """The actor-critic a recipe's ``model`` section (:class:`tdrl.config.ActorCriticModelConfig`) describes:
    :func:`make_recurrent_actor_critic` with ``model.lstm`` (its embedding: the first hidden width), else
    :func:`make_actor_critic` (image observations: :func:`make_conv_actor_critic`)."""
    common = {"activation": model.activation, "distribution": model.distribution,
              "init_log_std": model.init_log_std, "normalize_observation": model.normalize_observation}
    if model.lstm and is_image_spec(specs.observation_spec):
        raise UserError("model.lstm=true takes vector observations; image observations get the feed-forward "
                        "convolutional actor-critic (model.lstm=false)")
    if model.lstm:
        return make_recurrent_actor_critic(specs, hidden_sizes=model.hidden_sizes[:1], lstm_size=model.lstm_size,
                                           **common)
    return make_actor_critic(specs, hidden_sizes=model.hidden_sizes, **common)
