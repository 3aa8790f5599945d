"""TorchRL's clipped PPO loss, masked by ``loss_mask`` and run in recurrent mode."""

from __future__ import annotations

import contextlib
import inspect
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy
import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from tensordict.nn import CompositeDistribution, dispatch
from torch import nn
from torchrl.modules import set_recurrent_mode
from torchrl.modules.distributions.utils import has_analytic_entropy
from torchrl.objectives import ClipPPOLoss, PPOLoss
from torchrl.objectives.utils import ValueEstimators, distance_loss
from torchrl.objectives.value import TD0Estimator

from rppo_td._distributed import (
    all_reduce,
    check_process_group,
    resolve_group,
    settings_across_group,
)
from rppo_td._keys import RolloutKeys, as_path
from rppo_td._validation import MissingKeyError, first_line, get_key
from rppo_td._values import functional_parameters, state_dtype_error, torchrl_cores
from rppo_td.functional import masked_mean, masked_normalize
from rppo_td.objectives._value import GAEEstimator

__all__ = ["RecurrentPPOLoss"]

_DEFAULT = RolloutKeys()
_CRITIC_LOSSES = ("l1", "l2", "smooth_l1")
# the keyword arguments TorchRL's ClipPPOLoss and PPOLoss take (PPOLoss swallows any other
# silently), and the two it refuses itself with a message naming their new spelling
_TORCHRL_KWARGS = {
    name
    for cls in (ClipPPOLoss, PPOLoss)
    for name, p in inspect.signature(cls.__init__).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY or p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
} | {"critic_coef", "entropy_coef"}
_PARAMS = (
    "actor_network_params",
    "critic_network_params",
    "target_actor_network_params",
    "target_critic_network_params",
)


