"""Action heads: a distribution per action space (Discrete, MultiDiscrete, Box)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Normal

__all__ = ["ActionHead", "MultiCategorical", "action_center", "make_action_head"]


class MultiCategorical:
    """Independent categoricals over the ``K`` entries of a MultiDiscrete action.

    Args:
        logits: ``[*B, sum(nvec)]`` float.
        nvec: the category count of each entry.
    """

    has_rsample = False  # TorchRL's Monte-Carlo entropy fallback asks

    def __init__(self, logits: torch.Tensor, nvec: list[int]) -> None:
        self.parts = [
            Categorical(logits=chunk, validate_args=False)
            for chunk in torch.split(logits, nvec, dim=-1)
        ]

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:  # noqa: B008
        """``[*sample_shape, *B, K]`` int64."""
        return torch.stack([d.sample(sample_shape) for d in self.parts], dim=-1)

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        """``[*B, K]`` int64 -> ``[*B]``, the sum over entries."""
        return sum(d.log_prob(action[..., i]) for i, d in enumerate(self.parts))

    def entropy(self) -> torch.Tensor:
        """``[*B]``."""
        return sum(d.entropy() for d in self.parts)

    @property
    def mode(self) -> torch.Tensor:
        """``[*B, K]`` int64, the most likely action."""
        return torch.stack([d.probs.argmax(-1) for d in self.parts], dim=-1)


class _DiagonalNormal:
    """Normal with a diagonal covariance; log-prob and entropy summed over ``D``."""

    has_rsample = False

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor) -> None:
        self.base = Normal(mean, log_std.exp().expand_as(mean), validate_args=False)

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:  # noqa: B008
        return self.base.sample(sample_shape)

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        return self.base.log_prob(action).sum(-1)

    def entropy(self) -> torch.Tensor:
        return self.base.entropy().sum(-1)

    @property
    def mode(self) -> torch.Tensor:
        return self.base.mean


class _Categorical:
    has_rsample = False

    def __init__(self, logits: torch.Tensor) -> None:
        self.base = Categorical(logits=logits, validate_args=False)

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:  # noqa: B008
        return self.base.sample(sample_shape)

    def log_prob(self, action: torch.Tensor) -> torch.Tensor:
        return self.base.log_prob(action)

    def entropy(self) -> torch.Tensor:
        return self.base.entropy()

    @property
    def mode(self) -> torch.Tensor:
        return self.base.logits.argmax(-1)


class ActionHead(nn.Module):
    """Features ``[*B, H]`` -> an action distribution with batch ``[*B]``.

    The distribution has ``sample()``, ``log_prob(action) -> [*B]``, ``entropy() -> [*B]``
    and ``mode`` (the deterministic action). Actions are int64 ``[*B]`` (Discrete), int64
    ``[*B, K]`` (MultiDiscrete) or float32 ``[*B, D]`` (Box, unclipped; the env loop clips).

    A Box head's mean is the linear layer's output plus ``center`` (``[D]``), so the first
    actions are sampled about the middle of the space: with bounds ``[5, 6]`` a mean about 0
    had every sample clipped to 5, and every action the same to the env.

    Args:
        kind: ``"discrete"``, ``"multi_discrete"`` or ``"box"``.
        in_features: ``H``.
        sizes: category counts (``[n]`` or ``nvec``), or ``[D]`` for a Box.
        center: ``[D]`` float, a Box's ``action_center`` (default zeros); not a parameter,
            nor in the state dict (it follows from the space).
    """

    def __init__(
        self, kind: str, in_features: int, sizes: list[int], center: torch.Tensor | None = None
    ) -> None:
        super().__init__()
        self.kind = kind
        self.sizes = sizes
        out = sum(sizes) if kind != "box" else sizes[0]
        self.linear = nn.Linear(in_features, out)
        nn.init.orthogonal_(self.linear.weight, 0.01)
        nn.init.zeros_(self.linear.bias)
        if kind == "box":
            self.log_std = nn.Parameter(torch.zeros(sizes[0]))
            zero = torch.zeros(sizes[0])
            self.register_buffer(
                "center", zero if center is None else center.to(zero), persistent=False
            )

    def forward(self, features: torch.Tensor):
        """Returns the distribution (see the class docstring)."""
        out = self.linear(features)
        if self.kind == "discrete":
            return _Categorical(out)
        if self.kind == "multi_discrete":
            return MultiCategorical(out, self.sizes)
        return _DiagonalNormal(out + self.center, self.log_std)


def action_center(space: gym.spaces.Box) -> torch.Tensor:
    """``[D]`` float32: where a Box head's first actions are centred, per dimension.

    The middle of ``[low, high]`` where both are finite; else 0 clipped into the bounds (the
    finite bound where 0 lies outside them). Symmetric spaces (Pendulum's ``[-2, 2]``) give 0.
    """
    low = np.asarray(space.low, dtype=np.float64)
    high = np.asarray(space.high, dtype=np.float64)
    finite = np.isfinite(low) & np.isfinite(high)
    # (the bounds zeroed where one is infinite: no inf - inf, whose NaN np.where would keep)
    middle = (np.where(finite, low, 0.0) + np.where(finite, high, 0.0)) / 2
    center = np.where(finite, middle, np.clip(0.0, low, high))
    return torch.as_tensor(center, dtype=torch.float32)


_USE_MAKE_ENV = "rppo_td.envs.make_env shows the env through spaces the agent supports"


def make_action_head(space: gym.Space, in_features: int) -> ActionHead:
    """The head for a ``Discrete``, 1-D ``MultiDiscrete`` or 1-D float ``Box`` action space.

    Discrete spaces must start at 0 (the head samples ``0..n-1``), spaces must not be empty.
    ``rppo_td.envs.make_env`` converts other starts, ``MultiBinary`` and multi-dimensional
    spaces to these (``canonical_action_space``).

    Raises:
        ValueError: any other action space, naming it.
    """
    if isinstance(space, gym.spaces.Discrete):
        if int(space.start) != 0:
            raise ValueError(
                f"action space {space} starts at {space.start}, but the agent samples "
                f"0..n-1; {_USE_MAKE_ENV} (it shifts the actions)"
            )
        return ActionHead("discrete", in_features, [int(space.n)])
    if isinstance(space, gym.spaces.MultiDiscrete) and space.nvec.ndim == 1:
        if space.start.any():
            raise ValueError(
                f"action space {space} has start {space.start.tolist()}, but the agent samples "
                f"from 0; {_USE_MAKE_ENV} (it shifts the actions)"
            )
        if space.nvec.size == 0:
            raise ValueError(f"action space {space} has no entries")
        return ActionHead("multi_discrete", in_features, [int(n) for n in space.nvec])
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        if not np.issubdtype(space.dtype, np.floating):
            raise ValueError(
                f"action space {space}: Box actions must be floating point, got {space.dtype}"
            )
        if space.shape[0] == 0:
            raise ValueError(f"action space {space} has no entries")
        return ActionHead("box", in_features, [int(space.shape[0])], action_center(space))
    raise ValueError(
        f"action space {space} is not supported: use Discrete, 1-D MultiDiscrete or 1-D float "
        f"Box; {_USE_MAKE_ENV} (it converts MultiBinary and multi-dimensional spaces)"
    )
