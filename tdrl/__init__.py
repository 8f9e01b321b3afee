"""tdrl: reinforcement-learning research pipelines on TensorDict and TorchRL, at rlpyt's throughput.

Data contract: every batch is a TensorDict with ``batch_size=[B, T]`` (B environments, time last; rlpyt's
``batch_B`` × ``batch_T``) and TorchRL keys (``observation``, ``action``, ``("next", "reward")``,
``("next", "done")``, ``("next", "terminated")``, ``("next", "truncated")``).

Importing tdrl needs neither wandb, submitit nor a display: those are imported where used.
"""

__version__ = "0.1.0"
