"""R2D1 (Kapturowski et al. 2019, rlpyt's ``R2D1``): recurrent replay DQN on stored-state sequences.

A replayed sequence ``[B, L]``, ``L = warmup_T + batch_T + n_step`` (:class:`~tdrl.replay.SequenceReplayBuffer`),
starts from the recurrent state the collector stored. The online network burns in the first ``warmup_T`` steps
without gradient, then trains on the next ``batch_T``; the target network unrolls the whole sequence from the *same*
stored state. Targets are n-step double-Q with value rescaling ``h(x) = sign(x)(sqrt(|x|+1)-1) + eps x``:
``y_t = h(R_t^n + gamma^n h^-1(Q_target(s_{t+n}, argmax_a Q(s_{t+n}, a))))``, no bootstrap past a termination. A
window that reaches a time-limit truncation is not trained on: the final observation is not in the recurrent stream,
so its bootstrap is unknown (rlpyt: no training on ``timeout`` samples). Steps the collector masked (wait-reset
idling) are not trained on either. Sequence priorities are ``eta max_t |delta_t| + (1 - eta) mean_t |delta_t|``;
:func:`input_priorities` gives new collector batches theirs from the Q-values recorded while acting.
"""

from __future__ import annotations

import copy

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.objectives import LossModule

from tdrl.models.recurrent_q import RecurrentQActor
from tdrl.objectives.terms import check_gamma
from tdrl.utils.keys import MASK_KEY, RECURRENT_KEYS, WEIGHT_KEY
from tdrl.utils.returns import nstep_returns, sequence_priority

__all__ = ["R2D1Loss", "input_priorities", "inverse_value_rescale", "value_rescale"]



