"""target_kl: an update stops after the first epoch whose mean kl_k3 exceeds it."""

from __future__ import annotations

import csv
import itertools
import os

import gymnasium as gym
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from tensordict import TensorDict

from rppo_td.modules import RecurrentActor, RecurrentActorCritic, RecurrentCritic
from rppo_td.train import TrainConfig
from rppo_td.train._outputs import METRIC_FIELDS, _truncate_rows
from rppo_td.train._ppo import PPOSettings, PPOUpdate


def _net() -> RecurrentActorCritic:
    torch.manual_seed(0)
    return RecurrentActorCritic(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2), hidden_size=4)


def _update(*, epochs: int, num_minibatches: int, target_kl: float) -> PPOUpdate:
    net = _net()
    settings = PPOSettings(
        gamma=0.9, lmbda=0.95, sequence_length=4, epochs=epochs,
        num_minibatches=num_minibatches, value_coef=0.5, entropy_coef=0.0, max_grad_norm=0.5,
        normalize_advantage=False, target_kl=target_kl,
    )  # fmt: skip
    return PPOUpdate(
        RecurrentActor(net), RecurrentCritic(net), torch.optim.Adam(net.parameters()),
        settings=settings, generator=torch.Generator().manual_seed(0),
    )  # fmt: skip


def _rollout(w: int = 4, t: int = 8) -> TensorDict:
    """``[W, T]`` steps of one episode per worker: ``2 W`` sequences of 4 steps."""
    flags = torch.zeros(w, t, 1, dtype=torch.bool)
    is_init = flags.clone()
    is_init[:, 0] = True
    net = _net()
    states = {
        key: torch.zeros(w, t, *net.state_shape)
        for key in (*net.actor_state_keys, *net.critic_state_keys)
    }
    return TensorDict(
        {
            **states,
            "observation": torch.randn(w, t, 2),
            "is_init": is_init,
            "action": torch.randint(0, 2, (w, t)),
            "action_log_prob": torch.full((w, t), -0.69),
            "next": {
                **{key: state.clone() for key, state in states.items()},
                "observation": torch.randn(w, t, 2),
                "is_init": flags.clone(),
                "reward": torch.randn(w, t, 1),
                "terminated": flags.clone(),
                "truncated": flags.clone(),
                "done": flags.clone(),
            },
        },
        batch_size=[w, t],
    )


def _expected_epochs(kls: list[float], epochs: int, batches: int, target: float) -> int:
    """The naive rule: the first epoch whose minibatches' mean KL is over the target.

    Each KL is the float32 a loss reports, and an epoch's are summed in float32 as the update
    does: in float64, a mean a rounding away from the target (``[1e-3, 1e-3]`` against
    ``1e-3``) falls on the other side of it.
    """
    for epoch in range(epochs):
        chunk = kls[epoch * batches : (epoch + 1) * batches]
        total = torch.zeros(())
        for kl in chunk:
            total = total + torch.tensor(kl)
        if target > 0 and float(total) / batches > target:
            return epoch + 1
    return epochs


@given(
    epochs=st.integers(1, 6),
    batches=st.integers(1, 3),
    target=st.sampled_from([0.0, 1e-3, 0.01, 0.05]),
    kls=st.lists(st.floats(-0.02, 0.1), min_size=18, max_size=18),
)
@example(epochs=2, batches=2, target=1e-3, kls=[1e-3] * 18)  # over the target in float32 only
def test_the_update_stops_after_the_first_epoch_over_target_kl(epochs, batches, target, kls):
    update = _update(epochs=epochs, num_minibatches=batches, target_kl=target)
    scripted = iter(kls)
    steps = itertools.count()

    def step(batch):
        next(steps)
        return {"kl_k3": torch.tensor(next(scripted)), "loss_total": torch.tensor(1.0)}

    update._step = step  # the KL each minibatch would report, scripted
    stats = update(_rollout(), clip_epsilon=0.2)
    expected = _expected_epochs(kls, epochs, batches, target)
    assert stats["epochs"] == expected
    ran = next(steps)
    assert ran == expected * batches  # no minibatch after the stop
    # the scripted KLs are float32 tensors: a mean near 0 of terms near 0.02 is exact to
    # about 1e-8 absolute, not relative
    assert stats["kl_k3"] == pytest.approx(sum(kls[:ran]) / ran, rel=1e-6, abs=1e-7)


