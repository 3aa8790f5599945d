"""What every rppo_td transform shares: its keys, ``set_keys``, and refusing to run in an env."""

from __future__ import annotations

from dataclasses import fields, replace

from tensordict import NestedKey, TensorDictBase
from torchrl.envs.transforms import Transform

from rppo_td._keys import DEFAULT_KEYS, RolloutKeys

__all__ = ["RolloutTransform"]

_FIELDS = tuple(item.name for item in fields(RolloutKeys))


class RolloutTransform(Transform):
    """Base of the batch transforms: they act on whole rollouts, never on env steps.

    ``forward`` (also what ``Compose`` and ``ReplayBuffer.sample`` call) does the work; ``inv``
    (what ``ReplayBuffer.extend`` calls) is the identity unless a subclass says otherwise.

    ``in_keys`` are the keys a transform reads (optional ones, read only when present, are
    listed too, and named so in each subclass's docstring) and ``out_keys`` the keys it writes;
    both follow ``keys`` and are recomputed by ``set_keys``. Subclasses say which fields they
    read and write in ``_in_fields`` and ``_out_fields``.
    """

    _in_fields: tuple[str, ...] = ()
    _out_fields: tuple[str, ...] = ()

    def __init__(self, *, keys: RolloutKeys | None = None) -> None:
        if keys is not None and not isinstance(keys, RolloutKeys):
            raise TypeError(f"keys must be a RolloutKeys, got {type(keys).__name__}")
        keys = keys if keys is not None else DEFAULT_KEYS
        super().__init__(in_keys=self._keys_of(keys, self._in_fields), out_keys=[])
        self.out_keys = self._keys_of(keys, self._out_fields)
        self.keys = keys

    @staticmethod
    def _keys_of(keys: RolloutKeys, names: tuple[str, ...]) -> list[NestedKey]:
        return [getattr(keys, name) for name in names]

    def set_keys(self, **kwargs: NestedKey) -> RolloutTransform:
        """Renames keys after construction, as TorchRL's ``LossModule.set_keys`` does.

        Each keyword is a ``RolloutKeys`` field (``reward=("next", "agents", "reward")``); the
        transform's ``keys``, ``in_keys`` and ``out_keys`` are updated together. An unknown
        field is a ``ValueError`` naming the accepted ones; keys that clash are refused as
        ``RolloutKeys`` refuses them. Returns the transform.

        Example:
            >>> from rppo_td import GAE
            >>> gae = GAE(gamma=0.99, lmbda=0.95).set_keys(advantage="adv")
            >>> gae.out_keys
            ['adv', 'value_target']
        """
        unknown = sorted(set(kwargs) - set(_FIELDS))
        if unknown:
            raise ValueError(
                f"{type(self).__name__}.set_keys got unknown key name(s) {unknown}; the "
                f"accepted names are the RolloutKeys fields {list(_FIELDS)}"
            )
        keys = replace(self.keys, **kwargs)
        self.in_keys = self._keys_of(keys, self._in_fields)
        self.out_keys = self._keys_of(keys, self._out_fields)
        self.keys = keys
        return self

    def _check_writable(
        self, tensordict: TensorDictBase, key: NestedKey, shape: tuple[int, ...], dtype: object
    ) -> None:
        """Refuses to write ``key`` over a leaf of another kind (lost data, not a rerun).

        A leaf of the same shape and dtype is this transform's own output of an earlier call
        (run again, it is replaced); anything else is the rollout's own data under a key that
        ``keys`` pointed at by mistake (``RolloutKeys(episode_id="observation")``).
        """
        old = tensordict.get(key, None)
        if old is None:
            return
        if not hasattr(old, "shape") or tuple(old.shape) != shape or old.dtype != dtype:
            kind = f"{old.dtype} {list(old.shape)}" if hasattr(old, "shape") else "a tensordict"
            raise ValueError(
                f"{type(self).__name__} writes {key!r} ({dtype} {list(shape)}), but the "
                f"rollout already holds {kind} there: it would be overwritten. Give the "
                "output another key (RolloutKeys, set_keys)"
            )

    def _repr_args(self) -> str:
        return ""

    def __repr__(self) -> str:
        extra = self._repr_args()
        return (
            f"{type(self).__name__}({extra}{', ' if extra else ''}in_keys={self.in_keys}, "
            f"out_keys={self.out_keys})"
        )

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        raise RuntimeError(
            f"{type(self).__name__} works on whole [W, T] rollouts; apply it to collected "
            "data (or as a ReplayBuffer transform), not inside a TransformedEnv"
        )

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        return self._call(tensordict_reset)
