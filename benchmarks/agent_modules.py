"""The agent's TensorDict modules: rppo_td's own against TorchRL's ``LSTMModule`` stack.

Two agents with the same parameters (CartPoleNoVel sizes: observation ``[2]``, Discrete(2)
actions, hidden 64, one LSTM layer, separate actor and critic LSTMs, rppo_td's heads):

- ``rppo_td``: ``RecurrentActor(net)`` and ``RecurrentCritic(net)`` over
  ``rppo_td.modules.RecurrentActorCritic`` (``normalize_observations=False``, so both do the
  same arithmetic; ``rppo_td+norm`` times the default with the observation normaliser).
- ``torchrl``: ``ProbabilisticActor(TensorDictSequential(encoder, LSTMModule, head),
  distribution_class=Categorical, return_log_prob=True)`` and a critic
  ``TensorDictSequential(encoder, LSTMModule, ValueOperator(head))``, the weights copied from
  the rppo_td net, with the same state keys (``recurrent_state_h``/``_c`` for the actor,
  ``critic_recurrent_state_h``/``_c`` for the critic).

Measured, interleaved, in one process (``torch.set_num_threads(1)``, the trainer's default):

1. one collection step of ``TensorDictSequential(actor, critic)`` on ``W = 16`` workers under
   ``set_exploration_type(RANDOM)`` and ``torch.no_grad()`` (each step on a fresh shallow copy
   of the input, as a collector hands over; ``copy`` alone is timed too);
2. one update minibatch: ``rppo_td.RecurrentPPOLoss(actor, critic, functional=False, ...)``
   forward and backward of the summed losses on ``[B, L]`` sequences (``B = 32`` and
   ``B = 256``, ``L = 16``) whose stored states are the true ones from stepping the agent,
   ``is_init`` True at position 0 of some rows and right-padding masked by ``loss_mask``.

It also checks that both agents write the same keys and shapes and the same numbers (same
weights), and that each one's recurrent-mode log-probabilities equal its step-by-step ones.

    python benchmarks/agent_modules.py
    python benchmarks/agent_modules.py --quick
"""

from __future__ import annotations

import argparse
import copy
import os

import gymnasium as gym
import torch
from _common import (
    at_least,
    format_seconds,
    print_table,
    results_name,
    time_interleaved,
    write_json,
)
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import LSTMModule, ProbabilisticActor, ValueOperator, set_recurrent_mode

from rppo_td import RecurrentPPOLoss
from rppo_td.modules import RecurrentActor, RecurrentActorCritic, RecurrentCritic, RecurrentPolicy

OBS, ACTIONS, HIDDEN, LAYERS = 2, 2, 64, 1
WORKERS, LENGTH = 16, 16
ACTOR_KEYS = ("recurrent_state_h", "recurrent_state_c")
CRITIC_KEYS = ("critic_recurrent_state_h", "critic_recurrent_state_c")


# --------------------------------------------------------------------------------------------
# The two agents
# --------------------------------------------------------------------------------------------
def rppo_td_agent(*, normalize: bool, seed: int = 0) -> tuple[nn.Module, nn.Module, nn.Module]:
    """``(net, RecurrentActor(net), RecurrentCritic(net))`` at the CartPoleNoVel sizes."""
    torch.manual_seed(seed)
    net = RecurrentActorCritic(
        gym.spaces.Box(-1.0, 1.0, (OBS,)),
        gym.spaces.Discrete(ACTIONS),
        recurrence="lstm",
        hidden_size=HIDDEN,
        num_layers=LAYERS,
        head_layers=1,
        normalize_observations=normalize,
    )
    return net, RecurrentActor(net), RecurrentCritic(net)


def _lstm(prefix: str, input_key: str, output_key: str, weights: nn.LSTM) -> LSTMModule:
    module = LSTMModule(
        input_size=HIDDEN,
        hidden_size=HIDDEN,
        num_layers=LAYERS,
        in_keys=[input_key, f"{prefix}recurrent_state_h", f"{prefix}recurrent_state_c"],
        out_keys=[
            output_key,
            ("next", f"{prefix}recurrent_state_h"),
            ("next", f"{prefix}recurrent_state_c"),
        ],
    )
    module.lstm.load_state_dict(weights.state_dict())
    return module


def _copy(module: nn.Module) -> nn.Module:
    return copy.deepcopy(module)


