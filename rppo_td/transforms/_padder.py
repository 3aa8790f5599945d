"""SequencePadder: ``[W, T]`` rollout <-> ``[N, Lp]`` right-padded sequences."""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase, is_leaf_nontensor

from rppo_td._buffers import OutputPool
from rppo_td._keys import RolloutKeys
from rppo_td._layout import SequenceLayout, gather_sequences
from rppo_td._lazy import group_dims
from rppo_td._validation import (
    check_dtype,
    check_not_meta,
    check_pad_to,
    check_shape,
    check_tensor_leaf,
    get_key,
    none_true,
)
from rppo_td.functional import unpad_rows
from rppo_td.transforms._base import RolloutTransform

__all__ = ["SequencePadder"]


class SequencePadder(RolloutTransform):
    """Regroups a chunked rollout into right-padded sequences with a ``loss_mask``.

    Batch ``[W, T] -> [N, Lp]`` with ``N`` sequences and ``Lp = min(L, longest fragment)``, or
    ``Lp = pad_to`` when given: then the shape does not depend on the data, which a
    replay-buffer storage refilled every update, ``torch.compile`` and CUDA graphs need.
    Reads ``sequence_id`` and ``sequence_offset`` (``SequenceChunker``); returns a new
    tensordict holding every key of the rollout regrouped (zero on padding), plus
    ``loss_mask`` (``[N, Lp]`` bool, a True prefix per row), ``worker_index``,
    ``time_index`` and ``rollout_steps`` (``[N, Lp]`` int64: the step's row and column in the
    rollout, and the rollout's ``W * T``; 0 on padding). The input is not modified. Position 0
    of each sequence holds the rollout's values at its first step, recurrent state included.
    **The rollout's leaves are gathered when first read.** The output is a plain
    ``TensorDict`` holding every key at once, but each rollout leaf is regrouped only when
    something reads it (``td[key]``, ``items()``, indexing, ``clone()``, ``to()``, ...), once;
    ``SequenceSampler`` reads the leaves not gathered yet without gathering them, straight
    from the rollout per minibatch, so padding then sampling costs one gather, not two. Such a
    leaf stands for the rollout's values at padding time: a rollout leaf written in place
    since (its version counter moved) is refused with a ``ValueError`` naming the key when it
    is read. (The counter sees writes made through torch, ``.data`` excluded; a write
    through a NumPy view of the rollout, ``td[key].numpy()[:] = ...``, is not seen: read or
    clone the output before writing the rollout that way.) A leaf that requires grad stays
    pending too, gathered with the grad mode of padding time, so that the sampler gives each
    minibatch its own graph (a ``backward`` per minibatch works). Inference tensors, and
    outputs made in inference mode or under ``torch.compile``, are gathered at once. On CPU
    the gathered leaves are written into memory the padder reuses from its earlier outputs
    once nothing holds them any more (``del`` them or let them go), which spares a large
    rollout the kernel's first touch of fresh pages every update: build the padder once and
    call it every update.

    Refused with a ``ValueError`` naming the key: a tensordict that is padded already
    (``loss_mask`` present), a rollout that already holds ``worker_index``, ``time_index`` or
    ``rollout_steps`` (they would be overwritten, and dropped by ``inv``: exclude them or
    rename the padder's keys with ``keys=RolloutKeys(...)``), an empty rollout (``W = 0`` or
    ``T = 0``: no sequence, and no ``[N, Lp]`` batch could remember ``[W, T]`` for ``inv``),
    non-tensor leaves, meta tensors.

    ``inv`` turns a padded tensordict back into the ``[W, T]`` rollout exactly, from
    ``worker_index`` and ``time_index``, and removes the keys the padder added; a tensordict
    without ``loss_mask`` passes through unchanged (so ``ReplayBuffer.extend`` can store
    rollouts). It needs all the sequences of one rollout, in any order (shuffled, stored in a
    ``ReplayBuffer`` and read back, concatenated from parts): ``[W, T]`` is read off the
    largest indices and checked against ``rollout_steps``, so a subset of the sequences (one
    minibatch, or all but the last worker's, which would look like a smaller rollout),
    sequences of two rollouts of different sizes, or a missing or repeated step is an error.
    It cannot tell apart two rollouts of the same ``[W, T]`` whose sequences were mixed. To
    scatter values of a subset (one minibatch), index a ``[W, T]`` tensor with that subset's
    ``worker_index`` and ``time_index`` where ``loss_mask`` is True.

    Args:
        pad_to: optional fixed ``Lp``; every sequence is padded to it. It must be ``>=`` every
            sequence's length (``sequence_length`` bounds them all), else a ``ValueError``
            names ``pad_to`` and the longest sequence.
        keys: key overrides (also ``set_keys(...)`` after construction).

    ``in_keys`` are ``sequence_id`` and ``sequence_offset``; ``out_keys`` are ``loss_mask``,
    ``worker_index``, ``time_index`` and ``rollout_steps``.

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
        >>> SequencePadder(pad_to=4)(td).batch_size
        torch.Size([3, 4])
    """

    _in_fields = ("sequence_id", "sequence_offset")
    _out_fields = ("loss_mask", "worker_index", "time_index", "rollout_steps")

    def __init__(self, *, pad_to: int | None = None, keys: RolloutKeys | None = None) -> None:
        super().__init__(keys=keys)
        self.pad_to = check_pad_to(pad_to)
        self._pool = OutputPool()

    def _repr_args(self) -> str:
        return f"pad_to={self.pad_to}"

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        layout = SequenceLayout.from_rollout(
            tensordict, self.keys, "SequencePadder", pad_to=self.pad_to
        )
        # from_rollout checked what gather would: the rollout is the layout's, unwritten
        return gather_sequences(layout, tensordict, self.keys, pool=self._pool, lazy=True)

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
        hint = (
            "SequencePadder writes it; inv needs it to check that it has all the sequences of "
            "one rollout."
        )
        mask = get_key(tensordict, keys.loss_mask)
        worker = get_key(tensordict, keys.worker_index, hint=hint)
        time = get_key(tensordict, keys.time_index, hint=hint)
        steps = get_key(tensordict, keys.rollout_steps, hint=hint)
        check_shape(keys.loss_mask, mask, shape)
        check_dtype(keys.loss_mask, mask, torch.bool)
        named = {keys.worker_index: worker, keys.time_index: time, keys.rollout_steps: steps}
        for key, value in named.items():
            check_shape(key, value, shape)
            check_dtype(key, value, torch.int64)
        check_not_meta({keys.loss_mask: mask, **named})
        real = mask.flatten().nonzero().squeeze(1)
        if real.numel() == 0:
            raise ValueError(
                f"SequencePadder.inv got padded sequences without a real step ({keys.loss_mask!r} "
                "is all False); a rollout has at least one"
            )
        w_real, t_real, s_real = (x.flatten().index_select(0, real) for x in named.values())
        num_workers, num_time, low_w, low_t, low_s, high_s, prefix = torch.stack(
            [
                w_real.max() + 1,
                t_real.max() + 1,
                w_real.min(),
                t_real.min(),
                s_real.min(),
                s_real.max(),
                none_true(mask[:, 1:] > mask[:, :-1]).long(),
            ]
        ).tolist()
        if not prefix:
            raise ValueError(
                f"{keys.loss_mask!r} must be a True prefix in every row (padding only at the "
                "end), as SequencePadder writes it"
            )
        if low_s <= 0:
            raise ValueError(
                f"{keys.loss_mask!r} is True where {keys.rollout_steps!r} is {low_s}: a padding "
                "position is marked as a real step"
            )
        if low_w < 0 or low_t < 0:
            raise ValueError(
                f"{keys.worker_index!r} and {keys.time_index!r} must be >= 0 on real steps, got "
                f"minima {low_w} and {low_t}"
            )
        if low_s != high_s:
            raise ValueError(
                "SequencePadder.inv needs all the sequences of one rollout; these come from "
                f"rollouts of different sizes ({keys.rollout_steps!r} holds {low_s} and "
                f"{high_s} steps)"
            )
        num_steps = num_workers * num_time
        dest = (w_real * num_time).add_(t_real)
        # sizes first: bincount's length is only trusted once it is the recorded W * T
        sizes_ok = real.numel() == num_steps == high_s
        if not sizes_ok or not bool((torch.bincount(dest, minlength=num_steps) == 1).all()):
            raise ValueError(
                "SequencePadder.inv needs all the sequences of one rollout, every step once: "
                f"they were padded from a rollout of {high_s} steps ({keys.rollout_steps!r}), "
                f"and these hold {real.numel()} real steps over {torch.unique(dest).numel()} "
                f"distinct (worker, time) pairs within [{num_workers}, {num_time}]. To scatter "
                "values of a subset (one minibatch), index a [W, T] tensor with its "
                "worker_index and time_index where loss_mask is True"
            )
        own = set(keys.index_keys())
        out = TensorDict(batch_size=[num_workers, num_time], device=tensordict.device)
        # nested levels of their own batch dims ([N, Lp, n_agents] -> [W, T, n_agents]),
        # empty ones and tensorclasses (wrapped again once filled)
        groups = sorted(group_dims(tensordict).items(), key=lambda item: len(item[0]))
        for path, group in groups:
            out.set(
                path,
                TensorDict(batch_size=[num_workers, num_time, *group.dims], device=out.device),
            )
        for key, value in tensordict.items(
            include_nested=True, leaves_only=True, is_leaf=is_leaf_nontensor
        ):
            if key in own:
                continue
            check_tensor_leaf(key, value, real.device, ids=repr(keys.loss_mask))
            flat = unpad_rows(value, dest, real, num_steps)
            out.set(key, flat.view(num_workers, num_time, *flat.shape[1:]))
        for path, group in reversed(groups):  # the deepest first
            if group.wrap is not None:
                out.set(path, group.wrap._from_tensordict(out.get(path)))
        return out
