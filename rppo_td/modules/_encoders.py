"""Observation encoders chosen from the observation space."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch
from tensordict import NestedKey, TensorDictBase
from torch import nn

from rppo_td.modules._spaces import (
    ImageLayout,
    ObservationLeaf,
    check_image_layout,
    image_channels_last,
    is_image,
)

__all__ = ["ObservationEncoder"]


class _ImageEncoder(nn.Module):
    """CNN: uint8 ``[*B, H, W, C]``, ``[*B, C, H, W]`` or ``[*B, H, W]`` -> ``[*B, F]`` float.

    Pixels are scaled to [0, 1] by the space's bounds: ``(x - low) / (high - low)``, which
    is ``x / 255`` for the usual ``[0, 255]`` box (a binary ``[0, 1]`` image is read as 0 and 1,
    not 0 and 1/255). ``channels_last`` says which end of a 3-D image is the channel axis
    (``image_channels_last``).

    Images of at least 36 x 36 (Memory Gym's and Atari's 84 x 84) go through the Nature-DQN
    stack (32 8x8/4, 64 4x4/2, 64 3x3/1), as the seed design's agent does; smaller ones
    through two 3x3/2 layers (16 and 32 channels).
    """

    low: torch.Tensor  # buffers of a box other than [0, 255]: its bounds, per pixel
    span: torch.Tensor

    def __init__(self, space: gym.spaces.Box, out_features: int, *, channels_last: bool) -> None:
        super().__init__()
        shape = space.shape
        self.grayscale = len(shape) == 2
        if self.grayscale:  # [H, W]: one channel, added in forward
            shape = (*shape, 1)
        self.channels_last = channels_last
        c, h, w = (shape[2], shape[0], shape[1]) if self.channels_last else shape
        layers: list[nn.Module]
        if min(h, w) >= 36:
            layers = [
                nn.Conv2d(c, 32, kernel_size=8, stride=4),
                nn.ReLU(),
                nn.Conv2d(32, 64, kernel_size=4, stride=2),
                nn.ReLU(),
                nn.Conv2d(64, 64, kernel_size=3, stride=1),
                nn.ReLU(),
            ]
        else:
            layers = [
                nn.Conv2d(c, 16, kernel_size=3, stride=2, padding=1),
                nn.ReLU(),
                nn.Conv2d(16, 32, kernel_size=3, stride=2, padding=1),
                nn.ReLU(),
            ]
        self.conv = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            flat = self.conv(torch.zeros(1, c, h, w)).shape[-1]
        self.linear = nn.Linear(flat, out_features)
        low, high = np.asarray(space.low, np.float64), np.asarray(space.high, np.float64)
        self.plain = bool((low == 0).all() and (high == 255).all())  # x / 255, as before
        if not self.plain:  # from the space, so not in the state dict (old checkpoints load)
            span = np.where(high > low, high - low, 1.0)
            if self.grayscale:  # [H, W, 1], as forward adds the channel
                low, span = low[..., None], span[..., None]
            self.register_buffer("low", torch.as_tensor(low, dtype=torch.float32), False)
            self.register_buffer("span", torch.as_tensor(span, dtype=torch.float32), False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.grayscale:
            x = x.unsqueeze(-1)
        batch = x.shape[:-3]
        if self.plain:
            x = x.reshape(-1, *x.shape[-3:]).float() / 255.0
        else:
            x = ((x.float() - self.low) / self.span).reshape(-1, *x.shape[-3:])
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        return torch.relu(self.linear(self.conv(x))).reshape(*batch, -1)


class _OneHot(nn.Module):
    """int ``[*B]`` (Discrete) or ``[*B, K]`` (MultiDiscrete) -> one-hot ``[*B, sum(n)]``.

    Encoded in one scatter: entry ``i`` sets column ``offsets[i] + x[..., i]``, where
    ``offsets`` are the running sums of ``nvec`` (a Discrete leaf is one entry). That is
    ``torch.cat([one_hot(x[..., i], n_i) ...])`` exactly, without its ``K`` calls, each of
    which checks its input's range on a CPU by two reductions (MiniGrid's 28 entries took
    0.6 ms a call on the project's VM). The range is checked once for all entries instead,
    since an entry outside ``[0, n_i)`` would set a column of its neighbour: on a CPU with a
    ``ValueError`` naming the key and the entry, elsewhere with an assertion on the device (no
    wait for it). Float values must be whole numbers (checked the same way): truncating 0.99
    to 0 would read another observation. A MultiDiscrete leaf whose last dimension is not
    ``K`` is refused.
    """

    sizes: torch.Tensor
    offsets: torch.Tensor

    def __init__(self, nvec: list[int], *, multi: bool, key: NestedKey = "observation") -> None:
        super().__init__()
        self.nvec = nvec
        self.multi = multi
        self.key = key
        self.width = sum(nvec)
        # buffers, not parameters: they follow .to(device), are not trained, and are not in
        # the net's state_dict (a TorchRL loss's functional copies of the buffers hold them)
        self.register_buffer("sizes", torch.tensor(nvec, dtype=torch.int64), persistent=False)
        starts = [0]
        for n in nvec[:-1]:
            starts.append(starts[-1] + n)
        self.register_buffer("offsets", torch.tensor(starts, dtype=torch.int64), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.multi:
            x = x.unsqueeze(-1)
        elif x.ndim == 0 or x.shape[-1] != len(self.nvec):
            raise ValueError(
                f"observation {self.key!r}: a MultiDiscrete observation of {len(self.nvec)} "
                f"entries must have them in its last dimension, got shape {list(x.shape)}"
            )
        index = x.long()
        bad = (index < 0) | (index >= self.sizes)
        if x.is_floating_point():
            bad |= index != x
        if x.device.type != "cpu":
            torch._assert_async(~bad.any(), "Discrete observation entry out of its range")
        elif bool(bad.any()):
            entry = int(bad.reshape(-1, len(self.nvec)).any(0).nonzero()[0])
            value = x[..., entry][bad[..., entry]][0].item()
            which = f"entry {entry} " if self.multi else ""
            raise ValueError(
                f"observation {self.key!r}: {'Multi' if self.multi else ''}Discrete "
                f"observation {which}must be a whole number in [0, {self.nvec[entry]}), got "
                f"{value!r}"
            )
        out = torch.zeros(*x.shape[:-1], self.width, dtype=torch.float32, device=x.device)
        return out.scatter_(-1, index + self.offsets, 1.0)


class _Flatten(nn.Module):
    """float ``[*B, *S]`` -> ``[*B, prod(S)]`` (``S`` the leaf's shape)."""

    def __init__(self, ndim: int) -> None:
        super().__init__()
        self.ndim = ndim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ndim == 0:
            return x.float().unsqueeze(-1)
        return x.float().flatten(start_dim=x.ndim - self.ndim)


def _leaf_encoder(
    key: NestedKey, space: gym.Space, image_features: int, image_layout: ImageLayout
) -> tuple[nn.Module, int]:
    shape = tuple(space.shape or ())
    if int(np.prod(shape)) == 0:
        raise ValueError(f"observation leaf {space} has no entries (shape {shape})")
    if isinstance(space, gym.spaces.Box) and is_image(space):
        last = image_channels_last(shape, image_layout, key)
        return _ImageEncoder(space, image_features, channels_last=last), image_features
    if isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete) and np.any(space.start):
        raise ValueError(
            f"observation space {space} does not start at 0, so its one-hot encoding "
            "would be wrong; rppo_td.envs.make_env shifts such observations to start at 0"
        )
    if isinstance(space, gym.spaces.Discrete):
        return _OneHot([int(space.n)], multi=False, key=key), int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        if space.nvec.ndim != 1:
            raise ValueError(
                f"MultiDiscrete observations must be 1-D, got nvec {space.nvec.tolist()}; "
                "rppo_td.envs.make_env flattens them"
            )
        nvec = [int(n) for n in space.nvec]
        return _OneHot(nvec, multi=True, key=key), sum(nvec)
    return _Flatten(len(shape)), int(np.prod(shape)) if shape else 1


