"""A. Transforms (GAE, EpisodeSplitter, SequenceChunker, SequencePadder, DeviceMover), samplers."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from tests.adversarial import oracles as O
from tests.adversarial.core import Case, Result, lib_either, lib_error, lib_ok

CAT_T = "A. transforms"
BATCH = ("batch", "[W, T]", "[N, Lp]", "dims")
CAT_S = "A. samplers"


def R():
    import rppo_td

    return rppo_td


def _case(cid: str, fn: Callable[[], Result], cat: str = CAT_T) -> Case:
    prefix = "A.tf." if cat == CAT_T else "A.smp."
    return Case(prefix + cid, cat, lambda _tmp: fn())


def rollout(seed=0, w=3, t=10, p_term=0.1, p_trunc=0.05, *, done=True, is_init=False, obs=3):
    """A collector-like ``[W, T]`` rollout with TorchRL's keys."""
    from tensordict import TensorDict

    g = torch.Generator().manual_seed(seed)
    term = torch.rand(w, t, 1, generator=g) < p_term
    trunc = torch.rand(w, t, 1, generator=g) < p_trunc
    nxt = {
        "reward": torch.randn(w, t, 1, generator=g),
        "terminated": term,
        "truncated": trunc,
        "state_value": torch.randn(w, t, 1, generator=g),
        "observation": torch.randn(w, t, obs, generator=g),
    }
    if done:
        nxt["done"] = term | trunc
    data = {
        "observation": torch.randn(w, t, obs, generator=g),
        "pixels": torch.randint(0, 255, (w, t, 2, 2, 1), generator=g, dtype=torch.uint8),
        "action": torch.randint(0, 4, (w, t), generator=g),
        "action_log_prob": torch.randn(w, t, generator=g),
        "state_value": torch.randn(w, t, 1, generator=g),
        "recurrent_state_h": torch.randn(w, t, 1, 4, generator=g),
        "next": nxt,
    }
    if is_init:
        data["is_init"] = torch.rand(w, t, 1, generator=g) < 0.1
    return TensorDict(data, batch_size=[w, t])


def _done_of(td):
    d = td.get(("next", "done"), None)
    if d is None:
        d = td["next", "terminated"] | td["next", "truncated"]
    return d


def _gae_ok(td, gamma, lmbda, rtol=2e-5):
    want = O.gae_loop(
        td["next", "reward"],
        td["state_value"],
        td["next", "state_value"],
        td["next", "terminated"],
        _done_of(td),
        gamma,
        lmbda,
    )

    def check(out):
        return O.close(out["advantage"], want[0], rtol, "advantage") or O.close(
            out["value_target"], want[1], rtol, "value_target"
        )

    return check


def _fragments(td):
    """Fragment starts of a rollout, by the loop."""
    d = _done_of(td).squeeze(-1)
    ii = td.get("is_init", None)
    return torch.tensor(O.starts_loop(d, None if ii is None else ii.squeeze(-1)))


def _pipeline(length):
    r = R()
    return [r.EpisodeSplitter(), r.SequenceChunker(sequence_length=length)]


def _chunked(td, length):
    for t in _pipeline(length):
        td = t(td)
    return td


def _pad_check(td, length):
    """Checks SequencePadder's output against the loop, and inv against the rollout."""
    w, t = td.batch_size
    start = _fragments(td)
    sid, _off = (torch.tensor(a) for a in O.chunk_loop(start, length))
    seqs = O.sequences_loop(sid, t)
    lp = max(len(s) for s in seqs)
    longest_fragment = max(len(s) for s in O.sequences_loop(torch.tensor(O.ids_loop(start)), t))

    def check(padded):
        if tuple(padded.batch_size) != (len(seqs), lp):
            return f"batch {list(padded.batch_size)}, expected [{len(seqs)}, {lp}]"
        if length is not None and lp != min(length, longest_fragment):
            return f"Lp {lp} != min(L, longest fragment)"
        for key in ("observation", "pixels", "action", ("next", "reward"), "recurrent_state_h"):
            want = O.pad_loop(td.get(key), seqs)
            if not torch.equal(padded.get(key), want):
                return f"padded {key!r} differs from the loop"
        mask = padded["loss_mask"]
        for n, s in enumerate(seqs):
            if mask[n].tolist() != [True] * len(s) + [False] * (lp - len(s)):
                return f"loss_mask row {n} not a True prefix of {len(s)}"
        back = R().SequencePadder().inv(padded)
        if tuple(back.batch_size) != (w, t):
            return f"inv batch {list(back.batch_size)}"
        keys = sorted(map(str, td.keys(True, True)))
        got = sorted(map(str, back.keys(True, True)))
        if keys != got:
            return f"inv keys {set(got) ^ set(keys)} differ"
        for key in td.keys(True, True):
            a, b = td.get(key), back.get(key)
            if a.dtype != b.dtype or not torch.equal(a, b):
                return f"inv {key!r} differs from the rollout"
        return None

    return check