class RecurrentPPOLoss(ClipPPOLoss):
    """TorchRL's ``ClipPPOLoss`` over padded sequences ``[B, Lp]``, masked by ``loss_mask``.

    A subclass of ``torchrl.objectives.ClipPPOLoss`` (``set_keys``, ``make_value_estimator``,
    TorchRL trainers and loggers work as they do with it) for the minibatches of
    [`SequenceSampler`][rppo_td.SequenceSampler]. Three things differ:

    - **Masked, with no extra setting.** Every output is a scalar (0-dim) over the real steps
      (``loss_mask`` True) only: the loss terms ``loss_objective``, ``loss_critic`` and
      ``loss_entropy`` and the diagnostics ``clip_fraction``, ``kl_approx``, ``kl_k3``, ``entropy``,
      ``ESS``, ``explained_variance``, ``max_ratio``, ``mean_ratio`` and ``value_clip_fraction``;
      with a composite (multi-head) action also ``composite_entropy``, each head's mean entropy
      (0-dim, where ``ClipPPOLoss`` gives the per-step values, padding included). A head of
      several action dimensions counts its entropy summed over them, as ``entropy`` does, also
      under a per-head ``entropy_coeff`` (``ClipPPOLoss`` averages such a head there).
      ``kl_approx`` is TorchRL's ``log(pi_old / pi)``, whose mean over the minibatch the update
      itself drives below zero (it raises the probability of the actions it saw); ``kl_k3`` is the
      mean of ``(r - 1) - log r`` with ``r = pi / pi_old`` (Schulman's k3 estimator of the KL
      divergence from pi_old to pi), never negative: what a KL threshold should compare
      (``rppo-train --target-kl`` does). The loss's own inputs at padding (advantages, targets, old
      values and log-probabilities, actions) are replaced before use, so whatever they hold changes
      neither an output nor a gradient. The networks run over the padding's observations as they
      are: ``SequencePadder``'s zeros change nothing, but values that drive a network's output to
      inf there can make gradients NaN (0 * inf), as in any masked loss.
      ``normalize_advantage=True`` standardises with the real steps' mean and deviation
      (``functional.masked_normalize``; one real value is left as it is, as ``ClipPPOLoss``
      leaves it, and equal values become 0). Without a ``loss_mask`` key in the input every step
      counts as real, unless the input holds padded sequences all the same (a leaf named
      ``loss_mask`` under another key, or ``rollout_steps`` with padding): that is refused,
      naming the key. A minibatch whose mask is all False (padding only) is refused too, and
      so is a mask that is not a True prefix in every row (a real step after padding would
      see the padding through the recurrent core).
    - **Recurrent mode.** ``forward`` runs the actor and the critic inside TorchRL's
      ``set_recurrent_mode(True)``: an ``LSTMModule``/``GRUModule`` runs over the ``Lp``
      positions of each sequence from the state stored at position 0, and restarts where
      ``is_init`` is True.
    - **rppo_td's GAE.** When the input has no ``advantage``, the loss's value estimator
      computes it; the default is [`GAEEstimator`][rppo_td.GAEEstimator] (``gamma=0.99``,
      ``lmbda=0.95``; ``make_value_estimator(gamma=..., lmbda=...)`` changes them, and
      ``make_value_estimator(ValueEstimators.GAE)`` gives it too). GAE belongs on the whole
      ``[W, T]`` rollout: call ``loss.value_estimator(rollout)`` before the pipeline, or the
      loss on an unpadded rollout; the estimator refuses padded sequences.

    **Across ranks** (``process_group``; off by default). With data-parallel training
    (``DistributedDataParallel``, or any gradient all-reduce that *averages* over ranks, as DDP
    does) the means above are per rank, so the averaged gradient weights every rank alike, not
    every real step. With ``process_group`` set and more than one process in it, each call
    all-reduces (sums) the real-step count over the group and, with ``normalize_advantage``,
    the advantage's mean and deviation, so that

    - every loss term of a rank is ``(its sum over its real steps) / C * world_size``, ``C``
      the count of real steps on all ranks: the ranks' loss values *average* to the loss on
      the union of their minibatches, and their gradients, once DDP averages them, equal the
      gradient of one process on that union (``tests/integration/test_distributed_loss.py``);
    - the advantage is standardised with the union's mean and population deviation.

    The diagnostics are then the union's too (``clip_fraction``, ``kl_approx``, ``kl_k3``,
    ``entropy``, ``ESS``, ``mean_ratio``, ``max_ratio``, ``value_clip_fraction``,
    ``explained_variance``; the same value on every rank). Per rank stay:
    ``reduction="sum"``/``"none"`` (nothing is divided) and TorchRL's ``advantage_norm`` normaliser.
    Each call then holds 3 (4 with ``normalize_advantage``) small all-reduces: every rank of the
    group must call the loss the same number of times (the sampler's equal minibatch counts see to
    that, given the same ``num_minibatches`` and epochs on every rank). The first call also
    compares the options across the group and refuses, on every rank, options that differ.
    The advantage statistics are treated as constants (an ``advantage`` that requires grad is
    not differentiated through them).

    Inputs: ``[B, Lp]`` (or ``[W, T]``) with the actor's and critic's inputs,
    ``action``, ``action_log_prob`` ``[B, Lp]``, ``advantage`` and ``value_target``
    ``[B, Lp, 1]``, ``loss_mask`` ``[B, Lp]`` bool, and ``state_value`` ``[B, Lp, 1]`` with
    ``clip_value``. The key of the mask is ``loss_mask`` (``rppo_td.RolloutKeys``); change it
    with ``loss_mask_key=``, ``set_keys(loss_mask=...)`` or ``loss.loss_mask_key = ...``.

    Args:
        actor_network: a probabilistic TensorDict actor (``ProbabilisticActor``).
        critic_network: a TensorDict module writing ``state_value``.
        clip_epsilon: the ratio's clipping range, as in ``ClipPPOLoss``: a number in
            ``(0, 1)``, or TorchRL's asymmetric ``(low, high)`` (the ratio clipped to
            ``[1 - low, 1 + high]``; then ``clip_value`` must be a number or None).
        entropy_coeff: weight of ``loss_entropy``.
        critic_coeff: weight of ``loss_critic``.
        loss_critic_type: ``"l1"``, ``"l2"`` or ``"smooth_l1"``.
        normalize_advantage: standardise ``advantage`` over the real steps of each call.
        clip_value: clip the value prediction to ``state_value +- clip_value`` (``True``:
            ``clip_epsilon``); ``None``: no value clipping.
        loss_mask_key: the mask's key.
        normalize_advantage_eps: added to the deviation when normalising the advantage.
        process_group: reduce over ranks (see above): None (default) reduces nothing;
            ``"default"`` is ``torch.distributed``'s default group, read at each call (one
            process when none is initialised); or a ``torch.distributed.ProcessGroup``.
        **kwargs: any other keyword of ``ClipPPOLoss`` (``reduction``, ``separate_losses``,
            ``functional``, ``delay_actor``, ``advantage_norm``, ...), except
            ``normalize_advantage_exclude_dims``.

    Raises:
        ValueError: at construction, naming the option: ``clip_epsilon`` not a finite
            number in ``(0, 1)`` nor such a pair, ``clip_value`` neither None, a bool nor a
            finite number > 0, ``critic_coeff`` neither None nor a finite number >= 0, an
            ``entropy_coeff`` (or a value of its mapping) that is not a finite number
            (TorchRL's loss takes each of these and trains on, its clip range inverted or
            NaN).

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl.modules import ProbabilisticActor
        >>> actor = ProbabilisticActor(
        ...     TensorDictModule(torch.nn.Linear(3, 2), ["observation"], ["logits"]),
        ...     in_keys=["logits"], distribution_class=torch.distributions.Categorical,
        ...     return_log_prob=True)
        >>> critic = TensorDictModule(torch.nn.Linear(3, 1), ["observation"], ["state_value"])
        >>> B, Lp = 2, 4
        >>> mask = torch.tensor([[True, True, True, True], [True, True, False, False]])
        >>> batch = TensorDict({"observation": torch.randn(B, Lp, 3),
        ...                     "advantage": torch.randn(B, Lp, 1),
        ...                     "value_target": torch.randn(B, Lp, 1),
        ...                     "loss_mask": mask}, batch_size=[B, Lp])
        >>> with torch.no_grad():
        ...     batch = actor(batch)  # action and action_log_prob of the unchanged policy
        >>> batch["action_log_prob"][~batch["loss_mask"]] = -50.0  # garbage in the padding
        >>> out = RecurrentPPOLoss(actor, critic)(batch)
        >>> out["loss_objective"].shape, out["clip_fraction"], out["kl_approx"], out["ESS"]
        (torch.Size([]), tensor(0.), tensor(0.), tensor(1.))
    """

    @dataclass
    class _AcceptedKeys(ClipPPOLoss._AcceptedKeys):
        """``ClipPPOLoss``'s keys and ``loss_mask``.

        Attributes:
            loss_mask: ``[B, Lp]`` bool, True on real steps (``rppo_td.RolloutKeys``).
        """

        loss_mask: NestedKey = _DEFAULT.loss_mask

    default_keys = _AcceptedKeys
    default_value_estimator = ValueEstimators.GAE

    def __init__(
        self,
        actor_network: Any,
        critic_network: Any,
        *,
        clip_epsilon: float | tuple[float, float] = 0.2,
        entropy_coeff: float = 0.01,
        critic_coeff: float = 1.0,
        loss_critic_type: str = "smooth_l1",
        normalize_advantage: bool = False,
        clip_value: bool | float | None = None,
        loss_mask_key: NestedKey = _DEFAULT.loss_mask,
        normalize_advantage_eps: float = 1e-8,
        process_group: Any = None,
        **kwargs: Any,
    ) -> None:
        check_process_group(process_group, "RecurrentPPOLoss")
        unknown = sorted(set(kwargs) - _TORCHRL_KWARGS)
        if unknown:
            hint = ""
            if {"start_state", "burn_in"} & set(unknown):
                hint = (
                    "; start states and burn-in are SequenceStartStates' options: apply "
                    "SequenceStartStates(modules, start_state=..., burn_in=...) to the padded "
                    "sequences before each epoch"
                )
            raise TypeError(f"RecurrentPPOLoss got unexpected keyword arguments {unknown}{hint}")
        _check_coefficients(clip_epsilon, entropy_coeff, critic_coeff, clip_value)
        if loss_critic_type not in _CRITIC_LOSSES:
            # TorchRL's NotImplementedError came at the first forward
            raise ValueError(
                f"loss_critic_type must be one of {list(_CRITIC_LOSSES)}, got {loss_critic_type!r}"
            )
        if not isinstance(normalize_advantage, bool | numpy.bool_):
            raise TypeError(
                "normalize_advantage must be True or False, got "
                f"{normalize_advantage!r} ({type(normalize_advantage).__name__})"
            )
        normalize_advantage = bool(normalize_advantage)
        # TorchRL takes floats and tensors only: a numpy number (np.float32 from a sweep) is
        # refused by some of its checks, so every real number reaches it as a float
        clip_epsilon = _as_float(clip_epsilon)
        critic_coeff = _as_float(critic_coeff)
        clip_value = clip_value if isinstance(clip_value, bool) else _as_float(clip_value)
        entropy_coeff = (
            {key: _as_float(value) for key, value in entropy_coeff.items()}  # type: ignore[assignment]
            if isinstance(entropy_coeff, Mapping)
            else _as_float(entropy_coeff)
        )
        if kwargs.get("normalize_advantage_exclude_dims"):
            raise ValueError(
                "RecurrentPPOLoss normalises the advantage over all real steps; "
                "normalize_advantage_exclude_dims is not supported"
            )
        super().__init__(
            actor_network,
            critic_network,
            clip_epsilon=clip_epsilon,
            entropy_coeff=entropy_coeff,
            critic_coeff=critic_coeff,
            loss_critic_type=loss_critic_type,
            normalize_advantage=normalize_advantage,
            clip_value=clip_value,
            **kwargs,
        )
        self.loss_mask_key = loss_mask_key
        if self.separate_losses:
            self._train_critic_only_parameters()
        if not normalize_advantage_eps > 0:
            raise ValueError(
                f"normalize_advantage_eps must be > 0, got {normalize_advantage_eps!r}"
            )
        self.normalize_advantage_eps = float(normalize_advantage_eps)
        self.process_group = process_group
        self._group_checked = False  # the options compared across the group, at the first call
        # the networks' TorchRL LSTMModule / GRUModule, found at the first call
        self._recurrent: tuple[tuple[str, Any, Any, torch.Tensor, list, Any], ...] | None = None
        self._recurrence: bool | None = None  # _has_recurrence
        # False: the trunk runs once per network whatever the networks say (what
        # benchmarks/learn_phase.py compares with); None: as _shares_trunk finds
        self._trunk_shared: bool | None = None
        # whether the critic runs with the actor's own tensors, for the parameter
        # containers of _parameters_key (see _shares_trunk)
        self._parameters_key: tuple[int, ...] | None = None
        self._parameters_same = False
        # (input, distribution) of the shared trunk's pass, for _get_cur_log_prob
        self._shared_dist: tuple[TensorDictBase, Any] | None = None

    @property
    def out_keys(self) -> list[NestedKey]:
        """The keys ``forward`` returns: TorchRL's, with ``kl_k3`` and ``explained_variance``."""
        if getattr(self, "_out_keys", None) is None:
            keys = list(ClipPPOLoss.out_keys.fget(self))  # type: ignore[attr-defined]
            keys.insert(keys.index("kl_approx") + 1 if "kl_approx" in keys else len(keys), "kl_k3")
            if self._has_critic and self.log_explained_variance:
                keys.append("explained_variance")
            self._out_keys = keys
        return self._out_keys

    @out_keys.setter
    def out_keys(self, values: list[NestedKey]) -> None:
        self._out_keys = values

    def _train_critic_only_parameters(self) -> None:
        """``separate_losses``: the critic loss trains the parameters only the critic reads.

        TorchRL keeps detached copies of every critic parameter the actor network holds
        (shared ones train on the policy loss only). rppo_td's ``RecurrentActor`` and
        ``RecurrentCritic`` both hold the whole ``RecurrentActorCritic``, so every critic
        parameter, the value head's too, was detached: the critic never trained. The ones
        the actor does not read (``critic_only_parameters``) get their parameters back.
        """
        critic_only = getattr(
            getattr(self.critic_network, "net", None), "critic_only_parameters", None
        )
        if not self.functional or not callable(critic_only):
            return
        own = {id(param) for param in critic_only()}
        params = self.critic_network_params
        for key, param in self.critic_network.named_parameters():
            if id(param) in own:
                params.set(tuple(key.split(".")), param)

    # ---- the mask key: one field of tensor_keys, also TorchRL's loss_mask_key ------------
    @property
    def loss_mask_key(self) -> NestedKey:
        """The key of ``loss_mask``; the same as ``tensor_keys.loss_mask``."""
        return self.tensor_keys.loss_mask

    @loss_mask_key.setter
    def loss_mask_key(self, value: NestedKey) -> None:
        if value is None or value == "auto":
            raise ValueError(
                f"RecurrentPPOLoss is always masked; loss_mask_key must be a key, got {value!r}"
            )
        self.set_keys(loss_mask=value)

    def _loss_mask_keys(self) -> tuple[NestedKey, ...]:
        return (self.tensor_keys.loss_mask,)

    def _set_in_keys(self) -> None:
        super()._set_in_keys()
        if self.tensor_keys.loss_mask not in self._in_keys:
            self._in_keys.append(self.tensor_keys.loss_mask)

    def _forward_value_estimator_keys(self, **kwargs: Any) -> None:
        super()._forward_value_estimator_keys(**kwargs)
        if isinstance(self._value_estimator, GAEEstimator):
            self._value_estimator.set_keys(loss_mask=self.tensor_keys.loss_mask)

    # ---- the value estimator ----------------------------------------------------------------
    def make_value_estimator(self, value_type: Any = None, **hyperparams: Any) -> Any:
        """Sets the value estimator; ``None`` or ``ValueEstimators.GAE``: a ``GAEEstimator``.

        ``hyperparams`` go to ``GAEEstimator`` (``gamma``, ``lmbda``; defaults 0.99 and 0.95),
        with this loss's critic as its value network and this loss's keys. Any other
        ``value_type`` (a TorchRL estimator enum, class or instance) is ``ClipPPOLoss``'s.

        Returns:
            The loss itself.
        """
        gae_names = ("gae", ValueEstimators.GAE.name.lower(), ValueEstimators.GAE.value.lower())
        if isinstance(value_type, str) and value_type.lower() in gae_names:
            value_type = ValueEstimators.GAE  # TorchRL's string alias: the same estimator
        if value_type not in (None, ValueEstimators.GAE, GAEEstimator):
            # TorchRL's PPOLoss returns None from this branch: the loss itself, as documented
            super().make_value_estimator(value_type, **hyperparams)
            return self
        hyperparams = {"gamma": 0.99, "lmbda": 0.95, **hyperparams}
        hyperparams.setdefault("value_network", self.critic_network)
        hyperparams.pop("device", None)
        estimator = GAEEstimator(**hyperparams)
        keys = self.tensor_keys
        estimator.set_keys(
            advantage=keys.advantage,
            value_target=keys.value_target,
            value=keys.value,
            reward=keys.reward,
            done=keys.done,
            terminated=keys.terminated,
            loss_mask=keys.loss_mask,
        )
        self._value_estimator = estimator
        self.value_type = GAEEstimator
        return self

    def _default_value_estimator(self) -> None:
        self.make_value_estimator()

    # ---- the loss -----------------------------------------------------------------------------
    @dispatch
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The masked losses and diagnostics of one minibatch.

        Args:
            tensordict: ``[B, Lp]`` sequences (see the class docstring for the keys).

        Returns:
            A tensordict of 0-dim tensors: ``loss_objective``, ``loss_critic``,
            ``loss_entropy`` (per position with ``reduction="none"``), ``clip_fraction``,
            ``kl_approx``, ``kl_k3``, ``entropy``, ``ESS``, ``max_ratio``, ``mean_ratio``,
            ``explained_variance`` and, with ``clip_value``, ``value_clip_fraction``.
        """
        with set_recurrent_mode(True):
            return self._masked_forward(tensordict)

    def _masked_forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        if tensordict.batch_dims == 0:
            # the padding helpers index the batch's positions: one failed in view() of ()
            raise ValueError(
                "RecurrentPPOLoss needs a batch of steps ([B] or sequences [B, Lp]), got batch "
                "size [] (a single step); give td.unsqueeze(0)"
            )
        if tensordict.batch_size.numel() == 0:  # (TensorDict.numel() says 1 for [0, Lp])
            # before any collective: torch's max() of the empty ratios failed naming nothing
            raise ValueError(
                f"RecurrentPPOLoss got an empty minibatch (batch size "
                f"{list(tensordict.batch_size)}): it needs at least one sequence of one step"
            )
        self._check_recurrent_inputs(tensordict)
        tensordict = tensordict.clone(False)  # the estimator and actors write into it
        keys = self.tensor_keys
        advantage = tensordict.get(keys.advantage, None)
        computed = advantage is None
        if advantage is None:
            if self.critic_network is None:
                raise RuntimeError(
                    f"{keys.advantage!r} is missing and there is no critic to compute it"
                )
            self._check_estimator_input(tensordict)
            self.value_estimator(
                tensordict,
                params=self._cached_critic_network_params_detached,
                target_params=self.target_critic_network_params,
            )
            advantage = get_key(tensordict, keys.advantage)
        _check_per_step(keys.advantage, advantage, tensordict.batch_size)
        actions = keys.action if isinstance(keys.action, list) else [keys.action]
        for key in actions:
            if tensordict.get(key, None) is None:
                # TorchRL's loss fails on it with an AttributeError naming nothing
                raise MissingKeyError(
                    f"RecurrentPPOLoss needs the actions taken, {key!r}, in the minibatch (the "
                    "ratio is their probability now over then); it has none"
                )
        mask = self._mask(tensordict)
        for key in actions:
            # padding holds any finite values: an action out of the space (7 of 3) or a huge
            # one would fail in log_prob or give NaN gradients (0 * inf) through the network
            tensordict.set(key, _pad_with_a_real_one(get_key(tensordict, key), mask))
        group, world_size = resolve_group(self.process_group)
        if group is not None and not self._group_checked:
            settings_across_group(self._group_options(), group, "RecurrentPPOLoss")
            self._group_checked = True
        # the real steps, and whether a row holds a real step after padding (a mask that is
        # not a True prefix along the time dim: the padding would run through the recurrent
        # core before it; a feed-forward network may mask any step)
        sequences = mask.ndim >= 2 and self._has_recurrence()
        holes = (mask[:, 1:] > mask[:, :-1]).any() if sequences else mask.new_zeros(())
        flags = torch.stack([mask.sum(), holes.long()])
        if group is not None:
            flags = all_reduce(flags, group)
        count = flags[0]
        # the loss terms' denominator; with a group, C / world_size for C real steps in all
        denominator: torch.Tensor = count if group is None else count / world_size
        real_steps, with_holes = flags.tolist()  # one sync; every rank raises together
        alone = group is None
        if not real_steps:
            raise ValueError(
                f"RecurrentPPOLoss got a minibatch of padding only: {keys.loss_mask!r} is False "
                f"at all {mask.numel()} positions{'' if alone else ' on any rank'}; it "
                "needs at least one real step"
            )
        if with_holes:
            raise ValueError(
                f"{keys.loss_mask!r} must be a True prefix in every row (padding only at the "
                f"end, as SequencePadder writes it): a row{'' if alone else ' on some rank'}"
                " holds a real step after a padding position, whose inputs would then reach it "
                "through the recurrent core"
            )
        advantage = _where(mask, advantage, 0.0)
        # one real value is left as it is, as ClipPPOLoss leaves it (standardised it is 0)
        normalize = self.normalize_advantage and real_steps * _per_step(advantage, mask) > 1
        if self.advantage_norm is not None:
            advantage = self._scale_advantage(advantage, tensordict, update=computed)
        elif normalize and group is not None:
            advantage = _normalize_over_group(
                advantage, mask, count, group, self.normalize_advantage_eps
            )
        elif normalize:
            advantage = masked_normalize(advantage, mask, eps=self.normalize_advantage_eps)

        # one key (a composite action's log-probs are a list of keys, or none)
        key = keys.sample_log_prob
        one = isinstance(key, str) or (
            isinstance(key, tuple) and bool(key) and all(isinstance(k, str) for k in key)
        )
        stored = tensordict.get(key, None) if one else None
        if isinstance(stored, torch.Tensor) and stored.shape != advantage.shape[:-1]:
            # refused before TorchRL subtracts it: [B, Lp, 1] fails there with a broadcast
            # error naming nothing (B != Lp), or broadcasts to [B, Lp, Lp] (B == Lp)
            raise _log_prob_shape_error(keys, advantage.shape, list(stored.shape))
        value = None
        if self._shares_trunk():
            # one pass of the shared encoder and core for both heads (not one per network)
            dist, value = self._dist_and_value(tensordict)
            if not isinstance(dist, CompositeDistribution):
                self._shared_dist = (tensordict, dist)
        try:
            log_weight, dist, kl_approx, log_is_weight = self._log_weight(
                tensordict, adv_shape=advantage.shape[:-1]
            )
        except (RuntimeError, IndexError) as err:
            if "out of bounds" not in str(err):
                raise
            # an action out of a categorical's range: torch's "index 7 is out of bounds for
            # dimension 2 with size 2" named no key
            raise type(err)(
                f"the stored {keys.action!r} holds an action outside the actor's action "
                f"space: {first_line(err)}"
            ) from err
        finally:
            self._shared_dist = None
        if isinstance(dist, torch.distributions.Categorical):
            _check_whole_actions(tensordict, actions)
        if isinstance(log_weight, torch.Tensor) and log_weight.shape != advantage.shape:
            # a log-prob of another form (a composite's) that broadcast against the advantage
            raise _log_prob_shape_error(
                keys, advantage.shape, _shape_of(tensordict, keys.sample_log_prob)
            )
        # a zero log-ratio on padding: exp() of garbage can overflow, and inf * 0 is NaN
        log_weight = _where(mask, log_weight, 0.0)
        behaviour = log_weight  # log(pi / pi_behaviour), what the surrogate is weighted by
        clipped = log_weight.clamp(*self._clip_bounds)
        if log_is_weight is not None:
            log_is_weight = _where(mask, log_is_weight, 0.0)
            behaviour = log_weight + log_is_weight
            clipped = clipped + log_is_weight
        gain = torch.minimum(behaviour.exp() * advantage, clipped.exp() * advantage)
        losses: dict[str, torch.Tensor] = {"loss_objective": -gain}
        # per-step diagnostics, zero on padding: their means are sums over the count
        with torch.no_grad():  # k3 = (r - 1) - log r >= 0, zero on padding (log r = 0)
            kl_k3 = torch.expm1(log_weight) - log_weight
        sums: dict[Any, torch.Tensor] = {  # names; composite_entropy heads nested
            "clip_fraction": (clipped != behaviour).to(gain.dtype),
            "kl_approx": kl_approx,
            "kl_k3": kl_k3,
        }
        if self.entropy_bonus:
            entropy = self._masked_entropy(dist, advantage.shape[:-1], mask)
            if isinstance(entropy, TensorDictBase):  # one entropy per head, zeroed on padding
                # each head's summed over its own event dims, to the batch shape [B, Lp, 1]:
                # heads of other trailing shapes broadcast against each other when added
                dims = entropy.batch_dims
                heads = entropy.apply(lambda x: _where(mask, _sum_beyond(x, dims), 0.0))
                entropy = sum(heads.values(True, True))
                # entropy_coeff={head: coeff} weighs each head (TorchRL's map mode)
                weighted = heads if self._entropy_coeff_map is not None else entropy
                # each head's mean over the real steps, under TorchRL's composite_entropy
                for head, x in heads.items(include_nested=True, leaves_only=True):
                    sums[("composite_entropy", *as_path(head))] = x.detach()
            elif self._entropy_coeff_map is not None:
                raise ValueError(
                    "RecurrentPPOLoss: entropy_coeff is a mapping of action heads "
                    f"({sorted(map(str, self._entropy_coeff_map))}), but the policy's "
                    "distribution gives one entropy, not one per head (it is not composite); "
                    "pass entropy_coeff as a number"
                )
            else:
                entropy = weighted = _where(mask, entropy, 0.0)
            sums["entropy"] = entropy
            losses["loss_entropy"] = self._weighted_loss_entropy(weighted)
        critic: _CriticParts | None = None
        if self._has_critic:
            losses["loss_critic"], critic = self._critic_loss(tensordict, value)
        with torch.no_grad():
            if group is None:
                stats: dict[Any, torch.Tensor] = {
                    name: _mean(x, mask, count) for name, x in sums.items()
                }
                stats.update(_ratio_stats(behaviour, mask, count))
                if critic is not None:
                    stats.update(critic.stats(self.log_explained_variance))
            else:
                stats = _group_stats(
                    sums, behaviour, critic, mask, count, group, self.log_explained_variance
                )
        # every term is zero on padding already: a mean is a sum over the real steps' count
        # (times the values each step holds: [B, Lp, A, 1] for TorchRL's agents' layout)
        if self.reduction == "mean":
            out = {name: x.sum() / (denominator * _per_step(x, mask)) for name, x in losses.items()}
        else:
            out = {name: self._reduce_loss(x, tensordict).squeeze(-1) for name, x in losses.items()}
        td_out = TensorDict({**out, **stats}, batch_size=[])
        self._clear_weakrefs(tensordict, td_out, *_PARAMS)
        return td_out

    def _group_options(self) -> dict[str, Any]:
        """The options the ranks of a group must share.

        Those that change the collectives each call runs, or the loss whose gradient the
        ranks average.
        """

        def plain(value: Any) -> Any:
            # float tensors as float32, as TorchRL's buffers hold them: a float64 tensor of
            # 0.2 on one rank and 0.2 on another are the same setting
            if isinstance(value, torch.Tensor):
                return (value.float() if value.is_floating_point() else value).tolist()
            return value

        names = [
            "normalize_advantage",
            "clip_value",
            "log_explained_variance",
            "entropy_bonus",
            "clip_epsilon",
            "critic_coeff",
            "entropy_coeff",
            "loss_critic_type",
            "reduction",
            "normalize_advantage_eps",
            "separate_losses",
        ]
        options = {name: plain(getattr(self, name, None)) for name in names}
        options["advantage_norm"] = self.advantage_norm is not None
        # entropy_coeff as a mapping (per action head) is kept apart by TorchRL
        per_head = getattr(self, "_entropy_coeff_map", None)
        if per_head is not None:
            options["entropy_coeff"] = {
                str(k): plain(torch.as_tensor(v)) for k, v in sorted(per_head.items())
            }
        return options

    def _masked_entropy(
        self, dist: Any, adv_shape: torch.Size, mask: torch.Tensor
    ) -> torch.Tensor | TensorDictBase:
        """TorchRL's ``_get_entropy``, its finiteness check over the real steps only.

        TorchRL samples a Monte-Carlo entropy for the whole minibatch where the analytic one
        is not finite anywhere: padding whose inputs made the distribution degenerate (a
        scale of inf) changed every real step's entropy.
        """
        if (
            not isinstance(dist, CompositeDistribution)
            and has_analytic_entropy(dist)
            and not torch.compiler.is_compiling()
        ):
            entropy = dist.entropy()
            if entropy.shape == adv_shape and bool(_where(mask, entropy, 0.0).isfinite().all()):
                return entropy.unsqueeze(-1)
        return self._get_entropy(dist, adv_shape=adv_shape)

    def _has_recurrence(self) -> bool:
        """Whether the actor or the critic holds a recurrent core (an RNN or RNN cell)."""
        if self._recurrence is None:  # found once
            networks = [n for n in (self.actor_network, self.critic_network) if n is not None]
            self._recurrence = any(
                isinstance(module, (nn.RNNBase, nn.RNNCellBase))
                for network in networks
                for module in network.modules()
            )
        return self._recurrence

    def _check_recurrent_inputs(self, tensordict: TensorDictBase) -> None:
        """Refuses by name the inputs TorchRL's ``LSTMModule`` / ``GRUModule`` would fail on.

        Each sequence runs from the state stored at its position 0, split at ``is_init``: a
        missing state or ``is_init``, or a state of another dtype than the module's weights,
        would otherwise surface as TorchRL's or oneDNN's own error.
        """
        if self._recurrent is None:  # found once: walking the networks costs 60 us a call
            self._recurrent = tuple(
                (role, module, _weight_path(network, weight), weight, states, is_init)
                for role, network in (
                    ("actor", self.actor_network),
                    ("critic", self.critic_network),
                )
                if network is not None
                for module, weight, states, is_init in torchrl_cores(network)
            )
        for role, module, path, weight, states, is_init in self._recurrent:
            self._check_present(tensordict, role, module, [*states, is_init], is_init)
            # the weights the loss runs with: its parameters, which a deep copy or .double()
            # of the loss moves apart from the module's own tensors
            params = getattr(self, f"{role}_network_params", None)
            used = params.get(path, None) if params is not None and path else None
            used = used if isinstance(used, torch.Tensor) else weight
            for key in states:
                state = get_key(tensordict, key)
                if state.dtype != used.dtype:
                    raise state_dtype_error("RecurrentPPOLoss", key, state, role, module, used)
        # rppo_td's modules (and any with follows_recurrent_mode): in step mode a missing
        # state is a zero one, which in a minibatch would run every sequence from zero
        for role, network in (("actor", self.actor_network), ("critic", self.critic_network)):
            if getattr(network, "follows_recurrent_mode", False):
                states = list(getattr(network, "state_keys", ()))
                self._check_present(tensordict, role, network, states, None)

    @staticmethod
    def _check_present(
        tensordict: TensorDictBase,
        role: str,
        module: Any,
        keys: list[NestedKey],
        is_init: NestedKey | None,
    ) -> None:
        """Refuses a minibatch without one of the recurrent ``keys`` a module reads."""
        for key in keys:
            if tensordict.get(key, None) is None:
                what = "is_init" if key == is_init else "recurrent state"
                raise MissingKeyError(
                    f"RecurrentPPOLoss: the {role}'s {type(module).__name__} reads "
                    f"{key!r} (its {what}, at each sequence's first position), which "
                    "the minibatch lacks"
                )

    def loss_critic(
        self, tensordict: TensorDictBase
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The critic's loss per position and its masked diagnostics.

        Args:
            tensordict: ``[B, Lp]`` with ``value_target`` ``[B, Lp, 1]``, the critic's inputs,
                ``loss_mask`` and, with ``clip_value``, ``state_value`` (the old values).

        Returns:
            ``(loss, value_clip_fraction, explained_variance)``: ``loss`` ``[B, Lp, 1]``
            (times ``critic_coeff``, zero on padding, unreduced), the fraction of real steps
            whose value was clipped (``None`` without ``clip_value``) and
            ``1 - Var(target - value) / Var(target)`` over real steps (``None`` if
            ``log_explained_variance`` is False), both 0-dim.
        """
        loss, parts = self._critic_loss(tensordict)
        stats = parts.stats(self.log_explained_variance)
        return loss, stats.get("value_clip_fraction"), stats.get("explained_variance")

    def _critic_loss(
        self, tensordict: TensorDictBase, value: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, _CriticParts]:
        """``loss_critic``'s loss ``[B, Lp, 1]`` and what its diagnostics are computed from.

        ``value``: the critic's values ``[B, Lp, 1]`` if already computed (the shared
        trunk's pass), else the critic is run here.
        """
        if self.separate_losses:
            tensordict = tensordict.detach()
        keys = self.tensor_keys
        mask = self._mask(tensordict)
        target = get_key(tensordict, keys.value_target)
        _check_per_step(keys.value_target, target, tensordict.batch_size)
        target = _where(mask, target, 0.0)
        old_value = None
        if self.clip_value is not None:
            hint = "(clip_value needs the values the data was collected with)"
            old_value = get_key(tensordict, keys.value, hint=hint)
            _check_per_step(keys.value, old_value, tensordict.batch_size)
            old_value = _where(mask, old_value, 0.0).detach()
        if value is None:
            # the critic writes its outputs: give it a copy of what it reads
            in_keys = getattr(self.critic_network, "in_keys", None)
            inputs = tensordict.select(*in_keys, strict=False) if in_keys else tensordict.copy()
            with self._critic_parameters():
                value = get_key(self.critic_network(inputs), keys.value)
        target, value, old_value = self._critic_loss_inputs(target, value, old_value)
        loss = distance_loss(target, value, loss_function=self.loss_critic_type)
        was_clipped = None
        if old_value is not None:
            step = value - old_value
            clipped_step = step.clamp(-self.clip_value, self.clip_value)
            clipped_loss = distance_loss(
                target, old_value + clipped_step, loss_function=self.loss_critic_type
            )
            loss = torch.maximum(loss, clipped_loss)
            was_clipped = (step != clipped_step).detach().to(loss.dtype)
        loss = _where(mask, loss, 0.0)
        if self._has_critic:
            loss = self.critic_coeff * loss
        return loss, _CriticParts(mask, target.detach(), value.detach(), was_clipped)

    def _shares_trunk(self) -> bool:
        """Whether the actor's and critic's outputs come from one pass of a shared trunk.

        True where the actor says it shares its trunk with the critic
        (``RecurrentActor.shares_trunk_with``; any actor with that method and
        ``get_dist_and_value``), the critic writes the value key, both run with the same
        parameters (the critic's are the actor's: not ``separate_losses``, whose critic
        must not move the shared ones) and there is a critic loss. Checked at every call
        (the networks, keys and parameter containers may change between calls), the
        parameters' identity once per pair of containers. The two passes it replaces
        computed the same values; the gradients are the same sums, added up in one
        backward pass through the trunk instead of two.
        """
        if not self._has_critic or self.separate_losses or self._trunk_shared is False:
            return False
        actor, critic = self.actor_network, self.critic_network
        if self.tensor_keys.value not in getattr(critic, "out_keys", ()):
            return False
        shares = getattr(actor, "shares_trunk_with", None)
        if not (
            callable(shares)
            and callable(getattr(actor, "get_dist_and_value", None))
            and bool(shares(critic))
        ):
            return False
        # the containers' check walks every tensor: done again only for other containers
        key = (
            (id(self.actor_network_params), id(self.critic_network_params))
            if self.functional
            else ()
        )
        if self._parameters_key != key:
            self._parameters_same = self._same_parameters()
            self._parameters_key = key
        return self._parameters_same

    def _same_parameters(self) -> bool:
        """Whether the critic runs with the actor's own tensors (functional losses swap them in)."""
        if not self.functional:
            return True
        actor = self.actor_network_params.flatten_keys()
        critic = self.critic_network_params.flatten_keys()
        for key, value in critic.items():
            mine = actor.get(key, None)
            if (
                mine is None
                or mine.data_ptr() != value.data_ptr()
                or mine.requires_grad != value.requires_grad
            ):
                return False
        return True

    def _dist_and_value(self, tensordict: TensorDictBase) -> tuple[Any, torch.Tensor]:
        """The actor's distribution and the critic's values from the shared trunk's one pass."""
        params = self.actor_network_params if self.functional else None
        with functional_parameters(params, self.actor_network):
            return self.actor_network.get_dist_and_value(tensordict)  # type: ignore[no-any-return]

    def _get_cur_log_prob(
        self, tensordict: TensorDictBase, params: Any = None
    ) -> tuple[Any, Any, bool]:
        """TorchRL's, reading the shared trunk's distribution where this pass computed one."""
        shared = self._shared_dist
        if params is not None or shared is None or shared[0] is not tensordict:
            return super()._get_cur_log_prob(tensordict, params)
        dist = shared[1]
        action = get_key(tensordict, self.tensor_keys.action)
        if action.requires_grad:
            raise RuntimeError(f"tensordict stored {self.tensor_keys.action} requires grad.")
        return dist.log_prob(action), dist, False

    def _critic_parameters(self) -> contextlib.AbstractContextManager[object]:
        params = self.critic_network_params if self.functional else None
        return functional_parameters(params, self.critic_network)

    def _check_estimator_input(self, tensordict: TensorDictBase) -> None:
        """Refuses padded sequences without ``advantage`` where the estimator would misuse them.

        rppo_td's ``GAEEstimator`` works on ``[W, T]`` rollouts, where each episode is whole;
        TorchRL's recursive estimators (TD(1), TD(lambda), V-trace, TorchRL's own GAE, as the
        string ``"gae"`` gives it) run through the padding, so padded rewards would reach the
        real steps' advantages. TD(0) reads one step at a time and is left alone.
        """
        keys = self.tensor_keys
        estimator = self.value_estimator
        if tensordict.get(keys.loss_mask, None) is None or isinstance(estimator, TD0Estimator):
            return
        mask = self._mask(tensordict)  # [*B] bool, checked
        missing = f"{keys.advantage!r} is missing from these padded sequences"
        before = (
            "compute it on the [W, T] rollout before SequencePadder (rppo_td.GAE, or "
            "loss.value_estimator(rollout)), where every episode is whole"
        )
        if isinstance(estimator, GAEEstimator):
            raise MissingKeyError(f"{missing}: {before}")
        if not bool(mask.all()):
            raise ValueError(
                f"{missing}, and {type(estimator).__name__} would run its recursion over time "
                f"through their padding ({keys.loss_mask!r} is False at "
                f"{int((~mask).sum())} positions): padded rewards would reach the real steps' "
                f"advantages; {before}, or use make_value_estimator(ValueEstimators.TD0)"
            )

    def _mask(self, tensordict: TensorDictBase) -> torch.Tensor:
        """``loss_mask`` ``[*B]`` bool, or all True where the input has none."""
        key = self.tensor_keys.loss_mask
        batch = tensordict.batch_size
        mask = tensordict.get(key, None)
        if mask is None:
            _check_unmasked(tensordict, key)
            return torch.ones(batch, dtype=torch.bool, device=tensordict.device)
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise ValueError(f"{key!r} must be a bool tensor, got {getattr(mask, 'dtype', mask)}")
        if mask.shape == (*batch, 1):
            mask = mask.squeeze(-1)
        if mask.shape != batch:
            raise ValueError(
                f"{key!r} must have the batch shape {list(batch)}, got {list(mask.shape)}"
            )
        return mask


