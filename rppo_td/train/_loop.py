"""The training loop: collect, update, log, checkpoint, evaluate."""

from __future__ import annotations

import collections
import logging
import math
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from rppo_td.envs import make_vector_env
from rppo_td.evaluate import evaluate_agent
from rppo_td.train._checkpoint import (
    CHECKPOINT_NAME,
    check_resumable,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from rppo_td.train._config import TrainConfig
from rppo_td.train._outputs import MetricsLog, plot_learning_curve, write_json_atomic
from rppo_td.train._ppo import PPOSettings, PPOUpdate
from rppo_td.train._setup import build_agent, seed_everything
from rppo_td.train._vector_collector import VectorCollector

__all__ = ["Trainer", "train"]

log = logging.getLogger(__name__)


class _StopFlag:
    """Turns SIGINT/SIGTERM into a flag checked between updates (a second Ctrl-C aborts)."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopFlag:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        log.warning("signal %d: stopping after this update and saving a checkpoint", signum)

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class Trainer:
    """One run of recurrent PPO, fresh or resumed, writing everything to its output directory.

    Args:
        config: the settings; with ``config.resume`` set, the checkpoint there is loaded and
            ``given`` (the explicitly requested settings) is checked against it.
        given: settings given explicitly (CLI flags, preset, config file); default: none.
    """

    def __init__(self, config: TrainConfig, *, given: dict[str, Any] | None = None) -> None:
        checkpoint = None
        if config.resume:
            checkpoint = load_checkpoint(config.resume)
            saved = TrainConfig.from_dict(checkpoint["config"], where="checkpoint config")
            given = {**(given or {}), "resume": config.resume}
            if "output" not in given:
                given["output"] = str(Path(config.resume))
            config = check_resumable(saved, given)
        self.config = config
        self.device = _check_device(config.device)
        self.directory = config.output_dir()
        self.directory.mkdir(parents=True, exist_ok=True)
        if config.threads:
            torch.set_num_threads(config.threads)
        self.generator = seed_everything(config.seed)
        self.agent = build_agent(config).to(self.device)
        self.optimizer = torch.optim.Adam(
            self.agent.parameters(), lr=config.learning_rate, eps=1e-5, foreach=True
        )
        self.collector = self._make_collector()
        self.ppo = PPOUpdate(
            self.agent,
            self.optimizer,
            generator=self.generator,
            settings=PPOSettings(
                gamma=config.gamma,
                gae_lambda=config.gae_lambda,
                sequence_length=config.sequence_length,
                epochs=config.epochs,
                num_minibatches=config.num_minibatches,
                value_coef=config.value_coef,
                entropy_coef=config.entropy_coef,
                max_grad_norm=config.max_grad_norm,
                normalize_advantage=config.normalize_advantage,
                advantage_eps=config.advantage_eps,
            ),
        )
        self.counters: dict[str, Any] = {
            "update": 0,
            "env_steps": 0,
            "wall_time_s": 0.0,
            "episodes": 0,
        }
        self.recent: collections.deque = collections.deque(maxlen=20)
        self.recent_lengths: collections.deque = collections.deque(maxlen=20)
        if checkpoint is not None:
            self._restore(checkpoint)

    def _make_collector(self):
        c = self.config
        if c.collector == "torchrl":
            from rppo_td.train._torchrl_collector import TorchRLCollector

            return TorchRLCollector(
                c.env,
                self.agent,
                num_envs=c.num_workers,
                rollout_steps=c.rollout_steps,
                seed=c.seed,
                device=self.device,
            )
        env = make_vector_env(c.env, c.num_workers)
        return VectorCollector(
            env, self.agent, rollout_steps=c.rollout_steps, seed=c.seed, device=self.device
        )

    def _restore(self, checkpoint: dict[str, Any]) -> None:
        try:
            self.agent.load_state_dict(checkpoint["model"])
        except RuntimeError as err:
            raise ValueError(f"checkpoint model does not fit this agent: {err}") from err
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.collector.load_state_dict(checkpoint["collector"])
        set_rng_state(checkpoint["rng"], self.generator)
        self.counters = dict(checkpoint["counters"])
        self.recent.extend(checkpoint.get("recent_returns", []))
        self.recent_lengths.extend(checkpoint.get("recent_lengths", []))
        log.info(
            "resumed %s at update %d (%d env steps)",
            self.directory,
            self.counters["update"],
            self.counters["env_steps"],
        )

    def save(self) -> Path:
        """Writes ``checkpoint.pt`` atomically (model, optimizer, RNG, config, counters)."""
        path = self.directory / CHECKPOINT_NAME
        save_checkpoint(
            path,
            {
                "config": self.config.to_dict(),
                "model": self.agent.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "collector": self.collector.state_dict(),
                "rng": rng_state(self.generator),
                "counters": dict(self.counters),
                "recent_returns": list(self.recent),
                "recent_lengths": list(self.recent_lengths),
            },
        )
        return path

    def _schedule(self, update: int) -> tuple[float, float]:
        c = self.config
        remaining = 1.0 - update / c.num_updates
        lr = c.learning_rate * (remaining if c.anneal_lr else 1.0)
        clip = c.clip_epsilon * (remaining if c.anneal_clip else 1.0)
        return lr, max(clip, 1e-3)

    def _one_update(self) -> dict[str, Any]:
        update = self.counters["update"]
        lr, clip = self._schedule(update)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        start = time.perf_counter()
        rollout = self.collector.rollout().to(self.device)
        stats = self.ppo(rollout, clip_epsilon=clip)
        frozen = 0 < self.config.normalizer_steps <= self.counters["env_steps"]
        if self.agent.normalizer is not None and not frozen:
            self.agent.normalizer.update(rollout.select(*[k for k, _ in self.agent.leaves]))
        elapsed = time.perf_counter() - start
        returns, lengths = self.collector.stats.pop()
        self.recent.extend(returns)
        self.recent_lengths.extend(lengths)
        steps = self.config.steps_per_update
        self.counters["update"] = update + 1
        self.counters["env_steps"] += steps
        self.counters["wall_time_s"] += elapsed
        self.counters["episodes"] += len(returns)
        return {
            "update": update + 1,
            "env_steps": self.counters["env_steps"],
            "wall_time_s": round(self.counters["wall_time_s"], 4),
            "fps": steps / elapsed,
            "episode_return_mean": float(np.mean(self.recent)) if self.recent else math.nan,
            "episode_length_mean": (
                float(np.mean(self.recent_lengths)) if self.recent_lengths else math.nan
            ),
            "episodes": self.counters["episodes"],
            "learning_rate": lr,
            "clip_epsilon": clip,
            **stats,
        }

    def run(self, *, stop_after_updates: int | None = None) -> dict[str, Any] | None:
        """Trains to ``total_steps``; returns the summary, or None if stopped early.

        Args:
            stop_after_updates: stop (as on SIGTERM) once this many updates are done; for
                tests of ``--resume``.
        """
        c = self.config
        metrics = MetricsLog(self.directory)
        bar = tqdm(
            total=c.num_updates * c.steps_per_update,
            initial=self.counters["env_steps"],
            unit="step",
            disable=not c.progress,
            dynamic_ncols=True,
        )
        stopped = False
        try:
            with _StopFlag() as stop:
                while self.counters["update"] < c.num_updates:
                    row = self._one_update()
                    metrics.write(row)
                    bar.update(c.steps_per_update)
                    bar.set_postfix(
                        fps=f"{row['fps']:.0f}", ret=f"{row['episode_return_mean']:.1f}"
                    )
                    done = self.counters["update"]
                    if stop.requested or done == stop_after_updates:
                        stopped = True
                        break
                    if done % c.checkpoint_every == 0:
                        self.save()
        finally:
            bar.close()
            metrics.close()
            self.save()
            plot_learning_curve(self.directory, title=f"{c.env} ({c.recurrence})")
        if stopped:
            log.info(
                "stopped at update %d; continue with --resume %s",
                self.counters["update"],
                self.directory,
            )
            return None
        return self.finish()

    def finish(self) -> dict[str, Any]:
        """Deterministic evaluation; writes and returns ``summary.json``'s content."""
        c = self.config
        evaluation = (
            evaluate_agent(
                self.agent.cpu(), c.env, episodes=max(c.eval_episodes, 1), seed=c.seed + 10_000
            )
            if c.eval_episodes
            else {}
        )
        self.agent.to(self.device)
        wall = self.counters["wall_time_s"]
        summary = {
            "eval_return_mean": evaluation.get("eval_return_mean", math.nan),
            "eval_return_std": evaluation.get("eval_return_std", math.nan),
            "eval_episodes": c.eval_episodes,
            "env_steps": self.counters["env_steps"],
            "wall_time_s": wall,
            "fps": self.counters["env_steps"] / max(wall, 1e-9),
            "updates": self.counters["update"],
            "eval_returns": evaluation.get("eval_returns", []),
            "eval_wall_time_s": evaluation.get("eval_wall_time_s", 0.0),
            "config": c.to_dict(),
        }
        write_json_atomic(self.directory / "summary.json", summary)
        return summary


def _check_device(name: str) -> torch.device:
    """``torch.device(name)``, refusing one this machine does not have with a clear message."""
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ValueError(f"device {name!r} is not a torch device ({err})") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available here")
    return device


def train(config: TrainConfig, *, given: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Runs ``Trainer(config, given=given).run()``."""
    return Trainer(config, given=given).run()
