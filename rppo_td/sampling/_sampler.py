"""SequenceSampler: one epoch of whole-sequence minibatches."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import torch
from tensordict import TensorDictBase

from rppo_td._keys import DEFAULT_KEYS, RolloutKeys
from rppo_td._layout import SequenceLayout, gather_sequences
from rppo_td._validation import (
    check_balance,
    check_dtype,
    check_generator,
    check_not_meta,
    check_pad_to,
    check_shape,
    get_key,
    none_true,
)
from rppo_td.functional import plan_minibatches

__all__ = ["SequenceSampler"]

Balance = Literal["steps", "sequences"]


def check_minibatch_args(
    num_minibatches: int, balance: str, generator: torch.Generator | None = None
) -> None:
    """Constructor checks shared by both samplers."""
    if isinstance(num_minibatches, bool) or not isinstance(num_minibatches, int):
        raise ValueError(f"num_minibatches must be an int, got {num_minibatches!r}")
    if num_minibatches < 1:
        raise ValueError(f"num_minibatches must be >= 1, got {num_minibatches}")
    check_balance(balance)
    check_generator(generator)


def mask_conditions(
    key: object, lengths: torch.Tensor, mask: torch.Tensor
) -> list[tuple[torch.Tensor, str]]:
    """``plan_minibatches`` conditions on stored ``[N, Lp]`` bool ``loss_mask``.

    Every row is a sequence: at least one real step, and a True prefix (padding only at the
    end), as ``SequencePadder`` writes it.
    """
    return [
        (
            none_true(lengths <= 0),
            f"{key!r} has a row without a real step (all False); every row must be a sequence "
            "of at least one step",
        ),
        (
            none_true(mask[:, 1:] > mask[:, :-1]),
            f"{key!r} must be a True prefix in every row (padding only at the end), as "
            "SequencePadder writes it",
        ),
    ]


class SequenceSampler:
    """Yields one epoch of minibatches made of whole sequences.

    ``for mb in sampler(td)`` yields ``num_minibatches`` tensordicts of batch ``[B_i, Lp]``;
    every sequence appears in exactly one of them, in an order drawn from ``generator``.
    With ``balance="steps"`` (default) the minibatches hold equal numbers of *real* steps, give
    or take one sequence at each cut; ``balance="sequences"`` splits by sequence count instead.

    ``td`` is either padded sequences ``[N, Lp]`` (``SequencePadder``'s output, with
    ``loss_mask``), indexed per minibatch, or a chunked ``[W, T]`` rollout (``sequence_id`` and
    ``sequence_offset`` from ``SequenceChunker``, no ``loss_mask``): then each minibatch is
    gathered straight from the rollout and no padded copy of the whole rollout is made.
    Both give the same minibatches for the same generator state.

    With ``reuse_memory=True`` (rollout input only) all minibatches of one epoch are written into
    one buffer sized for the largest: no fresh memory per minibatch, whose first touch costs as
    much as the gather itself on large rollouts. Each minibatch is then overwritten by the next:
    use it (forward and backward) or clone it before asking for the next one. A graph that still
    needs an overwritten minibatch fails loudly in ``backward`` (autograd's in-place check).

    Refused with a ``ValueError`` naming the key or argument: more minibatches than sequences;
    padded input whose ``loss_mask`` has a row with no real step or is not a True prefix (read
    in the sync that plans the epoch); a rollout that is empty or already holds a key the
    gather writes (``worker_index``, ``time_index``, ``rollout_steps``; see
    ``SequencePadder``); a ``generator`` that is not a ``torch.Generator`` (``TypeError``).

    Args:
        num_minibatches: ``M >= 1``; at most the number of sequences.
        generator: a ``torch.Generator`` (CPU or the data's device), the source of the order;
            None uses torch's global one.
        balance: ``"steps"`` or ``"sequences"``.
        reuse_memory: write every minibatch of an epoch into the same buffer (see above).
        pad_to: optional fixed ``Lp`` for rollout input, as ``SequencePadder(pad_to=...)``:
            minibatches are ``[B, pad_to]``, the same as sampling
            ``SequencePadder(pad_to=pad_to)``'s output. Padded input must then already be
            ``[N, pad_to]`` (else a ``ValueError`` names ``pad_to``).
        keys: key overrides.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]).bool()
        >>> padded = TensorDict({"loss_mask": mask}, batch_size=[4, 4])
        >>> sampler = SequenceSampler(num_minibatches=2, generator=torch.Generator().manual_seed(0))
        >>> [(tuple(mb.batch_size), int(mb["loss_mask"].sum())) for mb in sampler(padded)]
        [((2, 4), 5), ((2, 4), 5)]
    """

    def __init__(
        self,
        num_minibatches: int,
        *,
        generator: torch.Generator | None = None,
        balance: Balance = "steps",
        reuse_memory: bool = False,
        pad_to: int | None = None,
        keys: RolloutKeys | None = None,
    ) -> None:
        check_minibatch_args(num_minibatches, balance, generator)
        check_pad_to(pad_to)
        self.pad_to = pad_to
        self.num_minibatches = num_minibatches
        self.generator = generator
        self.balance: Balance = balance
        self.reuse_memory = bool(reuse_memory)
        self.keys = keys if keys is not None else DEFAULT_KEYS

    def __call__(self, td: TensorDictBase) -> Iterator[TensorDictBase]:
        """Yields the minibatches of one epoch over ``td`` (see the class docstring)."""
        if td.get(self.keys.loss_mask, None) is not None:
            return self._from_padded(td)
        return self._from_rollout(td)

    def _groups(
        self, lengths: torch.Tensor, require: list[tuple[torch.Tensor, str]] | None = None
    ) -> list[torch.Tensor]:
        if self.num_minibatches > lengths.shape[0]:
            raise ValueError(
                f"num_minibatches={self.num_minibatches} exceeds the {lengths.shape[0]} "
                "sequences available"
            )
        return plan_minibatches(
            lengths,
            self.num_minibatches,
            generator=self.generator,
            balance=self.balance,
            require=require or (),
        )

    def _from_padded(self, td: TensorDictBase) -> Iterator[TensorDictBase]:
        if td.batch_dims != 2:
            raise ValueError(
                "SequenceSampler expects padded sequences with batch dims [N, Lp], got batch "
                f"size {list(td.batch_size)}"
            )
        if self.pad_to is not None and td.batch_size[1] != self.pad_to:
            raise ValueError(
                f"SequenceSampler(pad_to={self.pad_to}) got padded sequences of length "
                f"{td.batch_size[1]} (batch size {list(td.batch_size)}): pad them with "
                f"SequencePadder(pad_to={self.pad_to}), or give the sampler the chunked rollout"
            )
        mask = get_key(td, self.keys.loss_mask)
        check_shape(self.keys.loss_mask, mask, td.batch_size)
        check_dtype(self.keys.loss_mask, mask, torch.bool)
        check_not_meta({self.keys.loss_mask: mask})
        lengths = mask.sum(-1)
        groups = self._groups(lengths, mask_conditions(self.keys.loss_mask, lengths, mask))
        return (td[index] for index in groups)

    def _from_rollout(self, td: TensorDictBase) -> Iterator[TensorDictBase]:
        layout = SequenceLayout.from_rollout(td, self.keys, "SequenceSampler", pad_to=self.pad_to)
        groups = self._groups(layout.lengths())
        # the groups are the plan's own: in range, so gather_sequences skips the index check
        if not self.reuse_memory:
            return (gather_sequences(layout, td, self.keys, index) for index in groups)
        buffer = layout.empty_buffer(td, max(index.numel() for index in groups))
        return (gather_sequences(layout, td, self.keys, index, out=buffer) for index in groups)
