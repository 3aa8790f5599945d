"""SequencePadder: ``[W, T]`` rollout <-> ``[N, Lp]`` right-padded sequences."""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from rppo_td._validation import check_dtype, check_shape, get_key
from rppo_td.functional._padding import unpad_sequences
from rppo_td.transforms._base import RolloutTransform
from rppo_td.transforms._layout import SequenceLayout

__all__ = ["SequencePadder"]


class SequencePadder(RolloutTransform):
    """Regroups a chunked rollout into right-padded sequences with a ``loss_mask``.

    Batch ``[W, T] -> [N, Lp]`` with ``N`` sequences and ``Lp = min(L, longest fragment)``.
    Reads ``sequence_id`` and ``sequence_offset`` (``SequenceChunker``); returns a new
    tensordict holding every key of the rollout regrouped (zero on padding), plus
    ``loss_mask`` (``[N, Lp]`` bool, a True prefix per row), ``worker_index`` and
    ``time_index`` (``[N, Lp]`` int64). The input is not modified. Position 0 of each sequence
    holds the rollout's values at its first step, recurrent state included.

    ``inv`` turns a padded tensordict back into the ``[W, T]`` rollout exactly, from
    ``worker_index`` and ``time_index`` alone; a tensordict without ``loss_mask`` passes through
    unchanged (so ``ReplayBuffer.extend`` can store rollouts). It needs all the sequences of one
    rollout, in any order: ``[W, T]`` is read off the largest indices, and a missing or repeated
    step is an error. To scatter values of a subset (one minibatch), index a ``[W, T]`` tensor
    with that subset's ``worker_index`` and ``time_index`` where ``loss_mask`` is True.

    Args:
        keys: key overrides.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from rppo_td import EpisodeSplitter, SequenceChunker
        >>> done = torch.tensor([[0, 0, 1, 0, 0]]).bool().unsqueeze(-1)
        >>> td = TensorDict({"observation": torch.arange(5.0).view(1, 5, 1),
        ...                  "next": {"done": done}}, batch_size=[1, 5])
        >>> td = SequenceChunker(sequence_length=2)(EpisodeSplitter()(td))
        >>> padded = SequencePadder()(td)
        >>> padded.batch_size, padded["loss_mask"]
        (torch.Size([3, 2]), tensor([[ True,  True],
                [ True, False],
                [ True,  True]]))
        >>> padded["observation"].squeeze(-1)
        tensor([[0., 1.],
                [2., 0.],
                [3., 4.]])
        >>> (SequencePadder().inv(padded) == td).all()
        True
    """

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        layout = SequenceLayout.from_rollout(tensordict, self.keys, "SequencePadder")
        return layout.gather(tensordict, self.keys)

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase:
        keys = self.keys
        if tensordict.get(keys.loss_mask, None) is None:
            return tensordict
        if tensordict.batch_dims != 2:
            raise ValueError(
                "SequencePadder.inv expects padded sequences with batch dims [N, Lp], got "
                f"{list(tensordict.batch_size)}"
            )
        shape = tuple(tensordict.batch_size)
        mask = get_key(tensordict, keys.loss_mask)
        worker = get_key(tensordict, keys.worker_index)
        time = get_key(tensordict, keys.time_index)
        check_shape(keys.loss_mask, mask, shape)
        check_dtype(keys.loss_mask, mask, torch.bool)
        for key, value in ((keys.worker_index, worker), (keys.time_index, time)):
            check_shape(key, value, shape)
            check_dtype(key, value, torch.int64)
        real = mask.flatten().nonzero().squeeze(1)
        num_workers, num_time = (
            torch.stack([worker.max() + 1, time.max() + 1]).tolist() if real.numel() else (0, 0)
        )
        dest = (worker * num_time + time).flatten().index_select(0, real)
        num_steps = num_workers * num_time
        counts = torch.bincount(dest, minlength=num_steps)
        if real.numel() != num_steps or not bool((counts == 1).all()):
            raise ValueError(
                f"SequencePadder.inv needs every step of the [{num_workers}, {num_time}] "
                f"rollout exactly once; the padded tensordict holds {real.numel()} real steps "
                f"over {int((counts > 0).sum())} distinct (worker, time) pairs"
            )
        own = set(keys.index_keys())
        out = TensorDict(batch_size=[num_workers, num_time], device=tensordict.device)
        for key, value in tensordict.items(include_nested=True, leaves_only=True):
            if key in own:
                continue
            flat = unpad_sequences(value, dest, real, num_steps)
            out.set(key, flat.view(num_workers, num_time, *flat.shape[1:]))
        return out
