"""tdrl.replay: memmap-backed replay buffers for off-policy and recurrent agents.

Buffers
-------
``TransitionReplayBuffer(scratch_dir, capacity, *, sampler=None, n_step=1, gamma=0.99, frame_stack=None,
mask_key=("collector", "mask"), priority_key="priority", keys=None, exclude_keys=(), seed=None)``
    Uniform (``sampler=None``) or prioritized (``sampler=PrioritizedSampler(...)``) transition replay.

``buffer.extend(batch)``
    ``batch`` is a collector TensorDict ``[B, T]`` (time last) or, for one-step buffers, a flat ``[N]`` batch of
    transitions. The first batch fixes ``B``, the stored keys, dtypes and per-step shapes; every later batch must
    match (else :class:`ReplayError` naming the key; nothing is written). Storage is a ring of ``T_cap =
    capacity // B`` steps per environment stream (rlpyt's ``[T, B]`` ring, time last), memmapped under
    ``scratch_dir``. Optional per-step input priorities under ``priority_key`` (``[B, T]``) seed a prioritized
    sampler; they are not stored.

``buffer.sample(batch_size) -> TensorDict[batch_size]``, ready for TorchRL losses (``DQNLoss``,
``DistributionalDQNLoss``, ``SACLoss``, ``TD3Loss``, ``DDPGLoss``):

    ==================================  =====================================================================
    key                                 meaning
    ==================================  =====================================================================
    every stored root key               at the start step ``t`` (``observation``, ``action``, policy outputs)
    ``("next", "reward")`` [N, 1]       n-step discounted reward sum ``sum_{i<k} gamma^i r_{t+i}`` (k = window)
    ``("next", "observation")``         observation after the window's last step ``t+k-1`` (for a truncated
                                        step: the final pre-reset observation, so the target bootstraps)
    ``("next", "done"/"terminated"/     flags of step ``t+k-1`` (rlpyt's ``done_n``: ``terminated`` stops
    "truncated")`` [N, 1] bool          bootstrapping, ``truncated`` does not)
    ``steps_to_next_obs`` [N, 1] int64  ``k`` (only when ``n_step > 1``): bootstrap with ``gamma ** k``.
                                        TorchRL's TD0/TD(lambda) estimators and ``DistributionalDQNLoss`` read
                                        this key; losses need ``gamma`` equal to the buffer's ``gamma``
    ``index`` [N] int64                 flat slot index ``b * T_cap + t % T_cap``; pass back to
                                        ``update_priority``
    ``priority_weight`` [N] float32     prioritized only: importance weight, normalised by the batch max; the
                                        key TorchRL losses read (``tensor_keys.priority_weight``)
    ==================================  =====================================================================

    The window ``k = min(n_step, steps up to and including the first done)`` never crosses the write cursor.

``buffer.update_priority(index, priority)`` or ``buffer.update_priority(sampled_td)`` (reads ``"td_error"``).

Frame de-duplication: ``TransitionReplayBuffer(..., frame_stack=FrameStack(n_frames=4, padding="zero"|"reset"))``
stores stacked uint8 observations ``[B, T, 4, 84, 84]`` one frame per step (plus the final frame of each episode) and
rebuilds ``observation`` and ``("next", "observation")`` stacks when sampling, at ~1.06/4 of the memory of the
observation stacks alone. ``padding`` must match the environment's stacking (gymnasium's ``FrameStackObservation``
default, used by ``tdrl.envs`` Atari presets, is ``"reset"``); a mismatch is detected at the first episode start.
See :mod:`tdrl.replay.frames`.

``SequenceReplayBuffer(scratch_dir, capacity, *, batch_T, warmup_T=0, lookahead_T=0, rnn_state_interval,
state_keys, sampler=None, pri_eta=0.9, ...)``: R2D1 sequences ``[batch_B, warmup_T + batch_T + lookahead_T]``
starting only at steps whose recurrent state was stored (every ``rnn_state_interval`` steps), with that state as the
initial state (``sample(batch_B)``, ``update_priority(index, priority [batch_B] or td_error [batch_B, T])``). See
:mod:`tdrl.replay.sequence`.

``PrioritizedSampler(max_capacity=None, *, alpha=0.6, beta_init=0.4, beta_final=1.0, beta_steps=1, eps=1e-6,
default_priority=None, seed=None)``: float64 sum-tree sampler (one per buffer; also usable as
``torchrl.data.ReplayBuffer(storage, sampler=PrioritizedSampler(capacity, ...))``).

Counters (shared by every process holding the buffer): ``write_count`` (transitions written), ``samples_drawn``
(transitions sampled), ``len(buffer)`` (stored). An async trainer throttles on
``samples_drawn / write_count <= replay_ratio``.

Sharing: pass the buffer to another process (pickle, e.g. as a ``multiprocessing`` argument); only paths travel,
the other process maps the same files. One process extends, others sample; a lock-free seqlock on the write cursor
redraws any sample whose slots were overwritten during the gather, so a half-written transition is never returned
(see :mod:`tdrl.replay.storage`). Prioritized trees are updated under an ``flock`` (taken once the buffer has been
pickled). One writing process at a time; a writer killed in the middle of ``extend`` leaves the slots it was
writing unsampleable until they are overwritten.

Persistence (for ``tdrl.ckpt``):

* ``buffer.state_dict()`` / ``load_state_dict(sd)``: counters, layout, RNG and sampler state (no stored data). The
  data stays in ``scratch_dir``; a buffer built on the same directory reopens it in place. Cheap, but steps written
  after the checkpoint remain in the files (a resumed run sees slightly newer data in the oldest slots), so it is
  not bit-exact.
* ``buffer.dumps(path)`` / ``buffer.loads(path)``: a full copy of the data files plus the state; exact (storage,
  cursor, tree and sampling order for the same RNG state). ``dumps(scratch_dir)`` writes only the state.

Why these pieces are ours: TorchRL's ``ReplayBuffer(LazyMemmapStorage)`` costs ~110 us per ``extend`` and ~135 us per
``sample`` here, its prioritized sampler's C++ extension does not load against torch 2.13, and it has no frame
de-duplication, stored-state sequences or cross-process sharing. :class:`PrioritizedSampler` implements TorchRL's
``Sampler`` interface, so it also plugs into ``torchrl.data.ReplayBuffer``.
"""

from tdrl.replay.buffer import TransitionReplayBuffer
from tdrl.replay.frames import FrameStack
from tdrl.replay.nstep import nstep_returns
from tdrl.replay.prioritized import PrioritizedSampler, check_priorities
from tdrl.replay.schema import ReplayError
from tdrl.replay.sequence import SequenceReplayBuffer, sequence_priority
from tdrl.replay.storage import MemmapStore
from tdrl.replay.sum_tree import SumTree

__all__ = [
    "FrameStack",
    "MemmapStore",
    "PrioritizedSampler",
    "ReplayError",
    "SequenceReplayBuffer",
    "SumTree",
    "TransitionReplayBuffer",
    "check_priorities",
    "nstep_returns",
    "sequence_priority",
]
