"""Values and episode ends, shared by the GAE transform and estimator.

``network_values`` runs a TensorDict value network on a ``[*B, T]`` rollout and on its
``"next"`` sub-tensordict and returns ``(V(o_t), V(o_{t+1}))`` without writing anything into
the rollout. TorchRL's ``LSTMModule`` / ``GRUModule`` and rppo_td's recurrent modules are
evaluated correctly in both modes: outside recurrent mode every step runs from the state
stored with it; inside
``set_recurrent_mode(True)`` each row runs as a sequence split where ``is_init`` is True, and
``"next"`` is split at the root's ``is_init`` too, so it never runs across a reset.
``episode_ends`` adds to ``done`` the ends that only ``is_init`` marks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from tensordict import NestedKey, TensorDictBase, is_tensor_collection, unravel_key
from torch import nn
from torchrl.modules import GRUModule, LSTMModule, recurrent_mode

from rppo_td._validation import (
    MissingKeyError,
    check_dtype,
    check_not_transposed,
    first_line,
    get_key,
)

__all__ = [
    "episode_ends",
    "functional_parameters",
    "network_values",
    "state_dtype_error",
    "torchrl_cores",
]


def network_values(
    network: Callable[[TensorDictBase], TensorDictBase],
    tensordict: TensorDictBase,
    *,
    value_key: NestedKey,
    is_init_key: NestedKey,
    time_dim: int,
    who: str,
    params: TensorDictBase | None = None,
    target_params: TensorDictBase | None = None,
    current: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(V(o_t), V(o_{t+1}))``, each ``[*B, T, 1]``, from ``network``, without gradients.

    The network runs on a selection of its ``in_keys`` (a copy of the whole tensordict for a
    plain callable without ``in_keys``) of the root and of ``tensordict["next"]``, so its
    by-products (an LSTM's ``("next", "recurrent_state_h")``) never reach ``tensordict``.

    Args:
        network: a TensorDict module writing ``value_key``.
        tensordict: ``[*B, T]`` rollout with a ``"next"`` sub-tensordict.
        value_key: what the network writes (``state_value``); the next value is read from
            the network's output on ``"next"`` under the same key.
        is_init_key: first step of an episode, ``[*B, T, 1]`` bool; needed by a recurrent
            network in recurrent mode.
        time_dim: the time dimension; a network in recurrent mode needs it last.
        who: the caller's name, for error messages.
        params: parameters to run ``network`` with (TorchRL's functional parameters,
            detached here); ``None``: the network's own.
        target_params: parameters for the next values; ``None``: ``params``.
        current: also compute ``V(o_t)``; False returns ``None`` in its place (one network
            call instead of two).

    Returns:
        ``(value, next_value)``, each ``[*B, T, 1]``, detached.
    """
    in_keys = list(getattr(network, "in_keys", []))
    following_td = _sub_tensordict(tensordict, "next", who)
    _check_state_dtypes(network, [tensordict, following_td] if current else [following_td], who)
    _check_is_init(network, tensordict, who)
    if in_keys:
        _check_inputs(in_keys, tensordict, following_td, is_init_key, who, current=current)
        root = tensordict.select(*in_keys, strict=False)
        following = following_td.select(*in_keys, strict=False)
    else:  # a plain callable: give it copies it may write into
        root = tensordict.copy()
        following = following_td.copy()
    if _runs_recurrent(network):
        if time_dim != tensordict.batch_dims - 1:
            raise ValueError(
                "a recurrent value network runs along the last batch dimension; "
                f"time_dim is {time_dim} for batch size {list(tensordict.batch_size)}"
            )
        is_init = get_key(tensordict, is_init_key, hint="(a recurrent value network splits at it)")
        next_init = following.get(is_init_key, None)
        # split rollout["next"] where the root starts an episode: the next observation
        # after a reset must start from its own stored state, not run on from the old one
        following.set(is_init_key, is_init if next_init is None else next_init | is_init)
    elif root.get(is_init_key, None) is not None and is_init_key not in following.keys(
        include_nested=True
    ):
        # outside recurrent mode is_init zeroes the state; the next step continues it
        following.set(is_init_key, torch.zeros_like(root.get(is_init_key)))
    if params is not None:
        params = params.detach()
    if target_params is None:
        target_params = params
    with torch.no_grad():
        value = None
        if current:
            with functional_parameters(params, network):
                out = _run(network, root, who, plain=not in_keys)
                value = get_key(out, value_key, hint="(value_network's output)")
        with functional_parameters(target_params, network):
            next_value = get_key(
                _run(network, following, who, plain=not in_keys),
                value_key,
                hint="(value_network's output on 'next')",
            )
    return value, next_value


