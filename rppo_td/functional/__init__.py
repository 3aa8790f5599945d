"""Pure tensor functions under the rppo_td transforms; usable without TensorDict.

Shapes use ``W`` workers, ``T`` time steps, ``N`` sequences and ``Lp`` the padded length.

Also importable from here, outside ``__all__`` and the documented API: the same computations
without the entry checks (``check_gae_inputs``, ``gae_unchecked``, ``plan_minibatches``,
``pad_rows``, ``runs_pay``, ``sequence_runs``, ``unpad_rows``, ``chunk_episodes_unchecked``,
``episode_ids_unchecked``, ``layout_from_starts``) and ``movable`` (a dtype's bytes as one
torch's gathers take), for the rppo_td wrappers that check their inputs once at their own entry
(re-exported as ``name as name``). Other packages import them from ``rppo_td.functional``,
never from its modules.
"""

from rppo_td.functional._burn_in import burn_in_lengths, burn_in_window, episode_first_steps
from rppo_td.functional._gae import check_gae_inputs as check_gae_inputs
from rppo_td.functional._gae import discounted_segment_sum, generalized_advantage_estimate
from rppo_td.functional._gae import gae_unchecked as gae_unchecked
from rppo_td.functional._masked import masked_mean, masked_normalize
from rppo_td.functional._minibatch import balanced_minibatches
from rppo_td.functional._minibatch import plan_minibatches as plan_minibatches
from rppo_td.functional._novelty import NoveltyCarry, episodic_novelty, observation_words
from rppo_td.functional._padding import movable as movable
from rppo_td.functional._padding import pad_rows as pad_rows
from rppo_td.functional._padding import pad_sequences, padding_positions, unpad_sequences
from rppo_td.functional._padding import runs_pay as runs_pay
from rppo_td.functional._padding import sequence_runs as sequence_runs
from rppo_td.functional._padding import unpad_rows as unpad_rows
from rppo_td.functional._sequences import (
    chunk_episodes,
    episode_ids,
    episode_starts,
    sequence_layout,
)
from rppo_td.functional._sequences import chunk_episodes_unchecked as chunk_episodes_unchecked
from rppo_td.functional._sequences import episode_ids_unchecked as episode_ids_unchecked
from rppo_td.functional._sequences import layout_from_starts as layout_from_starts

__all__ = [
    "balanced_minibatches",
    "burn_in_lengths",
    "burn_in_window",
    "chunk_episodes",
    "NoveltyCarry",
    "discounted_segment_sum",
    "episode_first_steps",
    "episode_ids",
    "episode_starts",
    "episodic_novelty",
    "generalized_advantage_estimate",
    "masked_mean",
    "masked_normalize",
    "observation_words",
    "pad_sequences",
    "padding_positions",
    "sequence_layout",
    "unpad_sequences",
]
