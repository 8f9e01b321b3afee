"""R2D1's recurrent Q-network (rlpyt's ``AtariR2d1Model``): torso -> LSTM -> dueling head, reading the observation,
the previous action (one-hot) and the previous reward.

:class:`RecurrentQActor` is its greedy actor for the collectors (one step per call, state in TorchRL's
``("recurrent_state", "h" | "c")`` keys, ``[n, 1, lstm_size]``), and :class:`PreviousAction` closes the loop after
exploration: ``chain_policy(actor, EpsilonGreedy(...), PreviousAction(n_actions))`` writes the *executed* action as
``("next", "prev_action")``, which the collector feeds back as ``prev_action`` (zeros after a reset) and stores with
every step, as it stores the state read and ``prev_reward`` (see :mod:`tdrl.collect.policy`). The loss unrolls
:class:`RecurrentQNetwork` over replayed ``[B, T]`` sequences directly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn
from torch.nn import functional as F

from tdrl.models.acting import Inputs, Outputs
from tdrl.models.conv import image_torso
from tdrl.models.q import DuelingHead, is_image_spec, relu_mlp, vector_torso
from tdrl.utils.keys import NEXT_RECURRENT_KEYS, RECURRENT_KEYS

__all__ = ["PreviousAction", "RecurrentQActor", "RecurrentQNetwork", "make_recurrent_q_actor"]



class RecurrentQNetwork(nn.Module):
    """``Q(observation, prev_action, prev_reward; h, c)`` over ``[B, T]`` sequences.

    ``torso`` maps observations to ``feature_size`` features; the LSTM reads ``[features, prev_action one-hot,
    prev_reward]`` and a dueling head (or an MLP) maps its output to ``n_actions`` values.
    """

    def __init__(self, torso: nn.Module, feature_size: int, n_actions: int, *, lstm_size: int = 512,
            head_sizes: Sequence[int] = (512,), dueling: bool = True) -> None:
        super().__init__()
        self.torso, self.n_actions, self.lstm_size = torso, n_actions, lstm_size
        self.lstm = nn.LSTM(feature_size + n_actions + 1, lstm_size, batch_first=True)
        head = DuelingHead if dueling else relu_mlp
        self.head = head(lstm_size, n_actions, head_sizes)

    def zero_state(self, batch: int, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(h, c)`` zeros ``[batch, 1, lstm_size]``: a new episode's state."""
        zeros = torch.zeros(batch, 1, self.lstm_size, device=device)
        return zeros, zeros.clone()

    def forward(self, observation: torch.Tensor, prev_action: torch.Tensor, prev_reward: torch.Tensor,
            h: torch.Tensor, c: torch.Tensor,
            is_init: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Unroll over ``T`` steps from ``(h, c)`` ``[B, 1, lstm_size]``.

        ``observation`` ``[B, T, *obs]``, ``prev_action`` ``[B, T, n_actions]``, ``prev_reward`` ``[B, T, 1]``;
        ``is_init`` ``[B, T, 1]`` zeroes a sequence's state where a new episode starts (the LSTM runs once per
        stretch between such steps). Returns ``q`` ``[B, T, n_actions]`` and the final ``(h, c)``.
        """
        B, T = prev_reward.shape[:2]
        x = torch.cat([self.torso(observation), prev_action, prev_reward], -1)
        h, c = h.transpose(0, 1).contiguous(), c.transpose(0, 1).contiguous()  # nn.LSTM: [layers, B, H]
        starts = [0]
        if is_init is not None and T > 1:
            starts += (torch.nonzero(is_init[:, 1:].reshape(B, T - 1).any(0)).flatten() + 1).tolist()
        outputs = []
        for lo, hi in zip(starts, [*starts[1:], T], strict=True):
            if is_init is not None:
                keep = (~is_init[:, lo].reshape(1, B, 1)).to(h.dtype)
                h, c = h * keep, c * keep
            y, (h, c) = self.lstm(x[:, lo:hi], (h, c))
            outputs.append(y)
        y = outputs[0] if len(outputs) == 1 else torch.cat(outputs, 1)
        return self.head(y), h.transpose(0, 1), c.transpose(0, 1)


class RecurrentQActor(TensorDictModuleBase):
    """Greedy actor over a :class:`RecurrentQNetwork`, one step per call (``[n]`` TensorDicts or tensors).

    Reads ``observation``, ``prev_action`` ``[n, n_actions]``, ``prev_reward`` ``[n, 1]`` and the state (zeros
    when absent); writes ``action``, ``action_value``, ``chosen_action_value`` and ``("next", state)``.
    """

    def __init__(self, net: RecurrentQNetwork) -> None:
        super().__init__()
        self.net = net
        self.in_keys = ["observation", "prev_action", "prev_reward", *RECURRENT_KEYS]
        self.out_keys = ["action", "action_value", "chosen_action_value", *NEXT_RECURRENT_KEYS]

    def act(self, observation: torch.Tensor, inputs: Inputs, *, deterministic: bool) -> Outputs:
        n = observation.shape[0]
        zeros = torch.zeros(n, 1, device=observation.device)
        prev_action = inputs.get("prev_action")
        if prev_action is None:
            prev_action = zeros.new_zeros(n, self.net.n_actions)
        prev_reward = inputs.get("prev_reward")
        h, c = inputs.get(RECURRENT_KEYS[0]), inputs.get(RECURRENT_KEYS[1])
        if h is None or c is None:
            h, c = self.net.zero_state(n, observation.device)
        q, h, c = self.net(observation.unsqueeze(1), prev_action.unsqueeze(1),
                           (zeros if prev_reward is None else prev_reward).unsqueeze(1), h, c)
        q = q.squeeze(1)
        action = q.argmax(-1)
        return {"action": action, "action_value": q, "chosen_action_value": q.gather(-1, action[:, None]),
                NEXT_RECURRENT_KEYS[0]: h, NEXT_RECURRENT_KEYS[1]: c}

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        inputs = {key: tensordict.get(key) for key in self.in_keys if key in tensordict.keys(True)}
        for key, value in self.act(tensordict.get("observation"), inputs, deterministic=True).items():
            tensordict.set(key, value)
        return tensordict


class PreviousAction(TensorDictModuleBase):
    """``action`` -> ``("next", "prev_action")`` one-hot float: the executed action, fed back as ``prev_action``."""

    def __init__(self, n_actions: int) -> None:
        super().__init__()
        self.n_actions = int(n_actions)
        self.in_keys, self.out_keys = ["action"], [("next", "prev_action")]

    def act(self, observation: torch.Tensor, inputs: Inputs, *, deterministic: bool) -> Outputs:
        return {("next", "prev_action"): F.one_hot(inputs["action"], self.n_actions).float()}

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict.set(("next", "prev_action"),
                              F.one_hot(tensordict.get("action"), self.n_actions).float())


def make_recurrent_q_actor(specs, *, hidden_sizes: Sequence[int] = (64,), lstm_size: int = 512,
        head_sizes: Sequence[int] = (512,), dueling: bool = True) -> RecurrentQActor:
    """R2D1's greedy actor: images get :func:`~tdrl.models.conv.image_torso` and its hidden layer, vectors an MLP
    of ``hidden_sizes``; then the LSTM (``lstm_size``) and the head (``head_sizes``, dueling)."""
    obs_spec = specs.observation_spec
    if is_image_spec(obs_spec):
        conv, feature_size = image_torso(obs_spec.shape)
        torso: nn.Module = nn.Sequential(conv, nn.Linear(conv.output_size, feature_size), nn.ReLU())
    else:
        torso, feature_size = vector_torso(obs_spec, hidden_sizes)
    net = RecurrentQNetwork(torso, feature_size, specs.n_actions, lstm_size=lstm_size, head_sizes=head_sizes,
                            dueling=dueling)
    return RecurrentQActor(net)
