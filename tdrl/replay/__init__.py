"""tdrl.replay: memmap-backed replay buffers for off-policy and recurrent agents.

:class:`TransitionReplayBuffer` (uniform, or prioritized with ``sampler=PrioritizedSampler(...)``; n-step; optional
:class:`FrameStack` de-duplication) and :class:`SequenceReplayBuffer` (R2D1 sequences starting at stored recurrent
states). ``extend(batch)`` takes a collector batch ``[B, T]`` (time last; a one-step transition buffer also takes a
flat ``[N]`` batch); the first batch fixes ``B`` and the stored keys, dtypes and shapes, and a later batch that does
not match raises :class:`ReplayError` naming the key, with nothing written.

``TransitionReplayBuffer.sample(n)`` returns a flat ``[n]`` TensorDict ready for TorchRL losses: every stored key at
the start step ``t``; ``("next", "reward")`` the n-step discounted sum over the window ``k = min(n_step, steps up to
the first done)``; the other ``("next", ...)`` entries of step ``t+k-1`` (for a time-limit truncation, the final
pre-reset observation, so targets bootstrap; ``terminated`` stops bootstrapping); ``steps_to_next_obs`` (``k``, when
``n_step > 1``, read by TorchRL's value estimators); ``index`` (pass it back to ``update_priority``); prioritized:
``priority_weight``, the importance weight TorchRL losses read. Nested TensorDicts keep their own batch dims (a
multi-agent group's ``(group, ...)`` entries come back ``[n, n_agents]``, docs/design.md §1). A window never crosses
the write cursor. With ``device=`` (the learner's) a sample arrives on that device: the data stays in host memory,
and a GPU sample is gathered into pinned memory and copied without blocking the host.

A buffer pickled to another process sends only paths: one process extends, others sample (a seqlock redraws samples
overwritten during their gather), and they share ``write_count``, ``samples_drawn`` and ``len(buffer)``, on which an
async trainer throttles. ``state_dict``/``load_state_dict`` hold counters, layout, RNG and sampler state and reopen
the data in place; ``dumps(path)``/``loads(path)`` copy the data too (exact resume): only its filled part, in time
segments, and ``checkpoint_writer()`` makes each checkpoint hard-link the segments unchanged since the one before
(:mod:`tdrl.replay.segments`), so keeping two checkpoints costs about one replay.

Ours rather than TorchRL's: its memmap buffer is an order of magnitude slower per extend and sample here, its
prioritized sampler's C++ extension does not load against torch 2.13, and it has no frame de-duplication,
stored-state sequences or cross-process sharing. :class:`PrioritizedSampler` implements TorchRL's ``Sampler``.
"""

from tdrl.replay.buffer import TRANSITION_KEYS, TransitionReplayBuffer, grouped_transition_keys
from tdrl.replay.frames import FrameStack
from tdrl.replay.prioritized import PrioritizedSampler, check_priorities
from tdrl.replay.schema import ReplayError
from tdrl.replay.sequence import SequenceReplayBuffer
from tdrl.replay.storage import MemmapStore
from tdrl.replay.sum_tree import SumTree
from tdrl.utils.returns import nstep_returns, sequence_priority

__all__ = ["TRANSITION_KEYS", "FrameStack", "MemmapStore", "PrioritizedSampler", "ReplayError", "SequenceReplayBuffer",
    "SumTree", "TransitionReplayBuffer", "check_priorities", "grouped_transition_keys", "nstep_returns",
    "sequence_priority"]
