"""PPO on CartPole-v1, data-parallel over two nodes: one rank per node, gradients all-reduced over gloo (2 seeds).

Each run is one SLURM job of 2 nodes x 1 task; the ranks meet at the first node's address (SLURM's NodeAddr) on a
port that is new after every requeue. On the local cluster (bash slurm/local-cluster.sh start --nodes 2) the
partition with two nodes is `multi`:

python slurm/launch.py slurm  slurm/sweeps/ppo_cartpole_ddp.py --partition multi --time 10
python slurm/launch.py status runs/sweeps/ppo_cartpole_ddp
"""

from tdrl.launch import Resources, Sweep

sweep = Sweep(
    name="ppo_cartpole_ddp",
    recipe="recipes/ppo.py",
    seeds=[0, 1],
    overrides={"env.id": "CartPole-v1", "collector.total_frames": 50_000, "trainer.kind": "ddp",
               "trainer.world_size": 2},  # = nodes x tasks_per_node
    resources=Resources(cpus_per_run=1, nodes=2, tasks_per_node=1, time_min=30),
)
