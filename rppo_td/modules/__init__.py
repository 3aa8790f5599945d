"""The agent as TensorDict modules: parameters, and their TorchRL actor and critic.

``RecurrentActorCritic`` holds the parameters (encoders from the spaces, LSTM/GRU cores, heads);
``RecurrentActor`` and ``RecurrentCritic`` are its TorchRL faces.
"""

from rppo_td.modules._actor_critic import Recurrence, RecurrentActorCritic
from rppo_td.modules._modules import (
    RecurrentActor,
    RecurrentCritic,
    RecurrentPolicy,
    recurrent_state_primer,
)
from rppo_td.modules._normalizer import ObservationNormalizer
from rppo_td.modules._spaces import (
    ObservationLeaf,
    image_shaped,
    observation_leaves,
    observation_to_tensordict,
)

__all__ = [
    "ObservationLeaf",
    "ObservationNormalizer",
    "RecurrentActor",
    "RecurrentActorCritic",
    "RecurrentCritic",
    "RecurrentPolicy",
    "Recurrence",
    "image_shaped",
    "observation_leaves",
    "observation_to_tensordict",
    "recurrent_state_primer",
]
