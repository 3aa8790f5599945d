"""RecurrentPPOLoss across 2 gloo ranks (subprocesses) against one process on the union.

Each rank computes the loss on its minibatch with ``process_group="default"``, takes the
gradient and averages it over the ranks as ``DistributedDataParallel`` does (an all-reduce
sum divided by the world size; the agent modules call ``net.policy``/``net.value``, not
``net.forward``, so DDP's forward hook is replaced by the same all-reduce by hand). That average
must equal the gradient of one process computing the loss (no group) on the union of the ranks'
minibatches, and every rank's diagnostics must be the union's. Two uses of the sampler: one
rollout shared by the ranks and sharded (rank and world size read from the group), and each rank
its own rollout (``rank=0, world_size=1``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import torch
import torch.distributed as dist
from tensordict import TensorDict
from torchrl.modules import set_recurrent_mode

from rppo_td import RecurrentPPOLoss, SequenceSampler
from rppo_td.modules import RecurrentActor, RecurrentActorCritic, RecurrentCritic

ROOT = Path(__file__).resolve().parents[2]
WORLD, MINIBATCHES, LP = 2, 2, 5
CONFIGS = {
    "plain": {},
    "normalized-clip-value": {"normalize_advantage": True, "clip_value": 0.3},
}
STATS = ("clip_fraction", "kl_approx", "entropy", "ESS", "max_ratio", "mean_ratio")
STATS += ("explained_variance", "value_clip_fraction")


def _net() -> RecurrentActorCritic:
    torch.manual_seed(0)
    net = RecurrentActorCritic(
        gym.spaces.Box(-1, 1, (3,)),
        gym.spaces.Discrete(2),
        hidden_size=8,
        normalize_observations=False,
    )
    return net


def _data(net: RecurrentActorCritic, seed: int, num_sequences: int) -> TensorDict:
    """Padded sequences ``[N, LP]`` with varied lengths, behaviour log-probs near the policy's."""
    g = torch.Generator().manual_seed(seed)
    n = num_sequences
    lengths = torch.randint(1, LP + 1, (n,), generator=g)
    is_init = torch.zeros(n, LP, 1, dtype=torch.bool)
    is_init[:, 0] = torch.rand(n, 1, generator=g) < 0.5
    td = TensorDict(
        {
            "row": (torch.arange(n) + 1000 * seed)[:, None].expand(n, LP),  # its identity
            "observation": torch.randn(n, LP, 3, generator=g),
            "is_init": is_init,
            "action": torch.randint(0, 2, (n, LP), generator=g),
            "advantage": 1.0 + torch.randn(n, LP, 1, generator=g),
            "value_target": torch.randn(n, LP, 1, generator=g),
            "loss_mask": torch.arange(LP) < lengths[:, None],
        },
        batch_size=[n, LP],
    )
    for key in net.state_keys:
        td[key] = 0.5 * torch.randn(n, LP, *net.state_shape, generator=g)
    with torch.no_grad(), set_recurrent_mode(True):
        log_prob = RecurrentActor(net).get_dist(td).log_prob(td["action"])
        value = RecurrentCritic(net)(td.clone())["state_value"]
    noise = torch.randn(n, LP, generator=g)
    td["action_log_prob"] = log_prob + 0.3 * noise
    td["state_value"] = value + 0.5 * torch.randn(n, LP, 1, generator=g)
    return td


def _loss(net: RecurrentActorCritic, config: str, process_group: object) -> RecurrentPPOLoss:
    return RecurrentPPOLoss(
        RecurrentActor(net),
        RecurrentCritic(net),
        entropy_coeff=0.01,
        critic_coeff=0.5,
        loss_critic_type="l2",
        process_group=process_group,
        **CONFIGS[config],
    )


def _step(loss: RecurrentPPOLoss, net: RecurrentActorCritic, minibatch: TensorDict):
    out = loss(minibatch)
    total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
    grads = torch.autograd.grad(total, list(net.parameters()))
    return total.detach(), grads, {key: out[key] for key in STATS if out.get(key, None) is not None}


def _shifted(td: TensorDict, rank: int) -> TensorDict:
    td["action_log_prob"] = td["action_log_prob"] + 0.5 * rank
    return td