def gae_cases() -> list[Case]:
    cases = []
    for i, (w, t, gamma, lmbda, done) in enumerate(
        [
            (3, 10, 0.99, 0.95, True),
            (3, 10, 0.99, 0.95, False),
            (1, 1, 0.9, 0.9, True),
            (8, 64, 1.0, 1.0, True),
            (2, 200, 0.0, 1.0, False),
            (16, 4096, 0.99, 0.95, True),
        ]
    ):
        td = rollout(300 + i, w, t, done=done)
        cases.append(
            _case(
                f"gae.oracle.{w}x{t}.g{gamma}.l{lmbda}.{'done' if done else 'nodone'}",
                lambda td=td, g=gamma, lm=lmbda: lib_ok(
                    lambda: R().GAE(gamma=g, lmbda=lm)(td.clone()), _gae_ok(td, g, lm)
                ),
            )
        )

    # custom keys
    def custom():
        from tensordict import TensorDict

        td = rollout(310)
        td2 = TensorDict(
            {
                "v": td["state_value"],
                "next": {
                    "agents": {"r": td["next", "reward"]},
                    "v": td["next", "state_value"],
                    "term": td["next", "terminated"],
                    "done": td["next", "done"],
                },
            },
            batch_size=td.batch_size,
        )
        keys = R().RolloutKeys(
            reward=("next", "agents", "r"),
            state_value="v",
            next_state_value=("next", "v"),
            terminated=("next", "term"),
        )
        return R().GAE(gamma=0.9, lmbda=0.8, keys=keys)(td2)

    td_ref = rollout(310)
    cases.append(_case("gae.oracle.custom.keys", lambda: lib_ok(custom, _gae_ok(td_ref, 0.9, 0.8))))

    # value network path
    def with_net():
        from tensordict.nn import TensorDictModule

        td = rollout(311)
        del td["state_value"]
        del td["next", "state_value"]
        net = TensorDictModule(torch.nn.Linear(3, 1), ["observation"], ["state_value"])
        out = R().GAE(gamma=0.9, lmbda=0.8, value_network=net)(td)
        want = O.gae_loop(
            out["next", "reward"],
            out["state_value"],
            out["next", "state_value"],
            out["next", "terminated"],
            out["next", "done"],
            0.9,
            0.8,
        )
        if out["advantage"].requires_grad:
            return "advantage requires grad"
        return O.close(out["advantage"], want[0], 2e-5)

    cases.append(_case("gae.value_network", lambda: lib_ok(with_net, lambda why: why)))

    def grad_value():
        td = rollout(312)
        td["state_value"] = td["state_value"].clone().requires_grad_(True)
        return R().GAE(gamma=0.9, lmbda=0.8)(td)

    cases.append(
        _case(
            "gae.state_value.requires_grad",
            lambda: lib_either(
                grad_value,
                ["state_value", "grad"],
                lambda out: (
                    "value_target requires grad (a target must be a constant)"
                    if out["value_target"].requires_grad or out["advantage"].requires_grad
                    else None
                ),
            ),
        )
    )

    def bad(cid, make, words, accept=None, gamma=0.9, lmbda=0.8):
        cases.append(
            _case(
                f"gae.bad.{cid}",
                lambda: lib_error(
                    lambda: R().GAE(gamma=gamma, lmbda=lmbda)(make()), words, accept=accept
                ),
            )
        )

    def mod(fn):
        def make():
            td = rollout(320)
            fn(td)
            return td

        return make

    bad("missing.reward", mod(lambda td: td.del_(("next", "reward"))), ["reward"])
    bad("missing.state_value", mod(lambda td: td.del_("state_value")), ["state_value"])
    bad(
        "missing.next.state_value",
        mod(lambda td: td.del_(("next", "state_value"))),
        ["state_value"],
    )
    bad("missing.terminated", mod(lambda td: td.del_(("next", "terminated"))), ["terminated"])
    bad(
        "missing.done.and.truncated",
        mod(lambda td: (td.del_(("next", "done")), td.del_(("next", "truncated")))),
        ["done", "truncated"],
    )
    for key in (("next", "reward"), "state_value", ("next", "state_value")):
        name = key[-1] if isinstance(key, tuple) else key
        bad(
            f"{name}.{'next.' if isinstance(key, tuple) else ''}no.trailing1",
            mod(lambda td, k=key: _replace(td, k, td.get(k)[..., 0])),
            [name],
        )
        bad(
            f"{name}.{'next.' if isinstance(key, tuple) else ''}nan",
            mod(lambda td, k=key: td.get(k).__setitem__((0, 1, 0), math.nan)),
            [name],
        )
        bad(
            f"{name}.{'next.' if isinstance(key, tuple) else ''}int",
            mod(lambda td, k=key: _replace(td, k, td.get(k).round().long())),
            [name],
            accept=_int_reward_ok if name == "reward" else None,
        )
    for flag in ("terminated", "done", "truncated"):
        bad(
            f"{flag}.float",
            mod(lambda td, f=flag: _replace(td, ("next", f), td["next", f].float())),
            [flag],
        )
        bad(
            f"{flag}.no.trailing1",
            mod(lambda td, f=flag: _replace(td, ("next", f), td["next", f][..., 0])),
            [flag],
        )

    def term_not_done(td):
        td["next", "terminated"][0, 2, 0] = True
        td["next", "done"][0, 2, 0] = False

    def trunc_not_done(td):
        td["next", "truncated"][1, 4, 0] = True
        td["next", "done"][1, 4, 0] = False

    def done_not_either(td):
        td["next", "terminated"][2, 5, 0] = False
        td["next", "truncated"][2, 5, 0] = False
        td["next", "done"][2, 5, 0] = True

    bad("terminated.true.where.done.false", mod(term_not_done), ["terminated", "done"])
    bad("truncated.true.where.done.false", mod(trunc_not_done), ["truncated", "done"])
    bad("done.true.where.neither", mod(done_not_either), ["done"])
    bad(
        "truncated.different.shape.no.done",
        mod(
            lambda td: (
                td.del_(("next", "done")),
                _replace(td, ("next", "truncated"), td["next", "truncated"][..., 0]),
            )
        ),
        ["truncated"],
    )
    bad(
        "reward.holds.subtensordict",
        mod(
            lambda td: (
                td.del_(("next", "reward")),
                td.set(("next", "reward", "a"), torch.zeros(3, 10, 1)),
            )
        ),
        ["reward"],
    )
    bad("padded.input", lambda: R().SequencePadder()(_chunked(rollout(321), 4)), ["loss_mask"])
    bad("batch.1dim", lambda: rollout(322)[0], [BATCH])
    bad("batch.3dim", lambda: rollout(323).unsqueeze(0), [BATCH])
    for p in ("gamma", "lmbda"):
        for tag, v in {
            "neg": -0.1,
            "above1": 1.01,
            "nan": math.nan,
            "str": "0.9",
            "bool": True,
            "none": None,
        }.items():
            kw = {"gamma": 0.9, "lmbda": 0.8, p: v}
            cases.append(
                _case(
                    f"gae.bad.ctor.{p}.{tag}",
                    lambda kw=kw, p=p: lib_error(lambda: R().GAE(**kw), [p]),
                )
            )
    cases.append(
        _case(
            "gae.bad.ctor.keys.dict",
            lambda: lib_error(
                lambda: R().GAE(gamma=0.9, lmbda=0.8, keys={"reward": "r"}), ["keys"]
            ),
        )
    )
    for tag, (w, t) in {"W0": (0, 5), "T0": (3, 0)}.items():
        cases.append(
            _case(
                f"gae.empty.{tag}",
                lambda w=w, t=t: lib_either(
                    lambda: R().GAE(gamma=0.9, lmbda=0.8)(rollout(324, w, t)),
                    [("empty", "batch", "W", "T")],
                    lambda out, w=w, t=t: (
                        None if tuple(out["advantage"].shape) == (w, t, 1) else "wrong shape"
                    ),
                ),
            )
        )
    return cases