class ObservationEncoder(nn.Module):
    """Encodes every observation leaf, concatenates, and applies an MLP.

    Vectors (``Box``, ``MultiBinary``) are flattened, images (uint8 ``Box`` ``HxWxC`` or
    ``CxHxW``, see ``image_layout``) go through a small CNN, ``Discrete``/``MultiDiscrete``
    become one-hot; the pieces of a ``Tuple``/``Dict`` space are concatenated. An MLP of
    ``num_layers`` layers of ``hidden_size`` units (ReLU) follows.

    Input: a tensordict holding each leaf key with batch ``[*B]``. Output: ``[*B, hidden_size]``.

    Args:
        leaves: from ``observation_leaves``.
        hidden_size: width of the MLP and of each CNN's output.
        num_layers: MLP layers (>= 1).
        image_layout: ``"auto"`` reads a 3-D image's channel axis from its shape, and refuses
            a shape whose both ends could be it (``[3, 4, 4]``); ``"channels_first"`` or
            ``"channels_last"`` says which (``image_channels_last``).

    Example:
        >>> from tensordict import TensorDict
        >>> from rppo_td.modules._spaces import observation_leaves
        >>> enc = ObservationEncoder(observation_leaves(gym.spaces.Box(-1, 1, (2,))), hidden_size=8)
        >>> enc(TensorDict({"observation": torch.zeros(4, 5, 2)}, batch_size=[4, 5])).shape
        torch.Size([4, 5, 8])
    """

    def __init__(
        self,
        leaves: list[ObservationLeaf],
        *,
        hidden_size: int,
        num_layers: int = 1,
        image_layout: ImageLayout = "auto",
    ):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        if not leaves:
            raise ValueError("the observation space has no leaves (an empty Dict or Tuple)")
        check_image_layout(image_layout)  # before any leaf: vector spaces are checked too
        self.keys = [key for key, _ in leaves]
        encoders, width = [], 0
        for key, space in leaves:
            module, size = _leaf_encoder(key, space, hidden_size, image_layout)
            encoders.append(module)
            width += size
        self.leaf_encoders = nn.ModuleList(encoders)
        layers: list[nn.Module] = []
        for _ in range(num_layers):
            layers += [nn.Linear(width, hidden_size), nn.ReLU()]
            width = hidden_size
        self.mlp = nn.Sequential(*layers)
        self.out_features = hidden_size
        for layer in self.mlp:
            if isinstance(layer, nn.Linear):
                nn.init.orthogonal_(layer.weight, math.sqrt(2))
                nn.init.zeros_(layer.bias)

    def forward(self, obs: TensorDictBase) -> torch.Tensor:
        """``obs`` with batch ``[*B]`` -> features ``[*B, hidden_size]``."""
        parts = [enc(obs.get(key)) for key, enc in zip(self.keys, self.leaf_encoders, strict=True)]
        x = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
        return self.mlp(x)