def _refusals(net: RecurrentActorCritic, rank: int) -> dict[str, str]:
    """Each rank's error for each misuse: all ranks must raise it (none left waiting)."""
    seeded = torch.Generator().manual_seed
    misuses = {
        # the README's sampler (shard from the group) given each rank's own rollout: each
        # rank trained on half of it, in silence
        "own rollouts, sharded": lambda: list(
            SequenceSampler(MINIBATCHES, generator=seeded(7))(_data(net, 1 + rank, 9))
        ),
        # the same sequences, other values: no count tells them apart, the data's bits do
        "own values, sharded": lambda: list(
            SequenceSampler(MINIBATCHES, generator=seeded(7))(_shifted(_data(net, 0, 13), rank))
        ),
        # one rollout, generators seeded apart: sequences skipped or taken twice
        "other seeds, sharded": lambda: list(
            SequenceSampler(MINIBATCHES, generator=seeded(rank))(_data(net, 0, 13))
        ),
        # one rollout, one seed, another minibatch count: blamed on the seeds before
        "other num_minibatches, sharded": lambda: list(
            SequenceSampler(MINIBATCHES + rank, generator=seeded(7))(_data(net, 0, 13))
        ),
        # other loss options: other collectives per call, a gloo "collective mismatch"
        "other loss options": lambda: RecurrentPPOLoss(
            RecurrentActor(net),
            RecurrentCritic(net),
            normalize_advantage=rank == 1,
            process_group="default",
        )(_data(net, 0, 4)),
    }
    refused = {}
    for name, misuse in misuses.items():
        try:
            misuse()
            refused[name] = ""
        except ValueError as err:
            refused[name] = str(err)
    return refused


def _worker(rank: int, out_path: str) -> None:
    """One rank: both sampler uses, both loss configs; results saved to ``out_path``."""
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    net = _net()
    results = {}
    for use in ("shared", "own"):
        if use == "shared":  # one rollout, sharded: rank and world size read from the group
            data = _data(net, seed=0, num_sequences=13)
            sampler = SequenceSampler(MINIBATCHES, generator=torch.Generator().manual_seed(7))
        else:  # each rank its own rollout and generator, no sharding
            data = _data(net, seed=1 + rank, num_sequences=5 + 2 * rank)
            generator = torch.Generator().manual_seed(11 + rank)
            sampler = SequenceSampler(MINIBATCHES, generator=generator, rank=0, world_size=1)
        for config in CONFIGS:
            loss = _loss(net, config, "default")
            steps = []
            for minibatch in sampler(data):
                total, grads, stats = _step(loss, net, minibatch)
                averaged = []
                for grad in grads:  # what DDP does: sum over ranks, divide by world size
                    grad = grad.clone()
                    dist.all_reduce(grad)
                    averaged.append(grad / WORLD)
                steps.append({"minibatch": minibatch, "loss": total, "grads": averaged, **stats})
            results[use, config] = steps
    results["refused"] = _refusals(net, rank)
    torch.save(results, out_path)
    dist.barrier()
    dist.destroy_process_group()


def _close(actual: torch.Tensor, expected: torch.Tensor, msg: str = "") -> None:
    """Equal to 1e-6 relative, the absolute slack 1e-6 of the tensor's largest entry: float32
    sums in another order differ in the last bits, most visibly on near-zero entries."""
    atol = 1e-6 * float(expected.abs().max()) + 1e-12
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=atol, msg=msg or None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("ranks")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    code = "import sys; from tests.integration.test_distributed_loss import _worker; "
    code += "_worker(int(sys.argv[1]), sys.argv[2])"
    paths = [tmp / f"rank{rank}.pt" for rank in range(WORLD)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(rank), str(path)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank, path in enumerate(paths)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=120)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, f"rank {rank} failed:\n{outputs[rank]}"
    return [torch.load(path, weights_only=False) for path in paths]


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("use", ["shared", "own"])
def test_averaged_gradient_equals_one_process_on_the_union(ranks, use, config):
    net = _net()
    loss = _loss(net, config, None)
    per_rank = [r[use, config] for r in ranks]
    assert [len(steps) for steps in per_rank] == [MINIBATCHES] * WORLD  # equal counts
    for k in range(MINIBATCHES):
        steps = [steps[k] for steps in per_rank]
        union = torch.cat([s["minibatch"] for s in steps], 0)
        total, grads, stats = _step(loss, net, union)
        # the ranks' losses average to the union's; DDP's averaged gradient is the union's
        mean_loss = sum(s["loss"] for s in steps) / WORLD
        _close(mean_loss, total)
        for step in steps:
            for grad, expected in zip(step["grads"], grads, strict=True):
                _close(grad, expected)
            assert set(step) - {"minibatch", "loss", "grads"} == set(stats)
            for key in stats:  # every diagnostic is the union's, on every rank (O(1) values:
                # explained_variance = 1 - a / b near 0 amplifies float32 rounding, so absolute)
                torch.testing.assert_close(step[key], stats[key], rtol=1e-6, atol=1e-6, msg=key)
        # not a vacuous check: the ranks' own (unreduced) mean gradient differs
        local = [_step(loss, net, s["minibatch"])[1] for s in steps]
        naive = [(a + b) / 2 for a, b in zip(*local, strict=True)]
        assert any(not torch.allclose(a, b) for a, b in zip(naive, grads, strict=True))