def _int_reward_ok(out):
    """GAE of a rollout whose reward was rounded to int64: must equal GAE of the float reward."""
    want = O.gae_loop(
        out["next", "reward"].double(),
        out["state_value"],
        out["next", "state_value"],
        out["next", "terminated"],
        out["next", "done"],
        0.9,
        0.8,
    )
    return O.close(out["advantage"], want[0], 2e-5, "advantage")


def _replace(td, key, value):
    td.del_(key)
    td.set(key, value)


def splitter_chunker_cases() -> list[Case]:
    cases = []
    for i, (w, t, init) in enumerate(
        [(3, 10, False), (3, 10, True), (1, 1, False), (5, 50, True), (4, 7, False)]
    ):
        td = rollout(400 + i, w, t, 0.2, 0.1, is_init=init)
        start = _fragments(td)
        ids = O.ids_loop(start)
        cases.append(
            _case(
                f"splitter.oracle.{w}x{t}.init{int(init)}",
                lambda td=td, ids=ids: lib_ok(
                    lambda: R().EpisodeSplitter()(td.clone()),
                    lambda out, ids=ids: (
                        None
                        if out["episode_id"].tolist() == ids
                        else "episode_id differs from the loop"
                    ),
                ),
            )
        )
        for length in (1, 3, 4, None, 1000):
            want = O.chunk_loop(start, length)
            cases.append(
                _case(
                    f"chunker.oracle.{w}x{t}.init{int(init)}.L{length}",
                    lambda td=td, L=length, want=want: lib_ok(
                        lambda: _chunked(td.clone(), L),
                        lambda out, want=want: (
                            None
                            if (out["sequence_id"].tolist(), out["sequence_offset"].tolist())
                            == want
                            else "sequence ids/offsets differ from the loop"
                        ),
                    ),
                )
            )

    def bad(cid, f, words, accept=None):
        cases.append(_case(cid, lambda: lib_error(f, words, accept=accept)))

    sp = lambda td: R().EpisodeSplitter()(td)  # noqa: E731
    no_done = rollout(409, 3, 10, 0.2, 0.1, done=False)
    ids_nd = O.ids_loop(_fragments(no_done))
    # the reference oracle's rule: without ("next", "done"), done = terminated | truncated
    cases.append(
        _case(
            "splitter.no.done.key",
            lambda: lib_either(
                lambda: sp(no_done.clone()),
                ["done"],
                lambda out: (
                    None
                    if out["episode_id"].tolist() == ids_nd
                    else "episode_id ignores terminated | truncated"
                ),
            ),
        )
    )
    bad(
        "splitter.bad.missing.done.and.truncated",
        lambda: sp(rollout(410).exclude(("next", "done"), ("next", "truncated"))),
        ["done"],
    )
    bad(
        "splitter.bad.missing.done.and.terminated",
        lambda: sp(rollout(410).exclude(("next", "done"), ("next", "terminated"))),
        ["done"],
    )
    bad(
        "splitter.bad.done.float",
        lambda: sp(_mod(rollout(411), ("next", "done"), lambda v: v.float())),
        ["done"],
    )
    bad(
        "splitter.bad.done.no.trailing1",
        lambda: sp(_mod(rollout(412), ("next", "done"), lambda v: v[..., 0])),
        ["done"],
    )
    bad(
        "splitter.bad.is_init.float",
        lambda: sp(_mod(rollout(413, is_init=True), "is_init", lambda v: v.float())),
        ["is_init"],
    )
    bad(
        "splitter.bad.padded.input",
        lambda: sp(R().SequencePadder()(_chunked(rollout(414), 3))),
        ["loss_mask"],
    )
    bad("splitter.bad.batch.1dim", lambda: sp(rollout(415)[0]), [BATCH])
    bad("splitter.bad.batch.3dim", lambda: sp(rollout(416).unsqueeze(0)), [BATCH])

    def done_not_term(td):
        td["next", "terminated"][0, 1, 0] = True
        td["next", "done"][0, 1, 0] = False
        return td

    bad(
        "splitter.bad.terminated.where.not.done",
        lambda: sp(done_not_term(rollout(417))),
        ["terminated", "done"],
    )
    ch = lambda td, L=3: R().SequenceChunker(sequence_length=L)(td)  # noqa: E731
    for tag, L in {"0": 0, "neg": -2, "float": 1.5, "bool": False, "str": "3"}.items():
        bad(
            f"chunker.bad.L.{tag}",
            lambda L=L: R().SequenceChunker(sequence_length=L),
            ["sequence_length"],
        )
    bad("chunker.bad.missing.episode_id", lambda: ch(rollout(420)), ["episode_id"])
    bad(
        "chunker.bad.episode_id.int32",
        lambda: ch(_mod(sp(rollout(421)), "episode_id", lambda v: v.int())),
        ["episode_id"],
    )
    bad(
        "chunker.bad.episode_id.trailing1",
        lambda: ch(_mod(sp(rollout(422)), "episode_id", lambda v: v[..., None])),
        ["episode_id"],
    )
    bad(
        "chunker.bad.padded.input",
        lambda: ch(R().SequencePadder()(_chunked(rollout(423), 3))),
        ["loss_mask"],
    )
    bad("chunker.bad.batch.1dim", lambda: ch(sp(rollout(424))[0]), [BATCH])

    def sliced_after_split():
        td = sp(rollout(425, 2, 12, 0.3, 0.0))
        return ch(td[:, 3:])  # fragments renumber? ids no longer start at 0: still valid

    ids_sliced = torch.tensor(O.ids_loop(_fragments(rollout(425, 2, 12, 0.3, 0.0))))[:, 3:]
    want = O.chunk_loop(_fragments_from_ids(ids_sliced), 3)
    cases.append(
        _case(
            "chunker.sliced.after.splitter",
            lambda: lib_either(
                sliced_after_split,
                ["episode_id"],
                lambda out: (
                    None
                    if (out["sequence_id"].tolist(), out["sequence_offset"].tolist()) == want
                    else "ids wrong after a time slice"
                ),
            ),
        )
    )
    return cases


