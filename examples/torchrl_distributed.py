"""Recurrent PPO fed by TorchRL's distributed collector, on one machine.

``Collector(..., backend="distributed", sync=True)`` (TorchRL's ``DistributedCollector``) starts
``C`` collector processes with the ``mp`` launcher on localhost. Each runs its own TorchRL
``Collector`` over a ``SerialEnv`` of ``E`` CartPole environments with an LSTM policy and sends
its ``[E, T]`` batch to this process over ``torch.distributed`` (``gloo``). The sync collector
stacks them into ``[C, E, T]``; reshaping gives the ``[W, T]`` rollout (``W = C * E``, row
``c * E + e`` is environment ``e`` of collector ``c``) that rppo_td's pipeline expects. Time stays
its own dimension, so no episode is glued across collectors: each row is one environment's own
time series. After every optimizer step ``collector.update_policy_weights_(actor)`` pushes the
new weights to every collector process. The printed ``max ratio - 1`` is the loss's ``max_ratio``
diagnostic on each fresh rollout before any step: 0 up to float rounding when the collectors ran
the weights this process holds, about 7e-3 at update 2 when the push is left out.

    python examples/torchrl_distributed.py                  # 20 updates
    RPPO_TD_TINY=1 python examples/torchrl_distributed.py   # two updates, for CI

Several machines (from TorchRL 0.14.1's ``DistributedCollector`` source and docstring):

- ``launcher="submitit"`` (the class default; needs the ``submitit`` package and a SLURM
  cluster, configured by ``slurm_kwargs``) submits one job per collector; ``"submitit_delayed"``
  (with ``submitit_delayed_launcher``) is for clusters that cannot spawn jobs from a job.
  ``"mp"`` only launches on this machine.
- Rank 0 (this trainer) is ``MASTER_ADDR``: with ``"mp"`` it is ``localhost``, otherwise
  ``socket.gethostbyname(socket.gethostname())``, so that name must resolve to an address the
  collector nodes can reach.
- ``tcp_port`` (default ``$TCP_PORT`` or 10003) is the ``init_process_group`` rendezvous; a
  ``TCPStore`` for the instructions goes on the next port (another free one if taken, sent to
  the nodes by broadcast): the nodes must reach both.
- ``backend`` (in ``backend_options``) is the ``torch.distributed`` backend for rollouts and
  weights: ``"gloo"`` (default, CPU tensors), ``"nccl"``, ``"mpi"`` or ``"ucc"``, the same on
  every node (TorchRL's docs: a mismatch hangs at the rendezvous without an error).
- ``Collector(..., backend="ray")`` builds a ``RayCollector`` instead (needs ``ray``);
  ``backend="rpc"`` an ``RPCCollector``.
- The trainer code below does not change: the batch is ``[C, E, T]`` whatever the launcher.
- Do not use ``("collector", "traj_ids")`` across collectors: TorchRL offsets collector ``c``'s
  ids by the largest id of collector ``c - 1``, not one more, so two trajectories share an id.
"""

from __future__ import annotations

import argparse
import copy
import os
import socket
import time
from dataclasses import dataclass
from functools import partial

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.collectors import Collector
from torchrl.envs import Compose, GymEnv, InitTracker, SerialEnv, TransformedEnv
from torchrl.modules import MLP, LSTMModule, ProbabilisticActor, ValueOperator

import rppo_td
from rppo_td.functional import masked_mean