def _check_unmasked(tensordict: TensorDictBase, key: NestedKey) -> None:
    """Refuses an input without ``key`` that holds padded sequences all the same.

    Read as unmasked, its padding would count as real steps (a mask key renamed on one side
    only). Padded: a leaf named ``loss_mask``, or ``rollout_steps`` (the padder's; 0 on padding)
    with a 0 in it. Sequences cut from padded ones without their padding pass.
    """
    for k in tensordict.keys(include_nested=True, leaves_only=True):
        name = as_path(k)[-1]
        found = name == _DEFAULT.loss_mask
        if name == _DEFAULT.rollout_steps:
            steps = tensordict.get(k)
            found = isinstance(steps, torch.Tensor) and bool((steps == 0).any())
        if found:
            raise MissingKeyError(
                f"RecurrentPPOLoss's mask key {key!r} is not in the minibatch, which holds "
                f"padded sequences ({k!r}): unmasked, their padding would count as real "
                "steps. Give the loss the padder's mask key (loss_mask_key=, "
                "set_keys(loss_mask=...))"
            )


def _check_whole_actions(tensordict: TensorDictBase, keys: list[NestedKey]) -> None:
    """Refuses float actions with a fraction for a categorical policy.

    Its ``log_prob`` reads ``1.5`` as action 1, silently. Integer actions (the usual) cost
    nothing here; the padding holds a real action by now.
    """
    for key in keys:
        action = tensordict.get(key, None)
        if isinstance(action, torch.Tensor) and action.is_floating_point():
            fractional = action != action.round()
            if bool(fractional.any()):
                value = float(action[fractional].flatten()[0])
                raise ValueError(
                    f"{key!r} holds {value}, a fraction, for a categorical policy: its "
                    "log-probability would be of the action rounded down; store the actions "
                    "as the indices the policy sampled (int64)"
                )