def torchrl_agent(net: RecurrentActorCritic) -> tuple[ProbabilisticActor, TensorDictSequential]:
    """TorchRL's stack with the same layers as ``net`` and its weights (copied, not shared).

    ``net``'s layers: encoder ``Linear(2, 64) + ReLU``, ``LSTM(64, 64)``; policy
    ``Linear(64, 64)`` (``policy_mlp`` with ``head_layers=1``) then ``Linear(64, 2)`` (the
    action head); value ``Linear(64, 64) + ReLU + Linear(64, 1)``.
    """
    a, c = net.actor_trunk, net.critic_trunk
    actor_encoder = _copy(a.encoder.mlp)
    policy = nn.Sequential(_copy(net.policy_mlp), _copy(net.action_head.linear))
    actor = ProbabilisticActor(
        TensorDictSequential(
            TensorDictModule(actor_encoder, ["observation"], ["actor_features"]),
            _lstm("", "actor_features", "actor_embed", a.core),
            TensorDictModule(policy, ["actor_embed"], ["logits"]),
        ),
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )
    critic = TensorDictSequential(
        TensorDictModule(_copy(c.encoder.mlp), ["observation"], ["critic_features"]),
        _lstm("critic_", "critic_features", "critic_embed", c.core),
        ValueOperator(_copy(net.value_head), in_keys=["critic_embed"]),
    )
    return actor, critic


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------
def step_input(workers: int, *, seed: int = 1) -> TensorDict:
    """One collector step ``[W]``: observation, is_init (a quarter True) and both states."""
    g = torch.Generator().manual_seed(seed)
    is_init = torch.zeros(workers, 1, dtype=torch.bool)
    is_init[::4] = True
    data = {"observation": torch.randn(workers, OBS, generator=g), "is_init": is_init}
    for key in (*ACTOR_KEYS, *CRITIC_KEYS):
        data[key] = 0.5 * torch.randn(workers, LAYERS, HIDDEN, generator=g)
    return TensorDict(data, batch_size=[workers])


@torch.no_grad()
def stepped_sequences(actor, critic, batch: int, length: int, *, seed: int = 2) -> TensorDict:
    """``[B, L]`` sequences made by stepping ``actor`` and ``critic`` (step mode) over time.

    Half of the rows start an episode (``is_init`` True at position 0 only, stored states zero,
    as TorchRL's primer stores them after a reset), the others start mid-episode from a random
    state. The state *entering* each position is stored under the state keys
    (``[B, L, 1, H]``). Rows are right-padded: row ``i`` has ``L - (i % 5)`` real steps
    (``loss_mask``); ``advantage`` and ``value_target`` are random ``[B, L, 1]``.
    """
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(batch, length, OBS, generator=g)
    is_init = torch.zeros(batch, length, 1, dtype=torch.bool)
    is_init[::2, 0] = True
    state = {
        key: 0.5 * torch.randn(batch, LAYERS, HIDDEN, generator=g) * (~is_init[:, 0, :, None])
        for key in (*ACTOR_KEYS, *CRITIC_KEYS)
    }
    steps = []
    with set_exploration_type(ExplorationType.RANDOM):
        for t in range(length):
            td = TensorDict(
                {"observation": obs[:, t], "is_init": is_init[:, t], **state}, batch_size=[batch]
            )
            td = critic(actor(td))
            steps.append(td.select("observation", "is_init", "action", "action_log_prob", *state))
            state = {key: td.get(("next", key)) for key in state}
    seq = torch.stack(steps, dim=1)
    real = torch.arange(length) < (length - torch.arange(batch) % 5).unsqueeze(1)
    seq.set("loss_mask", real)
    seq.set("advantage", torch.randn(batch, length, 1, generator=g))
    seq.set("value_target", torch.randn(batch, length, 1, generator=g))
    return seq


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------
def leaf_shapes(td: TensorDictBase) -> dict[str, list[int]]:
    """``{key: shape}`` for every leaf (nested keys joined with ``.``)."""
    return {
        ".".join(k) if isinstance(k, tuple) else k: list(v.shape)
        for k, v in td.items(include_nested=True, leaves_only=True)
    }