def _fragments_from_ids(ids):
    start = torch.ones_like(ids, dtype=torch.bool)
    start[:, 1:] = ids[:, 1:] != ids[:, :-1]
    return start


def _mod(td, key, fn):
    value = fn(td.get(key))
    td.del_(key)
    td.set(key, value)
    return td


def padder_cases() -> list[Case]:
    cases = []
    for i, (w, t, length, pt) in enumerate(
        [
            (3, 10, 4, 0.1),
            (3, 10, 1, 0.1),
            (3, 10, None, 0.2),
            (2, 6, 100, 0.0),
            (1, 1, 4, 0.0),
            (4, 16, 3, 0.5),
            (5, 40, 8, 0.05),
            (2, 9, 9, 1.0),
            (6, 12, 5, 0.0),
        ]
    ):

        def pad_pair(seed=500 + i, w=w, t=t, pt=pt, L=length):
            td = _chunked(rollout(seed, w, t, pt, pt / 2), L)
            return td, R().SequencePadder()(td.clone())

        cases.append(
            _case(
                f"padder.roundtrip.{w}x{t}.L{length}.p{pt}",
                lambda f=pad_pair, L=length: lib_ok(
                    f, lambda pair, L=L: _pad_check(pair[0], L)(pair[1])
                ),
            )
        )

    # inv of permuted sequences: exact
    def perm():
        td = _chunked(rollout(520, 3, 10, 0.2, 0.1), 3)
        padded = R().SequencePadder()(td)
        idx = torch.randperm(padded.batch_size[0], generator=torch.Generator().manual_seed(0))
        back = R().SequencePadder().inv(padded[idx])
        return td, back

    cases.append(
        _case(
            "padder.inv.permuted",
            lambda: lib_ok(
                perm,
                lambda pair: (
                    None
                    if all(
                        torch.equal(pair[0].get(k), pair[1].get(k))
                        for k in pair[0].keys(True, True)
                    )
                    else "inv of permuted sequences differs"
                ),
            ),
        )
    )

    def subset(drop):
        def make():
            td = _chunked(rollout(521, 3, 10, 0.2, 0.1), 3)
            padded = R().SequencePadder()(td)
            keep = drop(padded)
            return R().SequencePadder().inv(padded[keep])

        return make

    def bad(cid, f, words, accept=None):
        cases.append(_case(cid, lambda: lib_error(f, words, accept=accept)))

    last_worker = lambda p: (p["worker_index"][:, 0] != 2).nonzero().squeeze(1)  # noqa: E731
    first_worker = lambda p: (p["worker_index"][:, 0] != 0).nonzero().squeeze(1)  # noqa: E731
    middle = lambda p: torch.tensor([i for i in range(p.batch_size[0]) if i != 2])  # noqa: E731

    def tail_time(p):  # drop every sequence that reaches the rollout's last step
        return (p["time_index"].amax(1) < 9).nonzero().squeeze(1)

    dup = lambda p: torch.cat([torch.arange(p.batch_size[0]), torch.tensor([0])])  # noqa: E731
    bad(
        "padder.inv.subset.missing.last.worker",
        subset(last_worker),
        [("missing", "subset", "sequence", "step")],
    )
    bad(
        "padder.inv.subset.missing.first.worker",
        subset(first_worker),
        [("missing", "subset", "sequence", "step")],
    )
    bad(
        "padder.inv.subset.missing.middle.sequence",
        subset(middle),
        [("missing", "exactly once", "sequence", "step")],
    )
    bad(
        "padder.inv.subset.missing.last.time.steps",
        subset(tail_time),
        [("missing", "subset", "sequence", "step")],
    )
    bad("padder.inv.repeated.sequence", subset(dup), [("once", "repeat", "duplicate")])
    bad(
        "padder.inv.single.sequence",
        subset(lambda p: torch.tensor([0])),
        [("missing", "subset", "sequence", "step")],
    )

    def inv_mod(key, fn):
        def make():
            padded = R().SequencePadder()(_chunked(rollout(522), 3))
            return R().SequencePadder().inv(_mod(padded, key, fn))

        return make

    bad("padder.inv.bad.loss_mask.int", inv_mod("loss_mask", lambda v: v.long()), ["loss_mask"])
    bad(
        "padder.inv.bad.worker_index.int32",
        inv_mod("worker_index", lambda v: v.int()),
        ["worker_index"],
    )
    bad(
        "padder.inv.bad.time_index.negative", inv_mod("time_index", lambda v: v - 1), ["time_index"]
    )
    bad(
        "padder.inv.bad.missing.worker_index",
        lambda: (
            R()
            .SequencePadder()
            .inv(R().SequencePadder()(_chunked(rollout(523), 3)).exclude("worker_index"))
        ),
        ["worker_index"],
    )
    bad(
        "padder.inv.bad.loss_mask.not.prefix",
        inv_mod("loss_mask", lambda v: v.flip(-1)),
        ["loss_mask"],
    )
    bad(
        "padder.inv.bad.batch.1dim",
        lambda: R().SequencePadder().inv(R().SequencePadder()(_chunked(rollout(524), 3))[0]),
        [BATCH],
    )

    # rollout that already holds worker_index / time_index / loss_mask-free user keys
    def holds(key):
        def make():
            td = _chunked(rollout(525), 3)
            td.set(key, torch.full(td.batch_size, 7, dtype=torch.long))
            padded = R().SequencePadder()(td)
            return td, padded

        return make

    def holds_check(key):
        def check(pair):
            td, padded = pair
            back = R().SequencePadder().inv(padded)
            if back.get(key, None) is None:
                return f"the rollout's own {key!r} was dropped by inv (pad/inv not a round trip)"
            if not torch.equal(back.get(key), td.get(key)):
                return f"the rollout's own {key!r} was overwritten"
            return None

        return check

    for key in ("worker_index", "time_index"):
        cases.append(
            _case(
                f"padder.rollout.holds.{key}",
                lambda k=key: lib_error(holds(k), [k], accept=holds_check(k)),
            )
        )
    bad(
        "padder.bad.missing.sequence_id",
        lambda: R().SequencePadder()(R().EpisodeSplitter()(rollout(526))),
        ["sequence_id"],
    )
    bad(
        "padder.bad.sequence_id.int32",
        lambda: R().SequencePadder()(
            _mod(_chunked(rollout(527), 3), "sequence_id", lambda v: v.int())
        ),
        ["sequence_id"],
    )
    bad(
        "padder.bad.sliced.in.time.after.chunking",
        lambda: R().SequencePadder()(_chunked(rollout(528), 3)[:, 1:]),
        [("sequence_offset", "sequence_id", "chunk")],
    )
    bad(
        "padder.bad.padded.twice",
        lambda: R().SequencePadder()(R().SequencePadder()(_chunked(rollout(529), 3))),
        ["loss_mask"],
    )
    bad(
        "padder.bad.batch.3dim",
        lambda: R().SequencePadder()(_chunked(rollout(530), 3).unsqueeze(0)),
        [BATCH],
    )

    def nontensor():
        td = _chunked(rollout(531), 3)
        td.set_non_tensor("note", "hello")
        return R().SequencePadder()(td)

    bad(
        "padder.bad.nontensor.leaf",
        nontensor,
        ["note"],
        accept=lambda out: (
            None
            if out.get_non_tensor("note", None) == "hello"
            else "non-tensor leaf silently dropped"
        ),
    )

    def rows_subset():  # a ReplayBuffer-style row subset of a chunked rollout: valid
        td = _chunked(rollout(532, 4, 10, 0.2, 0.1), 3)
        sub = td[torch.tensor([2, 0])]
        return sub, R().SequencePadder()(sub)

    cases.append(
        _case(
            "padder.rows.subset.after.chunking",
            lambda: lib_ok(
                rows_subset,
                lambda pair: (
                    None
                    if all(
                        torch.equal(pair[0].get(k), R().SequencePadder().inv(pair[1]).get(k))
                        for k in pair[0].keys(True, True)
                    )
                    else "round trip of a row subset differs"
                ),
            ),
        )
    )
    for tag, (w, t) in {"W0": (0, 6), "T0": (3, 0)}.items():
        cases.append(
            _case(
                f"padder.empty.{tag}",
                lambda w=w, t=t: lib_either(
                    lambda: R().SequencePadder()(_chunked(rollout(533, w, t), 3)),
                    [("empty", "batch", "W", "T", "sequence")],
                    lambda out: None if out.batch_size[0] == 0 else f"batch {list(out.batch_size)}",
                ),
            )
        )

    # zero-width features and an expanded (stride-0) leaf
    def odd_leaves():
        td = _chunked(rollout(534, 2, 7, 0.2, 0.0), 3)
        td.set("empty_feat", torch.zeros(2, 7, 0))
        td.set("expanded", torch.arange(3.0).expand(2, 7, 3))
        return td

    def odd_pair():
        td = odd_leaves()
        return td, R().SequencePadder().inv(R().SequencePadder()(td.clone()))

    cases.append(
        _case(
            "padder.zero.width.and.expanded.leaves",
            lambda: lib_ok(
                odd_pair,
                lambda pair: (
                    None
                    if torch.equal(pair[1]["expanded"], pair[0]["expanded"])
                    and pair[1]["empty_feat"].shape == (2, 7, 0)
                    else "odd leaves not round-tripped"
                ),
            ),
        )
    )
    return cases


