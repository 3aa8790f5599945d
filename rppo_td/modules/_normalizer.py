"""Running mean/variance normalisation of the vector observation leaves."""

from __future__ import annotations

import math
import numbers

import torch
from tensordict import NestedKey, TensorDictBase
from torch import nn

from rppo_td._validation import MissingKeyError, check_tensordict
from rppo_td.modules._spaces import ObservationLeaf, is_image

__all__ = ["ObservationNormalizer"]


class ObservationNormalizer(nn.Module):
    """Scales vector observation leaves by running statistics, optionally centring them.

    Leaves that are float or integer ``Box`` spaces (not images; an integer vector, such as
    counts in ``[0, 1000]``, reached the network raw) are mapped, as float32, to
    ``clamp(x / sqrt(mean**2 + var + eps), -clip, clip)``, the running root mean square about
    zero, or with ``center=True`` to ``clamp((x - mean) / sqrt(var + eps), -clip, clip)``;
    other leaves pass through. The statistics start at mean 0, variance 1 and are buffers
    (saved with the model); they change only in ``update``, which the trainer calls after each
    PPO update, so a rollout and the update on it see the same normalisation and the
    first-epoch probability ratio is exactly 1.

    Centring is off by default: the running mean of an observation the policy moves, such as
    a cart's position, follows where the policy has been, so a centred input moves the point
    the policy treats as zero along with it, and a small bias becomes a drift (masked
    CartPole: the cart walks off the track while the pole stays up; docs/results.md). Without
    centring, zero stays the env's zero.

    Args:
        leaves: from ``observation_leaves``.
        clip: bound of the normalised values, a finite number > 0.
        center: subtract the running mean too (a standardisation).

    Example:
        >>> import gymnasium as gym
        >>> from tensordict import TensorDict
        >>> from rppo_td.modules._spaces import observation_leaves
        >>> leaves = observation_leaves(gym.spaces.Box(-9, 9, (2,)))
        >>> seen = TensorDict({"observation": torch.tensor([[1.0, 0.0], [3.0, 0.0]])}, [2])
        >>> obs = TensorDict({"observation": torch.tensor([[3.0, 0.0]])}, [1])
        >>> norm = ObservationNormalizer(leaves)
        >>> norm.update(seen)  # mean [2, 0], variance [1, 0]
        >>> norm(obs)["observation"]  # 3 / sqrt(2**2 + 1)
        tensor([[1.3416, 0.0000]])
        >>> centred = ObservationNormalizer(leaves, center=True)
        >>> centred.update(seen)
        >>> centred(obs)["observation"]  # (3 - 2) / sqrt(1)
        tensor([[1., 0.]])
    """

    def __init__(
        self, leaves: list[ObservationLeaf], *, clip: float = 10.0, center: bool = False
    ) -> None:
        super().__init__()
        import gymnasium as gym

        self.keys = [
            key
            for key, space in leaves
            if isinstance(space, gym.spaces.Box)
            and not is_image(space)
            and space.dtype.kind in "fiu"  # not bool
        ]
        self.shapes: dict = {
            key: tuple(space.shape or ()) for key, space in leaves if key in self.keys
        }
        if isinstance(clip, bool) or not isinstance(clip, numbers.Real) or not 0 < clip < math.inf:
            raise ValueError(f"clip must be a finite number > 0, got {clip!r}")
        self.clip: float = float(clip)
        self.center: bool = center
        for i, key in enumerate(self.keys):
            shape = self.shapes[key]
            self.register_buffer(f"mean_{i}", torch.zeros(shape, dtype=torch.float64))
            self.register_buffer(f"var_{i}", torch.ones(shape, dtype=torch.float64))
        self.count: torch.Tensor
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        # float32 mean and 1/std, derived from the float64 statistics: refreshed by update()
        # and on load_state_dict, so forward() is two ops per leaf
        for i, key in enumerate(self.keys):
            shape = self.shapes[key]
            self.register_buffer(f"shift_{i}", torch.zeros(shape), persistent=False)
            self.register_buffer(f"scale_{i}", torch.ones(shape), persistent=False)
        self._refresh()
        # a module-level function, not a lambda: the module stays picklable (torch.save of
        # the agent, TorchRL's multi-process collectors)
        self.register_load_state_dict_post_hook(_refresh_after_load)

    @torch.no_grad()
    def _refresh(self) -> None:
        for i in range(len(self.keys)):
            mean, var = getattr(self, f"mean_{i}"), getattr(self, f"var_{i}")
            if self.center:
                getattr(self, f"shift_{i}").copy_(mean)
                getattr(self, f"scale_{i}").copy_(var.add(1e-8).rsqrt())
            else:
                getattr(self, f"scale_{i}").copy_((mean.square() + var).add(1e-8).rsqrt())

    def forward(self, obs: TensorDictBase) -> TensorDictBase:
        """Obs with batch ``[*B]`` -> a shallow copy with the vector leaves normalised (float32)."""
        if not self.keys:
            return obs
        out = obs.copy()
        for i, key in enumerate(self.keys):
            x = obs.get(key).float()  # float32 out, whatever the leaf's dtype (a 0-dim scale
            # would not promote a float16 leaf; a float64 one stayed float64)
            if self.center:
                x = x - getattr(self, f"shift_{i}")
            out.set(key, (x * getattr(self, f"scale_{i}")).clamp_(-self.clip, self.clip))
        return out

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        # a dtype cast of the agent (net.half(), net.float(), net.to(torch.float32)) would
        # cast the float64 statistics too: half's count overflows to inf and the variances
        # turn NaN at the next update, float32 counts are inexact past 2**24. They keep
        # float64 and follow the module's device only (MPS, without float64, takes float32).
        kept = {name: self._buffers[name] for name in self._statistics()}
        out = super()._apply(fn, recurse)
        for name, before in kept.items():
            after = self._buffers[name]
            if before is not None and after is not None and after.dtype != before.dtype:
                dtype = torch.float32 if after.device.type == "mps" else before.dtype
                self._buffers[name] = before.to(device=after.device, dtype=dtype)
        return out

    def _statistics(self) -> list[str]:
        """The names of the float64 running statistics (buffers saved with the model)."""
        means = [f"mean_{i}" for i in range(len(self.keys))]
        return [*means, *(f"var_{i}" for i in range(len(self.keys))), "count"]

    @torch.no_grad()
    def update(self, obs: TensorDictBase, *, loss_mask: NestedKey = "loss_mask") -> None:
        """Merges the statistics of ``obs`` (any batch) into the running ones (Chan et al.).

        Padded sequences (or a minibatch of them) count their real steps only: where ``obs``
        holds ``loss_mask`` (``[*B]`` bool, True on real steps), the padding is left out (its
        zeros would pull the mean towards 0 and stay in the statistics for good).

        Args:
            obs: observations with batch ``[*B]`` (a ``[W, T]`` rollout, padded sequences).
            loss_mask: the mask's key, where ``SequencePadder`` was given another.

        Raises:
            ValueError: a leaf missing, of another trailing shape than its space's, or holding
                a NaN or an infinity (it would stay in the running statistics for good),
                naming the key; a ``loss_mask`` that is not ``[*B]`` bool; nothing is merged
                then.
        """
        if not self.keys:
            return
        check_tensordict(obs, "ObservationNormalizer.update")
        mask = obs.get(loss_mask, None)
        if mask is not None:
            if not (
                isinstance(mask, torch.Tensor)
                and mask.dtype == torch.bool
                and mask.shape == obs.batch_size
            ):
                got = (
                    f"{mask.dtype} {list(mask.shape)}"
                    if isinstance(mask, torch.Tensor)
                    else type(mask).__name__
                )
                raise ValueError(
                    f"ObservationNormalizer.update: {loss_mask!r} must be bool with the batch "
                    f"shape {list(obs.batch_size)} (True on real steps), got {got}; nothing "
                    "was merged"
                )
            obs = obs.select(*self.keys, strict=False)[mask]  # [n], the real steps
        leaves = [self._checked_leaf(obs, key) for key in self.keys]
        if leaves[0].numel() == 0:
            return  # no observation: nothing to merge (the mean of none is NaN)
        rows = [
            leaf.reshape(-1, *self.shapes[key]) for key, leaf in zip(self.keys, leaves, strict=True)
        ]
        counts = {key: x.shape[0] for key, x in zip(self.keys, rows, strict=True)}
        if len(set(counts.values())) > 1:  # one count serves every leaf
            raise ValueError(
                f"ObservationNormalizer.update: the observations hold different numbers of "
                f"rows {counts}; nothing was merged"
            )
        n = rows[0].shape[0]
        total = self.count + n
        merged = []
        for i, (key, x) in enumerate(zip(self.keys, rows, strict=True)):
            x = x.to(torch.float64)
            mean, var = getattr(self, f"mean_{i}"), getattr(self, f"var_{i}")
            batch_mean, batch_var = x.mean(0), x.var(0, unbiased=False)
            delta = batch_mean - mean
            new_mean = mean + delta * n / total
            # the weights first: a first update (count 0) must not meet an inf delta**2
            m2 = var * self.count + batch_var * n + delta.square() * (self.count * n / total)
            new_var = m2 / total
            if not bool(torch.isfinite(new_var).all() and torch.isfinite(new_mean).all()):
                raise ValueError(
                    f"ObservationNormalizer.update: observation {key!r} holds values whose "
                    "squares overflow float64 (|x| near 1e154 or more): the running statistics "
                    "would be inf or NaN for good; nothing was merged"
                )
            merged.append((mean, var, new_mean, new_var))
        for mean, var, new_mean, new_var in merged:
            mean.copy_(new_mean)
            var.copy_(new_var)
        self.count += n
        self._refresh()

    def _checked_leaf(self, obs: TensorDictBase, key: NestedKey) -> torch.Tensor:
        """``obs[key]``, refused by name where ``update`` would merge it wrongly."""
        x = obs.get(key, None)
        if x is None:
            raise MissingKeyError(
                f"ObservationNormalizer.update needs the observation {key!r}, which the "
                f"tensordict lacks (it holds {sorted(map(str, obs.keys(True, True)))[:8]})"
            )
        shape = self.shapes[key]
        if not _ends_with(tuple(x.shape), shape):
            raise ValueError(
                f"ObservationNormalizer.update: observation {key!r} must have the space's "
                f"shape {list(shape)} after its batch dims, got {list(x.shape)}"
            )
        if x.is_floating_point() and not bool(torch.isfinite(x).all()):
            raise ValueError(
                f"ObservationNormalizer.update: observation {key!r} holds a NaN or an "
                "infinity, which would stay in the running statistics for good; nothing was "
                "merged"
            )
        return x


def _ends_with(given: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether ``given`` ends with ``shape``, or with it less its trailing 1s.

    ``[B]`` for a ``(1,)`` space, as the forward pass takes it.
    """
    while True:
        if len(given) >= len(shape) and given[len(given) - len(shape) :] == shape:
            return True
        if not shape or shape[-1] != 1:
            return False
        shape = shape[:-1]


def _refresh_after_load(module: ObservationNormalizer, incompatible_keys: object) -> None:
    """``load_state_dict``'s post hook: the float32 shift and scale from the loaded statistics."""
    module._refresh()