@torch.no_grad()
def checks(rppo, trl, batch: int = 8) -> dict[str, object]:
    """Output keys/shapes, agreement of the two agents, and recurrent vs step log-probs."""
    out: dict[str, object] = {}
    step = {}
    for name, (actor, critic) in (("rppo_td", rppo), ("torchrl", trl)):
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            td = TensorDictSequential(actor, critic)(step_input(WORKERS))
        step[name] = td
        out[f"step_outputs_{name}"] = leaf_shapes(td)
    a, b = step["rppo_td"], step["torchrl"]
    out["step_max_abs_diff"] = {
        key: float((a.get(key).float() - b.get(key).float()).abs().max())
        for key in (
            "action",
            "action_log_prob",
            "state_value",
            *(("next", k) for k in (*ACTOR_KEYS, *CRITIC_KEYS)),
        )
    }
    out["step_max_abs_diff"] = {
        ".".join(k) if isinstance(k, tuple) else k: v for k, v in out["step_max_abs_diff"].items()
    }
    # the same [B, L] sequences (stepped with rppo_td's agent) through both, recurrent mode
    seq = stepped_sequences(*rppo, batch, LENGTH)
    recurrent = {}
    for name, (actor, critic) in (("rppo_td", rppo), ("torchrl", trl)):
        with set_recurrent_mode(True):
            log_prob = actor.get_dist(seq.clone(False)).log_prob(seq.get("action"))
            value = critic(seq.clone(False)).get("state_value")
        recurrent[name] = (log_prob, value)
        out[f"recurrent_shapes_{name}"] = {
            "log_prob": list(log_prob.shape),
            "state_value": list(value.shape),
        }
        out[f"recurrent_vs_step_log_prob_max_abs_diff_{name}"] = float(
            (log_prob - seq.get("action_log_prob")).abs().max()
        )
    out["recurrent_rppo_td_vs_torchrl_max_abs_diff"] = {
        "log_prob": float((recurrent["rppo_td"][0] - recurrent["torchrl"][0]).abs().max()),
        "state_value": float((recurrent["rppo_td"][1] - recurrent["torchrl"][1]).abs().max()),
    }
    # the loss on those sequences: same values and gradients
    grads = {}
    for name, (actor, critic) in (("rppo_td", rppo), ("torchrl", trl)):
        loss = make_loss(actor, critic)
        for p in loss.parameters():
            p.grad = None
        with torch.enable_grad():
            losses = loss(seq)
            sum(v for k, v in losses.items() if k.startswith("loss_")).backward()
        grads[name] = (losses, [p.grad for p in loss.parameters() if p.grad is not None])
        out[f"loss_outputs_{name}"] = sorted(losses.keys())
    (la, ga), (lb, gb) = grads["rppo_td"], grads["torchrl"]
    out["loss_rppo_td_vs_torchrl_max_abs_diff"] = max(
        float((la.get(k) - lb.get(k)).abs()) for k in out["loss_outputs_rppo_td"]
    )
    # the parameters are listed in another order: compare each gradient with its equal-shaped
    # counterpart of the closest norm (the sorted norms, and the count)
    norms_a = sorted(float(g.norm()) for g in ga)
    norms_b = sorted(float(g.norm()) for g in gb)
    out["grad_tensors"] = {"rppo_td": len(ga), "torchrl": len(gb)}
    out["grad_norms_rppo_td_vs_torchrl_max_abs_diff"] = max(
        abs(x - y) for x, y in zip(norms_a, norms_b, strict=True)
    )
    # and TorchRL's own: its sequences stepped by its own modules
    seq_trl = stepped_sequences(*trl, batch, LENGTH)
    with set_recurrent_mode(True):
        log_prob = trl[0].get_dist(seq_trl.clone(False)).log_prob(seq_trl.get("action"))
    out["torchrl_own_sequences_recurrent_vs_step_log_prob_max_abs_diff"] = float(
        (log_prob - seq_trl.get("action_log_prob")).abs().max()
    )
    return out


# --------------------------------------------------------------------------------------------
# Candidates
# --------------------------------------------------------------------------------------------
def step_candidate(policy, base: TensorDict, steps: int):
    """``steps`` collection steps, each on a fresh shallow copy of ``base``."""

    def run() -> None:
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            for _ in range(steps):
                policy(base.copy())

    return run


def copy_candidate(base: TensorDict, steps: int):
    """The ``copy`` alone (what every step candidate pays on top of the modules)."""

    def run() -> None:
        for _ in range(steps):
            base.copy()

    return run


def update_candidate(loss: RecurrentPPOLoss, batch: TensorDict):
    """One minibatch: zero the grads, the loss forward, the summed losses' backward."""
    params = [p for p in loss.parameters() if p.requires_grad]

    def run() -> None:
        for p in params:
            p.grad = None
        out = loss(batch)
        total = sum(v for k, v in out.items() if k.startswith("loss_"))
        total.backward()

    return run


def make_loss(actor, critic) -> RecurrentPPOLoss:
    return RecurrentPPOLoss(
        actor,
        critic,
        functional=False,
        loss_critic_type="l2",
        critic_coeff=0.25,
        entropy_coeff=0.0,
    )


