"""Value decomposition for a cooperative group: IQL, VDN and QMIX built from TorchRL's parts.

One Q-network per group (:func:`make_group_q`: TorchRL's ``MultiAgentMLP`` and ``QValueModule``) and one loss per
method (:func:`make_value_decomposition_loss`), on the grouped keys of docs/design.md §1: ``(group, "observation")``,
``(group, "action")`` (categorical), ``(group, "mask")``, the episode's done flags and the team reward at the root
(``("next", "reward")``; from tdrl's ``GroupedEnv`` the sum over agents), ``"state"`` for QMIX. Nothing here
re-derives TorchRL's maths; tdrl adds the agent mask, which TorchRL's losses do not read:

- IQL (each agent's own DQN target, Tan 1993) is ``DQNLoss`` on the group's keys (its per-agent rewards and done
  flags, else the root's) with its ``loss_mask_key`` on the agent mask: an absent agent's TD error is left out of
  the mean.
- VDN (Sunehag et al. 2018: ``Q_tot = sum_i Q_i``) and QMIX (Rashid et al. 2018: a monotonic mix conditioned on the
  state) are ``QMixerLoss`` with ``VDNMixer`` / ``QMixer``. ``QMixerLoss`` has no mask, so the mixer is wrapped in
  :class:`MaskedMixer`, which gives an absent agent the utility 0, at t and in the target at t+1: it neither
  receives gradient nor lends its max to the bootstrap.
- ``double_q`` (PyMARL's default for all three, van Hasselt et al. 2016): the next action of each agent is the
  online network's greedy one, valued by the target network. ``DQNLoss`` has it (``double_dqn``); ``QMixerLoss``
  has not, so :class:`DoubleQMixerLoss` gives it its target.

Both factorizations pick the greedy joint action agent by agent, so they can only represent what an additive (VDN)
or monotonic (QMIX) function of per-agent utilities can; ``tests/objectives/test_matrix_games.py`` checks what this
costs on Claus & Boutilier's climbing and penalty games.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.modules import MultiAgentMLP, QValueModule
from torchrl.modules.models.multiagent import Mixer, QMixer, VDNMixer
from torchrl.objectives import DQNLoss, LossModule
from torchrl.objectives.multiagent import QMixerLoss
from torchrl.objectives.utils import distance_loss

__all__ = [
    "METHODS", "DoubleQMixerLoss", "IndependentQLoss", "MaskedMixer", "make_group_q", "make_value_decomposition_loss",
]

METHODS = ("iql", "vdn", "qmix")
Method = Literal["iql", "vdn", "qmix"]


def make_group_q(n_agents: int, obs_dim: int, n_actions: int, *, group: str = "agents", share_params: bool = True,
                 num_cells: Sequence[int] = (64,), action_mask: bool = False) -> TensorDictSequential:
    """Per-agent Q-values for a group: ``(group, "observation")`` -> ``(group, "action_value")``, then the greedy
    ``(group, "action")`` and its ``(group, "chosen_action_value")``. ``share_params``: one network for all agents
    (give them an id in the observation); ``action_mask``: the greedy action respects ``(group, "action_mask")``."""
    net = MultiAgentMLP(obs_dim, n_actions, n_agents, centralized=False, share_params=share_params,
                        depth=len(num_cells), num_cells=list(num_cells), activation_class=nn.ReLU)
    values = TensorDictModule(net, in_keys=[(group, "observation")], out_keys=[(group, "action_value")])
    greedy = QValueModule(action_space="categorical", action_value_key=(group, "action_value"),
                          action_mask_key=(group, "action_mask") if action_mask else None,
                          out_keys=[(group, "action"), (group, "action_value"), (group, "chosen_action_value")])
    return TensorDictSequential(values, greedy)


class MaskedMixer(nn.Module):
    """A TorchRL ``Mixer`` that sees 0 as the utility of an absent agent (``mask`` False): no gradient reaches it and
    the target does not bootstrap from it. Called as ``(chosen_action_value, mask[, state])``."""

    def __init__(self, mixer: Mixer) -> None:
        super().__init__()
        self.mixer = mixer

    def forward(self, chosen_action_value: torch.Tensor, mask: torch.Tensor, *state: torch.Tensor) -> torch.Tensor:
        present = mask.unsqueeze(-1)  # [*B, n_agents, 1]
        return self.mixer(torch.where(present, chosen_action_value, torch.zeros_like(chosen_action_value)), *state)


class IndependentQLoss(DQNLoss):
    """IQL: TorchRL's ``DQNLoss`` per agent on the group's keys, the mean over present agents.

    The team reward and done flags come from the root where the group has none of its own (as BenchMARL does); an
    agent absent at t+1 (``("next", group, "mask")`` False) has left, so its target does not bootstrap. The input is
    not changed, except for the priority written to ``(group, "td_error")``.
    """

    def __init__(self, q_net: TensorDictSequential, *, group: str = "agents", loss_function: str = "l2",
                 delay_value: bool = True, double_dqn: bool = False) -> None:
        super().__init__(q_net, action_space="categorical", loss_function=loss_function, delay_value=delay_value,
                         double_dqn=double_dqn)
        self.group = group
        self.set_keys(action=(group, "action"), action_value=(group, "action_value"),
                      value=(group, "chosen_action_value"), reward=(group, "reward"), done=(group, "done"),
                      terminated=(group, "terminated"), priority=(group, "td_error"))
        self.loss_mask_key = (group, "mask")

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        td = tensordict.clone(False)  # a shallow copy: the keys set below stay out of the caller's batch
        agents = td.get(("next", self.group))
        for key in ("reward", "done", "terminated"):
            if key not in agents.keys():
                team = td.get(("next", key))  # [*B, 1]
                agents.set(key, team.unsqueeze(-2).expand(*agents.batch_size, team.shape[-1]))
        left = ~agents.get("mask", torch.ones(agents.batch_size, dtype=torch.bool, device=td.device)).unsqueeze(-1)
        for key in ("done", "terminated"):
            agents.set(key, agents.get(key) | left)
        out = super().forward(td)
        tensordict.set(self.tensor_keys.priority, td.get(self.tensor_keys.priority))
        return out


class DoubleQMixerLoss(QMixerLoss):
    """TorchRL's ``QMixerLoss`` with a double-Q target: ``r + gamma * mix_target(Q_target_i(a*_i); state')`` where
    ``a*_i`` is agent i's greedy action under the *online* network (its action mask respected), not the target
    network's own. ``QMixerLoss`` bootstraps from the target network's max, whose overestimation the mix adds up
    over the agents. Only categorical actions (what :func:`make_group_q` gives). The value estimator is the one
    ``make_value_estimator`` made (TD(0), n-step through ``steps_to_next_obs``), given the next value."""

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        keys = self.tensor_keys
        with torch.no_grad():
            after = tensordict.get("next").clone(False)
            with self.local_value_network_params.to_module(self.local_value_network):
                greedy = self.local_value_network(after).get(keys.action)  # the online network's choice
            with self.target_local_value_network_params.to_module(self.local_value_network):
                values = self.local_value_network(after).get(keys.action_value)
            after.set(keys.local_value, _value_of(values, greedy))
            with self.target_mixer_network_params.to_module(self.mixer_network):
                next_value = self.mixer_network(after).get(keys.global_value)

        td = tensordict.clone(False)
        with self.local_value_network_params.to_module(self.local_value_network):
            values = self.local_value_network(td).get(keys.action_value)  # [*B, n_agents, n_actions]
        td.set(keys.local_value, _value_of(values, tensordict.get(keys.action)))
        with self.mixer_network_params.to_module(self.mixer_network):
            predicted = self.mixer_network(td).get(keys.global_value).squeeze(-1)  # [*B]
        target = self.value_estimator.value_estimate(td, next_value=next_value).squeeze(-1)
        tensordict.set(keys.priority, (predicted - target).detach().pow(2).unsqueeze(-1), inplace=True)
        return TensorDict({"loss": distance_loss(predicted, target, self.loss_function).mean()}, [])


def _value_of(values: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """``[*B, n_agents, 1]``: each agent's value of its categorical action (``[*B, n_agents]`` or with a last 1)."""
    return values.gather(-1, action if action.dim() == values.dim() else action.unsqueeze(-1))