def device_cases() -> list[Case]:
    cases = []

    def bad(cid, f, words, accept=None):
        cases.append(_case(cid, lambda: lib_error(f, words, accept=accept)))

    DM = lambda *a, **k: R().DeviceMover(*a, **k)  # noqa: E731
    bad(
        "device.bad.keys.str",
        lambda: DM("cpu", keys="observation")(rollout(600)),
        ["keys"],
        accept=lambda out: (
            None if torch.equal(out["observation"], rollout(600)["observation"]) else "wrong"
        ),
    )
    bad("device.bad.keys.missing", lambda: DM("cpu", keys=["nope"])(rollout(601)), ["nope"])
    bad("device.bad.device.nonsense", lambda: DM("gpu0"), ["device"])
    bad("device.bad.device.int", lambda: DM(3.5), ["device"])
    if not torch.cuda.is_available():
        bad("device.bad.cuda.unavailable", lambda: DM("cuda")(rollout(602)), [("cuda", "device")])
    bad(
        "device.bad.keys.subtensordict",
        lambda: DM("cpu", keys=["next"])(rollout(603)),
        ["next"],
        accept=lambda out: None if out["next", "reward"].device.type == "cpu" else "x",
    )
    cases.append(
        _case(
            "device.meta.all",
            lambda: lib_ok(
                lambda: DM("meta")(rollout(604)),
                lambda out: None if out["observation"].device.type == "meta" else "not moved",
            ),
        )
    )
    cases.append(
        _case(
            "device.keys.nested.only",
            lambda: lib_ok(
                lambda: DM("meta", keys=[("next", "reward")])(rollout(605)),
                lambda out: (
                    None
                    if out["next", "reward"].device.type == "meta"
                    and out["observation"].device.type == "cpu"
                    else "wrong keys moved"
                ),
            ),
        )
    )

    def not_modified():
        td = rollout(606)
        DM("meta", keys=["observation"])(td)
        return td

    cases.append(
        _case(
            "device.input.not.modified",
            lambda: lib_ok(
                not_modified,
                lambda td: None if td["observation"].device.type == "cpu" else "input modified",
            ),
        )
    )
    return cases