@dataclass
class Config:
    """Settings of this example; ``RPPO_TD_TINY=1`` shrinks the budget for CI."""

    env_id: str = "CartPole-v1"
    """Any gymnasium id with a Discrete action space and 4 observations."""
    num_collectors: int = 2
    """C: collector processes started by TorchRL's ``mp`` launcher."""
    envs_per_collector: int = 2
    """E: environments each collector steps in a ``SerialEnv`` (W = C * E rows)."""
    rollout_steps: int = 64
    """T: steps per environment per rollout."""
    sequence_length: int = 8
    """L: the longest sequence the loss back-propagates through."""
    updates: int = 20
    """How many rollouts to collect and train on."""
    epochs: int = 4
    """Passes over each rollout's sequences."""
    num_minibatches: int = 4
    """Minibatches per epoch, balanced by real steps."""
    hidden_size: int = 64
    """LSTM hidden size."""
    gamma: float = 0.99
    """Discount."""
    lmbda: float = 0.95
    """GAE lambda."""
    lr: float = 3e-4
    """Adam learning rate."""
    seed: int = 0
    """Seeds torch and the minibatch order; collector ``c`` seeds its envs with seed + 1000 c."""
    tcp_port: int = 0
    """Rendezvous port of ``torch.distributed``; 0 picks a free one."""


def make_config() -> Config:
    """The default config, or a tiny one when ``RPPO_TD_TINY`` is set."""
    if os.environ.get("RPPO_TD_TINY"):
        return Config(rollout_steps=32, updates=2, epochs=1, num_minibatches=2, hidden_size=32)
    return Config()


