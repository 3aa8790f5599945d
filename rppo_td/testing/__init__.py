"""Test kit for transforms over ``[W, T]`` rollouts: hypothesis strategies and a loop oracle.

- ``rppo_td.testing.strategies``: hypothesis strategies drawing rollouts ``[W, T]`` keyed as
  ``rppo_td.RolloutKeys`` says, and their parts (observation, action and recurrent specs,
  episode ends, sequence lengths, discounts). Parts are given as strategies, as in
  ``xarray.testing.strategies``: ``st.just(...)`` fixes one.
- ``rppo_td.testing.reference``: naive, obviously-correct Python loops (GAE, episode ids,
  sequences, padding ``[N, Lp]`` and its inverse), the oracle rppo_td's own tests compare every
  fast path with.

hypothesis is an optional dependency (the ``test`` extra): without it, importing this package
raises an ``ImportError`` that says how to install it. ``import rppo_td`` never imports it.

Example:
    >>> from rppo_td.testing import reference, strategies
    >>> from hypothesis import given, settings, strategies as st
    >>> from rppo_td import EpisodeSplitter
    >>> @settings(max_examples=5, database=None)
    ... @given(strategies.rollouts(num_workers=st.just(2)))
    ... def test_episode_ids(td):  # [W, T] int64, as the loop oracle numbers them
    ...     ids = EpisodeSplitter()(td)["episode_id"]
    ...     assert ids.tolist() == reference.reference_episode_ids(td).tolist()
    >>> test_episode_ids()
"""

try:
    import hypothesis  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "rppo_td.testing needs hypothesis, an optional dependency: install the test extra, "
        "pip install 'rppo_td[test]'"
    ) from error

from rppo_td.testing import reference, strategies

__all__ = ["reference", "strategies"]
