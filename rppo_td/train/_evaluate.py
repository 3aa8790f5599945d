"""Deterministic evaluation of an agent, and the ``rppo-eval`` command."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torchrl.envs.utils import ExplorationType, set_exploration_type

from rppo_td.envs import EnvError, make_vector_env
from rppo_td.modules import RecurrentActor, RecurrentActorCritic, observation_to_tensordict
from rppo_td.train._checkpoint import load_checkpoint
from rppo_td.train._cli import ShortErrorParser
from rppo_td.train._config import TrainConfig
from rppo_td.train._setup import build_agent

__all__ = ["MAX_EPISODES", "evaluate_agent", "main"]

log = logging.getLogger(__name__)

# evaluation runs one env per episode, all at once
MAX_EPISODES = 10_000


def evaluate_agent(
    agent: RecurrentActorCritic,
    env_id: str,
    *,
    episodes: int,
    seed: int,
    deterministic: bool = True,
) -> dict[str, Any]:
    """Runs ``episodes`` episodes, one per env of a vector env, with the mode of the policy.

    Args:
        agent: the actor-critic (on CPU).
        env_id: gymnasium id (``module:EnvId`` accepted).
        episodes: number of episodes (envs) ``>= 1``.
        seed: seeds the envs (``seed + i`` for env ``i``).
        deterministic: take the distribution's mode (True) or sample.

    Returns:
        ``eval_return_mean``, ``eval_return_std``, ``eval_episodes``, ``eval_returns`` and
        ``eval_wall_time_s``.
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    start = time.perf_counter()
    env = make_vector_env(env_id, episodes)
    obs, _ = env.reset(seed=seed)
    actor = RecurrentActor(agent)
    td = observation_to_tensordict(obs, agent.leaves, (episodes,))
    td.set("is_init", torch.ones(episodes, 1, dtype=torch.bool))
    returns = np.zeros(episodes)
    running = np.ones(episodes, dtype=bool)
    space = env.single_action_space
    low_high = (space.low, space.high) if isinstance(space, gym.spaces.Box) else None
    was_training = agent.training
    agent.eval()
    kind = ExplorationType.DETERMINISTIC if deterministic else ExplorationType.RANDOM
    with torch.no_grad(), set_exploration_type(kind):
        while running.any():
            actor(td)
            action = td.get("action").numpy()
            if low_high is not None:
                action = np.clip(action, *low_high)
            obs, reward, terminated, truncated, _ = env.step(action)
            returns += np.where(running, reward, 0.0)
            done = terminated | truncated
            running &= ~done
            following = observation_to_tensordict(obs, agent.leaves, (episodes,))
            for key in actor.state_keys:
                following.set(key, td.get(("next", key)))
            following.set("is_init", torch.as_tensor(done).view(-1, 1))
            td = following
    env.close()
    agent.train(was_training)
    return {
        "eval_return_mean": float(returns.mean()),
        "eval_return_std": float(returns.std()),
        "eval_episodes": episodes,
        "eval_returns": returns.tolist(),
        "eval_wall_time_s": time.perf_counter() - start,
    }


def main(argv: list[str] | None = None) -> int:
    """``rppo-eval --checkpoint PATH --episodes N``: prints the evaluation as JSON.

    Reads only ``checkpoint.pt``, with ``torch.load(weights_only=True)``: a crafted file cannot
    run code, and the pickled env copies beside it are never read. A bad checkpoint, setting
    or env is one line on stderr and exit status 2.
    """
    parser = ShortErrorParser(prog="rppo-eval", description=__doc__)
    parser.add_argument("--checkpoint", required=True, help="checkpoint.pt or its run directory")
    parser.add_argument(
        "--episodes", type=int, default=20, help=f"episodes, 1 to {MAX_EPISODES} (default 20)"
    )
    parser.add_argument("--seed", type=int, default=10_000, help="env seed (default 10000)")
    parser.add_argument("--stochastic", action="store_true", help="sample instead of the mode")
    args = parser.parse_args(argv)
    if not 1 <= args.episodes <= MAX_EPISODES:
        parser.error(
            f"--episodes must be in [1, {MAX_EPISODES}] (one env each), got {args.episodes}"
        )
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        data = load_checkpoint(args.checkpoint)
        where = f"the config in the checkpoint {args.checkpoint!r}"
        config = TrainConfig.from_dict(data["config"], where=where)
        torch.set_num_threads(max(1, config.threads))
        agent = build_agent(config)
        try:
            agent.load_state_dict(data["model"])
        except RuntimeError as err:
            raise ValueError(
                f"the model in {args.checkpoint!r} does not fit the agent its config builds "
                f"({str(err).splitlines()[0][:200]})"
            ) from None
        result = evaluate_agent(
            agent,
            config.env,
            episodes=args.episodes,
            seed=args.seed,
            deterministic=not args.stochastic,
        )
    except (ValueError, KeyError, EnvError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        parser.exit(2, f"rppo-eval: error: {message}\n")
    except KeyboardInterrupt:
        parser.exit(130, "rppo-eval: interrupted\n")
    counters = data["counters"]
    result.update(
        env_steps=counters["env_steps"],
        wall_time_s=counters["wall_time_s"],
        fps=counters["env_steps"] / max(counters["wall_time_s"], 1e-9),
    )
    print(json.dumps(result, indent=2))  # noqa: T201 (the command's output)
    return 0