def free_port() -> int:
    """A TCP port free now, whose successor is free too (TorchRL puts its store there)."""
    for _ in range(20):
        with socket.socket() as s:
            s.bind(("localhost", 0))
            port = s.getsockname()[1]
        with socket.socket() as s:
            try:
                s.bind(("localhost", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no free pair of TCP ports found")


def make_env(env_id: str, num_envs: int, seed: int, lstm: LSTMModule) -> TransformedEnv:
    """One collector's batched env ``[E]``: is_init, the LSTM state primer, seeded.

    Module-level (and bound with ``partial``) so that it pickles into the spawned workers.
    """
    env = TransformedEnv(
        SerialEnv(num_envs, partial(GymEnv, env_id, categorical_action_encoding=True)),
        Compose(InitTracker(), lstm.make_tensordict_primer()),
    )
    env.set_seed(seed)
    return env


def main(cfg: Config) -> None:
    """Collects with C processes, runs the pipeline and trains; prints shapes and losses."""
    torch.manual_seed(cfg.seed)
    started = time.perf_counter()
    C, E, T = cfg.num_collectors, cfg.envs_per_collector, cfg.rollout_steps
    W = C * E

    # ---- the policy: observation -> LSTM -> (logits, value) -------------------------------
    lstm = LSTMModule(
        input_size=4, hidden_size=cfg.hidden_size, in_key="observation", out_key="embed"
    )
    logits = TensorDictModule(
        MLP(in_features=cfg.hidden_size, out_features=2, num_cells=[64]),
        in_keys=["embed"],
        out_keys=["logits"],
    )
    actor = ProbabilisticActor(
        TensorDictSequential(lstm, logits),
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,  # writes action_log_prob, which the loss reads
    )
    critic = TensorDictSequential(
        lstm,
        ValueOperator(
            MLP(in_features=cfg.hidden_size, out_features=1, num_cells=[64]), in_keys=["embed"]
        ),
    )

    # ---- the distributed collector: C processes, each [E, T], stacked to [C, E, T] ---------
    # One env constructor per collector (so each seeds differently). The collector gets a copy
    # of the actor: the mp launcher pickles the policy it is given into the workers through
    # torch.multiprocessing, which moves its parameters into shared memory, so the workers would
    # see every optimizer step without a push (and a missing push would go unnoticed until the
    # collectors run on other machines). With a copy, one machine behaves like several.
    env_fns = [partial(make_env, cfg.env_id, E, cfg.seed + 1000 * c, lstm) for c in range(C)]
    collector = Collector(
        env_fns,
        copy.deepcopy(actor),
        backend="distributed",
        sync=True,  # every batch holds all C collectors' steps under the same weights
        frames_per_batch=W * T,  # split evenly: E * T frames per collector
        total_frames=cfg.updates * W * T,
        backend_options={
            "launcher": "mp",
            "backend": "gloo",
            "tcp_port": cfg.tcp_port or free_port(),
        },
    )
    print(f"collector {type(collector).__name__} up in {time.perf_counter() - started:.1f} s")

    # ---- rppo_td: rollout [W, T] -> padded sequences [N, Lp] --------------------------------
    pipeline = Compose(
        rppo_td.GAE(gamma=cfg.gamma, lmbda=cfg.lmbda, value_network=critic),
        rppo_td.EpisodeSplitter(),
        rppo_td.SequenceChunker(sequence_length=cfg.sequence_length),
        rppo_td.SequencePadder(),
    )
    # this process alone learns, from all the collectors' data: rank=0, world_size=1 (the
    # default group is TorchRL's, with the collectors in it; read from it, the sampler would
    # shard this rollout over them, as if each were a learner)
    sampler = rppo_td.SequenceSampler(
        cfg.num_minibatches, generator=torch.Generator().manual_seed(cfg.seed), rank=0, world_size=1
    )
    loss_fn = rppo_td.RecurrentPPOLoss(
        actor, critic, clip_epsilon=0.2, entropy_coeff=0.01, normalize_advantage=True
    )
    optimizer = torch.optim.Adam(loss_fn.parameters(), lr=cfg.lr)

    try:
        tick = time.perf_counter()
        for update, batch in enumerate(collector):
            collect_s = time.perf_counter() - tick
            # [C, E, T] (a lazy stack over collectors) -> [W, T], only what the loss needs
            rollout = (
                batch.select(
                    "observation",
                    "action",
                    "action_log_prob",
                    "is_init",
                    "recurrent_state_h",
                    "recurrent_state_c",
                    ("next", "reward"),
                    ("next", "terminated"),
                    ("next", "truncated"),
                    ("next", "done"),
                    ("next", "observation"),
                    ("next", "is_init"),
                    ("next", "recurrent_state_h"),
                    ("next", "recurrent_state_c"),
                )
                .contiguous()
                .reshape(W, T)
            )
            padded = pipeline(rollout)
            if update == 0:
                traj_ids = batch["collector", "traj_ids"]
                print(f"batch     {tuple(batch.batch_size)}  (C, E, T), {type(batch).__name__}")
                print(f"rollout   {tuple(rollout.batch_size)}  (W, T)")
                print(f"traj_ids per collector (first step): {traj_ids[:, :, 0].tolist()}")
                print(f"padded    {tuple(padded.batch_size)}  (N, Lp)")
                print(
                    f"loss_mask {tuple(padded['loss_mask'].shape)}, "
                    f"{int(padded['loss_mask'].sum())} real steps"
                )
            with torch.no_grad():  # the weights the collectors ran, if the push worked
                stale = loss_fn(padded)["max_ratio"].item() - 1
            for epoch in range(cfg.epochs):
                seen = 0
                for minibatch in sampler(padded):  # [B, Lp]
                    seen += int(minibatch["loss_mask"].sum())
                    losses = loss_fn(minibatch)
                    loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(loss_fn.parameters(), 0.5)
                    optimizer.step()
                if update == 0 and epoch == 0:  # every real step, once an epoch
                    print(f"epoch 1   {seen} of {int(padded['loss_mask'].sum())} real steps")
            value_error = masked_mean(
                (padded["value_target"] - padded["state_value"]).abs(), padded["loss_mask"]
            )
            push = time.perf_counter()
            collector.update_policy_weights_(actor)  # over gloo, to all C processes
            push_s = time.perf_counter() - push
            print(
                f"update {update + 1:3d}  loss {loss.item():+.3f}  "
                f"max ratio - 1 {stale:+.1e}  "
                f"|value error| {value_error.item():.3f}  "
                f"collect {collect_s:.2f} s  push {push_s:.3f} s"
            )
            tick = time.perf_counter()
    finally:
        stop = time.perf_counter()
        collector.shutdown()
        print(f"collector shut down in {time.perf_counter() - stop:.1f} s")
    print(f"done: {update + 1} updates in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":  # required: the mp launcher spawns fresh interpreters
    # --help, and no option taken silently: the budget is set by RPPO_TD_TINY only
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    main(make_config())