def test_misuses_across_ranks_are_refused_on_every_rank(ranks):
    refused = [rank["refused"] for rank in ranks]
    for rank, errors in enumerate(refused):
        assert errors["own rollouts, sharded"].startswith(
            f"SequenceSampler on rank {rank} shards one rollout shared by the 2 ranks"
        ), errors
        assert "ranks hold different rollouts (sequences 9 to 9" in errors["own rollouts, sharded"]
        assert "pass rank=0, world_size=1" in errors["own rollouts, sharded"]
        assert "drew different plans of the same rollout" in errors["other seeds, sharded"]
        assert (
            f"were built with different num_minibatches ({MINIBATCHES}, {MINIBATCHES + 1} over "
            "the 2 ranks" in errors["other num_minibatches, sharded"]
        ), errors
        assert (
            "the same sequences, but other values of action_log_prob"
            in (errors["own values, sharded"])
        ), errors
        assert (
            "normalize_advantage=True on rank 1 but False on rank 0" in errors["other loss options"]
        ), errors


def test_shared_rollout_shards_are_disjoint_and_cover(ranks):
    rows = [
        [int(r) for step in rank[("shared", "plain")] for r in step["minibatch"]["row"][:, 0]]
        for rank in ranks
    ]
    assert not set(rows[0]) & set(rows[1])
    assert sorted(rows[0] + rows[1]) == list(range(13))


def test_default_group_without_one_reduces_nothing():
    assert not dist.is_initialized()
    net = _net()
    batch = _data(net, seed=3, num_sequences=4)
    for config in CONFIGS:
        expected = _step(_loss(net, config, None), net, batch)
        got = _step(_loss(net, config, "default"), net, batch)
        torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)
        for a, b in zip(got[1], expected[1], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert set(got[2]) == set(expected[2])
        for key in expected[2]:
            torch.testing.assert_close(got[2][key], expected[2][key], rtol=0, atol=0)


def test_bad_process_group():
    net = _net()
    with pytest.raises(ValueError, match="process_group must be None, 'default' or a torch"):
        _loss(net, "plain", "world")
    # what new_group gives a rank outside it: "must be None, ... got -100" before
    with pytest.raises(ValueError, match=r"is not a member of process_group \(torch"):
        _loss(net, "plain", dist.GroupMember.NON_GROUP_MEMBER)


LONE_SAMPLER = """
import os, sys, time
import torch, torch.distributed as dist
from tensordict import TensorDict
from rppo_td import SequenceSampler
dist.init_process_group("gloo", rank=int(sys.argv[1]), world_size=2)
if dist.get_rank() == 0:  # a learner; rank 1 stands for a collector that never samples
    mask = torch.arange(4) < torch.tensor([4, 1, 3, 2, 4, 1])[:, None]
    sampler = SequenceSampler(2, generator=torch.Generator().manual_seed(0))
    sampler.plan_check_timeout_s = 2
    try:
        list(sampler(TensorDict({"loss_mask": mask}, batch_size=[6, 4])))
    except ValueError as err:
        print(err, flush=True)
else:
    time.sleep(6)
os._exit(0)
"""


def test_a_group_whose_other_ranks_never_sample_is_refused_after_the_timeout(tmp_path):
    # TorchRL's distributed collectors share the trainer's default group: a sampler reading
    # its shard from it took the trainer for one of 3 learners (a third of each rollout)
    script = tmp_path / "lone.py"
    script.write_text(LONE_SAMPLER)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert "did not plan an epoch within 2 s" in outputs[0], outputs
    assert "pass rank=0, world_size=1" in outputs[0], outputs