def main() -> None:
    """Runs the checks and the timings; prints a table and writes the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repeats, B=32 only")
    parser.add_argument("--threads", type=at_least(1), default=1)
    parser.add_argument(
        "--output",
        type=results_name,
        default=None,
        help="JSON name (default agent_modules, agent_modules_quick)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"load average before: {os.getloadavg()}")

    net, r_actor, r_critic = rppo_td_agent(normalize=False)
    _, rn_actor, rn_critic = rppo_td_agent(normalize=True)
    t_actor, t_critic = torchrl_agent(net)
    agents = {
        "rppo_td": (r_actor, r_critic),
        "torchrl": (t_actor, t_critic),
        "rppo_td+norm": (rn_actor, rn_critic),
    }

    check = checks(agents["rppo_td"], agents["torchrl"])
    print("checks:")
    for key, value in check.items():
        print(f"  {key}: {value}")

    repeats = 5 if args.quick else 30
    steps = 20 if args.quick else 100
    base = step_input(WORKERS)
    step_candidates = {
        name: step_candidate(TensorDictSequential(a, c), base, steps)
        for name, (a, c) in agents.items()
    }
    # what the trainer collects with: both networks of the normalised agent in one module
    step_candidates["rppo_td+norm fused"] = step_candidate(
        RecurrentPolicy(rn_actor.net), base, steps
    )
    step_candidates["copy only"] = copy_candidate(base, steps)
    step_times = time_interleaved(step_candidates, repeats=repeats, warmup=2)
    for t in step_times.values():
        t["median"] /= steps
        t["min"] /= steps

    update_times = {}
    for b in (32,) if args.quick else (32, 256):
        # one batch for all (stepped with rppo_td's agent; same weights, same keys)
        seq = stepped_sequences(r_actor, r_critic, b, LENGTH)
        candidates = {
            name: update_candidate(make_loss(a, c), seq) for name, (a, c) in agents.items()
        }
        reps = repeats if b <= 32 else max(5, repeats // 2)
        update_times[b] = time_interleaved(candidates, repeats=reps, warmup=2)
    print(f"load average after: {os.getloadavg()}")

    names = list(agents)
    headers = ["measurement", *names, "torchrl / rppo_td"]
    rows = [
        [
            f"collection step W={WORKERS} (per step)",
            *(format_seconds(step_times[n]["median"]) for n in names),
            f"{step_times['torchrl']['median'] / step_times['rppo_td']['median']:.2f}",
        ]
    ]
    for b, times in update_times.items():
        rows.append(
            [
                f"update minibatch [{b}, {LENGTH}] fwd+bwd",
                *(format_seconds(times[n]["median"]) for n in names),
                f"{times['torchrl']['median'] / times['rppo_td']['median']:.2f}",
            ]
        )
    fused = step_times["rppo_td+norm fused"]["median"]
    print(
        f"\nRecurrentPolicy (fused actor+critic, normalised): {format_seconds(fused)} per step, "
        f"{step_times['rppo_td+norm']['median'] / fused:.2f}x faster than "
        "TensorDictSequential(RecurrentActor, RecurrentCritic)"
    )
    copy_time = format_seconds(step_times["copy only"]["median"])
    print(f"\n(copy only, included in every step figure: {copy_time})")
    print_table(headers, rows)

    ratios = {"step": step_times["torchrl"]["median"] / step_times["rppo_td"]["median"]}
    ratios.update(
        {
            f"update_B{b}": t["torchrl"]["median"] / t["rppo_td"]["median"]
            for b, t in update_times.items()
        }
    )
    faster = {k: ("rppo_td" if r > 1 else "torchrl") for k, r in ratios.items()}
    verdict = "; ".join(
        f"{k}: {faster[k]} faster by {max(r, 1 / r):.2f}x" for k, r in ratios.items()
    )
    print(f"\nverdict: {verdict}")

    path = write_json(
        args.output or ("agent_modules_quick" if args.quick else "agent_modules"),
        {
            "quick": args.quick,
            "sizes": {
                "observation": OBS,
                "actions": ACTIONS,
                "hidden": HIDDEN,
                "layers": LAYERS,
                "workers": WORKERS,
                "sequence_length": LENGTH,
            },
            "load_average_after": list(os.getloadavg()),
            "checks": check,
            "collection_step_seconds": step_times,
            "update_minibatch_seconds": {str(b): t for b, t in update_times.items()},
            "torchrl_over_rppo_td": ratios,
            "verdict": verdict,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