def _check_per_step(key: NestedKey, x: torch.Tensor, batch: torch.Size) -> None:
    """Refuses an advantage, a value target or an old value ``x`` not ``[*batch, 1]``.

    Another shape would broadcast against the ``[*batch, 1]`` log-ratios (values) into a
    wrong loss (an ``[B, Lp]`` advantage with ``B == Lp`` or ``B == 1``), or fail in
    TorchRL's ``distance_loss`` naming no key.
    """
    shape = tuple(x.shape)
    if len(shape) <= len(batch) or shape[: len(batch)] != tuple(batch) or shape[-1] != 1:
        raise ValueError(
            f"{key!r} must have shape [*batch, 1] = {[*batch, 1]} (one value per step), "
            f"got {list(shape)}"
        )


def _finite(value: object) -> TypeGuard[float]:
    """A real number (not a bool) that is finite.

    Also a one-number real tensor, which ``ClipPPOLoss`` takes as a coefficient.
    """
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype == torch.bool or value.is_complex():
            return False
        value = value.item()
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _as_float(value: Any) -> Any:
    """A real number (numpy's too, not a tensor) as a ``float``, as given otherwise.

    A pair of them (``clip_epsilon``'s ``(low, high)``) as a tuple of floats; None and tensors
    unchanged.
    """
    if isinstance(value, tuple | list):
        return tuple(_as_float(item) for item in value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    return value


def _check_coefficients(
    clip_epsilon: object, entropy_coeff: object, critic_coeff: object, clip_value: object
) -> None:
    """Refuses by name the values TorchRL's ``ClipPPOLoss`` would take and misuse.

    A ``clip_epsilon`` or ``clip_value`` of 0 or less inverts or empties the clip range, and
    NaN passes every comparison: each would train on without an error.
    """
    if isinstance(clip_epsilon, tuple | list):
        # TorchRL's asymmetric (low, high): the ratio clipped to [1 - low, 1 + high]
        low_high = tuple(clip_epsilon)
        if not (
            len(low_high) == 2
            and all(_finite(eps) for eps in low_high)
            and 0 < low_high[0] < 1
            and low_high[1] > 0
        ):
            raise ValueError(
                "clip_epsilon as (low, high) must hold two finite numbers, 0 < low < 1 and "
                f"high > 0 (the ratio is clipped to [1 - low, 1 + high]), got {clip_epsilon!r}"
            )
    elif not (_finite(clip_epsilon) and 0 < clip_epsilon < 1):
        raise ValueError(
            "clip_epsilon must be a finite number in (0, 1) (the ratio is clipped to "
            f"[1 - clip_epsilon, 1 + clip_epsilon]), or a (low, high) pair; got {clip_epsilon!r}"
        )
    if not (
        clip_value is None
        or isinstance(clip_value, bool)
        or (_finite(clip_value) and clip_value > 0)
    ):
        raise ValueError(
            f"clip_value must be None, True, False or a finite number > 0, got {clip_value!r}"
        )
    if critic_coeff is not None and not (_finite(critic_coeff) and critic_coeff >= 0):
        raise ValueError(f"critic_coeff must be None or a finite number >= 0, got {critic_coeff!r}")
    entropy = entropy_coeff.values() if isinstance(entropy_coeff, Mapping) else [entropy_coeff]
    if not all(_finite(value) for value in entropy):
        raise ValueError(
            "entropy_coeff must be a finite number (or a mapping of head keys to them), got "
            f"{entropy_coeff!r}"
        )


def _log_prob_shape_error(keys: Any, advantage: torch.Size, got: Any) -> ValueError:
    """The stored log-probabilities do not have one entry per step of ``advantage``."""
    steps = list(advantage[:-1])
    hint = ""
    if isinstance(got, list) and len(got) > len(steps) and got[: len(steps)] == steps:
        # e.g. torch.distributions.Normal: one log-probability per action dimension
        hint = (
            ": one per action dimension? Use a distribution whose log_prob sums over them "
            "(TorchRL's IndependentNormal or TanhNormal), or sum the stored log-probability "
            "over its trailing dimensions"
        )
    return ValueError(
        f"{keys.sample_log_prob!r} must hold one log-probability per step, "
        f"{steps} (as {keys.advantage!r} {list(advantage)}), got {got}{hint}"
    )


def _shape_of(tensordict: TensorDictBase, key: NestedKey) -> Any:
    value = tensordict.get(key, None)
    return list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__


def _pad_with_a_real_one(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x`` ``[*B, *F]`` with the first real step's value at each padding position.

    ``mask`` ``[*B]`` bool marks the real steps. No synchronisation; where every step is
    padding, the first one's value fills them all (``x`` as it is at position 0).
    """
    event = x.shape[mask.ndim :]
    first = mask.reshape(-1).to(torch.uint8).argmax().view(1)
    return _where(mask, x, x.reshape(mask.numel(), *event).index_select(0, first).view(event))


def _sum_beyond(x: torch.Tensor, dims: int) -> torch.Tensor:
    """``x`` ``[*B, *F]`` summed over ``F`` (``B`` its first ``dims`` dims): ``[*B]``."""
    return x.flatten(dims).sum(-1) if x.ndim > dims else x


def _where(mask: torch.Tensor, x: torch.Tensor, fill: float | torch.Tensor) -> torch.Tensor:
    """``x`` ``[*B, *F]`` where ``mask`` ``[*B]`` is True, ``fill`` (number or ``[*F]``) else."""
    return torch.where(mask.view(*mask.shape, *([1] * (x.ndim - mask.ndim))), x, fill)


def _masked_variance(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The population variance of ``x`` ``[*B, 1]`` over the real steps of ``mask``."""
    return masked_mean((x - masked_mean(x, mask)).square(), mask)


def _per_step(x: torch.Tensor, mask: torch.Tensor) -> int:
    """How many values ``x`` ``[*B, *F]`` holds per step of ``mask`` ``[*B]``.

    1 for ``[*B]`` or ``[*B, 1]``; ``A`` for TorchRL's agents' layout ``[*B, A, 1]``.
    """
    return max(x.numel() // max(mask.numel(), 1), 1)


def _mean(x: torch.Tensor, mask: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """The mean of ``x`` ``[*B, *F]`` over its values at the ``count`` real steps of ``mask``."""
    return _where(mask, x, 0.0).sum() / (count * _per_step(x, mask))


def _ratio_stats(
    log_weight: torch.Tensor, mask: torch.Tensor, count: torch.Tensor
) -> dict[str, torch.Tensor]:
    """ESS (normalised to ``(0, 1]``), largest and mean ratio, over the real steps."""
    values = count * _per_step(log_weight, mask)
    log_weight = _where(mask, log_weight, -torch.inf).flatten()
    ess = (2 * log_weight.logsumexp(0) - (2 * log_weight).logsumexp(0)).exp() / values
    ratio = log_weight.exp()
    return {
        "ESS": ess,
        "max_ratio": ratio.max(),
        "mean_ratio": ratio.sum() / values,
    }


@dataclass
class _CriticParts:
    """What the critic's diagnostics are computed from (all detached).

    ``mask`` ``[*B]`` bool; ``target`` and ``value`` ``[*B, 1]``; ``was_clipped`` ``[*B, 1]``
    float (1 where ``clip_value`` clipped the value's step) or None without ``clip_value``.
    """

    mask: torch.Tensor
    target: torch.Tensor
    value: torch.Tensor
    was_clipped: torch.Tensor | None

    def stats(self, explained_variance: bool) -> dict[str, torch.Tensor]:
        """``value_clip_fraction`` and ``explained_variance`` over this call's real steps."""
        out: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            if self.was_clipped is not None:
                out["value_clip_fraction"] = masked_mean(self.was_clipped, self.mask)
            if explained_variance:
                residual = _masked_variance(self.target - self.value, self.mask)
                eps = torch.finfo(self.target.dtype).eps
                total = _masked_variance(self.target, self.mask) + eps
                out["explained_variance"] = 1.0 - residual / total
        return out


def _normalize_over_group(
    advantage: torch.Tensor, mask: torch.Tensor, count: torch.Tensor, group: Any, eps: float
) -> torch.Tensor:
    """``masked_normalize`` with the mean and deviation of the real steps of every rank.

    ``advantage`` ``[*B, 1]`` is zero on padding; ``count`` is the group's real steps.
    """
    per_step = advantage.numel() // max(mask.numel(), 1)  # the trailing dims the mask covers
    total = (count * per_step).clamp(min=1)
    # the sums in float64, as masked_normalize's: real steps all equal centre to exactly 0
    values = advantage.double()
    mean = all_reduce(values.sum(), group) / total
    centred = _where(mask, values - mean, 0.0)
    std = (all_reduce(centred.square().sum(), group) / total).sqrt()
    return (centred / (std + eps)).to(advantage.dtype)


def _group_stats(
    sums: dict[Any, torch.Tensor],
    log_weight: torch.Tensor,
    critic: _CriticParts | None,
    mask: torch.Tensor,
    count: torch.Tensor,
    group: Any,
    explained_variance: bool,
) -> dict[Any, torch.Tensor]:
    """The diagnostics over the real steps of every rank: one MAX and one SUM all-reduce.

    ``sums`` maps a name to per-step values ``[*B]``, ``[*B, 1]`` or ``[*B, A, 1]`` whose
    mean it reports;
    ``log_weight`` is the log-ratio; ``count`` the group's real steps. Sums are float64.
    """
    dtype = log_weight.dtype
    log_weight = _where(mask, log_weight, -torch.inf)
    top = all_reduce(log_weight.max(), group, torch.distributed.ReduceOp.MAX)

    def summed(x: torch.Tensor, square: bool = False) -> tuple[torch.Tensor, int]:
        """The float64 sum of ``x`` (or of its square) over the real steps, and its divisor.

        The divisor per real step is the number of values a step gives (``A`` for
        ``[*B, A, 1]``).
        """
        y = _where(mask, x.double(), 0.0)
        return (y.square() if square else y).sum(), _per_step(x, mask)

    parts = [summed(x) for x in sums.values()]
    shifted = (log_weight - top).double().exp()  # 0 on padding
    ratio_values = _per_step(log_weight, mask)
    parts += [(shifted.sum(), ratio_values), (shifted.square().sum(), ratio_values)]
    clipped = critic.was_clipped if critic is not None else None
    if clipped is not None:
        parts.append(summed(clipped))
    if critic is not None and explained_variance:
        residual = critic.target - critic.value
        parts += [summed(residual), summed(residual, square=True)]
        parts += [summed(critic.target), summed(critic.target, square=True)]
    totals = all_reduce(torch.stack([total for total, _ in parts]), group)
    n = count.double()
    per = torch.tensor([values for _, values in parts], dtype=torch.float64, device=n.device)
    means = totals / (n * per)
    stats = {name: means[i].to(dtype) for i, name in enumerate(sums)}
    k = len(sums)
    first, second = totals[k], totals[k + 1]
    stats["ESS"] = (first.square() / second / (n * ratio_values)).to(dtype)
    stats["max_ratio"] = top.exp()
    stats["mean_ratio"] = (top.double().exp() * means[k]).to(dtype)
    k += 2
    if clipped is not None:
        stats["value_clip_fraction"] = means[k].to(dtype)
        k += 1
    if critic is not None and explained_variance:
        r_mean, r_square, t_mean, t_square = means[k : k + 4]
        residual_var = r_square - r_mean.square()
        target_var = t_square - t_mean.square()
        eps = torch.finfo(critic.target.dtype).eps
        stats["explained_variance"] = (1.0 - residual_var / (target_var + eps)).to(dtype)
    return stats


def _weight_path(network: nn.Module, weight: torch.Tensor) -> tuple[str, ...] | None:
    """The key of ``weight`` in ``network``'s parameters, as TorchRL's loss parameters key it."""
    for name, param in network.named_parameters():
        if param is weight:
            return tuple(name.split("."))
    return None