def sampler_cases() -> list[Case]:
    cases = []

    def case(cid, fn):
        cases.append(_case(cid, fn, CAT_S))

    def padded_of(seed, w=4, t=16, L=4, pt=0.15):
        return R().SequencePadder()(_chunked(rollout(seed, w, t, pt, pt / 2), L))

    def coverage(mbs, padded):
        seen = []
        for mb in mbs:
            m = mb["loss_mask"]
            seen += [
                (int(a), int(b))
                for a, b in zip(mb["worker_index"][:, 0], mb["time_index"][:, 0], strict=True)
            ]
            if m.shape[1] != padded.batch_size[1]:
                return f"minibatch Lp {m.shape[1]} != {padded.batch_size[1]}"
        want = sorted(
            (int(a), int(b))
            for a, b in zip(padded["worker_index"][:, 0], padded["time_index"][:, 0], strict=True)
        )
        if sorted(seen) != want:
            return f"epoch covered {len(seen)} sequence starts, want each of {len(want)} once"
        return None

    for i, (m, balance) in enumerate([(1, "steps"), (3, "steps"), (5, "sequences"), (7, "steps")]):

        def epoch_pair(seed=700 + i, m=m, b=balance):
            p = padded_of(seed)
            g = torch.Generator().manual_seed(0)
            return p, list(R().SequenceSampler(m, generator=g, balance=b)(p))

        case(
            f"sampler.padded.epoch.M{m}.{balance}",
            lambda f=epoch_pair, m=m: lib_ok(
                f,
                lambda pair, m=m: (
                    f"{len(pair[1])} minibatches"
                    if len(pair[1]) != m
                    else coverage(pair[1], pair[0])
                ),
            ),
        )

        def same_paths(m=m, b=balance, seed=700 + i):
            td = _chunked(rollout(seed, 4, 16, 0.15, 0.075), 4)
            a = list(
                R().SequenceSampler(m, generator=torch.Generator().manual_seed(3), balance=b)(
                    R().SequencePadder()(td.clone())
                )
            )
            lazy = R().SequenceSampler(
                m, generator=torch.Generator().manual_seed(3), balance=b, reuse_memory=True
            )(td.clone())
            c = [mb.clone() for mb in lazy]
            for x, y in zip(a, c, strict=True):
                for k in x.keys(True, True):
                    if not torch.equal(x.get(k), y.get(k)):
                        return f"padded and lazy (reuse_memory) minibatches differ at {k!r}"
            return None

        case(
            f"sampler.padded.equals.lazy.M{m}.{balance}",
            lambda f=same_paths: lib_ok(f, lambda why: why),
        )

    def bad(cid, f, words, accept=None):
        case(cid, lambda: lib_error(f, words, accept=accept))

    for tag, m in {"0": 0, "neg": -1, "bool": True, "float": 2.0, "str": "2"}.items():
        bad(f"sampler.bad.M.{tag}", lambda m=m: R().SequenceSampler(m), ["num_minibatches"])
        bad(f"replay.bad.M.{tag}", lambda m=m: R().SequenceReplaySampler(m), ["num_minibatches"])
    bad("sampler.bad.balance", lambda: R().SequenceSampler(2, balance="tokens"), ["balance"])
    bad(
        "sampler.bad.M.gt.sequences",
        lambda: list(R().SequenceSampler(10**6)(padded_of(710))),
        ["num_minibatches"],
    )
    bad(
        "sampler.bad.M.gt.sequences.lazy",
        lambda: list(R().SequenceSampler(10**6)(_chunked(rollout(711), 4))),
        ["num_minibatches"],
    )
    bad(
        "sampler.bad.loss_mask.int",
        lambda: list(R().SequenceSampler(2)(_mod(padded_of(712), "loss_mask", lambda v: v.long()))),
        ["loss_mask"],
    )
    bad(
        "sampler.bad.padded.1dim",
        lambda: list(R().SequenceSampler(2)(padded_of(713)[:, 0])),
        [BATCH],
    )
    bad(
        "sampler.bad.padded.3dim",
        lambda: list(R().SequenceSampler(2)(padded_of(714).unsqueeze(0))),
        [BATCH],
    )
    bad(
        "sampler.bad.rollout.not.chunked",
        lambda: list(R().SequenceSampler(2)(rollout(715))),
        ["sequence_id"],
    )
    bad(
        "sampler.bad.all.padding",
        lambda: list(
            R().SequenceSampler(2)(_mod(padded_of(716), "loss_mask", lambda v: torch.zeros_like(v)))
        ),
        ["loss_mask"],
    )

    # ReplayBuffer
    def rb_of(m, cap=1000, batch_size=None, gen_seed=0):
        from torchrl.data import LazyTensorStorage, ReplayBuffer

        kw = {} if batch_size is None else {"batch_size": batch_size}
        return ReplayBuffer(
            storage=LazyTensorStorage(cap),
            sampler=R().SequenceReplaySampler(m, generator=torch.Generator().manual_seed(gen_seed)),
            **kw,
        )

    def rb_epoch(m):
        def run():
            p = padded_of(720)
            rb = rb_of(m)
            rb.extend(p)
            mbs = [rb.sample(1) for _ in range(m)]
            if not rb.sampler.ran_out:
                return "ran_out False after a whole epoch"
            return coverage(mbs, p)

        return run

    for m in (1, 3, 6):
        epoch = rb_epoch(m)
        case(f"replay.epoch.M{m}", lambda f=epoch: lib_ok(f, lambda why: why))

    def iterate_twice():
        p = padded_of(721)
        rb = rb_of(3, batch_size=1)
        rb.extend(p)
        first = list(rb)
        second = list(rb)
        if len(first) != 3 or len(second) != 3:
            return f"iterations gave {len(first)} and {len(second)} minibatches, want 3 each"
        return coverage(first, p) or coverage(second, p)

    case("replay.iterate.twice", lambda: lib_ok(iterate_twice, lambda why: why))

    def refill(lp2_len):
        def run():
            p1 = padded_of(722, L=4)
            p2 = padded_of(723, L=lp2_len)
            rb = rb_of(2)
            rb.extend(p1)
            [rb.sample(1) for _ in range(2)]
            rb.empty()
            rb.extend(p2)
            mbs = [rb.sample(1) for _ in range(2)]
            return coverage(mbs, p2)

        return run

    case(
        "replay.refill.longer.Lp",
        lambda: lib_either(
            refill(8), [("shape", "Lp", "length", "loss_mask", "storage")], lambda why: why
        ),
    )
    case(
        "replay.refill.shorter.Lp",
        lambda: lib_either(
            refill(2), [("shape", "Lp", "length", "loss_mask", "storage")], lambda why: why
        ),
    )

    def refill_mid_epoch():
        p1 = padded_of(724)
        p2 = padded_of(725, w=2)
        rb = rb_of(3)
        rb.extend(p1)
        rb.sample(1)  # one group of the epoch over p1
        rb.empty()
        rb.extend(p2)
        mbs = [rb.sample(1) for _ in range(3)]
        return coverage(mbs, p2)

    case(
        "replay.refill.mid.epoch.fewer.sequences",
        lambda: lib_either(refill_mid_epoch, [("epoch", "storage", "index")], lambda why: why),
    )

    def extend_two():
        from tensordict import TensorDict

        p1, p2 = padded_of(726), padded_of(727)
        rb = rb_of(4)
        rb.extend(p1)
        rb.extend(p2)
        mbs = [rb.sample(1) for _ in range(4)]
        both = TensorDict.cat if hasattr(TensorDict, "cat") else None
        del both
        n = p1.batch_size[0] + p2.batch_size[0]
        got = sum(mb.batch_size[0] for mb in mbs)
        return None if got == n else f"epoch over two extends yielded {got} sequences, want {n}"

    case("replay.extend.twice.same.Lp", lambda: lib_ok(extend_two, lambda why: why))

    def state_roundtrip():
        p = padded_of(728)
        rb = rb_of(4)
        rb.extend(p)
        rb.sample(1)
        state = rb.sampler.state_dict()
        rest = [rb.sample(1)["worker_index"].clone() for _ in range(3)]
        s2 = R().SequenceReplaySampler(4)
        s2.load_state_dict(state)
        rb.sampler._plan, rb.sampler._next = s2._plan, s2._next
        again = [rb.sample(1)["worker_index"] for _ in range(3)]
        ok = all(torch.equal(a, b) for a, b in zip(rest, again, strict=True))
        return None if ok else "restored sampler state yields other groups"

    case("replay.state_dict.roundtrip", lambda: lib_ok(state_roundtrip, lambda why: why))
    bad(
        "replay.bad.M.gt.stored",
        lambda: _rb_sample(rb_of(10**6), padded_of(729)),
        ["num_minibatches"],
    )
    bad("replay.bad.no.loss_mask", lambda: _rb_sample(rb_of(2), rollout(730)[:, 0]), ["loss_mask"])
    case(
        "replay.bad.empty.storage",
        lambda: lib_error(
            lambda: rb_of(2).sample(1), [("empty", "storage")], allow=(RuntimeError,)
        ),
    )
    return cases


def _rb_sample(rb, data):
    rb.extend(data)
    return rb.sample(1)


def all_cases() -> list[Case]:
    return [
        *gae_cases(),
        *splitter_chunker_cases(),
        *padder_cases(),
        *device_cases(),
        *sampler_cases(),
    ]