def test_without_target_kl_every_epoch_runs_and_the_networks_train():
    update = _update(epochs=3, num_minibatches=2, target_kl=0.0)
    before = [p.detach().clone() for p in update.parameters]
    stats = update(_rollout(), clip_epsilon=0.2)
    assert stats["epochs"] == 3
    assert any(not torch.equal(a, b) for a, b in zip(before, update.parameters, strict=True))


def test_target_kl_must_not_be_negative():
    with pytest.raises(ValueError, match="target_kl"):
        TrainConfig(target_kl=-0.01)


def test_a_resumed_metrics_file_of_an_earlier_version_gets_todays_columns(tmp_path):
    path = tmp_path / "metrics.csv"
    old = [f for f in METRIC_FIELDS if f != "epochs"]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=old)
        writer.writeheader()
        for update in (1, 2, 3):
            writer.writerow({name: update for name in old})
    _truncate_rows(path, last_update=2)
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        assert tuple(reader.fieldnames or ()) == METRIC_FIELDS
    assert [r["update"] for r in rows] == ["1", "2"]
    assert all(r["epochs"] == "" and r["kl_approx"] == r["update"] for r in rows)
    _truncate_rows(path, last_update=2)  # nothing to drop, today's header: left alone
    assert path.read_text().count("\n") == 3


def test_a_metrics_file_that_is_not_text_is_named_and_malformed_rows_counted_apart(
    tmp_path, caplog
):
    path = tmp_path / "metrics.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=METRIC_FIELDS)
        writer.writeheader()
        for update in (1, 2, 3, 4):
            writer.writerow({name: update for name in METRIC_FIELDS})
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = "garbage,\n"  # update 2's row, mid-file
    path.write_text("".join(lines))
    with caplog.at_level("INFO"):
        _truncate_rows(path, last_update=3)
    assert "dropping 1 malformed rows" in caplog.text
    assert "dropping 1 rows logged after the checkpoint" in caplog.text  # update 4 only
    assert "lacks the rows of updates 2 (of 1-3" in caplog.text
    path.write_bytes(path.read_bytes() + b"\xb1\xff\x00")
    with pytest.raises(ValueError, match=r"metrics.csv' cannot be read as the run's CSV log"):
        _truncate_rows(path, last_update=3)


def test_a_row_cut_short_is_dropped_not_appended_onto_and_gaps_are_named(tmp_path, caplog):
    # a power cut before metrics.csv reached the disk: the resumed run's next row was glued
    # onto the half row (update 9 lost, update 8's columns holding 9's values)
    path = tmp_path / "metrics.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=METRIC_FIELDS)
        writer.writeheader()
        for update in range(1, 9):
            writer.writerow({name: update for name in METRIC_FIELDS})
    text = path.read_text()
    path.write_text(text[: text.rstrip("\n").rfind("\n") + 1 + 12])  # update 8's first 12
    with caplog.at_level("INFO"):
        _truncate_rows(path, last_update=8)
    assert path.read_text().endswith("\n")
    with path.open(newline="") as f:
        assert [r["update"] for r in csv.DictReader(f)] == [str(u) for u in range(1, 8)]
    assert "lacks the rows of updates 8 (of 1-8" in caplog.text
    caplog.clear()
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:1] + lines[1:3] + lines[6:]))  # updates 3-5 gone
    with caplog.at_level("INFO"):
        _truncate_rows(path, last_update=8)
    assert "lacks the rows of updates 3-5, 8 (of 1-8" in caplog.text
    # every row whole, the last one's line end lost: the file ends a line again, so the next
    # row appended is a row of its own (it was glued onto update 7's, both then dropped)
    path.write_bytes(path.read_bytes().rstrip(b"\r\n"))
    _truncate_rows(path, last_update=7)
    assert path.read_bytes().endswith(b"\n")
    with path.open("a", newline="") as f:
        csv.DictWriter(f, fieldnames=METRIC_FIELDS).writerow({n: 9 for n in METRIC_FIELDS})
    with path.open(newline="") as f:
        assert [r["update"] for r in csv.DictReader(f)] == ["1", "2", "6", "7", "9"]


def test_a_step_whose_gradient_is_not_finite_is_skipped_and_named(caplog):
    # a reward beyond float32 (1e38 squared) made the loss inf: clipping scaled the gradients
    # by 0, or made every parameter NaN and the next collection failed in a traceback
    update = _update(epochs=2, num_minibatches=2, target_kl=0.0)
    before = {name: p.detach().clone() for name, p in update.loss.named_parameters()}
    rollout = _rollout()
    rollout["next", "reward"][0, 3] = 1e38
    with caplog.at_level("WARNING"):
        means = update(rollout, clip_epsilon=0.2)
    assert "gradient steps of this update were skipped" in caplog.text
    assert update.skipped >= 1 and means["skipped_steps"] == update.skipped
    assert not torch.isfinite(torch.tensor(means["grad_norm"]))
    for name, p in update.loss.named_parameters():
        assert torch.isfinite(p).all(), name
    # the finite minibatch's steps were taken
    assert update.skipped < 4 or all(
        torch.equal(p, before[name]) for name, p in update.loss.named_parameters()
    )


