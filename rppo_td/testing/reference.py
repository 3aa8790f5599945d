"""Naive, obviously-correct reference implementations: the oracle for every fast path.

``rppo_td.testing.reference``: compare a transform of your own with these loops.

Everything here loops in Python, per worker, per episode fragment, per step, and reads one
number at a time. Nothing is vectorised on purpose: these functions should be checkable by
reading them next to the data-layout docs, and are slow by design. rppo_td's tests compare
its vectorised code with them; its benchmarks use them as the naive baseline.

A rollout is a TensorDict with batch ``[W, T]`` keyed as in ``rppo_td.RolloutKeys``:

- an episode fragment starts at ``t = 0`` of every worker row, after every ``("next", "done")``
  step, and wherever ``is_init`` is True (``done`` defaults to ``terminated | truncated`` when the
  rollout has no ``done`` key);
- a sequence is a run of at most ``L`` consecutive steps of one fragment, cut from its start;
- padded sequences are ``[N, Lp]`` with ``Lp`` the longest sequence, zero padding at the end of
  each row and ``loss_mask`` True on real steps.
"""

from __future__ import annotations

import numbers

import torch
from tensordict import TensorDict, TensorDictBase

from rppo_td import RolloutKeys
from rppo_td._validation import check_sequence_length

__all__ = [
    "reference_chunk_ids",
    "reference_done",
    "reference_episode_ids",
    "reference_episodic_novelty",
    "reference_fragments",
    "reference_gae",
    "reference_minibatch_sizes",
    "reference_monte_carlo_returns",
    "reference_pad",
    "reference_segment_sum",
    "reference_sequences",
    "reference_unpad",
]

Step = tuple[int, int]
"""A rollout step ``(worker, time)``."""

DEFAULT_KEYS = RolloutKeys()


def _flag_rows(td: TensorDictBase, key) -> list[list[bool]]:
    """A ``[W, T, 1]`` bool key as nested Python lists ``[W][T]``."""
    return [[bool(v) for v in row] for row in td.get(key).reshape(td.batch_size).tolist()]


def reference_done(rollout: TensorDictBase, keys: RolloutKeys = DEFAULT_KEYS) -> list[list[bool]]:
    """``done[w][t]``: the rollout's ``done`` key, or ``terminated | truncated`` without it."""
    if rollout.get(keys.done, None) is not None:
        return _flag_rows(rollout, keys.done)
    terminated = _flag_rows(rollout, keys.terminated)
    truncated = _flag_rows(rollout, keys.truncated)
    return [
        [term or trunc for term, trunc in zip(term_row, trunc_row, strict=True)]
        for term_row, trunc_row in zip(terminated, truncated, strict=True)
    ]


def reference_fragments(
    rollout: TensorDictBase, keys: RolloutKeys = DEFAULT_KEYS
) -> list[list[Step]]:
    """Episode fragments in row-major order, each the list of its steps in time order."""
    num_workers, num_steps = rollout.batch_size
    done = reference_done(rollout, keys)
    is_init = (
        _flag_rows(rollout, keys.is_init) if rollout.get(keys.is_init, None) is not None else None
    )
    fragments: list[list[Step]] = []
    for w in range(num_workers):
        for t in range(num_steps):
            starts_new = t == 0 or done[w][t - 1] or (is_init is not None and is_init[w][t])
            if starts_new:
                fragments.append([])
            fragments[-1].append((w, t))
    return fragments


def reference_episode_ids(
    rollout: TensorDictBase, keys: RolloutKeys = DEFAULT_KEYS
) -> torch.Tensor:
    """``[W, T]`` int64: the number of each step's fragment, counted row-major from 0."""
    ids = torch.zeros(tuple(rollout.batch_size), dtype=torch.int64)
    for number, fragment in enumerate(reference_fragments(rollout, keys)):
        for w, t in fragment:
            ids[w, t] = number
    return ids


