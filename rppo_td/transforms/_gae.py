"""GAE as a TorchRL transform over ``[W, T]`` rollouts."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase, unravel_key
from tensordict.nn import TensorDictModuleBase

from rppo_td._keys import RolloutKeys, as_path
from rppo_td._validation import (
    MissingKeyError,
    check_dtype,
    check_not_padded,
    check_not_split_trajs,
    check_unit_interval,
    check_value_network,
    get_key,
    rollout_shape,
)
from rppo_td._values import episode_ends, network_values
from rppo_td.functional import check_gae_inputs, gae_unchecked
from rppo_td.transforms._base import RolloutTransform

__all__ = ["GAE"]


class GAE(RolloutTransform):
    """Writes ``advantage`` and ``value_target`` into a ``[W, T]`` rollout.

    Batch ``[W, T] -> [W, T]``; adds ``advantage`` and ``value_target`` (``[W, T, 1]``, the
    dtype of ``state_value``) in place and returns the same tensordict. Runs on the whole
    rollout, before chunking, so sequence cuts never change an advantage.

    The recursion is ``functional.generalized_advantage_estimate``'s: it bootstraps from
    ``("next", "state_value")`` where a step is truncated and at the rollout's last step, never
    where it is terminated. ``done`` is read from ``("next", "done")`` when present, else
    ``terminated | truncated``. With a ``done`` key, ``terminated`` must imply it, and when
    ``truncated`` is present too ``done`` must equal ``terminated | truncated`` (checked in
    the one device synchronisation of the entry checks; ``EpisodeSplitter`` checks the same,
    so both see the same episode ends). Where the rollout has ``is_init``, a step it marks as an
    episode's first also ends the episode before it, as in ``EpisodeSplitter``, even without a
    ``done`` there (a collector that resets at each batch): that cut bootstraps from
    ``("next", "state_value")``, as a truncation does. ``advantage`` and ``value_target``
    never carry gradients, even if the values do. A ``[W, 0]`` or ``[0, T]`` rollout gets empty
    keys.

    Refused with a ``ValueError`` or ``KeyError`` naming the key: padded sequences (a
    ``loss_mask`` is present: GAE over ``[N, Lp]`` would cut at every sequence end and depend
    on ``L``), TorchRL's own padded trajectories (``Collector(split_trajs=True)``:
    ``("collector", "mask")`` is present, and its padding would count as real steps), wrong
    shapes or dtypes, NaN or inf in rewards and values, ``done`` that is not
    ``terminated | truncated``, meta tensors, a rollout whose ``is_init`` shows it is
    ``[T, W]`` (as ``EpisodeSplitter`` refuses it).

    Args:
        gamma: discount in ``[0, 1]``.
        lmbda: GAE lambda in ``[0, 1]``.
        value_network: optional TensorDict module writing ``state_value``, called (without
            gradients) when ``state_value`` or ``("next", "state_value")`` is missing, and
            only the missing one is written. It runs on a selection of its ``in_keys`` of the
            rollout and of ``rollout["next"]``, so its by-products (an LSTM's
            ``("next", "recurrent_state_h")``) never overwrite the rollout. TorchRL's
            ``LSTMModule`` / ``GRUModule`` are evaluated as
            [`GAEEstimator`][rppo_td.GAEEstimator] evaluates them (the same code): outside
            recurrent mode every step from its stored state; inside
            ``set_recurrent_mode(True)`` each row as a sequence split at ``is_init``, and
            ``rollout["next"]`` split at the root's ``is_init`` too, so it never runs across
            a reset.
        keys: key overrides (also ``set_keys(...)`` after construction).

    ``in_keys`` are ``reward``, ``state_value``, ``next_state_value``, ``terminated``,
    ``done``, ``truncated`` (``done`` or ``truncated`` may be missing, not both) and
    ``is_init`` (optional: a start it marks without a ``done`` before it cuts there too);
    ``out_keys`` are ``advantage`` and ``value_target``. With a ``value_network``, the
    network's ``in_keys`` (of the rollout and of ``"next"``) are ``in_keys`` too, and
    ``state_value`` and ``next_state_value``, which it may write, are ``out_keys``.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> W, T = 2, 4
        >>> td = TensorDict({
        ...     "state_value": torch.zeros(W, T, 1),
        ...     "next": {"reward": torch.ones(W, T, 1), "state_value": torch.zeros(W, T, 1),
        ...              "terminated": torch.zeros(W, T, 1, dtype=torch.bool),
        ...              "done": torch.zeros(W, T, 1, dtype=torch.bool)},
        ... }, batch_size=[W, T])
        >>> td = GAE(gamma=0.5, lmbda=1.0)(td)
        >>> td["advantage"].shape, td["advantage"][0, :, 0]
        (torch.Size([2, 4, 1]), tensor([1.8750, 1.7500, 1.5000, 1.0000]))
    """

    _in_fields = (
        "reward",
        "state_value",
        "next_state_value",
        "terminated",
        "done",
        "truncated",
        "is_init",
    )
    _out_fields = ("advantage", "value_target")

    def __init__(
        self,
        *,
        gamma: float,
        lmbda: float,
        value_network: TensorDictModuleBase | None = None,
        keys: RolloutKeys | None = None,
    ) -> None:
        super().__init__(keys=keys)
        check_value_network(value_network)
        check_unit_interval("gamma", gamma)
        check_unit_interval("lmbda", lmbda)
        self.gamma = float(gamma)
        self.lmbda = float(lmbda)
        self.value_network = value_network
        self._follow(self.keys)  # the network's keys listed too

    def _follow(self, keys: RolloutKeys) -> None:
        super()._follow(keys)
        network = getattr(self, "value_network", None)
        if network is None:
            return
        # what the network reads, of the rollout and of "next"; the values it may write
        read = [unravel_key(key) for key in getattr(network, "in_keys", [])]
        read += [unravel_key(("next", key)) for key in read]
        in_keys = list(dict.fromkeys([*self.in_keys, *read]))
        out_keys = [*self.out_keys, keys.state_value, keys.next_state_value]
        self._list_keys(in_keys, out_keys)

    def _repr_args(self) -> str:
        return f"gamma={self.gamma}, lmbda={self.lmbda}"

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        keys = self.keys
        rollout_shape(tensordict, "GAE")
        self._check_takes_outputs(tensordict)
        check_not_padded(tensordict, keys.loss_mask, "GAE")
        check_not_split_trajs(tensordict, "GAE")
        self._fill_values(tensordict)
        reward = get_key(tensordict, keys.reward)
        value = get_key(tensordict, keys.state_value)
        next_value = get_key(tensordict, keys.next_state_value)
        terminated = get_key(tensordict, keys.terminated)
        done, truncated = self._done(tensordict, terminated)
        expected = (*tensordict.batch_size, 1)
        if tuple(reward.shape) != expected:
            per_agent = reward.ndim > 3 and tuple(reward.shape[:2]) == expected[:2]
            raise ValueError(
                f"{keys.reward!r} must have shape {list(expected)}, got {list(reward.shape)}"
                + (
                    ": GAE computes one advantage per step, from one reward per step (per-agent "
                    "rewards: give it a team reward, their sum for instance)"
                    if per_agent
                    else ""
                )
            )
        check_gae_inputs(
            {
                keys.reward: reward,
                keys.state_value: value,
                keys.next_state_value: next_value,
                keys.terminated: terminated,
                keys.done: done,
            },
            gamma=self.gamma,
            lmbda=self.lmbda,
            truncated=None if truncated is None else (keys.truncated, truncated),
        )
        # an episode that is_init starts without a done before it ends there too
        ends = episode_ends(done, tensordict, keys.is_init, tensordict.batch_dims - 1, keys.done)
        advantage, target = gae_unchecked(
            reward, value, next_value, terminated, ends, gamma=self.gamma, lmbda=self.lmbda
        )
        for key in (keys.advantage, keys.value_target):
            self._check_writable(tensordict, key, tuple(advantage.shape), advantage.dtype)
        tensordict.set(keys.advantage, advantage)
        tensordict.set(keys.value_target, target)
        return tensordict

    def _done(
        self, tensordict: TensorDictBase, terminated: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``done`` and, when it is read from its key, ``truncated`` to check against it."""
        keys = self.keys
        if tensordict.get(keys.done, None) is not None:
            done = get_key(tensordict, keys.done)
            has_truncated = tensordict.get(keys.truncated, None) is not None
            return done, get_key(tensordict, keys.truncated) if has_truncated else None
        truncated = tensordict.get(keys.truncated, None)
        if truncated is None:
            raise MissingKeyError(
                f"GAE needs {keys.done!r} or {keys.truncated!r} beside {keys.terminated!r}; "
                "found neither"
            )
        truncated = get_key(tensordict, keys.truncated)
        check_dtype(keys.truncated, truncated, torch.bool)
        check_dtype(keys.terminated, terminated, torch.bool)
        if truncated.shape != terminated.shape:
            raise ValueError(
                f"{keys.truncated!r} must have shape {list(terminated.shape)}, "
                f"got {list(truncated.shape)}"
            )
        return terminated | truncated, None

    def _fill_values(self, tensordict: TensorDictBase) -> None:
        keys = self.keys
        missing_now = tensordict.get(keys.state_value, None) is None
        missing_next = tensordict.get(keys.next_state_value, None) is None
        if not (missing_now or missing_next) or self.value_network is None:
            return
        if as_path(keys.next_state_value) != ("next", *as_path(keys.state_value)):
            raise MissingKeyError(
                f"GAE with a value_network computes {keys.next_state_value!r} by calling the "
                f"network on tensordict['next']; it must be ('next', *{keys.state_value!r})"
            )
        value, next_value = network_values(
            self.value_network,
            tensordict,
            value_key=keys.state_value,
            is_init_key=keys.is_init,
            time_dim=tensordict.batch_dims - 1,
            who="GAE",
            current=missing_now,
        )
        if missing_now:
            tensordict.set(keys.state_value, value)
        if missing_next:
            tensordict.set(keys.next_state_value, next_value)