def test_an_epoch_whose_mean_kl_equals_the_target_does_not_stop():
    # the rule is "exceeds" (as TorchRL's and sb3's)
    update = _update(epochs=3, num_minibatches=2, target_kl=0.5)
    update._step = lambda batch: {"kl_k3": torch.tensor(0.5), "loss_total": torch.tensor(1.0)}
    assert update(_rollout(), clip_epsilon=0.2)["epochs"] == 3


def test_the_stop_compares_kl_k3():
    # kl_approx (about 3.4e-3 here against kl_k3's 7e-6) stopped after the first epoch; it
    # can be negative too, and never stop
    update = _update(epochs=4, num_minibatches=2, target_kl=1e-3)
    seen, real = [], update._step

    def step(batch):
        seen.append(real(batch))
        return seen[-1]

    update._step = step
    out = update(_rollout(), clip_epsilon=0.2)
    kls = [float(stats["kl_k3"]) for stats in seen]
    assert out["epochs"] == _expected_epochs(kls + [0.0] * 8, 4, 2, 1e-3) and out["epochs"] > 1


def test_skipped_steps_are_counted_per_update_and_leave_the_optimizer_alone():
    # the count added up over updates (every later update reported skipped steps), and a
    # skipped step still ran Adam: momentum moved the parameters, its step count went up
    update = _update(epochs=2, num_minibatches=1, target_kl=0.0)
    update(_rollout(), clip_epsilon=0.2)  # Adam now has momentum
    before = [p.detach().clone() for p in update.parameters]
    steps = [state["step"].clone() for state in update.optimizer.state.values()]
    bad = _rollout()
    bad["next", "reward"][0, 3] = 1e38  # one minibatch: every step is not finite
    assert update(bad, clip_epsilon=0.2)["skipped_steps"] == 2
    assert all(torch.equal(a, b) for a, b in zip(before, update.parameters, strict=True))
    assert [state["step"] for state in update.optimizer.state.values()] == steps
    assert update(_rollout(), clip_epsilon=0.2)["skipped_steps"] == 0
    assert update.skipped == 0


def _metrics(path, updates, delimiter=","):
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=METRIC_FIELDS, delimiter=delimiter)
        writer.writeheader()
        for update in updates:
            writer.writerow({name: update for name in METRIC_FIELDS})


def test_a_metrics_file_a_spreadsheet_saved_keeps_its_rows(tmp_path):
    # "CSV UTF-8" starts with a byte-order mark, read into the first column's name: every
    # row was dropped as malformed and the file rewritten without them
    path = tmp_path / "metrics.csv"
    _metrics(path, (1, 2, 3))
    text = path.read_text().replace("\n2,2,", "\n2.0,2,")  # an update written as 2.0
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    _truncate_rows(path, last_update=3)
    with path.open(newline="") as f:
        assert [r["update"] for r in csv.DictReader(f)] == ["1", "2", "3"]
    # semicolons (a spreadsheet in another locale): refused, the file left as it is
    _metrics(path, (1, 2), delimiter=";")
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"its header has no 'update' column"):
        _truncate_rows(path, last_update=2)
    assert path.read_bytes() == before


def test_a_resumed_metrics_file_is_a_file_of_its_own(tmp_path):
    # a hard-linked copy of a run (cp -al, rsync --link-dest) shared its metrics.csv with
    # the original, and the rows the resumed copy appended reached the original
    original = tmp_path / "original.csv"
    _metrics(original, (1, 2))
    copy = tmp_path / "metrics.csv"
    os.link(original, copy)
    _truncate_rows(copy, last_update=2)
    assert copy.stat().st_ino != original.stat().st_ino
    assert copy.read_bytes() == original.read_bytes()


def test_a_column_a_user_added_is_dropped_with_a_warning(tmp_path, caplog):
    path = tmp_path / "metrics.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*METRIC_FIELDS, "note"])
        writer.writeheader()
        writer.writerow({name: 1 for name in METRIC_FIELDS} | {"note": "good run"})
    _truncate_rows(path, last_update=1)
    assert "dropping the columns the run does not write: ['note']" in caplog.text
    assert "note" not in path.read_text()
