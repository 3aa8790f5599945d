"""What every rppo_td transform shares: its keys, ``set_keys``, and refusing to run in an env."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from tensordict import NestedKey, TensorDictBase, is_tensor_collection, is_tensorclass
from tensordict.utils import unravel_key
from torchrl.envs.transforms import Transform

from rppo_td._keys import DEFAULT_KEYS, RolloutKeys, as_path
from rppo_td._validation import check_tensordict

__all__ = ["RolloutTransform"]

_FIELDS = tuple(item.name for item in fields(RolloutKeys))


class RolloutTransform(Transform):
    """Base of the batch transforms: they act on whole rollouts, never on env steps.

    ``forward`` (also what ``Compose`` and ``ReplayBuffer.sample`` call) does the work; ``inv``
    (what ``ReplayBuffer.extend`` calls) is the identity unless a subclass says otherwise.

    ``in_keys`` are the keys a transform reads (optional ones, read only when present, are
    listed too, and named so in each subclass's docstring) and ``out_keys`` the keys it writes;
    both follow ``keys`` and are recomputed by ``set_keys``. Assigning other keys to them is
    refused (the transform would go on reading and writing its ``keys``). Subclasses say which
    fields they read and write in ``_in_fields`` and ``_out_fields``.
    """

    _in_fields: tuple[str, ...] = ()
    _out_fields: tuple[str, ...] = ()

    def __init__(self, *, keys: RolloutKeys | None = None) -> None:
        if keys is not None and not isinstance(keys, RolloutKeys):
            raise TypeError(f"keys must be a RolloutKeys, got {type(keys).__name__}")
        keys = keys if keys is not None else DEFAULT_KEYS
        super().__init__(in_keys=[], out_keys=[])
        self._follow(keys)

    @property
    def in_keys(self) -> list[NestedKey]:
        """The keys this transform reads; they follow ``keys`` (see ``set_keys``)."""
        return Transform.in_keys.fget(self)  # type: ignore[attr-defined]

    @in_keys.setter
    def in_keys(self, value: Any) -> None:
        self._assign_listed("in_keys", value)

    @property
    def out_keys(self) -> list[NestedKey]:
        """The keys this transform writes; they follow ``keys`` (see ``set_keys``)."""
        return Transform.out_keys.fget(self)  # type: ignore[attr-defined]

    @out_keys.setter
    def out_keys(self, value: Any) -> None:
        self._assign_listed("out_keys", value)

    def _follow(self, keys: RolloutKeys) -> None:
        """Takes ``keys``, listing what they name in ``in_keys`` and ``out_keys``."""
        self._list_keys(self._keys_of(keys, self._in_fields), self._keys_of(keys, self._out_fields))
        self.keys = keys

    def _list_keys(self, in_keys: list[NestedKey], out_keys: list[NestedKey]) -> None:
        """Sets ``in_keys`` and ``out_keys`` (the transform's own bookkeeping)."""
        Transform.in_keys.fset(self, in_keys)  # type: ignore[attr-defined]
        Transform.out_keys.fset(self, out_keys)  # type: ignore[attr-defined]

    def _assign_listed(self, name: str, value: Any) -> None:
        """``transform.in_keys = [...]`` from outside: the same keys pass, others are refused.

        The keys a transform reads and writes are its ``keys``; a list assigned here would
        describe keys it never touches, while it went on with its own.
        """
        listed = getattr(Transform, name)
        if f"_{name}" not in self.__dict__:  # Transform.__init__ listing them the first time
            listed.fset(self, value)
            return
        given = [value] if isinstance(value, str | tuple) else list(value or [])
        given = [unravel_key(key) for key in given]
        current = list(listed.fget(self))
        if given == current:
            return
        raise ValueError(
            f"{type(self).__name__}.{name} lists the keys it "
            f"{'reads' if name == 'in_keys' else 'writes'}, {current}; assigning {given} "
            f"would not change them: {self._rename_hint()}"
        )

    def _rename_hint(self) -> str:
        fields = [name for name in _FIELDS if name in {*self._in_fields, *self._out_fields}]
        return (
            f"rename them with set_keys(name=key), name one of {fields} (or build it with "
            "keys=RolloutKeys(...))"
        )

    def _check_takes_outputs(self, tensordict: TensorDictBase) -> None:
        """Refuses a rollout that cannot take the keys this transform adds, before any work.

        A locked tensordict, and a tensorclass without a field for each key (tensordict's
        own ``AttributeError`` named no transform and no way out).
        """
        if is_tensorclass(tensordict):
            declared = {field.name for field in fields(type(tensordict))}
            missing = [key for key in self.out_keys if as_path(key)[0] not in declared]
            if missing:
                raise ValueError(
                    f"{type(self).__name__} writes {missing} into the rollout, but "
                    f"{type(tensordict).__name__} (a tensorclass) has no field for "
                    f"{'it' if len(missing) == 1 else 'them'}: declare each as an optional "
                    f"field ({as_path(missing[0])[0]}: torch.Tensor | None = None), or pass "
                    "rollout.to_tensordict()"
                )
        if tensordict.is_locked:
            raise RuntimeError(
                f"{type(self).__name__} writes {self.out_keys} into the rollout, but the "
                "rollout is locked (memory-mapped, shared-memory and lock_()ed tensordicts "
                "are): pass an unlocked shallow copy, rollout.clone(recurse=False), which "
                "shares the data and takes the new keys"
            )

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
        self._follow(replace(self.keys, **kwargs))
        return self

    def _check_writable(
        self, tensordict: TensorDictBase, key: NestedKey, shape: tuple[int, ...], dtype: object
    ) -> None:
        """Refuses to write ``key`` over a leaf of another kind (lost data, not a rerun).

        A leaf of the same shape and dtype is this transform's own output of an earlier call
        (run again, it is replaced); anything else is the rollout's own data under a key that
        ``keys`` pointed at by mistake (``RolloutKeys(episode_id="observation")``).
        """
        path = as_path(key)
        for depth in range(1, len(path)):  # a key nested under a tensor cannot be written
            above = tensordict.get(path[:depth], None)
            if above is not None and not is_tensor_collection(above):
                raise ValueError(
                    f"{type(self).__name__} writes {key!r}, but the rollout's "
                    f"{path[:depth] if depth > 1 else path[0]!r} is a tensor, not a "
                    "tensordict, so nothing can be nested under it. Give the output another "
                    "key (RolloutKeys, set_keys)"
                )
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

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args:  # Compose and ReplayBuffer call it with the tensordict first
            check_tensordict(args[0], type(self).__name__)
        return super().__call__(*args, **kwargs)

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase:
        # TorchRL's inv reads a non-tensordict as keyword arguments: "takes 2 positional
        # arguments but 3 were given"
        check_tensordict(tensordict, f"{type(self).__name__}.inv")
        return super().inv(tensordict)

    def _repr_args(self) -> str:
        return ""

    def __repr__(self) -> str:
        extra = self._repr_args()
        return (
            f"{type(self).__name__}({extra}{', ' if extra else ''}in_keys={self.in_keys}, "
            f"out_keys={self.out_keys})"
        )

    def _refuse_env(self) -> RuntimeError:
        return RuntimeError(
            f"{type(self).__name__} works on whole [W, T] rollouts; apply it to collected "
            "data, or as a ReplayBuffer transform that runs on sample() (append_transform "
            "without invert=True), not inside a TransformedEnv"
        )

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        raise self._refuse_env()

    # a TransformedEnv asks for its transforms' specs before it steps (check_env_specs, a
    # collector's set-up): refused there too, before TorchRL's "unaccounted for" KeyError
    def transform_output_spec(self, output_spec: Any) -> Any:
        raise self._refuse_env()

    def transform_input_spec(self, input_spec: Any) -> Any:
        raise self._refuse_env()

    def _reset(
        self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase
    ) -> TensorDictBase:
        return self._call(tensordict_reset)