def reference_sequences(
    rollout: TensorDictBase, sequence_length: int | None, keys: RolloutKeys = DEFAULT_KEYS
) -> list[list[Step]]:
    """Sequences in row-major order: each fragment cut into runs of ``sequence_length`` steps.

    ``sequence_length=None`` keeps whole fragments. The last run of a fragment may be shorter.
    Anything but an int ``>= 1`` or None is refused (``ValueError``), as ``SequenceChunker``
    refuses it.
    """
    check_sequence_length(sequence_length)
    sequences: list[list[Step]] = []
    for fragment in reference_fragments(rollout, keys):
        current: list[Step] = []
        for step in fragment:
            if sequence_length is not None and len(current) == sequence_length:
                sequences.append(current)
                current = []
            current.append(step)
        sequences.append(current)
    return sequences


def reference_chunk_ids(
    rollout: TensorDictBase, sequence_length: int | None, keys: RolloutKeys = DEFAULT_KEYS
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sequence_id, sequence_offset)``, each ``[W, T]`` int64, from ``reference_sequences``."""
    shape = tuple(rollout.batch_size)
    sequence_id = torch.zeros(shape, dtype=torch.int64)
    offset = torch.zeros(shape, dtype=torch.int64)
    for number, sequence in enumerate(reference_sequences(rollout, sequence_length, keys)):
        for position, (w, t) in enumerate(sequence):
            sequence_id[w, t] = number
            offset[w, t] = position
    return sequence_id, offset


def reference_pad(
    rollout: TensorDictBase,
    sequence_length: int | None,
    keys: RolloutKeys = DEFAULT_KEYS,
    *,
    pad_to: int | None = None,
) -> TensorDict:
    """Every tensor leaf of ``rollout`` regrouped into right-padded sequences ``[N, Lp]``.

    ``Lp`` is the longest sequence, or ``pad_to`` when given (a ``ValueError`` if a sequence
    is longer). Padding is zero for every key; adds ``loss_mask`` (True on real steps),
    ``worker_index`` and ``time_index`` (the step's place in the rollout, 0 on padding).
    """
    sequences = reference_sequences(rollout, sequence_length, keys)
    if not sequences:  # as SequencePadder, which has no [0, Lp] to give either
        raise ValueError(
            f"reference_pad got an empty rollout (batch size {list(rollout.batch_size)}): "
            "it holds no sequence"
        )
    num_sequences = len(sequences)
    padded_length = max(len(sequence) for sequence in sequences)
    if pad_to is not None:
        if pad_to < padded_length:
            raise ValueError(f"pad_to={pad_to} is shorter than a sequence of {padded_length}")
        padded_length = pad_to
    shape = (num_sequences, padded_length)
    out = TensorDict(batch_size=shape)
    for key, value in rollout.items(include_nested=True, leaves_only=True):
        target = torch.zeros(shape + tuple(value.shape[2:]), dtype=value.dtype)
        for n, sequence in enumerate(sequences):
            for i, (w, t) in enumerate(sequence):
                target[n, i] = value[w, t]
        out.set(key, target)
    mask = torch.zeros(shape, dtype=torch.bool)
    worker = torch.zeros(shape, dtype=torch.int64)
    time = torch.zeros(shape, dtype=torch.int64)
    for n, sequence in enumerate(sequences):
        for i, (w, t) in enumerate(sequence):
            mask[n, i] = True
            worker[n, i] = w
            time[n, i] = t
    out.set(keys.loss_mask, mask)
    out.set(keys.worker_index, worker)
    out.set(keys.time_index, time)
    return out


def reference_unpad(padded: TensorDictBase, keys: RolloutKeys = DEFAULT_KEYS) -> TensorDict:
    """Puts every real step of ``[N, Lp]`` padded sequences back at its ``(worker, time)``.

    Drops ``loss_mask``, ``worker_index`` and ``time_index``; the rollout's size is read from the
    largest indices.
    """
    mask = padded.get(keys.loss_mask).tolist()
    worker = padded.get(keys.worker_index).tolist()
    time = padded.get(keys.time_index).tolist()
    places = [
        (n, i, worker[n][i], time[n][i])
        for n in range(len(mask))
        for i in range(len(mask[n]))
        if mask[n][i]
    ]
    num_workers = max(w for _, _, w, _ in places) + 1
    num_steps = max(t for _, _, _, t in places) + 1
    out = TensorDict(batch_size=(num_workers, num_steps))
    own = set(keys.index_keys())
    for key, value in padded.items(include_nested=True, leaves_only=True):
        if key in own:
            continue
        target = torch.zeros((num_workers, num_steps, *value.shape[2:]), dtype=value.dtype)
        for n, i, w, t in places:
            target[w, t] = value[n, i]
        out.set(key, target)
    return out


def reference_gae(
    rollout: TensorDictBase, gamma: float, lmbda: float, keys: RolloutKeys = DEFAULT_KEYS
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE by the textbook reverse loop, per worker, in float64.

    For ``t = T-1, ..., 0``::

        next_value = 0 if terminated[t] else next_state_value[t]
        delta      = reward[t] + gamma * next_value - state_value[t]
        A[t]       = delta                                  if done[t] or t == T-1
                                                            or is_init[t + 1]
                   = delta + gamma * lmbda * A[t + 1]       otherwise

    so a truncated step (and the rollout's last step) bootstraps from ``next_state_value`` and a
    terminated one does not; no sum crosses an episode end, whether ``done`` or (when the
    rollout has it) ``is_init`` marks it, as in ``reference_episode_ids``.

    Returns:
        ``(advantage, value_target)``, each ``[W, T, 1]`` float64.
    """
    num_workers, num_steps = rollout.batch_size
    reward = rollout.get(keys.reward).reshape(num_workers, num_steps).tolist()
    value = rollout.get(keys.state_value).reshape(num_workers, num_steps).tolist()
    next_value = rollout.get(keys.next_state_value).reshape(num_workers, num_steps).tolist()
    terminated = _flag_rows(rollout, keys.terminated)
    done = reference_done(rollout, keys)
    has_init = rollout.get(keys.is_init, None) is not None
    is_init = _flag_rows(rollout, keys.is_init) if has_init else None
    advantage = torch.zeros(num_workers, num_steps, 1, dtype=torch.float64)
    for w in range(num_workers):
        following = 0.0
        for t in reversed(range(num_steps)):
            bootstrap = 0.0 if terminated[w][t] else next_value[w][t]
            delta = reward[w][t] + gamma * bootstrap - value[w][t]
            last = t == num_steps - 1
            if done[w][t] or last or (is_init is not None and is_init[w][t + 1]):
                following = delta
            else:
                following = delta + gamma * lmbda * following
            advantage[w, t, 0] = following
    # reshaped, not unsqueezed: a W = 0 rollout's [] list has lost its T
    state_value = torch.tensor(value, dtype=torch.float64).reshape(num_workers, num_steps, 1)
    return advantage, advantage + state_value


def reference_monte_carlo_returns(
    rollout: TensorDictBase, gamma: float, keys: RolloutKeys = DEFAULT_KEYS
) -> torch.Tensor:
    """Discounted returns to the end of each fragment, by a forward sum per step, float64.

    ``G[t] = sum_{k=t}^{e} gamma**(k-t) * reward[k] + gamma**(e-t+1) * bootstrap`` where ``e`` is
    the last step of ``t``'s fragment in this rollout and ``bootstrap`` is 0 if ``e`` is
    terminated, else ``next_state_value[e]``.

    Returns:
        ``[W, T, 1]`` float64.
    """
    num_workers, num_steps = rollout.batch_size
    reward = rollout.get(keys.reward).reshape(num_workers, num_steps).tolist()
    next_value = rollout.get(keys.next_state_value).reshape(num_workers, num_steps).tolist()
    terminated = _flag_rows(rollout, keys.terminated)
    done = reference_done(rollout, keys)
    returns = torch.zeros(num_workers, num_steps, 1, dtype=torch.float64)
    for w in range(num_workers):
        for t in range(num_steps):
            total, discount, k = 0.0, 1.0, t
            while True:
                total += discount * reward[w][k]
                discount *= gamma
                if done[w][k] or k == num_steps - 1:
                    break
                k += 1
            if not terminated[w][k]:
                total += discount * next_value[w][k]
            returns[w, t, 0] = total
    return returns


def reference_segment_sum(x: list[float], carry_on: list[bool], decay: float) -> list[float]:
    """``y[t] = x[t] + decay * carry_on[t] * y[t + 1]`` with ``y[T] = 0``, one step at a time."""
    y = [0.0] * len(x)
    following = 0.0
    for t in reversed(range(len(x))):
        following = x[t] + (decay * following if carry_on[t] else 0.0)
        y[t] = following
    return y


def reference_minibatch_sizes(lengths: list[int], num_minibatches: int) -> list[int]:
    """Sequences per minibatch when ``lengths`` (in the shuffled order) are cut by real steps.

    Cut ``k`` (of ``0..M``) goes where the running step count is nearest to ``k * S / M``:
    between the last count below that target and the first count at or above it, the nearer
    one (a tie: the later). Then every group gets at least one sequence: each cut is moved
    past the one before it, and before the point where the groups after it would run out.

    ``num_minibatches`` must be an int in ``[1, len(lengths)]`` (else a ``ValueError``, as
    ``balanced_minibatches`` gives).
    """
    n, m = len(lengths), num_minibatches
    if isinstance(m, bool) or not isinstance(m, numbers.Integral) or not 1 <= m <= n:
        raise ValueError(
            f"num_minibatches must be an int in [1, {n}] (the number of sequences), got {m!r}"
        )
    m = int(m)  # numpy's integers too, as balanced_minibatches takes them
    counts = [0]
    for length in lengths:
        counts.append(counts[-1] + length)
    cuts = []
    for k in range(m + 1):
        target = k * counts[-1] / m
        first_at_or_above = n
        for i in range(1, n + 1):
            if counts[i] >= target:
                first_at_or_above = i
                break
        last_below = first_at_or_above - 1
        nearer_below = target - counts[last_below] < counts[first_at_or_above] - target
        cuts.append(last_below if nearer_below else first_at_or_above)
    for k in range(1, m + 1):
        if cuts[k] <= cuts[k - 1]:
            cuts[k] = cuts[k - 1] + 1
    for k in range(m + 1):
        if cuts[k] > n - (m - k):
            cuts[k] = n - (m - k)
    cuts[0], cuts[m] = 0, n
    return [cuts[k + 1] - cuts[k] for k in range(m)]


def reference_episodic_novelty(
    rollouts: list[TensorDictBase],
    observation_keys: tuple = ("observation",),
    keys: RolloutKeys = DEFAULT_KEYS,
) -> list[list[list[bool]]]:
    """``novel[r][w][t]`` over consecutive rollouts of the same workers, with a set per worker.

    A step is novel when the observation after it (the ``("next", key)`` leaves together) is
    not among its episode's observations so far, byte for byte. An episode starts at the
    first rollout's first step, after a ``done`` step (in this rollout or at the end of the
    previous one) and wherever ``is_init`` is True; its first observation is the root leaves'.
    """

    def view(td: TensorDictBase, root: bool, w: int, t: int) -> bytes:
        parts = []
        for key in observation_keys:
            path = key if isinstance(key, tuple) else (key,)
            value = td.get(path if root else ("next", *path))[w, t]
            parts.append(value.contiguous().numpy().tobytes())
        return b"|".join(parts)

    out: list[list[list[bool]]] = []
    seen: list[set[bytes]] = []
    ended: list[bool] = []
    for index, td in enumerate(rollouts):
        num_workers, num_steps = td.batch_size
        if index == 0:
            seen = [set() for _ in range(num_workers)]
            ended = [True] * num_workers
        done = reference_done(td, keys)
        is_init = _flag_rows(td, keys.is_init) if td.get(keys.is_init, None) is not None else None
        novel = [[False] * num_steps for _ in range(num_workers)]
        for w in range(num_workers):
            for t in range(num_steps):
                new = ended[w] if t == 0 else done[w][t - 1]
                if new or (is_init is not None and is_init[w][t]):
                    seen[w] = {view(td, True, w, t)}
                key = view(td, False, w, t)
                novel[w][t] = key not in seen[w]
                seen[w].add(key)
            if num_steps:
                ended[w] = done[w][num_steps - 1]
        out.append(novel)
    return out