def value_rescale(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x`` (Pohlen et al. 2018)."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1) - 1) + eps * x


def inverse_value_rescale(z: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """``h^-1(z)``, the closed form of the inverse of :func:`value_rescale`."""
    return torch.sign(z) * (((torch.sqrt(1 + 4 * eps * (z.abs() + 1 + eps)) - 1) / (2 * eps)) ** 2 - 1)


def _n_step_returns(reward: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor, start: int, steps: int,
        n_step: int, gamma: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For ``t`` in ``start .. start+steps-1``: the n-step reward sum ``[B, steps]`` (stopping at an episode's
    end), whether the window stayed in the episode (bootstrap at ``t+n``) and whether it reached a truncation."""
    B = reward.shape[0]
    done = terminated | truncated

    def windows(x: torch.Tensor) -> torch.Tensor:  # [B * steps, n_step, 1]: the window of each start t
        return x[:, start : start + steps + n_step - 1].unfold(1, n_step, 1).reshape(B * steps, n_step, 1)

    ret, k = nstep_returns(windows(reward), windows(done), gamma)
    last = start + torch.arange(steps, device=reward.device) + k.view(B, steps) - 1  # the window's last step
    alive = ~windows(done).view(B, steps, n_step).any(-1)
    return ret.view(B, steps), alive, truncated.gather(1, last)


def _columns(td: TensorDictBase) -> tuple[torch.Tensor, ...]:
    reward = td.get(("next", "reward")).reshape(td.batch_size)
    terminated = td.get(("next", "terminated")).reshape(td.batch_size)
    truncated = td.get(("next", "truncated")).reshape(td.batch_size)
    mask = td.get(MASK_KEY, None)
    valid = torch.ones_like(terminated) if mask is None else mask.reshape(td.batch_size)
    return reward, terminated, truncated, valid


class R2D1Loss(LossModule):
    """R2D1's sequence loss (module docstring) for a :class:`~tdrl.models.recurrent_q.RecurrentQActor`.

    Args:
        actor: the online greedy actor; its network is copied into ``target_q_net`` (updated by ``TargetUpdate``).
        gamma, n_step: discount and n-step return length (the replay's ``lookahead_T`` must be ``n_step``).
        warmup_T: burn-in steps (the replay's ``warmup_T``).
        double_dqn: the online network selects the bootstrap action.
        value_scale_eps: ``eps`` of ``h``; ``pri_eta``: the max/mean mix of sequence priorities.
        clip_reward: clip rewards to [-1, 1] in the target (the model's ``prev_reward`` input stays raw).

    Calling it on a sample returns ``{"loss", "priority"}``: the importance-weighted ``0.5 delta^2`` mean over
    trained steps and the ``[B]`` new sequence priorities (for ``replay.update_priority``).
    """

    def __init__(self, actor: RecurrentQActor, *, gamma: float = 0.997, n_step: int = 5, warmup_T: int = 40,
            double_dqn: bool = True, value_scale_eps: float = 1e-3, pri_eta: float = 0.9,
            clip_reward: bool = False) -> None:
        super().__init__()
        if n_step < 1 or warmup_T < 0:
            raise ValueError(f"need n_step >= 1 and warmup_T >= 0, got {n_step} and {warmup_T}")
        self.gamma = float(check_gamma(gamma))
        self.value_network = actor
        self.q_net = actor.net
        self.target_q_net = copy.deepcopy(self.q_net).requires_grad_(False)
        self.n_step, self.warmup_T, self.double_dqn = int(n_step), int(warmup_T), double_dqn
        self.eps, self.pri_eta, self.clip_reward = float(value_scale_eps), float(pri_eta), clip_reward

    def forward(self, sample: TensorDictBase) -> TensorDict:
        w, n = self.warmup_T, self.n_step
        steps = sample.batch_size[1] - w - n
        if steps < 1:
            raise ValueError(f"sequences of {sample.batch_size[1]} steps leave none to train after warmup_T={w} "
                             f"and n_step={n}")
        inputs = [sample.get(key) for key in ("observation", "prev_action", "prev_reward")]
        is_init = sample.get("is_init")
        h0, c0 = (sample.get(key)[:, 0] for key in RECURRENT_KEYS)  # the stored state, for both networks
        with torch.no_grad():
            h, c = h0, c0
            if w:  # burn-in: the online network's state at the first trained step, without gradient
                _, h, c = self.q_net(*(x[:, :w] for x in inputs), h, c, is_init[:, :w])
            target_q = self.target_q_net(*inputs, h0, c0, is_init)[0][:, w:]
        q = self.q_net(*(x[:, w:] for x in inputs), h, c, is_init[:, w:])[0]  # [B, steps + n, A]
        action = sample.get("action")[:, w : w + steps].long().unsqueeze(-1)
        q_sa = q[:, :steps].gather(-1, action).squeeze(-1)
        reward, terminated, truncated, valid = _columns(sample)
        if self.clip_reward:
            reward = reward.clamp(-1.0, 1.0)
        with torch.no_grad():
            ret, alive, truncation = _n_step_returns(reward, terminated, truncated, w, steps, n, self.gamma)
            chooser = q if self.double_dqn else target_q
            best = chooser[:, n : n + steps].argmax(-1, keepdim=True)
            bootstrap = target_q[:, n : n + steps].gather(-1, best).squeeze(-1)
            y = value_rescale(ret + alive * self.gamma**n * inverse_value_rescale(bootstrap, self.eps), self.eps)
            trained = valid[:, w : w + steps] & ~truncation
        delta = y - q_sa
        weight = sample.get(WEIGHT_KEY, None)
        per_step = 0.5 * delta.pow(2) * (1.0 if weight is None else weight[:, :1])
        loss = (per_step * trained).sum() / trained.sum().clamp(min=1)
        priority = sequence_priority(delta, self.pri_eta, trained)
        return TensorDict(loss=loss, priority=priority)


def input_priorities(batch: TensorDictBase, *, gamma: float, n_step: int, eta: float = 0.9,
        value_scale_eps: float = 1e-3, clip_reward: bool = False) -> torch.Tensor:
    """Priorities ``[B, T]`` of a new ``[B, T]`` collector batch (rlpyt's ``input_priorities``): each row's sequence
    priority of the n-step TD errors computed from the ``action_value`` the acting network recorded (no target
    network), repeated along time; the replay keeps the value of the steps that start sequences. Rows without a
    complete window get the batch's mean."""
    B, T = batch.batch_size
    steps = T - n_step
    if steps < 1:
        raise ValueError(f"input priorities need collector batches longer than n_step={n_step}, got batch_T={T}")
    q = batch.get("action_value")
    reward, terminated, truncated, valid = _columns(batch)
    if clip_reward:
        reward = reward.clamp(-1.0, 1.0)
    ret, alive, truncation = _n_step_returns(reward, terminated, truncated, 0, steps, n_step, gamma)
    q_sa = q[:, :steps].gather(-1, batch.get("action")[:, :steps].long().unsqueeze(-1)).squeeze(-1)
    bootstrap = q[:, n_step:].max(-1).values
    y = value_rescale(ret + alive * gamma**n_step * inverse_value_rescale(bootstrap, value_scale_eps), value_scale_eps)
    trained = valid[:, :steps] & ~truncation
    priority = sequence_priority(y - q_sa, eta, trained)
    has_any = trained.any(1)
    if has_any.any():
        priority = torch.where(has_any, priority, priority[has_any].mean())
    return priority.unsqueeze(1).expand(B, T)
