"""GAE as a TorchRL value estimator, on rppo_td's functional GAE."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import NestedKey, TensorDictBase
from tensordict.nn import composite_lp_aggregate, skip_existing
from torchrl.objectives.value import ValueEstimatorBase

from rppo_td._keys import RolloutKeys
from rppo_td._validation import (
    check_not_padded,
    check_not_split_trajs,
    check_unit_interval,
    check_value_network,
    get_key,
)
from rppo_td._values import episode_ends, network_values
from rppo_td.functional import check_gae_inputs, gae_unchecked

__all__ = ["GAEEstimator"]

_DEFAULT = RolloutKeys()


class GAEEstimator(ValueEstimatorBase):
    """GAE advantages for any TorchRL loss, on a ``[W, T]`` rollout.

    A TorchRL value estimator (a ``ValueEstimatorBase``), so it serves as a loss's
    ``value_estimator`` (``loss.make_value_estimator(GAEEstimator, gamma=..., lmbda=...,
    value_network=critic)`` or ``loss.value_estimator = GAEEstimator(...)``), and it is the
    default estimator of [`RecurrentPPOLoss`][rppo_td.RecurrentPPOLoss]. The recursion is
    [`generalized_advantage_estimate`][rppo_td.functional.generalized_advantage_estimate]'s
    (Schulman et al., ICLR 2016)::

        delta[t] = reward[t] + gamma * (1 - terminated[t]) * next_state_value[t] - state_value[t]
        A[t]     = delta[t] + gamma * lmbda * (1 - done[t]) * A[t + 1],   A[T] = 0

    It bootstraps from ``("next", "state_value")`` where a step is truncated and at the
    rollout's last step, never where it is terminated, and never sums across an episode end.
    Where the rollout has ``is_init``, a step it marks as an episode's first ends the episode
    before it, as in ``EpisodeSplitter``, even without a ``done`` there (a collector that
    resets at each batch); that cut bootstraps, as a truncation does.

    Batch ``[W, T] -> [W, T]`` (any ``[*B, T]``, time last unless ``time_dim`` says otherwise);
    writes ``advantage`` and ``value_target`` (``[W, T, 1]``, detached) in place and returns the
    same tensordict. With a ``value_network`` it also writes ``state_value`` and
    ``("next", "state_value")`` (``[W, T, 1]``), computed without gradients on a selection of
    the network's in_keys, so the network's by-products (an LSTM's ``("next",
    "recurrent_state_h")``) never overwrite the rollout; without one it reads both.

    Recurrent value networks (TorchRL's ``LSTMModule`` / ``GRUModule``) are evaluated correctly
    in both of their modes:

    - outside recurrent mode every step runs from the state stored with it: ``V(o_t | h_t)``
      from the root and ``V(o_{t+1} | h_{t+1})`` from ``rollout["next"]``;
    - inside ``set_recurrent_mode(True)`` each row runs as a sequence from its stored state at
      ``t = 0``, split where ``is_init`` is True. ``rollout["next"]`` is split where the
      root's ``is_init`` is True as well (TorchRL's GAE does the same), so its sequence of
      next observations never runs across a reset: after a reset it restarts from the stored
      ``("next", "recurrent_state_h")``, the state after the reset step.

    Reads (TorchRL's key names; ``reward``, ``done``, ``terminated`` and ``truncated`` are read
    under ``"next"``): ``("next", "reward")`` ``[W, T, 1]`` float, ``("next", "terminated")``
    and ``("next", "done")`` ``[W, T, 1]`` bool (``done`` may be missing if
    ``("next", "truncated")`` is there), the network's inputs and ``is_init`` ``[W, T, 1]``
    bool for a recurrent network. Rename them with ``set_keys(...)``.

    Refused with a ``ValueError`` or ``KeyError`` naming the key: padded sequences (a
    ``loss_mask`` is present: GAE over ``[N, Lp]`` would cut every sequence's sum at its end;
    run the estimator on the rollout, before ``SequencePadder``), a recurrent network with
    time not the last batch dimension, and everything ``generalized_advantage_estimate``
    refuses (wrong shapes or dtypes, NaN or inf, ``terminated`` without ``done``).

    Args:
        gamma: discount in ``[0, 1]``.
        lmbda: GAE lambda in ``[0, 1]``.
        value_network: a TensorDict module writing ``state_value``, or ``None`` to read
            ``state_value`` and ``("next", "state_value")`` from the tensordict.
        time_dim: the time dimension of the tensordict; ``None``: the dimension named
            ``"time"``, else the last.
        device: where TorchRL's base class keeps its buffers (TorchRL passes it).
        average_gae: standardise the written ``advantage`` over the whole tensordict, as
            TorchRL's ``GAE(average_gae=True)`` does: minus its mean, over its standard
            deviation (Bessel-corrected, floored at ``1e-4``; a single step is only
            centred). ``value_target`` is computed before, from the raw advantage.
        skip_existing: with a ``value_network``, read ``state_value`` and
            ``("next", "state_value")`` where the tensordict already holds them instead of
            recomputing them (each one separately); ``None``: tensordict's
            ``skip_existing()`` mode, False unless set.
        differentiable: TorchRL's option; only False: the advantages and targets are
            constants for the loss (True is refused).
        vectorized: TorchRL's way of computing the same values, taken for a drop-in
            replacement of TorchRL's ``GAE``; it changes nothing here (one path).
        shifted: the same (TorchRL's one network call over ``T + 1`` steps); no change here.
        deactivate_vmap: the same (rppo_td runs a recurrent network without vmap).

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> W, T = 2, 4
        >>> done = torch.zeros(W, T, 1, dtype=torch.bool)
        >>> done[0, 1] = True  # worker 0 terminates after t = 1
        >>> td = TensorDict({
        ...     "state_value": torch.zeros(W, T, 1),
        ...     "next": {"reward": torch.ones(W, T, 1), "state_value": torch.zeros(W, T, 1),
        ...              "terminated": done, "done": done},
        ... }, batch_size=[W, T])
        >>> td = GAEEstimator(gamma=0.5, lmbda=1.0, value_network=None)(td)
        >>> td["advantage"].shape, td["advantage"][..., 0]
        (torch.Size([2, 4, 1]), tensor([[1.5000, 1.0000, 1.5000, 1.0000],
                [1.8750, 1.7500, 1.5000, 1.0000]]))
    """

    @dataclass
    class _AcceptedKeys:
        """The keys ``set_keys(...)`` accepts: TorchRL's, ``truncated``, ``is_init``, ``loss_mask``.

        Attributes:
            advantage: written, ``[W, T, 1]``.
            value_target: written, ``[W, T, 1]``.
            value: ``state_value`` (and, under ``"next"``, the next value), ``[W, T, 1]``.
            reward: read under ``"next"``, ``[W, T, 1]``.
            done: read under ``"next"``, ``[W, T, 1]`` bool.
            terminated: read under ``"next"``, ``[W, T, 1]`` bool.
            truncated: read under ``"next"`` when ``done`` is missing, ``[W, T, 1]`` bool.
            is_init: first step of an episode, ``[W, T, 1]`` bool (recurrent networks).
            loss_mask: marks padded sequences, which are refused.
            steps_to_next_obs: TorchRL's; not supported (refused when present).
            sample_log_prob: TorchRL's; unused.
        """

        advantage: NestedKey = _DEFAULT.advantage
        value_target: NestedKey = _DEFAULT.value_target
        value: NestedKey = _DEFAULT.state_value
        reward: NestedKey = "reward"
        done: NestedKey = "done"
        terminated: NestedKey = "terminated"
        truncated: NestedKey = "truncated"
        is_init: NestedKey = _DEFAULT.is_init
        loss_mask: NestedKey = _DEFAULT.loss_mask
        steps_to_next_obs: NestedKey = "steps_to_next_obs"
        sample_log_prob: NestedKey | None = None

        def __post_init__(self) -> None:
            if self.sample_log_prob is None:
                aggregate = composite_lp_aggregate(nowarn=True)
                self.sample_log_prob = "sample_log_prob" if aggregate else "action_log_prob"

    default_keys = _AcceptedKeys

    def __init__(
        self,
        *,
        gamma: float,
        lmbda: float,
        value_network: Any,
        time_dim: int | None = None,
        device: torch.device | str | None = None,
        average_gae: bool = False,
        skip_existing: bool | None = None,
        differentiable: bool = False,
        vectorized: bool | None = None,
        shifted: bool = False,
        deactivate_vmap: bool = False,
    ) -> None:
        check_value_network(value_network)
        check_unit_interval("gamma", gamma)
        check_unit_interval("lmbda", lmbda)
        for name, value, nullable in (
            ("average_gae", average_gae, False),
            ("differentiable", differentiable, False),
            ("shifted", shifted, False),
            ("deactivate_vmap", deactivate_vmap, False),
            ("skip_existing", skip_existing, True),
            ("vectorized", vectorized, True),
        ):
            if not (isinstance(value, bool | np.bool_) or (nullable and value is None)):
                allowed = "True or False" + (" or None" if nullable else "")
                raise TypeError(f"GAEEstimator's {name} must be {allowed}, got {value!r}")
        if differentiable:
            raise ValueError(
                "GAEEstimator does not take differentiable=True: its advantage and "
                "value_target are constants for the loss (computed without gradients)"
            )
        super().__init__(value_network=value_network, device=device)
        self.gamma = float(gamma)
        self.lmbda = float(lmbda)
        self.time_dim = time_dim
        self.average_gae = bool(average_gae)
        self.skip_existing = None if skip_existing is None else bool(skip_existing)

    def forward(
        self,
        tensordict: TensorDictBase,
        *,
        params: TensorDictBase | None = None,
        target_params: TensorDictBase | None = None,
        time_dim: int | None = None,
    ) -> TensorDictBase:
        """Writes ``advantage`` and ``value_target`` into ``tensordict`` and returns it.

        Args:
            tensordict: ``[W, T]`` (or ``[*B, T]``) rollout.
            params: parameters to run ``value_network`` with (TorchRL losses pass their
                detached critic parameters); ``None``: the network's own.
            target_params: parameters for the next values; ``None``: ``params``.
            time_dim: overrides the constructor's ``time_dim`` for this call.

        Returns:
            ``tensordict``, with ``advantage`` and ``value_target`` ``[W, T, 1]``.
        """
        keys = self.tensor_keys
        if tensordict.batch_dims < 1:
            raise ValueError(
                f"GAEEstimator needs a tensordict with a time dimension, got batch size "
                f"{list(tensordict.batch_size)}"
            )
        check_not_padded(tensordict, keys.loss_mask, "GAEEstimator")
        check_not_split_trajs(tensordict, "GAEEstimator")
        if tensordict.get(keys.steps_to_next_obs, None) is not None:
            raise ValueError(
                f"GAEEstimator does not support multi-step returns ({keys.steps_to_next_obs!r} "
                "is present)"
            )
        dim = self._get_time_dim(time_dim, tensordict)
        if self.value_network is not None:
            value, next_value = self._values(tensordict, dim, params, target_params)
            tensordict.set(keys.value, value)
            tensordict.set(("next", keys.value), next_value)
        else:
            hint = "(GAEEstimator has no value_network to compute it)"
            value = get_key(tensordict, keys.value, hint=hint)
            next_value = get_key(tensordict, ("next", keys.value), hint=hint)
        reward = get_key(tensordict, ("next", keys.reward))
        terminated = get_key(tensordict, ("next", keys.terminated))
        done = tensordict.get(("next", keys.done), None)
        truncated = None
        if done is None:
            hint = f"(GAEEstimator needs {('next', keys.done)!r} or this key)"
            done = terminated | get_key(tensordict, ("next", keys.truncated), hint=hint)
        elif tensordict.get(("next", keys.truncated), None) is not None:
            # checked against done as the GAE transform does: a done that is neither end
            # would be read as a truncation
            key = ("next", keys.truncated)
            truncated = (key, get_key(tensordict, key))
        dim = check_gae_inputs(
            {
                ("next", keys.reward): reward,
                keys.value: value,
                ("next", keys.value): next_value,
                ("next", keys.terminated): terminated,
                ("next", keys.done): done,
            },
            gamma=self.gamma,
            lmbda=self.lmbda,
            truncated=truncated,
            time_dim=dim,
        )
        advantage, target = gae_unchecked(
            reward,
            value,
            next_value,
            terminated,
            # an episode that is_init starts without a done before it ends there too
            episode_ends(done, tensordict, keys.is_init, dim, ("next", keys.done)),
            gamma=self.gamma,
            lmbda=self.lmbda,
            time_dim=dim,
        )
        if self.average_gae:
            advantage = _standardized(advantage)
        tensordict.set(keys.advantage, advantage)
        tensordict.set(keys.value_target, target)
        return tensordict

    def value_estimate(
        self,
        tensordict: TensorDictBase,
        target_params: TensorDictBase | None = None,
        next_value: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """The GAE value targets ``[W, T, 1]`` (``advantage + V``) of ``tensordict``.

        TorchRL's hook for a value target: ``forward`` on a shallow copy (``tensordict`` is
        left as it is), its ``value_target``. ``next_value`` is not supported (the next
        values come from ``("next", "state_value")`` or the network).
        """
        if next_value is not None:
            raise ValueError(
                "GAEEstimator.value_estimate takes no next_value: it reads "
                f"{('next', self.tensor_keys.value)!r} or runs its value_network"
            )
        if kwargs:
            raise TypeError(
                f"GAEEstimator.value_estimate got unexpected arguments {sorted(kwargs)}"
            )
        out = self.forward(tensordict.copy(), target_params=target_params)
        return get_key(out, self.tensor_keys.value_target)

    def _values(
        self,
        tensordict: TensorDictBase,
        time_dim: int,
        params: TensorDictBase | None,
        target_params: TensorDictBase | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(V(o_t), V(o_{t+1}))``, each ``[*B, T, 1]``, from the network, without gradients.

        With ``skip_existing``, a value the tensordict already holds is read, not computed.
        """
        keys = self.tensor_keys
        skip = skip_existing() if self.skip_existing is None else self.skip_existing
        stored = [
            tensordict.get(key, None) if skip else None
            for key in (keys.value, ("next", keys.value))
        ]
        if stored[0] is not None and stored[1] is not None:
            return stored[0], stored[1]
        value, next_value = network_values(
            self.value_network,
            tensordict,
            value_key=keys.value,
            is_init_key=keys.is_init,
            time_dim=time_dim,
            who="GAEEstimator",
            params=params,
            target_params=target_params,
            current=stored[0] is None,
        )
        value = value if stored[0] is None else stored[0]
        assert value is not None  # computed (current=True) where none was stored
        return value, next_value if stored[1] is None else stored[1]


def _standardized(advantage: torch.Tensor) -> torch.Tensor:
    """``advantage`` ``[*B, T, 1]`` minus its mean, over its std (Bessel, floored at 1e-4).

    TorchRL's ``GAE(average_gae=True)``; a single element is centred only (its std is NaN).
    """
    centred = advantage - advantage.mean()
    if advantage.numel() < 2:
        return centred
    return centred / advantage.std().clamp_min(1e-4)