def _run(
    network: Callable[[TensorDictBase], TensorDictBase],
    tensordict: TensorDictBase,
    who: str,
    *,
    plain: bool,
) -> TensorDictBase:
    """``network(tensordict)``, refusing a plain callable that is no TensorDict module.

    An ``nn.Linear`` failed with torch's dispatch error from inside it; one returning a
    tensor failed reading the value from it.
    """
    if not plain:
        return network(tensordict)
    what = f"{who}'s value_network ({type(network).__name__}, without in_keys)"
    expected = "it must be a TensorDict module, or a callable taking and returning a tensordict"
    try:
        out = network(tensordict)
    except TypeError as err:
        raise TypeError(f"{what} failed on a tensordict ({first_line(err)}): {expected}") from err
    if not is_tensor_collection(out):
        raise TypeError(f"{what} returned {type(out).__name__}, not a tensordict: {expected}")
    return out


def _check_inputs(
    in_keys: list[NestedKey],
    tensordict: TensorDictBase,
    following: TensorDictBase,
    is_init_key: NestedKey,
    who: str,
    *,
    current: bool,
) -> None:
    """Refuses a rollout that lacks one of the value network's ``in_keys`` (root or next).

    TorchRL's ``LSTMModule``/``GRUModule`` run from a zero state where their state keys are
    missing, without a word: the values, and every advantage after them, would be those of
    a network that forgot its episode. ``is_init`` is left to the caller (it is derived
    under ``"next"``).
    """
    skip = unravel_key(is_init_key)
    places = [(following, "next")] if not current else [(tensordict, None), (following, "next")]
    for td, prefix in places:
        for key in in_keys:
            key = unravel_key(key)
            if key == skip or td.get(key, None) is not None:
                continue
            path = key if prefix is None else unravel_key((prefix, key))
            raise MissingKeyError(
                f"{who}: the value network reads {key!r} (one of its in_keys), and the "
                f"rollout has no {path!r}: keep it in the rollout. (A collector stores the "
                "recurrent states at the root and under 'next'; a recurrent module would take "
                "a missing state as zero and every value after it would be wrong, silently.)"
            )


def _check_is_init(network: object, tensordict: TensorDictBase, who: str) -> None:
    """Refuses a rollout without the ``is_init`` a TorchRL recurrent module reads.

    ``LSTMModule``/``GRUModule`` read it in and out of recurrent mode; without it they fail
    inside TorchRL with a bare ``KeyError``. (Under ``"next"`` it is derived from the root's.)
    """
    if not isinstance(network, nn.Module):
        return
    for module, _, _, is_init in torchrl_cores(network):
        if tensordict.get(is_init, None) is None:
            raise MissingKeyError(
                f"{who}: the value network's {type(module).__name__} reads {is_init!r} (where "
                "episodes start, [*B, T, 1] bool), which the rollout lacks: append TorchRL's "
                "InitTracker() to the env, and its collector stores it"
            )


def _check_state_dtypes(network: object, places: list[TensorDictBase], who: str) -> None:
    """Refuses a stored state of another dtype than its TorchRL recurrent module's weights."""
    if not isinstance(network, nn.Module):
        return
    for module, weight, states, _ in torchrl_cores(network):
        for key in states:
            for td in places:
                state = td.get(key, None)
                if isinstance(state, torch.Tensor) and state.dtype != weight.dtype:
                    raise state_dtype_error(who, key, state, "value network", module, weight)


def torchrl_cores(
    network: nn.Module,
) -> list[tuple[nn.Module, torch.Tensor, list[NestedKey], NestedKey]]:
    """``(module, weight, state keys, is_init key)`` of each TorchRL recurrent module.

    The ``LSTMModule`` s and ``GRUModule`` s inside ``network``; ``weight`` is the core's first
    input weight, whose dtype the stored states must have (a tensor whether a loss or the
    module holds it).
    """
    found = []
    for module in network.modules():
        if isinstance(module, LSTMModule | GRUModule):
            core = module.lstm if isinstance(module, LSTMModule) else module.gru
            *states, is_init = module.in_keys[1:]  # in_key, the states, is_init
            found.append((module, core.weight_ih_l0, states, is_init))
    return found


