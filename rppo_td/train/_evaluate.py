"""Deterministic evaluation of an agent, recording its episodes, and the ``rppo-eval`` command.

``rppo-eval --video PATH`` writes the first evaluated episodes to a GIF or an MP4
(docs/watching.md).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type

from rppo_td._signals import terminate_as_interrupt
from rppo_td._validation import first_line, whole_at_least
from rppo_td.envs import EnvError, make_vector_env, resolve_env_id
from rppo_td.modules import RecurrentActor, RecurrentActorCritic, observation_to_tensordict
from rppo_td.train._checkpoint import load_checkpoint
from rppo_td.train._cli import ShortErrorParser, integer_flag
from rppo_td.train._config import TrainConfig
from rppo_td.train._outputs import json_text, print_result
from rppo_td.train._setup import build_agent
from rppo_td.train._video import (
    FPS_RANGES,
    VideoWriter,
    check_video_path,
    default_fps,
    fps_problem,
    headless_rendering,
    make_render_env,
    render_frame,
    whole_if_integral,
)

__all__ = [
    "EVAL_STEP_LIMIT",
    "MAX_EPISODES",
    "episode_step_limit",
    "evaluate_agent",
    "load_agent",
    "main",
    "record_agent",
]

log = logging.getLogger(__name__)

# evaluation runs one env per episode, all at once
MAX_EPISODES = 10_000

#: Steps after which an evaluation episode of an env *without* a time limit (gymnasium's
#: ``max_episode_steps`` None, as ``CliffWalking-v1``) is cut: a deterministic policy that
#: never reaches a terminal state would otherwise never end the evaluation.
EVAL_STEP_LIMIT = 10_000


def episode_step_limit(env_id: str, limit: int | None = None) -> int | None:
    """The steps after which ``evaluate_agent`` and ``record_agent`` cut an episode.

    ``limit`` when given (``>= 1``); else None (no cut) for an env registered with a time
    limit of its own, and ``EVAL_STEP_LIMIT`` for one without.

    Example:
        >>> episode_step_limit("CartPole-v1"), episode_step_limit("CliffWalking-v1")
        (None, 10000)
    """
    if limit is not None:
        return whole_at_least("max_episode_steps", limit, 1)
    if gym.spec(resolve_env_id(env_id)).max_episode_steps is not None:
        return None
    return EVAL_STEP_LIMIT


def _warn_cut(
    env_id: str, cut: int, episodes: int, limit: int, given: bool, kind: str = "evaluation"
) -> None:
    log.warning(
        "env %r: %d of %d %s episodes did not end within %d steps and were cut there "
        "(their returns are those of the steps played)%s",
        env_id,
        cut,
        episodes,
        kind,
        limit,
        "" if given else "; the env has no time limit of its own",
    )


class _Policy:
    """The agent's actor as evaluation runs it, on a batch of ``n`` envs.

    The mode of the action distribution (or a sample), the recurrent state carried from step
    to step and started afresh (``is_init``) where an episode begins, actions clipped into a
    ``Box`` action space. ``evaluate_agent`` and ``record_agent`` both step envs through it, so a
    video shows the policy that was evaluated.
    """

    def __init__(self, agent: RecurrentActorCritic, action_space: gym.Space, n: int) -> None:
        self.agent = agent
        self.actor = RecurrentActor(agent)
        self.n = n
        self.low_high = None
        if isinstance(action_space, gym.spaces.Box):
            self.low_high = (action_space.low, action_space.high)
        self.td = TensorDict(batch_size=(n,))

    def start(self, obs: Any) -> None:
        """Every env begins an episode with the (batched) observation ``obs``."""
        self.td = observation_to_tensordict(obs, self.agent.leaves, (self.n,))
        self.td.set("is_init", torch.ones(self.n, 1, dtype=torch.bool))

    def act(self) -> np.ndarray:
        """The actions ``[n, ...]`` for the current observations."""
        self.actor(self.td)
        action = self.td.get("action").numpy()
        if self.low_high is not None:
            action = np.clip(action, *self.low_high)
        return action

    def advance(self, obs: Any, done: np.ndarray) -> None:
        """Moves to the next observations; ``done`` ``[n]`` bool starts a new episode there."""
        following = observation_to_tensordict(obs, self.agent.leaves, (self.n,))
        for key in self.actor.state_keys:
            following.set(key, self.td.get(("next", key)))
        following.set("is_init", torch.as_tensor(done).view(-1, 1))
        self.td = following


@contextmanager
def _acting(agent: RecurrentActorCritic, deterministic: bool) -> Iterator[None]:
    """No gradients, eval mode, the mode (or samples) of the policy; restores the mode."""
    was_training = agent.training
    agent.eval()
    kind = ExplorationType.DETERMINISTIC if deterministic else ExplorationType.RANDOM
    try:
        with torch.no_grad(), set_exploration_type(kind):
            yield
    finally:
        agent.train(was_training)


def evaluate_agent(
    agent: RecurrentActorCritic,
    env_id: str,
    *,
    episodes: int,
    seed: int | None,
    deterministic: bool = True,
    max_episode_steps: int | None = None,
) -> dict[str, Any]:
    """Runs ``episodes`` episodes, one per env of a vector env, with the mode of the policy.

    Args:
        agent: the actor-critic (on CPU).
        env_id: gymnasium id (``module:EnvId`` accepted).
        episodes: number of episodes (envs), an int ``>= 1`` (numpy's integers too).
        seed: an int ``>= 0``, which seeds the envs (``seed + i`` for env ``i``), or None:
            unseeded envs, other episodes at each call.
        deterministic: take the distribution's mode (True) or sample (False; the samples
            come from torch's global generator: seed it for repeatable ones).
        max_episode_steps: cut episodes still running after this many steps (a warning
            says how many); None: ``episode_step_limit``'s default (no cut for an env with a
            time limit of its own, ``EVAL_STEP_LIMIT`` steps for one without).

    Returns:
        ``eval_return_mean``, ``eval_return_std``, ``eval_episodes``, ``eval_returns``,
        ``eval_cut_episodes`` (how many were cut) and ``eval_wall_time_s``.

    Raises:
        ValueError: ``episodes``, ``seed`` or ``max_episode_steps`` not a whole number in
            range, or ``deterministic`` not a bool (each named with its value).
    """
    episodes = whole_at_least("episodes", episodes, 1)
    seed = None if seed is None else whole_at_least("seed", seed, 0)
    if not isinstance(deterministic, bool | np.bool_):
        raise ValueError(f"deterministic must be True or False, got {deterministic!r}")
    deterministic = bool(deterministic)
    limit = episode_step_limit(env_id, max_episode_steps)
    start = time.perf_counter()
    env = make_vector_env(env_id, episodes)
    try:
        obs, _ = env.reset(seed=seed)
        policy = _Policy(agent, env.single_action_space, episodes)
        policy.start(obs)
        returns = np.zeros(episodes)
        running = np.ones(episodes, dtype=bool)
        steps, cut = 0, 0
        with _acting(agent, deterministic):
            while running.any():
                if steps == limit:
                    cut = int(running.sum())
                    _warn_cut(env_id, cut, episodes, limit, max_episode_steps is not None)
                    break
                obs, reward, terminated, truncated, _ = env.step(policy.act())
                steps += 1
                returns += np.where(running, reward, 0.0)
                done = terminated | truncated
                running &= ~done
                policy.advance(obs, done)
    finally:
        env.close()
    return {
        "eval_return_mean": float(returns.mean()),
        "eval_return_std": float(returns.std()),
        "eval_episodes": episodes,
        "eval_returns": returns.tolist(),
        "eval_cut_episodes": cut,
        "eval_wall_time_s": time.perf_counter() - start,
    }


def load_agent(
    path: str | Path, *, image_layout: str | None = None
) -> tuple[RecurrentActorCritic, TrainConfig, dict[str, Any]]:
    """The trained agent of a checkpoint, its config and the checkpoint's content.

    Reads ``checkpoint.pt`` with ``load_checkpoint`` (no code runs from the file), builds the
    agent its config describes (``build_agent``) and loads the weights; torch's settings
    (its thread count included: ``rppo-eval`` sets the run's ``threads``) are left as they
    are. The agent acts with ``evaluate_agent``, ``record_agent`` or, as a TorchRL actor,
    ``rppo_td.modules.RecurrentActor(agent)``, under ``torch.no_grad()`` (its parameters
    require grad, so acting outside it records a graph that the carried state extends at
    every step).

    Args:
        path: ``checkpoint.pt`` or the run directory holding it.
        image_layout: ``"channels_first"`` or ``"channels_last"`` in place of the config's
            ``image_layout``, for a checkpoint saved with ``auto`` whose image shape reads
            either way; one contradicting a saved explicit layout is refused.

    Returns:
        ``(agent, config, data)``: the agent in eval mode on the CPU, the run's ``TrainConfig``,
        and the checkpoint's dict (``"counters"``: ``env_steps``, ``wall_time_s``, ...).

    Raises:
        CheckpointError: no readable checkpoint at ``path`` (a ``ValueError``).
        ValueError: a config the checkpoint's version cannot read, a contradicting
            ``image_layout``, or weights that do not fit the agent the config builds.
    """
    data = load_checkpoint(path)
    where = f"the config in the checkpoint {str(path)!r}"
    config = TrainConfig.from_dict(data["config"], where=where)
    if image_layout is not None:
        saved = config.image_layout
        if saved != "auto" and saved != image_layout:
            raise ValueError(
                f"image_layout={image_layout!r} (rppo-eval's --image-layout) contradicts "
                f"the checkpoint: its model was trained with image_layout {saved!r} (leave "
                "it out; it is for checkpoints saved with image_layout 'auto')"
            )
        config = config.replace(image_layout=image_layout)
    agent = build_agent(config)
    if image_layout is not None and not agent.image_keys:
        # the layout reads uint8 images only: on another run it would be ignored silently
        raise ValueError(
            f"image_layout={image_layout!r} (rppo-eval's --image-layout) is for a run with "
            f"uint8 image observations; the run in {str(path)!r} ({config.env!r}) has none "
            f"(observations {agent.observation_keys}): leave it out"
        )
    try:
        agent.load_state_dict(data["model"])
    except RuntimeError as err:
        raise ValueError(
            f"the model in {str(path)!r} does not fit the agent its config builds "
            f"({first_line(err, limit=400)})"
        ) from None
    agent.eval()
    return agent, config, data


def _batch_of_one(obs: Any) -> Any:
    """A single env's observation as a batch of one (dicts and tuples leaf by leaf)."""
    if isinstance(obs, dict):
        return {key: _batch_of_one(value) for key, value in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_batch_of_one(value) for value in obs)
    return np.asarray(obs)[None]


def record_agent(
    agent: RecurrentActorCritic,
    env: gym.Env,
    writer: VideoWriter,
    *,
    env_id: str,
    episodes: int,
    seed: int,
    deterministic: bool = True,
    max_episode_steps: int | None = None,
) -> tuple[list[float], list[int]]:
    """Plays ``episodes`` episodes in one rendering env and writes their frames.

    Episode ``i`` is seeded ``seed + i``, as env ``i`` of ``evaluate_agent``, and played by the
    same policy (``_Policy``): deterministic, it is the episode that ``evaluate_agent`` scored.
    An episode of ``n`` steps writes ``n + 1`` frames, after the reset and after each step
    (the last shows the terminal or truncated state).

    Args:
        agent: the actor-critic (on CPU).
        env: from ``make_render_env``.
        writer: receives the frames; the caller closes it.
        env_id: the env's id, for messages.
        episodes: ``>= 1``.
        seed: the first episode's seed.
        deterministic: the mode of the policy (True) or samples.
        max_episode_steps: as ``evaluate_agent``'s: an episode is cut after this many steps.

    Returns:
        The episodes' returns and their lengths (steps); ``sum(length + 1)`` frames are written.
    """
    limit = episode_step_limit(env_id, max_episode_steps)
    cut = 0
    policy = _Policy(agent, env.action_space, 1)
    shape = None
    returns: list[float] = []
    lengths: list[int] = []
    with _acting(agent, deterministic):
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            policy.start(_batch_of_one(obs))
            frame = render_frame(env, env_id, shape)
            shape = frame.shape
            total, steps, done = 0.0, 0, False
            while not done:
                obs, reward, terminated, truncated, _ = env.step(policy.act()[0])
                total += float(reward)
                steps += 1
                done = bool(terminated or truncated)
                writer.add(frame)
                frame = render_frame(env, env_id, shape)
                if not done and steps == limit:
                    cut += 1
                    break
                policy.advance(_batch_of_one(obs), np.array([done]))
            writer.add(frame, last=True)
            returns.append(total)
            lengths.append(steps)
    if cut and limit is not None:
        _warn_cut(env_id, cut, episodes, limit, max_episode_steps is not None, "recorded")
    return returns, lengths


def _evaluate_and_record(
    agent: RecurrentActorCritic,
    env_id: str,
    args: argparse.Namespace,
    path: Path,
    episodes: int,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``evaluate_agent``, then ``record_agent`` of its first ``episodes`` into ``path``.

    A render env is built and drawn once first, so an env that cannot give frames is refused
    before the evaluation runs; it is closed before the evaluation and a fresh one records,
    since closing a pygame env may end pygame for every env of the process (memory-gym's
    ``close`` calls ``pygame.quit()``). Returns the evaluation and the ``video_*`` entries.
    """
    probe = make_render_env(env_id)
    try:
        probe.reset(seed=args.seed)
        render_frame(probe, env_id)
        fps = default_fps(probe, path.suffix.lower()) if args.fps is None else args.fps
    finally:
        probe.close()
    result = evaluate_agent(
        agent,
        env_id,
        episodes=args.episodes,
        seed=args.seed,
        deterministic=not args.stochastic,
        max_episode_steps=args.max_episode_steps,
    )
    env = make_render_env(env_id)
    try:
        writer = VideoWriter(path, fps=fps)
        try:
            returns, lengths = record_agent(
                agent,
                env,
                writer,
                env_id=env_id,
                episodes=episodes,
                seed=args.seed,
                deterministic=not args.stochastic,
                max_episode_steps=args.max_episode_steps,
            )
            writer.close()
        except BaseException:
            writer.discard()
            raise
    finally:
        env.close()
    log.info(
        "wrote %s: %d episode%s, %d frames at %g fps",
        path,
        episodes,
        "" if episodes == 1 else "s",
        writer.frames,
        fps,
    )
    video = {
        "video": str(path),
        "video_episodes": episodes,
        "video_frames": writer.frames,
        "video_fps": fps,
        "video_returns": returns,
        "video_lengths": lengths,
    }
    return result, video


def main(argv: list[str] | None = None) -> int:
    """``rppo-eval --checkpoint PATH --episodes N``: prints the evaluation as JSON.

    Reads only ``checkpoint.pt``, with ``torch.load(weights_only=True)``: a crafted file cannot
    run code, and the pickled env copies beside it are never read. A bad checkpoint, setting
    or env is one line on stderr and exit status 2.

    ``--video PATH`` also records the first ``--video-episodes`` evaluated episodes (the same
    seeds and policy) in one rendering env, to a GIF or an MP4 chosen by PATH's suffix.

    Refusals end as argparse's do, with ``SystemExit(2)`` (also when called from Python).
    """
    parser = ShortErrorParser(prog="rppo-eval", description=__doc__)
    parser.add_argument("--checkpoint", required=True, help="checkpoint.pt or its run directory")
    parser.add_argument(
        "--episodes",
        type=integer_flag,
        default=20,
        help=f"episodes, 1 to {MAX_EPISODES} (default 20)",
    )
    parser.add_argument(
        "--seed",
        type=integer_flag,
        default=10_000,
        help="env seed, and with --stochastic the action sampler's (default 10000; at most "
        "2**64 - --episodes)",
    )
    parser.add_argument("--stochastic", action="store_true", help="sample instead of the mode")
    parser.add_argument(
        "--max-episode-steps",
        type=integer_flag,
        metavar="N",
        help="cut an episode still running after N steps, with a warning (default: none for "
        "an env with a time limit of its own, else "
        f"{EVAL_STEP_LIMIT}); the JSON's eval_cut_episodes counts them",
    )
    parser.add_argument(
        "--video",
        metavar="PATH",
        help="also record episodes to PATH, a .gif (Pillow) or an .mp4 (needs imageio-ffmpeg: "
        "pip install 'rppo_td[video]'), in a separate env with render_mode='rgb_array'; "
        "missing directories are created and an existing file is overwritten. An episode of "
        "n steps is n + 1 frames (after the reset and each step); a GIF holds each episode's "
        "last frame for 1 s",
    )
    parser.add_argument(
        "--video-episodes",
        type=integer_flag,
        metavar="N",
        help="record the first N evaluated episodes (seeds SEED to SEED+N-1; played again by "
        "the same policy: the same episodes, or with --stochastic new samples) (default 1)",
    )
    parser.add_argument(
        "--fps",
        type=float,
        help="frames per second of the video, fractional or not, in "
        + " or ".join(
            f"[{low:g}, {high:g}] for a {kind}" for kind, (low, high) in FPS_RANGES.items()
        )
        + " (default: the env's render_fps brought into that range, else 30)",
    )
    parser.add_argument(
        "--image-layout",
        choices=("channels_first", "channels_last"),
        help="channel axis of uint8 image observations, in place of the checkpoint's "
        "image_layout: for a checkpoint of an image shape that reads either way, such as "
        "[3, 4, 4], saved before the setting existed (it was then read as channels-last)",
    )
    parser.add_argument(
        "--threads",
        type=integer_flag,
        help="torch CPU threads, 0 to 4096 (0 keeps torch's default; default: the run's --threads)",
    )
    args = parser.parse_args(argv)
    if args.threads is not None and not 0 <= args.threads <= 4096:
        parser.error(f"--threads must be in [0, 4096], got {args.threads}")
    if not args.checkpoint.strip():
        parser.error(
            f"--checkpoint must name a run directory or its checkpoint.pt, got {args.checkpoint!r}"
        )
    if not 1 <= args.episodes <= MAX_EPISODES:
        parser.error(
            f"--episodes must be in [1, {MAX_EPISODES}] (one env each), got {args.episodes}"
        )
    if not 0 <= args.seed <= 2**64 - args.episodes:  # episode i's env takes seed + i
        parser.error(
            f"--seed must be in [0, 2**64 - --episodes] = [0, {2**64 - args.episodes}], got "
            f"{args.seed}"
        )
    if args.max_episode_steps is not None and args.max_episode_steps < 1:
        parser.error(f"--max-episode-steps must be >= 1, got {args.max_episode_steps}")
    if args.video is None:
        for flag, value in (("--video-episodes", args.video_episodes), ("--fps", args.fps)):
            if value is not None:
                parser.error(f"{flag} needs --video PATH")
    video_episodes = 1 if args.video_episodes is None else args.video_episodes
    if not 1 <= video_episodes <= args.episodes:
        parser.error(
            f"--video-episodes must be in [1, --episodes = {args.episodes}] (it records "
            f"evaluated episodes), got {video_episodes}"
        )
    if args.fps is not None:
        suffix = Path(args.video).suffix.lower()  # an unknown one is refused below, by name
        problem = fps_problem(args.fps, suffix) if suffix in FPS_RANGES else None
        if problem is not None:
            parser.error(f"--fps {problem}")
        args.fps = whole_if_integral(args.fps)  # --fps 10 is reported as 10, not 10.0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    video: dict[str, Any] = {}
    try:
        with terminate_as_interrupt():  # SIGTERM: as a Ctrl-C
            path = check_video_path(args.video) if args.video is not None else None
            # --stochastic: the same actions for the same seed (seeded before the agent is built,
            # whose initialisation draws from the same generator, as rppo-eval always did)
            torch.manual_seed(args.seed)
            agent, config, data = load_agent(args.checkpoint, image_layout=args.image_layout)
            threads = config.threads if args.threads is None else args.threads
            if threads:  # 0: torch's default, as rppo-train's --threads 0
                torch.set_num_threads(threads)
            if path is None:
                result = evaluate_agent(
                    agent,
                    config.env,
                    episodes=args.episodes,
                    seed=args.seed,
                    deterministic=not args.stochastic,
                    max_episode_steps=args.max_episode_steps,
                )
            else:
                with headless_rendering():
                    result, video = _evaluate_and_record(
                        agent, config.env, args, path, video_episodes
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
        **video,
    )
    print_result(json_text(result))
    return 0
