"""Pure tensor functions under the rppo_td transforms; usable without TensorDict.

Shapes use ``W`` workers, ``T`` time steps, ``N`` sequences and ``Lp`` the padded length.
"""

from rppo_td.functional._gae import discounted_segment_sum, generalized_advantage_estimate
from rppo_td.functional._masked import masked_mean, masked_normalize
from rppo_td.functional._minibatch import balanced_minibatches
from rppo_td.functional._padding import pad_sequences, padding_positions, unpad_sequences
from rppo_td.functional._sequences import (
    chunk_episodes,
    episode_ids,
    episode_starts,
    sequence_layout,
)

__all__ = [
    "balanced_minibatches",
    "chunk_episodes",
    "discounted_segment_sum",
    "episode_ids",
    "episode_starts",
    "generalized_advantage_estimate",
    "masked_mean",
    "masked_normalize",
    "pad_sequences",
    "padding_positions",
    "sequence_layout",
    "unpad_sequences",
]