def state_dtype_error(
    who: str,
    key: NestedKey,
    state: torch.Tensor,
    role: str,
    module: nn.Module,
    weight: torch.Tensor,
) -> ValueError:
    """A stored recurrent state of another dtype than its module's weights.

    oneDNN's own error for it names nothing ("get_mkldnn_dtype: unsupported data type").
    """
    return ValueError(
        f"{who}: the stored state {key!r} is {state.dtype}, but the {role}'s "
        f"{type(module).__name__} has {weight.dtype} weights; store the recurrent state as "
        f"{weight.dtype}"
    )


def _runs_recurrent(network: object) -> bool:
    """Whether a recurrent module inside ``network`` would run in recurrent mode now.

    TorchRL's ``LSTMModule``/``GRUModule`` say so themselves (``recurrent_mode``); a module
    with ``follows_recurrent_mode`` (rppo_td's ``RecurrentActor``, ``RecurrentCritic`` and
    ``RecurrentPolicy``) runs in it whenever TorchRL's ``recurrent_mode()`` is set.
    """
    if not isinstance(network, nn.Module):
        return False
    on = bool(recurrent_mode())
    return any(
        bool(module.recurrent_mode)
        if isinstance(module, (LSTMModule, GRUModule))
        else on and getattr(module, "follows_recurrent_mode", False) is True
        for module in network.modules()
    )


def _sub_tensordict(td: TensorDictBase, key: NestedKey, who: str) -> TensorDictBase:
    """``td[key]`` when it is a tensordict, else a ``KeyError`` naming it."""
    value = td.get(key, None)
    if not isinstance(value, TensorDictBase):
        raise MissingKeyError(f"{who} needs the sub-tensordict {key!r} (the next step's data)")
    return value


def functional_parameters(
    params: TensorDictBase | None, network: object
) -> contextlib.AbstractContextManager[object]:
    """Runs ``network`` with ``params`` (TorchRL's functional parameters) inside the block."""
    if params is None:
        return contextlib.nullcontext()
    return params.to_module(network, preserve_module_state=False)  # type: ignore[return-value]


def episode_ends(
    done: torch.Tensor,
    tensordict: TensorDictBase,
    is_init_key: NestedKey,
    time_dim: int,
    done_key: NestedKey,
) -> torch.Tensor:
    """``done`` ``[*B, T, 1]``, also True before each step that ``is_init`` marks as a start.

    A collector that resets its envs at each batch (TorchRL's ``reset_at_each_iter``) starts
    new episodes that ``is_init`` marks without a ``done`` on the step before. Where the
    rollout has ``is_init``, GAE cuts there as ``EpisodeSplitter`` does; ``terminated`` is
    False on that step, so the cut bootstraps from ``("next", "state_value")``, as a
    truncation does. Without ``is_init`` in the rollout, ``done`` is returned as it is.

    Raises:
        ValueError: ``is_init`` of another shape than ``done``, or not bool (naming the key);
            a ``[W, T]`` rollout whose ``is_init`` shows it is ``[T, W]``
            (``check_not_transposed``; ``done_key`` names ``done`` there).
    """
    is_init = tensordict.get(is_init_key, None)
    if is_init is None:
        return done
    is_init = get_key(tensordict, is_init_key)
    check_dtype(is_init_key, is_init, torch.bool)
    if is_init.shape != done.shape:
        raise ValueError(
            f"{is_init_key!r} must have the shape of done, {list(done.shape)}, "
            f"got {list(is_init.shape)}"
        )
    if tensordict.batch_dims == 2 and time_dim == 1 and done.ndim == 3:
        check_not_transposed(done_key, done.squeeze(-1), is_init_key, is_init.squeeze(-1))
    ends = done.clone()
    steps = done.shape[time_dim]
    if steps > 1:
        ends.narrow(time_dim, 0, steps - 1).logical_or_(is_init.narrow(time_dim, 1, steps - 1))
    return ends
