"""The acting contract: how a collector asks a policy for actions on plain tensors.

A collector steps its policy once per time step over a few envs; a ``TensorDictModule`` call spends more time in
generic TensorDict bookkeeping than in a small MLP. So tdrl's own policies also implement :class:`Acting`: the same
computation as their TensorDict ``forward``, written in the model class itself, on tensors. The collectors call
``act`` when a policy has it, in a ``TensorDictSequential`` too (:mod:`tdrl.collect.module_act`).

Promise of an implementation: ``act`` returns exactly the entries its ``forward`` writes (same keys, same values
under the same RNG state), with ``deterministic=True`` standing for ``ExplorationType.DETERMINISTIC`` and
``False`` for ``RANDOM``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import torch
from tensordict.nn import InteractionType, TensorDictModule, TensorDictSequential
from tensordict.utils import NestedKey
from torchrl.modules import ProbabilisticActor

__all__ = [
    "Acting", "Inputs", "ObservationModule", "Outputs", "ProbabilisticPolicy", "chain_policy",
]

Inputs = Mapping[NestedKey, torch.Tensor]
Outputs = dict[NestedKey, torch.Tensor]


@runtime_checkable
class Acting(Protocol):
    """A policy that acts on tensors: ``observation`` ``[n, *obs]`` and the other keys it reads (``is_init``,
    recurrent state, ``("collector", "env_index")``, or what earlier modules of a sequence wrote) in ``inputs``."""

    def act(self, observation: torch.Tensor, inputs: Inputs, *, deterministic: bool) -> Outputs: ...


def chain_policy(*modules: TensorDictModule) -> TensorDictSequential:
    """``modules`` in sequence as one policy (e.g. a greedy actor, then its exploration); the collectors call each
    module's ``act`` in turn (:mod:`tdrl.collect.module_act`)."""
    return TensorDictSequential(*modules)


class ObservationModule(TensorDictModule):
    """``observation -> out_key`` through ``net``: DDPG/TD3's actor (``action``), a value head (``state_value``)."""

    def __init__(self, net: torch.nn.Module, out_key: str = "action") -> None:
        super().__init__(net, in_keys=["observation"], out_keys=[out_key])
        self.out_key = out_key

    def act(self, observation: torch.Tensor, inputs: Inputs, *, deterministic: bool) -> Outputs:
        return {self.out_key: self.module(observation)}


class ProbabilisticPolicy(ProbabilisticActor):
    """TorchRL's ``ProbabilisticActor`` over a plain network ``net: observation -> distribution parameters``, named
    ``param_keys`` (a tensor, or a tuple in that order; e.g. ``["logits"]`` or ``["loc", "scale"]``), which are also
    the ``distribution_class`` keyword arguments (with ``distribution_kwargs``: a ``TanhNormal``'s ``low``/``high``).
    """

    def __init__(self, net: torch.nn.Module, param_keys: list[str], spec, distribution_class: type,
            distribution_kwargs: dict | None = None, *, return_log_prob: bool = True,
            default_interaction_type: InteractionType = InteractionType.RANDOM) -> None:
        super().__init__(
            TensorDictModule(net, in_keys=["observation"], out_keys=param_keys),
            in_keys=param_keys,
            spec=spec,
            distribution_class=distribution_class,
            distribution_kwargs=distribution_kwargs or {},
            return_log_prob=return_log_prob,
            default_interaction_type=default_interaction_type,
        )
        self.__dict__["net"] = net  # a plain reference (its parameters are registered once, under ``module``)
        self.param_keys = list(param_keys)
        self.dist_class, self.dist_kwargs = distribution_class, dict(distribution_kwargs or {})
        if issubclass(distribution_class, torch.distributions.Categorical):
            self.dist_kwargs["validate_args"] = False  # checks only; the values are the same
        self.action_log_prob_key = self.module[-1].log_prob_key if return_log_prob else None

    def params(self, observation: torch.Tensor) -> dict[str, torch.Tensor]:
        """The distribution parameters at ``observation``."""
        return self.named_params(self.net(observation))

    def named_params(self, out: torch.Tensor | tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
        """The network's output (a tensor, or a tuple in ``param_keys``' order) named by ``param_keys``."""
        return dict(zip(self.param_keys, out if isinstance(out, tuple) else (out,), strict=True))

    def distribution(self, params: Mapping[str, torch.Tensor]) -> torch.distributions.Distribution:
        return self.dist_class(**params, **self.dist_kwargs)

    def act(self, observation: torch.Tensor, inputs: Inputs, *, deterministic: bool) -> Outputs:
        out: Outputs = self.params(observation)
        dist = self.distribution(out)
        log_prob = None
        if deterministic:  # tensordict's DETERMINISTIC: deterministic_sample, else the mode (Categorical)
            action = dist.deterministic_sample if hasattr(dist, "deterministic_sample") else dist.mode
        elif self.action_log_prob_key is not None and dist.has_rsample and hasattr(dist, "rsample_and_log_prob"):
            action, log_prob = dist.rsample_and_log_prob()  # TanhNormal: scored from the same latent draw, as TorchRL
        else:
            action = dist.rsample() if dist.has_rsample else dist.sample()
        out["action"] = action
        if self.action_log_prob_key is not None:
            out[self.action_log_prob_key] = dist.log_prob(action) if log_prob is None else log_prob
        return out
