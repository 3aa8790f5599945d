"""Recurrent forward + backward over one epoch of minibatches: padded batch vs packed sequences.

The minibatches come from rppo_td's pipeline on a vector-observation rollout (see
``_common.PIPELINE_SHAPES``), so they hold right-padded sequences ``[B, Lp]`` with a
``loss_mask`` and the stored recurrent state at position 0. A small recurrent actor-critic
(linear encoder, one LSTM or GRU layer, policy and value heads) runs over each minibatch from
that stored state, and a masked loss (action negative log-likelihood plus value error over real
steps only) is backpropagated:

- ``padded``: the RNN runs over the whole ``[B, Lp]`` batch, padding included; the mask drops
  the padded outputs from the loss.
- ``packed``: ``torch.nn.utils.rnn.pack_padded_sequence`` (``enforce_sorted=False``), so the RNN
  never steps over padding, then ``pad_packed_sequence`` back to ``[B, Lp]`` for the heads.

Both give the same loss and gradients (checked); the faster one is what a trainer should use.
Times are medians of interleaved repeats of one whole epoch (forward, backward, zeroing the
gradients; no optimiser step, which is the same for both).

    python benchmarks/update.py
    python benchmarks/update.py --quick
"""

from __future__ import annotations

import argparse

import torch
from _common import (
    PIPELINE_SHAPES,
    QUICK_SHAPES,
    RolloutShape,
    at_least,
    format_seconds,
    make_rollout,
    print_table,
    results_name,
    shape_dict,
    time_interleaved,
    write_json,
)
from tensordict import TensorDictBase
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from rppo_td import GAE, EpisodeSplitter, SequenceChunker, SequenceSampler


class RecurrentActorCritic(nn.Module):
    """Encoder -> LSTM/GRU -> policy logits and value, over ``[B, Lp]`` sequences."""

    def __init__(self, observation_size: int, hidden: int, rnn: str, actions: int = 2) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(observation_size, hidden), nn.Tanh())
        rnn_class = nn.LSTM if rnn == "lstm" else nn.GRU
        self.rnn = rnn_class(hidden, hidden, batch_first=True)
        self.is_lstm = rnn == "lstm"
        self.policy = nn.Linear(hidden, actions)
        self.value = nn.Linear(hidden, 1)

    def initial_state(self, mb: TensorDictBase):
        # [B, Lp, layers, H] stored state -> position 0 -> [layers, B, H]
        h = mb.get("recurrent_state_h")[:, 0].transpose(0, 1).contiguous()
        if not self.is_lstm:
            return h
        return h, mb.get("recurrent_state_c")[:, 0].transpose(0, 1).contiguous()

    def forward(self, mb: TensorDictBase, packed: bool) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.encoder(mb.get("observation"))
        state = self.initial_state(mb)
        if packed:
            lengths = mb.get("loss_mask").sum(-1).cpu()
            sequence = pack_padded_sequence(
                features, lengths, batch_first=True, enforce_sorted=False
            )
            out, _ = self.rnn(sequence, state)
            out, _ = pad_packed_sequence(out, batch_first=True, total_length=features.shape[1])
        else:
            out, _ = self.rnn(features, state)
        return self.policy(out), self.value(out)


def masked_loss(model: RecurrentActorCritic, mb: TensorDictBase, packed: bool) -> torch.Tensor:
    """Action NLL plus value error, averaged over real steps only."""
    logits, value = model(mb, packed)
    mask = mb.get("loss_mask")
    nll = -logits.log_softmax(-1).gather(-1, mb.get("action").unsqueeze(-1)).squeeze(-1)
    value_error = (value - mb.get("value_target")).squeeze(-1).square()
    return ((nll + value_error) * mask).sum() / mask.sum()


def epoch(model: RecurrentActorCritic, minibatches: list, packed: bool) -> float:
    """Forward and backward over every minibatch; returns the summed loss."""
    total = 0.0
    for mb in minibatches:
        model.zero_grad(set_to_none=True)
        loss = masked_loss(model, mb, packed)
        loss.backward()
        total += float(loss.detach())
    return total


def minibatches_for(shape: RolloutShape) -> list:
    """One epoch of rppo_td minibatches of a vector rollout of this shape."""
    td = make_rollout(shape)
    td = GAE(gamma=0.99, lmbda=0.95)(td)
    td = SequenceChunker(sequence_length=shape.sequence_length)(EpisodeSplitter()(td))
    sampler = SequenceSampler(shape.num_minibatches, generator=torch.Generator().manual_seed(0))
    return list(sampler(td))


def same_gradients(model: RecurrentActorCritic, minibatches: list) -> float:
    """Largest difference between the padded and the packed gradients of one minibatch."""
    grads = []
    for packed in (False, True):
        model.zero_grad(set_to_none=True)
        masked_loss(model, minibatches[0], packed).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    return max(float((a - b).abs().max()) for a, b in zip(*grads, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, one repeat")
    parser.add_argument(
        "--repeats", type=at_least(1), default=None, help="timed repeats (default 3)"
    )
    parser.add_argument("--threads", type=at_least(1), default=None, help="torch.set_num_threads")
    parser.add_argument(
        "--output", type=results_name, default=None, help="JSON name under benchmarks/results/"
    )
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    shapes = [
        s for s in (QUICK_SHAPES if args.quick else PIPELINE_SHAPES) if s.observation == "vector"
    ]

    results = []
    for shape in shapes:
        print(f"{shape.name} ...", flush=True)
        torch.manual_seed(0)
        minibatches = minibatches_for(shape)
        model = RecurrentActorCritic(4, shape.hidden, shape.rnn)
        error = same_gradients(model, minibatches)
        times = time_interleaved(
            {
                "padded": lambda m=minibatches, md=model: epoch(md, m, packed=False),
                "packed": lambda m=minibatches, md=model: epoch(md, m, packed=True),
            },
            repeats=repeats,
        )
        real = sum(int(mb.get("loss_mask").sum()) for mb in minibatches)
        positions = sum(mb.numel() for mb in minibatches)
        faster = min(times, key=lambda n: times[n]["median"])
        results.append(
            {
                "shape": shape_dict(shape),
                "times": times,
                "padding_fraction": 1 - real / positions,
                "max_abs_grad_difference": error,
                "packed / padded": times["packed"]["median"] / times["padded"]["median"],
                "faster": faster,
            }
        )

    print("\nMedian time of forward + backward over one epoch of minibatches")
    rows = [
        [
            r["shape"]["name"],
            f"{r['padding_fraction']:.1%}",
            format_seconds(r["times"]["padded"]["median"]),
            format_seconds(r["times"]["packed"]["median"]),
            f"{r['packed / padded']:.2f}x",
            r["faster"],
            f"{r['max_abs_grad_difference']:.1e}",
        ]
        for r in results
    ]
    print_table(
        ["shape", "padding", "padded", "packed", "packed / padded", "faster", "max |grad diff|"],
        rows,
    )
    name = args.output or ("update_quick" if args.quick else "update")
    path = write_json(name, {"repeats": repeats, "results": results})
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
