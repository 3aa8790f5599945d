"""A. rppo_td.functional: valid tricky inputs against oracles, bad inputs that must be refused."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from tests.adversarial import oracles as O
from tests.adversarial.core import Case, Result, lib_either, lib_error, lib_ok

CAT = "A. functional"


def F():
    import rppo_td.functional as fn

    return fn


def _case(cid: str, fn: Callable[[], Result]) -> Case:
    return Case(f"A.fn.{cid}", CAT, lambda _tmp: fn())


def _rollout(seed: int, w: int, t: int, p_term=0.1, p_trunc=0.05, dtype=torch.float32, extra=()):
    g = torch.Generator().manual_seed(seed)
    shape = (*extra, w, t, 1)
    r = torch.randn(shape, generator=g).to(dtype)
    v = torch.randn(shape, generator=g).to(dtype)
    nv = torch.randn(shape, generator=g).to(dtype)
    term = torch.rand(shape, generator=g) < p_term
    trunc = torch.rand(shape, generator=g) < p_trunc
    return r, v, nv, term, term | trunc


def _gae_check(args, gamma, lmbda, rtol, time_dim=-2):
    r, v, nv, term, done = args
    want_adv, want_tgt = O.gae_loop(r, v, nv, term, done, gamma, lmbda, time_dim)

    def check(out):
        adv, tgt = out
        if adv.dtype != v.dtype:
            return f"advantage dtype {adv.dtype}, state_value is {v.dtype}"
        return O.close(adv, want_adv, rtol, "advantage") or O.close(
            tgt, want_tgt, rtol, "value_target"
        )

    return check


def _rtol(dtype):
    return {torch.float64: 1e-10, torch.float16: 2e-2, torch.bfloat16: 5e-2}.get(dtype, 2e-5)


def gae_cases() -> list[Case]:
    cases = []
    shapes = [(1, 1), (3, 7), (2, 300), (4, 33), (1, 1000)]
    grid = [(0.0, 0.0), (0.0, 1.0), (1.0, 0.0), (1.0, 1.0), (0.99, 0.95), (0.5, 0.3)]
    seed = 0
    for w, t in shapes:
        for gamma, lmbda in grid:
            seed += 1
            args = _rollout(seed, w, t)
            cases.append(
                _case(
                    f"gae.oracle.w{w}t{t}.g{gamma}.l{lmbda}",
                    lambda a=args, g=gamma, lm=lmbda: lib_ok(
                        lambda: F().generalized_advantage_estimate(*a, gamma=g, lmbda=lm),
                        _gae_check(a, g, lm, 2e-5),
                    ),
                )
            )
    # the two-level path (>= 2**16 elements), long T, many terminations / none / all
    for tag, (w, t, pt, ptr) in {
        "twolevel.16x4096": (16, 4096, 0.01, 0.005),
        "twolevel.2048x33": (2048, 33, 0.1, 0.05),
        "twolevel.64x1024.noend": (64, 1024, 0.0, 0.0),
        "long.1x20000.g1l1": (1, 20000, 0.0, 0.0),
        "allterminated": (3, 9, 1.0, 0.0),
        "alltruncated": (3, 9, 0.0, 1.0),
        "both.term.and.trunc": (5, 40, 0.5, 0.5),
    }.items():
        gamma, lmbda = (1.0, 1.0) if "g1l1" in tag else (0.99, 0.95)
        args = _rollout(100 + len(cases), w, t, pt, ptr)
        cases.append(
            _case(
                f"gae.oracle.{tag}",
                lambda a=args, g=gamma, lm=lmbda: lib_ok(
                    lambda: F().generalized_advantage_estimate(*a, gamma=g, lmbda=lm),
                    _gae_check(a, g, lm, 2e-5),
                ),
            )
        )
    # dtypes, batch layouts, time_dim
    for dt in (torch.float64, torch.float16, torch.bfloat16):
        args = _rollout(7, 3, 20, dtype=dt)
        cases.append(
            _case(
                f"gae.oracle.dtype.{str(dt).split('.')[-1]}",
                lambda a=args, d=dt: lib_ok(
                    lambda: F().generalized_advantage_estimate(*a, gamma=0.9, lmbda=0.8),
                    _gae_check(a, 0.9, 0.8, _rtol(d)),
                ),
            )
        )
    r, v, nv, term, done = _rollout(8, 3, 20)
    mixed = (r.double(), v, nv.double(), term, done)
    cases.append(
        _case(
            "gae.oracle.mixed.float64.reward",
            lambda: lib_ok(
                lambda: F().generalized_advantage_estimate(*mixed, gamma=0.9, lmbda=0.8),
                _gae_check(mixed, 0.9, 0.8, 2e-5),
            ),
        )
    )
    single = tuple(x[0] for x in _rollout(9, 1, 25))  # [T, 1]: no batch dims
    cases.append(
        _case(
            "gae.oracle.no.batch.T1",
            lambda: lib_ok(
                lambda: F().generalized_advantage_estimate(*single, gamma=0.9, lmbda=0.8),
                _gae_check(single, 0.9, 0.8, 2e-5),
            ),
        )
    )
    extra = _rollout(10, 3, 11, extra=(2,))  # [A, W, T, 1]
    cases.append(
        _case(
            "gae.oracle.extra.batch.dim",
            lambda: lib_ok(
                lambda: F().generalized_advantage_estimate(*extra, gamma=0.9, lmbda=0.8),
                _gae_check(extra, 0.9, 0.8, 2e-5),
            ),
        )
    )
    tmaj = tuple(x.transpose(0, 1).contiguous() for x in _rollout(11, 4, 12))  # [T, W, 1]
    cases.append(
        _case(
            "gae.oracle.time_dim0",
            lambda: lib_ok(
                lambda: F().generalized_advantage_estimate(*tmaj, gamma=0.9, lmbda=0.8, time_dim=0),
                _gae_check(tmaj, 0.9, 0.8, 2e-5, time_dim=0),
            ),
        )
    )
    nc = tuple(x.transpose(0, 1) for x in tmaj)  # non-contiguous [W, T, 1]
    cases.append(
        _case(
            "gae.oracle.noncontiguous",
            lambda: lib_ok(
                lambda: F().generalized_advantage_estimate(*nc, gamma=0.9, lmbda=0.8),
                _gae_check(nc, 0.9, 0.8, 2e-5),
            ),
        )
    )

    # targets must not require grad
    def grad_case():
        r, v, nv, term, done = _rollout(12, 2, 6)
        v = v.clone().requires_grad_(True)
        want = O.gae_loop(r, v.detach(), nv, term, done, 0.9, 0.8)

        def check(out):
            adv, tgt = out
            if adv.requires_grad or tgt.requires_grad:
                return "advantage/value_target require grad (state_value did)"
            return O.close(adv, want[0], 2e-5, "advantage")

        return lib_either(
            lambda: F().generalized_advantage_estimate(r, v, nv, term, done, gamma=0.9, lmbda=0.8),
            ["state_value", "grad"],
            check,
        )

    cases.append(_case("gae.state_value.requires_grad", grad_case))

    # empty rollouts: fine to refuse clearly or return empties
    for tag, (w, t) in {"W0": (0, 5), "T0": (3, 0)}.items():
        args = _rollout(13, w, t)

        def empty_check(out, w=w, t=t):
            adv = out[0]
            return None if tuple(adv.shape) == (w, t, 1) else f"shape {list(adv.shape)}"

        cases.append(
            _case(
                f"gae.empty.{tag}",
                lambda a=args, c=empty_check: lib_either(
                    lambda: F().generalized_advantage_estimate(*a, gamma=0.9, lmbda=0.8),
                    [("empty", "reward", "W", "T", "size")],
                    c,
                ),
            )
        )

    # ------------------------------------------------------------ bad inputs
    base = _rollout(20, 3, 8)
    names = ["reward", "state_value", "next_state_value", "terminated", "done"]

    def with_(i, value):
        a = list(base)
        a[i] = value
        return a

    def gae_bad(cid, args, words, gamma=0.9, lmbda=0.8, time_dim=-2, accept=None):
        cases.append(
            _case(
                f"gae.bad.{cid}",
                lambda: lib_error(
                    lambda: F().generalized_advantage_estimate(
                        *args, gamma=gamma, lmbda=lmbda, time_dim=time_dim
                    ),
                    words,
                    accept=accept,
                ),
            )
        )

    for i, name in enumerate(names):
        x = base[i]
        gae_bad(f"{name}.no.trailing1", with_(i, x.squeeze(-1)), [name])
        # reward sets the expected shape: naming the mismatching pair is clear enough
        pair = [tuple(names)] if name == "reward" else [name]
        gae_bad(f"{name}.broadcastable", with_(i, x[:1]), pair)
        gae_bad(f"{name}.longer.T", with_(i, torch.cat([x, x[:, :1]], 1)), pair)
        gae_bad(f"{name}.list", with_(i, x.tolist()), [name])
        if i < 3:
            for bad in ("nan", "inf", "-inf"):
                y = x.clone()
                y[1, 3, 0] = float(bad)
                gae_bad(f"{name}.{bad}", with_(i, y), [name])
            gae_bad(f"{name}.bool", with_(i, x > 0), [name])
        else:
            gae_bad(f"{name}.float.flags", with_(i, x.float()), [name])
            gae_bad(f"{name}.int.flags", with_(i, x.long()), [name])
            gae_bad(f"{name}.uint8.flags", with_(i, x.to(torch.uint8)), [name])
    # int rewards: refusing or computing exactly as float are both right
    r_int = (base[0] * 3).round().long()
    gae_bad(
        "reward.int64",
        with_(0, r_int),
        ["reward"],
        accept=_gae_check((r_int.double(), *base[1:]), 0.9, 0.8, 2e-5),
    )
    gae_bad("state_value.int64", with_(1, base[1].long()), ["state_value"])
    # terminated where not done: inconsistent flags
    term = base[3].clone()
    done = base[4].clone()
    term[0, 2, 0], done[0, 2, 0] = True, False
    gae_bad("terminated.without.done", [*base[:3], term, done], ["terminated", "done"])
    # meta tensors
    meta = [x.to("meta") for x in base]
    gae_bad("meta.device", meta, [("meta", "device", "reward")])
    # gamma / lambda values
    for pname in ("gamma", "lmbda"):
        for tag, value in {
            "neg": -0.1,
            "above1": 1.5,
            "nan": math.nan,
            "inf": math.inf,
            "str": "0.9",
            "bool": True,
            "none": None,
            "tensor2": torch.tensor([0.9, 0.9]),
            "complex": 0.5j,
        }.items():
            kw = {"gamma": 0.9, "lmbda": 0.8, pname: value}
            gae_bad(f"{pname}.{tag}", list(base), [pname], **kw)
    for td in (2, 3, -4, 7):
        gae_bad(f"time_dim.{td}", list(base), ["time_dim"], time_dim=td)
    gae_bad("time_dim.float", list(base), ["time_dim"], time_dim=1.0)
    gae_bad("time_dim.-1.the.trailing.1", list(base), ["time_dim"], time_dim=-1)
    return cases


def segment_cases() -> list[Case]:
    cases = []
    for i, (shape, td, decay) in enumerate(
        [
            ((3, 10, 1), -2, 0.9),
            ((3, 10, 2), -2, 1.0),
            ((10,), 0, 0.5),
            ((2, 4, 50), -1, 0.99),
            ((50, 3), 0, 0.0),
            ((4, 3000, 1), -2, 0.999),
            ((8, 9000, 1), -2, 0.97),  # two-level path
            ((1, 5000, 1), -2, 1e-300),  # tiny decay
            ((2, 2000, 1), -2, 0.3),  # decay**K underflow range
        ]
    ):
        g = torch.Generator().manual_seed(50 + i)
        x = torch.randn(shape, generator=g)
        keep = torch.rand(shape, generator=g) > 0.05
        want = O.segment_sum_loop(x, keep, decay, td)
        cases.append(
            _case(
                f"segsum.oracle.{i}.{'x'.join(map(str, shape))}.d{decay}",
                lambda x=x, k=keep, d=decay, t=td, w=want: lib_ok(
                    lambda: F().discounted_segment_sum(x, k, d, time_dim=t),
                    lambda out: O.close(out, w, 2e-5),
                ),
            )
        )
    x = torch.randn(3, 10, 1)
    keep = torch.rand(3, 10, 1) > 0.2

    def bad(cid, fn, words, accept=None):
        cases.append(_case(f"segsum.bad.{cid}", lambda: lib_error(fn, words, accept=accept)))

    ss = lambda *a, **k: F().discounted_segment_sum(*a, **k)  # noqa: E731
    bad("carry_on.float", lambda: ss(x, keep.float(), 0.9), ["carry_on"])
    bad("carry_on.shape", lambda: ss(x, keep[:, :5], 0.9), ["carry_on"])
    bad("carry_on.broadcast", lambda: ss(x, keep[:1], 0.9), ["carry_on"])
    bad("x.int", lambda: ss(x.long(), keep, 0.9), [("x", "float")])
    for tag, d in {"neg": -0.5, "above1": 1.5, "nan": math.nan, "str": "0.9", "bool": True}.items():
        bad(f"decay.{tag}", lambda d=d: ss(x, keep, d), ["decay"])
    bad("time_dim.3", lambda: ss(x, keep, 0.9, time_dim=3), ["time_dim"])
    bad("time_dim.-5", lambda: ss(x, keep, 0.9, time_dim=-5), ["time_dim"])
    return cases


def episode_cases() -> list[Case]:
    cases = []
    fn = F
    for i, (w, t, p) in enumerate([(1, 1, 0.5), (3, 9, 0.3), (5, 40, 0.05), (2, 7, 1.0)]):
        g = torch.Generator().manual_seed(70 + i)
        done = torch.rand(w, t, generator=g) < p
        init = torch.rand(w, t, generator=g) < 0.1
        cases.append(
            _case(
                f"starts.oracle.{w}x{t}",
                lambda d=done: lib_ok(
                    lambda: fn().episode_starts(d),
                    lambda out, d=d: (
                        None
                        if out.tolist() == O.starts_loop(d)
                        else "episode_starts differs from the loop"
                    ),
                ),
            )
        )
        cases.append(
            _case(
                f"starts.oracle.is_init.{w}x{t}",
                lambda d=done, ii=init: lib_ok(
                    lambda: fn().episode_starts(d, ii),
                    lambda out, d=d, ii=ii: (
                        None
                        if out.tolist() == O.starts_loop(d, ii)
                        else "episode_starts(is_init) differs from the loop"
                    ),
                ),
            )
        )
        start = torch.tensor(O.starts_loop(done, init))
        cases.append(
            _case(
                f"ids.oracle.{w}x{t}",
                lambda s=start: lib_ok(
                    lambda: fn().episode_ids(s),
                    lambda out, s=s: (
                        None
                        if out.tolist() == O.ids_loop(s) and out.dtype == torch.int64
                        else "episode_ids differs from the loop"
                    ),
                ),
            )
        )
        for length in (1, 2, 3, 7, None, 10**6):
            want = O.chunk_loop(start, length)
            cases.append(
                _case(
                    f"chunk.oracle.{w}x{t}.L{length}",
                    lambda s=start, L=length, want=want: lib_ok(
                        lambda: fn().chunk_episodes(s, L),
                        lambda out, want=want: (
                            None
                            if (out[0].tolist(), out[1].tolist()) == want
                            else "chunk_episodes differs from the loop"
                        ),
                    ),
                )
            )
    done = torch.tensor([[False, True, False, False], [False, False, False, True]])
    d3 = done.unsqueeze(-1)

    def bad(cid, f, words, accept=None):
        cases.append(_case(cid, lambda: lib_error(f, words, accept=accept)))

    bad("starts.bad.done.trailing1", lambda: fn().episode_starts(d3), ["done"])
    bad("starts.bad.done.float", lambda: fn().episode_starts(done.float()), ["done"])
    bad("starts.bad.done.1d", lambda: fn().episode_starts(done[0]), ["done"])
    bad("starts.bad.is_init.shape", lambda: fn().episode_starts(done, done[:1]), ["is_init"])
    bad("starts.bad.is_init.int", lambda: fn().episode_starts(done, done.long()), ["is_init"])
    bad("starts.bad.is_init.trailing1", lambda: fn().episode_starts(done, d3), ["is_init"])
    for tag, shape in {"W0": (0, 4), "T0": (2, 0)}.items():
        empty = torch.zeros(shape, dtype=torch.bool)
        cases.append(
            _case(
                f"starts.empty.{tag}",
                lambda e=empty: lib_either(
                    lambda: fn().episode_starts(e),
                    [("done", "empty")],
                    lambda out, e=e: None if out.shape == e.shape else f"shape {list(out.shape)}",
                ),
            )
        )
    start = torch.tensor([[True, False, True], [True, False, False]])
    bad(
        "ids.bad.first.column.false",
        lambda: fn().episode_ids(torch.tensor([[False, True, False], [True, False, True]])),
        ["start"],
    )
    bad("ids.bad.start.float", lambda: fn().episode_ids(start.float()), ["start"])
    bad("ids.bad.start.3d", lambda: fn().episode_ids(start.unsqueeze(-1)), ["start"])
    bad("ids.bad.start.1d", lambda: fn().episode_ids(start[0]), ["start"])
    bad(
        "chunk.bad.first.column.not.start",
        lambda: fn().chunk_episodes(torch.tensor([[True, False], [False, False]]), 2),
        ["start"],
    )
    bad(
        "chunk.bad.first.step.not.start",
        lambda: fn().chunk_episodes(torch.tensor([[False, False, True]]), 2),
        ["start"],
    )
    for tag, L in {
        "0": 0,
        "neg": -1,
        "float": 2.5,
        "bool": True,
        "str": "4",
        "float2.0": 2.0,
    }.items():
        bad(f"chunk.bad.L.{tag}", lambda L=L: fn().chunk_episodes(start, L), ["sequence_length"])
    bad("chunk.bad.start.float", lambda: fn().chunk_episodes(start.float(), 2), ["start"])
    bad("chunk.bad.start.int", lambda: fn().chunk_episodes(start.long(), 2), ["start"])
    bad("chunk.bad.start.3d", lambda: fn().chunk_episodes(start.unsqueeze(-1), 2), ["start"])
    bad("chunk.bad.start.1d", lambda: fn().chunk_episodes(start[0], 2), ["start"])
    return cases


def layout_cases() -> list[Case]:
    cases = []
    fn = F
    for i, (w, t, p, length) in enumerate(
        [
            (1, 1, 0.0, 4),
            (3, 9, 0.3, 2),
            (4, 30, 0.1, 8),
            (2, 5, 0.0, 100),
            (3, 6, 1.0, 3),
            (2, 12, 0.2, None),
            (6, 16, 0.15, 1),
        ]
    ):
        g = torch.Generator().manual_seed(90 + i)
        done = torch.rand(w, t, generator=g) < p
        start = torch.tensor(O.starts_loop(done))
        sid, off = (torch.tensor(a) for a in O.chunk_loop(start, length))
        seqs = O.sequences_loop(sid, t)

        def check(out, seqs=seqs):
            idx, mask = out
            lp = max(len(s) for s in seqs)
            if tuple(idx.shape) != (len(seqs), lp):
                return f"flat_index shape {list(idx.shape)}, expected [{len(seqs)}, {lp}]"
            for n, s in enumerate(seqs):
                row_mask = mask[n].tolist()
                if row_mask != [True] * len(s) + [False] * (lp - len(s)):
                    return f"loss_mask row {n} is not a True prefix of length {len(s)}"
                if idx[n, : len(s)].tolist() != s:
                    return f"flat_index row {n} = {idx[n].tolist()}, expected {s}"
            return None

        cases.append(
            _case(
                f"layout.oracle.{w}x{t}.L{length}",
                lambda sid=sid, off=off, c=check: lib_ok(lambda: fn().sequence_layout(sid, off), c),
            )
        )
        # pad / unpad round trip for several dtypes and feature shapes
        for feat, dtype in [
            ((), torch.float32),
            ((3,), torch.int64),
            ((2, 2), torch.uint8),
            ((1,), torch.bool),
            ((0,), torch.float32),
            ((4, 0, 2), torch.float64),
        ]:
            x = (torch.rand(w, t, *feat, generator=g) * 100).to(dtype)

            def pad_check(out, x=x, seqs=seqs):
                want = O.pad_loop(x, seqs)
                if out.dtype != x.dtype or out.shape != want.shape:
                    return f"padded {list(out.shape)} {out.dtype}, want {list(want.shape)}"
                if not torch.equal(out, want):
                    return "padded values differ from the loop"
                return None

            def pad(x=x, sid=sid, off=off):
                idx, mask = fn().sequence_layout(sid, off)
                return fn().pad_sequences(x, idx, fn().padding_positions(mask))

            tag = f"{w}x{t}.L{length}.{'x'.join(map(str, feat)) or 'scalar'}.{dtype}".replace(
                "torch.", ""
            )
            cases.append(_case(f"pad.oracle.{tag}", lambda p=pad, c=pad_check: lib_ok(p, c)))

            def roundtrip(x=x, sid=sid, off=off, w=w, t=t):
                idx, mask = fn().sequence_layout(sid, off)
                padded = fn().pad_sequences(x, idx, fn().padding_positions(mask))
                real = mask.flatten().nonzero().squeeze(1)
                flat = fn().unpad_sequences(padded, idx.flatten()[real], real, w * t)
                return flat.view(w, t, *flat.shape[1:])

            cases.append(
                _case(
                    f"unpad.roundtrip.{tag}",
                    lambda r=roundtrip, x=x: lib_ok(
                        r,
                        lambda out, x=x: (
                            None
                            if out.dtype == x.dtype and torch.equal(out, x)
                            else "unpad(pad(x)) != x"
                        ),
                    ),
                )
            )
    # bad layout / padding inputs
    sid = torch.tensor([[0, 0, 1], [2, 2, 2]])
    off = torch.tensor([[0, 1, 0], [0, 1, 2]])

    def bad(cid, f, words, accept=None):
        cases.append(_case(cid, lambda: lib_error(f, words, accept=accept)))

    bad("layout.bad.int32.ids", lambda: fn().sequence_layout(sid.int(), off), ["sequence_id"])
    bad(
        "layout.bad.int32.offsets",
        lambda: fn().sequence_layout(sid, off.int()),
        ["sequence_offset"],
    )
    bad("layout.bad.shape", lambda: fn().sequence_layout(sid, off[:, :2]), ["sequence_offset"])
    bad(
        "layout.bad.offset.gap",
        lambda: fn().sequence_layout(sid, torch.tensor([[0, 2, 0], [0, 1, 2]])),
        ["sequence_offset"],
    )
    bad(
        "layout.bad.id.skips",
        lambda: fn().sequence_layout(torch.tensor([[0, 0, 2], [3, 3, 3]]), off),
        ["sequence_id"],
    )
    bad(
        "layout.bad.seq.crosses.worker",
        lambda: fn().sequence_layout(
            torch.tensor([[0, 0, 1], [1, 1, 1]]), torch.tensor([[0, 1, 0], [1, 2, 3]])
        ),
        ["sequence_id"],
    )
    bad(
        "layout.bad.negative.offset",
        lambda: fn().sequence_layout(sid, torch.tensor([[0, 1, -1], [0, 1, 2]])),
        ["sequence_offset"],
    )
    bad(
        "layout.bad.1d", lambda: fn().sequence_layout(sid.flatten(), off.flatten()), ["sequence_id"]
    )
    cases.append(
        _case(
            "layout.empty.W0",
            lambda: lib_either(
                lambda: fn().sequence_layout(
                    torch.zeros(0, 3, dtype=torch.long), torch.zeros(0, 3, dtype=torch.long)
                ),
                [("sequence_id", "empty")],
                lambda out: None if out[0].shape[0] == 0 else f"{list(out[0].shape)}",
            ),
        )
    )
    x = torch.arange(6.0).view(2, 3)

    def layout():
        return fn().sequence_layout(sid, off)

    bad(
        "pad.bad.flat_index.out.of.range",
        lambda: fn().pad_sequences(x, torch.tensor([[0, 99]]), torch.tensor([], dtype=torch.long)),
        ["flat_index"],
    )
    bad(
        "pad.bad.flat_index.int32",
        lambda: fn().pad_sequences(x, layout()[0].int(), fn().padding_positions(layout()[1])),
        ["flat_index"],
        accept=lambda out: (
            None
            if torch.equal(
                out, fn().pad_sequences(x, layout()[0], fn().padding_positions(layout()[1]))
            )
            else "differs from int64 index"
        ),
    )
    bad(
        "pad.bad.x.wrong.steps",
        lambda: fn().pad_sequences(torch.arange(4.0).view(2, 2), *_idx_pad(fn, layout)),
        ["x", "flat_index"],
    )
    bad(
        "pad.bad.pad_positions.out.of.range",
        lambda: fn().pad_sequences(x, layout()[0], torch.tensor([100])),
        ["pad_positions"],
    )

    def unpad_with(n):
        idx, mask = layout()
        padded = fn().pad_sequences(x, idx, fn().padding_positions(mask))
        real = mask.flatten().nonzero().squeeze(1)
        return fn().unpad_sequences(padded, idx.flatten()[real], real, n)

    bad("unpad.bad.num_steps.smaller", lambda: unpad_with(5), ["num_steps"])
    bad("unpad.bad.num_steps.larger", lambda: unpad_with(7), ["num_steps"])
    bad("unpad.bad.num_steps.zero", lambda: unpad_with(0), ["num_steps"])
    bad(
        "unpad.bad.num_steps.float",
        lambda: unpad_with(6.0),
        ["num_steps"],
        accept=lambda out: None if torch.equal(out, x.flatten()) else "wrong",
    )

    def unpad_mismatch():
        idx, mask = layout()
        padded = fn().pad_sequences(x, idx, fn().padding_positions(mask))
        real = mask.flatten().nonzero().squeeze(1)
        return fn().unpad_sequences(padded, idx.flatten()[real][:-1], real, 6)

    bad("unpad.bad.destination.shorter", unpad_mismatch, [("flat_destination", "real_positions")])

    def unpad_dup():
        idx, mask = layout()
        padded = fn().pad_sequences(x, idx, fn().padding_positions(mask))
        real = mask.flatten().nonzero().squeeze(1)
        dest = idx.flatten()[real].clone()
        dest[1] = dest[0]
        return fn().unpad_sequences(padded, dest, real, 6)

    bad("unpad.bad.destination.repeats", unpad_dup, ["flat_destination"])
    return cases


def _idx_pad(fn, layout):
    idx, mask = layout()
    return idx, fn().padding_positions(mask)


def masked_cases() -> list[Case]:
    cases = []
    fn = F
    g = torch.Generator().manual_seed(123)
    for i, (n, lp, feat) in enumerate(
        [(4, 5, ()), (3, 7, (1,)), (6, 2, (3,)), (1, 1, ()), (5, 9, (2, 2))]
    ):
        x = torch.randn(n, lp, *feat, generator=g, dtype=torch.float64)
        lengths = torch.randint(1, lp + 1, (n,), generator=g)
        mask = torch.arange(lp)[None] < lengths[:, None]
        full = mask.view(n, lp, *([1] * len(feat))).expand_as(x)
        vals = x[full]
        mean = float(vals.mean())
        std = float(((vals - mean) ** 2).mean().sqrt())
        want_norm = torch.where(full, (x - mean) / (std + 1e-8), torch.zeros(()))
        # NaN / inf on padding must not leak (valid: padding can hold anything)
        dirty = x.clone()
        dirty[~full] = math.nan
        cases.append(
            _case(
                f"masked_mean.oracle.{i}",
                lambda x=x, m=mask, w=mean: lib_ok(
                    lambda: fn().masked_mean(x, m), lambda out, w=w: O.close(out, w, 1e-12)
                ),
            )
        )
        cases.append(
            _case(
                f"masked_normalize.oracle.{i}",
                lambda x=x, m=mask, w=want_norm: lib_ok(
                    lambda: fn().masked_normalize(x, m), lambda out, w=w: O.close(out, w, 1e-9)
                ),
            )
        )
        if (~mask).any():
            cases.append(
                _case(
                    f"masked_mean.nan.on.padding.{i}",
                    lambda x=dirty, m=mask, w=mean: lib_ok(
                        lambda: fn().masked_mean(x, m), lambda out, w=w: O.close(out, w, 1e-12)
                    ),
                )
            )
            cases.append(
                _case(
                    f"masked_normalize.nan.on.padding.{i}",
                    lambda x=dirty, m=mask, w=want_norm: lib_ok(
                        lambda: fn().masked_normalize(x, m),
                        lambda out, w=w: O.close(out, w, 1e-9),
                    ),
                )
            )
    x = torch.randn(3, 4)
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]]).bool()

    def bad(cid, f, words, accept=None):
        cases.append(_case(cid, lambda: lib_error(f, words, accept=accept)))

    for name in ("masked_mean", "masked_normalize"):
        f = lambda *a, name=name: getattr(fn(), name)(*a)  # noqa: E731
        # no real step: a clear error, or the correct empty result (the mean of nothing is
        # NaN, as torch.mean of an empty tensor; normalising all-padding gives its zeros)
        empty_ok = (
            (lambda out: None if bool(torch.isnan(out)) else f"mean of nothing = {out}")
            if name == "masked_mean"
            else (lambda out: None if bool((out == 0).all()) else "padding not zero")
        )
        bad(
            f"{name}.bad.all.false.mask",
            lambda f=f: f(x, torch.zeros(3, 4, dtype=torch.bool)),
            ["mask"],
            accept=empty_ok,
        )
        bad(f"{name}.bad.mask.int", lambda f=f: f(x, mask.long()), ["mask"])
        bad(f"{name}.bad.mask.float", lambda f=f: f(x, mask.float()), ["mask"])
        bad(f"{name}.bad.mask.shape", lambda f=f: f(x, mask[:, :3]), ["mask"])
        bad(f"{name}.bad.mask.broadcast", lambda f=f: f(x, mask[:1]), ["mask"])
        xi = (x * 10).long()
        stats = O.masked_stats_loop(xi, mask)
        want = torch.tensor(stats[0] if name == "masked_mean" else stats[1])
        # an int x: refusing it or computing what the float x gives are both right
        bad(
            f"{name}.int.x",
            lambda f=f, xi=xi: f(xi, mask),
            [("x", "float")],
            accept=lambda out, w=want: O.close(out, w.numpy(), 1e-6),
        )
        # NaN on a real step: propagating it visibly (NaN out) or refusing are both right
        bad(
            f"{name}.nan.on.real.step",
            lambda f=f: f(torch.full((3, 4), math.nan), mask),
            [("x", "nan", "finite")],
            accept=lambda out: None if torch.isnan(out).any() else "NaN input, finite output",
        )
    bad(
        "masked_normalize.bad.eps.negative",
        lambda: fn().masked_normalize(torch.ones(3, 4), mask, eps=-1.0),
        ["eps"],
    )
    return cases


def minibatch_cases() -> list[Case]:
    cases = []
    fn = F
    for i, (n, m, balance) in enumerate(
        [
            (10, 3, "steps"),
            (10, 10, "steps"),
            (10, 1, "steps"),
            (7, 3, "sequences"),
            (100, 7, "steps"),
            (1, 1, "steps"),
            (33, 32, "sequences"),
            (50, 4, "steps"),
        ]
    ):
        g = torch.Generator().manual_seed(200 + i)
        lengths = torch.randint(1, 17, (n,), generator=g)

        def check(groups, lengths=lengths, m=m, balance=balance):
            if len(groups) != m:
                return f"{len(groups)} groups, asked for {m}"
            if any(gr.numel() == 0 for gr in groups):
                return "an empty group"
            flat = torch.cat(groups).sort().values
            if not torch.equal(flat, torch.arange(lengths.numel())):
                return "groups are not a permutation of the sequences"
            if balance == "steps":
                total = int(lengths.sum())
                slack = 2 * int(lengths.max())
                for gr in groups:
                    s = int(lengths[gr].sum())
                    if abs(s - total / m) > slack:
                        return f"group of {s} steps, target {total / m:.1f} +- {slack}"
            else:
                sizes = [gr.numel() for gr in groups]
                if max(sizes) - min(sizes) > 1:
                    return f"sequence counts {sizes}"
            return None

        cases.append(
            _case(
                f"minibatch.oracle.N{n}.M{m}.{balance}",
                lambda L=lengths, m=m, b=balance, c=check: lib_ok(
                    lambda: fn().balanced_minibatches(
                        L, m, generator=torch.Generator().manual_seed(1), balance=b
                    ),
                    c,
                ),
            )
        )
    lengths = torch.tensor([3, 1, 4, 1, 5])

    def bad(cid, f, words, accept=None):
        cases.append(_case(cid, lambda: lib_error(f, words, accept=accept)))

    for tag, m in {
        "0": 0,
        "neg": -1,
        "gt.N": 6,
        "bool": True,
        "float": 2.5,
        "str": "2",
        "none": None,
    }.items():
        bad(
            f"minibatch.bad.M.{tag}",
            lambda m=m: fn().balanced_minibatches(lengths, m),
            ["num_minibatches"],
        )
    bad(
        "minibatch.bad.balance",
        lambda: fn().balanced_minibatches(lengths, 2, balance="tokens"),
        ["balance"],
    )
    bad(
        "minibatch.bad.lengths.2d", lambda: fn().balanced_minibatches(lengths[None], 1), ["lengths"]
    )
    bad(
        "minibatch.bad.lengths.float",
        lambda: fn().balanced_minibatches(lengths.float() + 0.5, 2),
        ["lengths"],
    )
    bad(
        "minibatch.bad.lengths.negative",
        lambda: fn().balanced_minibatches(torch.tensor([3, -1, 2]), 2),
        ["lengths"],
    )
    bad(
        "minibatch.bad.lengths.empty",
        lambda: fn().balanced_minibatches(torch.zeros(0, dtype=torch.long), 1),
        [("num_minibatches", "lengths", "sequences")],
    )
    return cases


def all_cases() -> list[Case]:
    return [
        *gae_cases(),
        *segment_cases(),
        *episode_cases(),
        *layout_cases(),
        *masked_cases(),
        *minibatch_cases(),
    ]
