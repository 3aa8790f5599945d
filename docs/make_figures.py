"""Draws the data-layout figure: one ``[W, T]`` rollout cut into padded sequences ``[N, Lp]``.

    python docs/make_figures.py            # writes docs/assets/rollout_to_sequences.png

The layout in the figure is computed by rppo_td itself (EpisodeSplitter, SequenceChunker,
SequencePadder) on a small rollout with hand-placed episode ends, so the picture cannot drift
from what the library does.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Rectangle
from tensordict import TensorDict

import rppo_td

OUT = Path(__file__).parent / "assets" / "rollout_to_sequences.png"
W, T, L = 3, 12, 4
TERMINATED = [(0, 4)]  # (worker, t): the episode truly ended, no bootstrap
TRUNCATED = [(1, 7)]  # (worker, t): time limit, bootstrap from V(o_{t+1})


def make_rollout() -> TensorDict:
    """The rollout of the figure, with ids and offsets already written by the pipeline."""
    terminated = torch.zeros(W, T, 1, dtype=torch.bool)
    truncated = torch.zeros(W, T, 1, dtype=torch.bool)
    for w, t in TERMINATED:
        terminated[w, t] = True
    for w, t in TRUNCATED:
        truncated[w, t] = True
    td = TensorDict(
        {
            "step": torch.arange(T).expand(W, T).clone(),
            "next": {
                "terminated": terminated,
                "truncated": truncated,
                "done": terminated | truncated,
            },
        },
        batch_size=[W, T],
    )
    td = rppo_td.EpisodeSplitter()(td)
    return rppo_td.SequenceChunker(sequence_length=L)(td)


def draw(path: Path) -> None:
    """Draws both panels and writes the PNG."""
    rollout = make_rollout()
    padded = rppo_td.SequencePadder()(rollout)
    episode = rollout["episode_id"]
    sequence = rollout["sequence_id"]
    mask = padded["loss_mask"]
    n, lp = mask.shape
    palette = plt.get_cmap("tab10")

    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(9, 7.5), gridspec_kw={"height_ratios": [W + 1.5, n + 1.5]}
    )

    # ---- top: the [W, T] rollout, coloured by episode, sequence cuts as thick lines ----------
    for w in range(W):
        for t in range(T):
            colour = palette(int(episode[w, t]) % 10)
            top.add_patch(
                Rectangle((t, W - 1 - w), 1, 1, facecolor=colour, alpha=0.55, edgecolor="white")
            )
            top.text(
                t + 0.5,
                W - 0.5 - w,
                f"s{int(sequence[w, t])}",
                ha="center",
                va="center",
                fontsize=8,
            )
            if t > 0 and sequence[w, t] != sequence[w, t - 1]:
                cut_style = "-" if episode[w, t] != episode[w, t - 1] else "--"
                top.plot([t, t], [W - 1 - w, W - w], color="black", lw=2.2, ls=cut_style)
    for w, t in TERMINATED:
        top.text(t + 0.5, W - 1 - w + 0.12, "term.", ha="center", fontsize=7, color="darkred")
    for w, t in TRUNCATED:
        top.text(t + 0.5, W - 1 - w + 0.12, "trunc.", ha="center", fontsize=7, color="darkblue")
    top.set_xlim(0, T)
    top.set_ylim(0, W)
    top.set_yticks([W - 0.5 - w for w in range(W)], [f"worker {w}" for w in range(W)])
    top.set_xticks([t + 0.5 for t in range(T)], [str(t) for t in range(T)])
    top.set_xlabel("time step t")
    top.set_title(
        f"rollout [W={W}, T={T}]: colour = episode, sN = sequence id "
        f"(L={L}; solid cut = episode end, dashed = length cut)",
        fontsize=9,
    )
    top.set_aspect("equal")

    # ---- bottom: the padded [N, Lp] batch, padding hatched ------------------------------------
    worker = padded["worker_index"]
    time = padded["time_index"]
    for i in range(n):
        for j in range(lp):
            y = n - 1 - i
            if mask[i, j]:
                w, t = int(worker[i, j]), int(time[i, j])
                colour = palette(int(episode[w, t]) % 10)
                bottom.add_patch(
                    Rectangle((j, y), 1, 1, facecolor=colour, alpha=0.55, edgecolor="white")
                )
                label = f"w{w} t{t}"
                if j == 0:
                    label += "\nh0"
                bottom.text(j + 0.5, y + 0.5, label, ha="center", va="center", fontsize=7)
            else:
                bottom.add_patch(
                    Rectangle((j, y), 1, 1, facecolor="white", edgecolor="grey", hatch="///")
                )
                bottom.text(
                    j + 0.5, y + 0.5, "pad", ha="center", va="center", fontsize=7, color="grey"
                )
    bottom.set_xlim(0, lp)
    bottom.set_ylim(0, n)
    bottom.set_yticks([n - 0.5 - i for i in range(n)], [f"seq {i}" for i in range(n)])
    bottom.set_xticks([j + 0.5 for j in range(lp)], [str(j) for j in range(lp)])
    bottom.set_xlabel("position in sequence (loss_mask True on coloured cells)")
    bottom.set_title(
        f"padded sequences [N={n}, Lp={lp}]: right-padded; h0 = stored recurrent state "
        "at position 0",
        fontsize=9,
    )
    bottom.set_aspect("equal")

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main() -> None:
    """Parses ``--out`` and draws."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="where to write the PNG")
    args = parser.parse_args()
    draw(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
