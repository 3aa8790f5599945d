"""The recurrent actor-critic and its TensorDict/TorchRL wrappers."""

from rppo_td.agent._actor_critic import ActorCriticOutput, Recurrence, RecurrentActorCritic
from rppo_td.agent._modules import RecurrentPolicyModule, recurrent_state_primer
from rppo_td.agent._spaces import observation_leaves, observation_to_tensordict

__all__ = [
    "ActorCriticOutput",
    "RecurrentActorCritic",
    "RecurrentPolicyModule",
    "Recurrence",
    "observation_leaves",
    "observation_to_tensordict",
    "recurrent_state_primer",
]