def make_value_decomposition_loss(method: Method, q_net: TensorDictSequential, *, n_agents: int,
                                  group: str = "agents", state_shape: Sequence[int] | None = None,
                                  mixing_embed_dim: int = 32, loss_function: str = "l2",
                                  delay_value: bool = True, double_q: bool = False) -> LossModule:
    """The ``method`` loss (one of :data:`METHODS`) on ``q_net`` (:func:`make_group_q`); QMIX needs the shape of the
    root ``"state"``; ``double_q``: the targets value the online network's greedy next actions. Call
    ``make_value_decomposition_loss(...).make_value_estimator(gamma=...)`` as for any TorchRL loss; the target
    networks (``delay_value``) are updated by the caller (``SoftUpdate``/``HardUpdate``)."""
    if method == "iql":
        return IndependentQLoss(q_net, group=group, loss_function=loss_function, delay_value=delay_value,
                                double_dqn=double_q)
    mixer: Mixer
    in_keys: list = [(group, "chosen_action_value"), (group, "mask")]
    if method == "vdn":
        mixer = VDNMixer(n_agents=n_agents, device="cpu")
    elif method == "qmix":
        if state_shape is None:
            raise ValueError("QMIX's mixer reads the global 'state': give its state_shape")
        mixer = QMixer(state_shape=tuple(state_shape), mixing_embed_dim=mixing_embed_dim, n_agents=n_agents,
                       device="cpu")
        in_keys.append("state")
    else:
        raise ValueError(f"unknown value-decomposition method {method!r}; one of {', '.join(METHODS)}")
    mixer_module = TensorDictModule(MaskedMixer(mixer), in_keys=in_keys, out_keys=["chosen_action_value"])
    loss = (DoubleQMixerLoss if double_q else QMixerLoss)(q_net, mixer_module, action_space="categorical",
                                                           loss_function=loss_function, delay_value=delay_value)
    loss.set_keys(action=(group, "action"), action_value=(group, "action_value"),
                  local_value=(group, "chosen_action_value"))
    return loss
