"""What every rppo_td transform shares: its keys, and refusing to run inside an env."""

from __future__ import annotations

from tensordict import TensorDictBase
from torchrl.envs.transforms import Transform

from rppo_td._keys import DEFAULT_KEYS, RolloutKeys

__all__ = ["RolloutTransform"]


class RolloutTransform(Transform):
    """Base of the batch transforms: they act on whole rollouts, never on env steps.

    ``forward`` (also what ``Compose`` and ``ReplayBuffer.sample`` call) does the work; ``inv``
    (what ``ReplayBuffer.extend`` calls) is the identity unless a subclass says otherwise.
    """

    def __init__(self, *, keys: RolloutKeys | None = None) -> None:
        super().__init__(in_keys=[], out_keys=[])
        if keys is not None and not isinstance(keys, RolloutKeys):
            raise TypeError(f"keys must be a RolloutKeys, got {type(keys).__name__}")
        self.keys = keys if keys is not None else DEFAULT_KEYS

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        raise RuntimeError(
            f"{type(self).__name__} works on whole [W, T] rollouts; apply it to collected "
            "data (or as a ReplayBuffer transform), not inside a TransformedEnv"
        )

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        return self._call(tensordict_reset)
