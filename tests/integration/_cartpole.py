"""One small TorchRL setup shared by the integration tests: time-limited CartPole, a recurrent
actor-critic sharing its core, and one collected ``[W, T]`` batch.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential
from torchrl.collectors import Collector
from torchrl.envs import GymEnv, InitTracker, SerialEnv, StepCounter, TransformedEnv
from torchrl.envs.transforms import Compose
from torchrl.modules import GRUModule, LSTMModule, ProbabilisticActor, ValueOperator


def time_limited_cartpole(max_steps: int) -> TransformedEnv:
    """CartPole with ``InitTracker`` and a ``StepCounter`` limit (truncations and terminations)."""
    return TransformedEnv(
        GymEnv("CartPole-v1", categorical_action_encoding=True),
        Compose(InitTracker(), StepCounter(max_steps=max_steps)),
    )


def actor_critic(
    core: LSTMModule | GRUModule, hidden: int
) -> tuple[ProbabilisticActor, TensorDictSequential]:
    """A categorical actor and a critic over one shared recurrent ``core`` writing ``embed``."""
    actor = ProbabilisticActor(
        TensorDictSequential(
            core, TensorDictModule(torch.nn.Linear(hidden, 2), ["embed"], ["logits"])
        ),
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )
    critic = TensorDictSequential(
        core, ValueOperator(torch.nn.Linear(hidden, 1), in_keys=["embed"])
    )
    return actor, critic


def collect_once(env: SerialEnv | TransformedEnv, policy, frames: int) -> TensorDictBase:
    """One batch of ``frames`` steps from a ``Collector``, shut down (and the env closed) after."""
    collector = Collector(env, policy, frames_per_batch=frames, total_frames=frames)
    try:
        return next(iter(collector))
    finally:
        collector.shutdown()
        if not env.is_closed:
            env.close()
