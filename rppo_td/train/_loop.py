"""The training loop: collect, update, log, checkpoint, evaluate."""

from __future__ import annotations

import collections
import contextlib
import csv
import dataclasses
import json
import logging
import math
import numbers
import pickle
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from rppo_td._signals import interrupts_kept
from rppo_td._validation import first_line
from rppo_td.envs import make_vector_env
from rppo_td.modules import RecurrentActor, RecurrentActorCritic, RecurrentCritic, RecurrentPolicy
from rppo_td.train._checkpoint import (
    CheckpointError,
    check_resumable,
    checkpoint_file,
    load_checkpoint,
    load_env_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from rppo_td.train._config import CLIP_FLOOR, RUNTIME_FIELDS, TrainConfig
from rppo_td.train._distributed import (
    Ranks,
    RanksRefused,
    any_rank,
    broadcast_module,
    gather_episodes,
    gather_ranks,
    leave_group,
    parameters_in_sync,
    settings_differences,
    share_from_main,
    start_group,
    wait_for_ranks,
)
from rppo_td.train._evaluate import evaluate_agent
from rppo_td.train._outputs import (
    MetricsLog,
    fcntl_available,
    lock_run_directory,
    path_exists,
    plot_learning_curve,
    prepare_run_directory,
    read_metrics,
    time_split,
    write_json_atomic,
)
from rppo_td.train._ppo import PPOSettings, PPOUpdate
from rppo_td.train._setup import build_agent, env_spaces, seed_everything
from rppo_td.train._vector_collector import VectorCollector
from rppo_td.transforms import EpisodicNoveltyBonus

__all__ = ["Trainer", "train"]

log = logging.getLogger(__name__)


class _StopFlag:
    """Turns SIGINT/SIGTERM into a flag checked between updates.

    A second SIGINT aborts the update in progress (``KeyboardInterrupt``) without saving, so
    the last checkpoint, written between updates, stays the consistent one; while a checkpoint
    is being written the abort waits until it is complete.
    """

    def __init__(self) -> None:
        self.requested = False
        self.saving = False
        self._abort_after_save = False
        self._previous: dict[int, Any] = {}
        self._kept = contextlib.ExitStack()

    def __enter__(self) -> _StopFlag:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
            # the second Ctrl-C's abort is not dropped where it lands in a __del__
            self._kept.enter_context(interrupts_kept())
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested and signum == signal.SIGINT:
            if self.saving:
                self._abort_after_save = True
                return
            raise KeyboardInterrupt
        self.requested = True
        log.warning(
            "signal %d: stopping after this update and saving a checkpoint (Ctrl-C again "
            "aborts the update; the last checkpoint is kept)",
            signum,
        )

    def saved(self) -> None:
        """Ends a save; raises the abort a second SIGINT asked for during it."""
        self.saving = False
        if self._abort_after_save:
            raise KeyboardInterrupt

    def release(self) -> None:
        """Gives SIGINT/SIGTERM back to their earlier handlers (again: nothing)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        self._kept.close()

    def __exit__(self, *exc: Any) -> None:
        self.release()


class Trainer:
    """One run of recurrent PPO, fresh or resumed, writing everything to its output directory.

    A run owns its process's random state, as a script's ``main`` would: it seeds torch's,
    numpy's and ``random``'s global generators from ``config.seed`` (a resume restores the
    checkpoint's), and ``threads`` (default 1) sets torch's thread count, which stays so
    after the run; save and restore them around it where the caller's own streams matter.
    Logging is the caller's (``rppo-train`` configures it from ``log_level``). Signal
    handlers are installed while it trains and restored after.

    Args:
        config: the settings; with ``config.resume`` set, the checkpoint there is loaded and
            ``given`` (the explicitly requested settings) is checked against it.
        given: settings given explicitly (CLI flags, preset, config file). None (the
            default): none for a fresh run; for a resumed one, the settings that differ from
            their defaults (``TrainConfig.non_default_settings``), so that a resume from
            Python refuses settings that would change the experiment and applies those that
            may change (threads, device, ...), as the CLI does with its flags.

    Example:
        >>> import tempfile
        >>> config = TrainConfig(total_steps=128, num_workers=2, rollout_steps=32,
        ...                      eval_episodes=1, progress=False, log_level="WARNING",
        ...                      output=tempfile.mkdtemp())
        >>> summary = Trainer(config).run()
        >>> summary["env_steps"], sorted(p.name for p in config.output_dir().glob("*.pt"))
        (128, ['checkpoint.pt'])
    """

    def __init__(self, config: TrainConfig, *, given: dict[str, Any] | None = None) -> None:
        self._lock = None
        self.summary_written = False
        # the update whose checkpoint is on disk (0: none), for the last line of a failed run
        self.saved_update = 0
        self._ran = False
        if not isinstance(config, TrainConfig):
            raise TypeError(
                f"Trainer needs a TrainConfig, got {type(config).__name__} (for a dict: "
                "TrainConfig.from_dict(...))"
            )
        config.validate()  # again: fields set after it was built were never checked
        if given:  # each by name and bounds: an unknown name ended in an AttributeError
            TrainConfig.check_each(given, where="given")
        if given is None and config.resume:
            # from Python every setting that is not the default was asked for: a resume
            # compares them with the checkpoint (and applies those that may change) as it
            # does the CLI's flags; before, all of them were dropped without a word
            given = config.non_default_settings()
        # under torchrun: this process's rank; rank 0 alone owns the output directory
        self.ranks = Ranks.from_environment()
        checkpoint = None
        if config.resume:
            run_directory = checkpoint_file(config.resume).parent
            # lock first: a run still writing there must not be read halfway
            if run_directory.is_dir() and self.ranks.main:
                self._lock = lock_run_directory(run_directory)
            try:
                checkpoint, config = _resumed_config(config, given, run_directory)
            except ValueError as err:
                self.release()
                if not self.ranks.main:  # each rank reads its own copy (another node's disk)
                    raise ValueError(f"{self.ranks.where}: {err}") from err
                raise
            except BaseException:
                self.release()
                raise
        self.config = config
        if self.ranks.main and checkpoint is None:
            for line in config.unused_settings():  # accepted, but the user expects an effect
                log.warning("%s", line)
        created = None
        try:
            self.device = start_group(self.ranks, _check_device(config.device))
            # where each rank starts: a rank resumed beside one started afresh trained its
            # own schedule into the others' gradients, then hung at the end
            start = None if checkpoint is None else int(checkpoint["counters"]["update"])
            differ = settings_differences(
                {**config.to_dict(), "resumed_from_update": start}, self.ranks
            )
            if differ is not None:  # every rank refuses, before anything is written
                raise RanksRefused(
                    f"the ranks were started with different settings: {differ}; start every "
                    "rank with the same settings (flags, preset and config file; --resume of "
                    "the same run on every rank or on none: resumed_from_update None is a "
                    "fresh run)"
                )
            self.directory = config.output_dir()
            created = None if path_exists(self.directory) else self.directory
            refused: Exception | None = None
            if self.ranks.main:
                try:
                    lock = prepare_run_directory(
                        self.directory,
                        resuming=checkpoint is not None,
                        overwrite=config.overwrite,
                        keep=None
                        if checkpoint is None
                        else (checkpoint.get("env_state") or {}).get("file"),
                        lock=self._lock is None,
                    )
                    self._lock = self._lock or lock
                except Exception as err:  # raised again below, and told to every rank
                    refused = err
            # rank 0 alone prepares the directory: the others learn of a refusal, and why,
            # before the first collective, which would otherwise break off in a gloo
            # traceback (each rank says why: torchrun may stop rank 0 before it has)
            reason = share_from_main(None if refused is None else str(refused), self.ranks)
            if reason is not None and refused is None:
                raise RanksRefused(f"rank {self.ranks.rank}: {reason}")
            if isinstance(refused, ValueError) and self.ranks.distributed:
                raise RanksRefused(str(refused)) from refused
            if refused is not None:
                raise refused
            self._build(config, checkpoint)
        except BaseException:
            self.release()
            if created is not None and self.ranks.main:
                # a run that failed to start leaves no empty directory behind
                with contextlib.suppress(OSError):
                    created.rmdir()  # only if still empty
            raise

    def _build(self, config: TrainConfig, checkpoint: dict[str, Any] | None) -> None:
        if config.threads:
            torch.set_num_threads(config.threads)
        self.generator = seed_everything(config.seed)
        try:
            self.agent = build_agent(config).to(self.device)
        except (RuntimeError, MemoryError) as err:
            if "alloc" not in str(err) and not isinstance(err, MemoryError):
                raise
            observation_space, action_space = env_spaces(config.env)
            raise ValueError(
                f"the agent (hidden_size={config.hidden_size}, num_layers={config.num_layers}) "
                f"for observation space {_brief(observation_space)} and action space "
                f"{_brief(action_space)} does not fit in memory on {self.device} (a Discrete or "
                f"MultiDiscrete observation is one-hot encoded: one input per value): "
                f"{_allocation(err)}"
            ) from None
        if checkpoint is None and config.image_layout != "auto" and not self.agent.image_keys:
            # it reads uint8 images only: ignored here, the run would go on as the user did not
            # ask (a float image goes to the MLP, never to the CNN); a resumed run keeps its own
            raise ValueError(
                f"image_layout={config.image_layout!r} is for uint8 image observations "
                f"(Box [H, W, C] or [C, H, W]); {config.env!r} has none (observations "
                f"{self.agent.observation_keys}; float images go to the MLP): leave it out"
            )
        if self.ranks.distributed:
            broadcast_module(self.agent)  # every rank starts from rank 0's parameters
            # ... and samples its own actions from its own envs (env i of rank r: seed + r W + i)
            torch.manual_seed(config.seed + self.ranks.rank)
        self._env_seed = config.seed + self.ranks.rank * config.num_workers
        # total_steps is the run's budget, all ranks together
        per_update = config.steps_per_update * self.ranks.world_size
        self.num_updates = config.total_steps // per_update
        if self.num_updates < 1:
            raise ValueError(
                f"total_steps={config.total_steps} is less than one update of the "
                f"{self.ranks.world_size} ranks (num_workers * rollout_steps * ranks = "
                f"{per_update})"
            )
        if config.total_steps % per_update and self.ranks.main:
            log.info(
                "total_steps=%d is not a multiple of one update (num_workers * rollout_steps * "
                "ranks = %d): the run trains %d updates, %d env steps",
                config.total_steps,
                per_update,
                self.num_updates,
                self.num_updates * per_update,
            )
        self.actor = RecurrentActor(self.agent)
        self.critic = RecurrentCritic(self.agent)
        self.optimizer = torch.optim.Adam(
            self.agent.parameters(), lr=config.learning_rate, eps=1e-5, foreach=True
        )
        self.collector = self._make_collector()
        self._batches = iter(self.collector)
        # exact resumes need the env copies: find an env that cannot be pickled now, not at
        # the first checkpoint
        self._envs_picklable = hasattr(self.collector, "env_copies")
        self._env_state()
        # the bonus reads the observations the agent reads; its coef is set every update
        self.novelty = (
            EpisodicNoveltyBonus(config.novelty_bonus, observation_keys=self.agent.observation_keys)
            if config.novelty_bonus
            else None
        )
        self.ppo = PPOUpdate(
            self.actor,
            self.critic,
            self.optimizer,
            generator=self.generator,
            world_size=self.ranks.world_size,
            settings=PPOSettings(
                gamma=config.gamma,
                lmbda=config.lmbda,
                sequence_length=config.sequence_length,
                epochs=config.epochs,
                num_minibatches=config.num_minibatches,
                value_coef=config.value_coef,
                entropy_coef=config.entropy_coef,
                max_grad_norm=config.max_grad_norm,
                normalize_advantage=config.normalize_advantage,
                advantage_eps=config.advantage_eps,
                reward_scale=config.reward_scale,
                start_state=config.start_state,
                burn_in=config.burn_in,
                target_kl=config.target_kl,
            ),
            novelty=self.novelty,
        )
        self.counters: dict[str, Any] = {
            "update": 0,
            "env_steps": 0,
            "wall_time_s": 0.0,
            "collect_time_s": 0.0,  # of wall_time_s: stepping the envs and the policy
            "learn_time_s": 0.0,  # of wall_time_s: the PPO update and the normaliser
            "checkpoint_time_s": 0.0,  # writing checkpoints, between updates: not in wall_time_s
            "episodes": 0,
        }
        self.recent: collections.deque = collections.deque(maxlen=20)
        self.recent_lengths: collections.deque = collections.deque(maxlen=20)
        self.resumed = checkpoint is not None
        if checkpoint is not None:
            self._restore(checkpoint)

    def _make_collector(self):
        c = self.config
        # the collection policy: both networks in one step (the same outputs as
        # TensorDictSequential(actor, critic), faster: benchmarks/agent_modules.py)
        policy = RecurrentPolicy(self.agent)
        if c.collector == "torchrl":
            from rppo_td.train._torchrl_collector import TorchRLCollector

            return TorchRLCollector(
                c.env,
                self.agent,
                policy,
                num_workers=c.num_workers,
                rollout_steps=c.rollout_steps,
                seed=self._env_seed,
                device=self.device,
            )
        env = make_vector_env(c.env, c.num_workers, processes=c.env_processes)
        return VectorCollector(
            env,
            policy,
            leaves=self.agent.leaves,
            frames_per_batch=c.steps_per_update,
            seed=self._env_seed,
            device=self.device,
        )

    def _env_state(self) -> bytes | None:
        """The env copies, pickled for an exact resume; None if there are none to pickle.

        Once they fail to pickle (found at start-up, or later) checkpoints hold no env state,
        and this says so once.
        """
        if not self._envs_picklable:
            return None
        envs = self.collector.env_copies()
        if envs is None:  # envs in worker processes: nothing here to pickle
            self._envs_picklable = False
            return None
        try:
            return pickle.dumps(envs)
        except Exception as err:  # any object can refuse to pickle in its own way
            log.warning(
                "env %r cannot be pickled (%s: %s): checkpoints will hold no env state, and a "
                "resumed run restarts its envs from a reset (not an exact resume)",
                self.config.env,
                type(err).__name__,
                err,
            )
            self._envs_picklable = False
            return None

    def _restore(self, checkpoint: dict[str, Any]) -> None:
        envs = None
        saves_envs = hasattr(self.collector, "env_copies")
        if saves_envs and not self.ranks.main:
            # the saved env copies are rank 0's; the other ranks' were never saved
            log.warning(
                "rank %d: only rank 0's envs are checkpointed; this rank's envs restart from "
                "a reset (the run continues, but not exactly as an uninterrupted one would)",
                self.ranks.rank,
            )
        elif saves_envs and self.collector.env_copies() is None:
            log.warning(
                "env_processes=%d: the envs run in worker processes, which cannot hand their "
                "sub-envs out to be saved, so the envs restart from a reset (the run continues, "
                "but not exactly as an uninterrupted one would)",
                self.config.env_processes,
            )
        elif saves_envs:
            envs, why = load_env_state(self.directory, checkpoint.get("env_state"))
            if envs is None:
                log.warning(
                    "no usable env state beside the checkpoint (%s): the envs restart from a "
                    "reset (the run continues, but not exactly as an uninterrupted one would)",
                    why,
                )
        try:
            self.agent.load_state_dict(checkpoint["model"])
            self.optimizer.load_state_dict(checkpoint["optimizer"])
            set_rng_state(checkpoint["rng"], self.generator)
            if not self.ranks.main:  # rank 0's RNG state was saved: the others draw anew
                torch.manual_seed(
                    self.config.seed + self.ranks.rank + checkpoint["counters"]["update"]
                )
            if saves_envs:
                state = _upgrade_collector_state(checkpoint["collector"], self.agent)
                self.collector.load_state_dict(state, envs)
            else:
                self.collector.load_state_dict(checkpoint["collector"])
            # what the open episodes have seen, only where they go on (the envs restored);
            # envs restarted from a reset start every episode afresh
            if self.novelty is not None and envs is not None and "novelty" in checkpoint:
                self.novelty.load_state_dict(checkpoint["novelty"])
        except (RuntimeError, KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
            raise ValueError(
                f"the checkpoint in {str(self.directory)!r} does not fit the run its config "
                f"builds ({type(err).__name__}: {first_line(err, limit=400)})"
            ) from None
        # checkpoints written before checkpoint_time_s was counted lack it
        self.counters = {"checkpoint_time_s": 0.0, **checkpoint["counters"]}
        self.saved_update = self.counters["update"]
        self._check_ranks(self.counters)
        self.recent.extend(checkpoint["recent_returns"])
        self.recent_lengths.extend(checkpoint["recent_lengths"])
        log.info(
            "resumed %s at update %d (%d env steps)",
            self.directory,
            self.counters["update"],
            self.counters["env_steps"],
        )

    def _check_ranks(self, counters: dict[str, Any]) -> None:
        """Refuses a resume on another number of ranks than the checkpoint's run had.

        Each update collects ``num_workers * rollout_steps`` steps per rank, so the ranks
        that wrote the checkpoint are its env steps over its updates: the budget
        (``total_steps``, all ranks together), the annealing and the env copies (each rank
        its own) all assume the same count, and another would silently miss or overshoot
        the budget.
        """
        done, steps = int(counters["update"]), int(counters["env_steps"])
        per_rank = self.config.steps_per_update
        if done < 1 or steps == done * per_rank * self.ranks.world_size:
            return
        saved = steps / (done * per_rank)
        raise ValueError(
            f"the checkpoint in {str(self.directory)!r} was written by a run of {saved:g} "
            f"rank(s) ({steps} env steps in {done} updates of {per_rank} steps a rank); this "
            f"run has {self.ranks.world_size}: resume it on as many ranks as it started with"
        )

    def save(self) -> Path:
        """Writes ``checkpoint.pt`` (and the env copies) atomically; only between updates."""
        return save_checkpoint(
            self.directory,
            {
                "config": self.config.to_dict(),
                "model": self.agent.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "collector": self.collector.state_dict(),
                "rng": rng_state(self.generator),
                "counters": dict(self.counters),
                "recent_returns": [float(x) for x in self.recent],
                "recent_lengths": [int(x) for x in self.recent_lengths],
                **({"novelty": self.novelty.state_dict()} if self.novelty is not None else {}),
            },
            env_state=self._env_state(),
        )

    def _schedule(self, update: int) -> tuple[float, float]:
        c = self.config
        # anneal_steps (and total_steps) count every rank's steps together
        remaining = max(
            0.0, 1.0 - update / c.horizon_updates(c.anneal_steps, self.ranks.world_size)
        )
        lr = c.learning_rate * (remaining if c.anneal_lr else 1.0)
        clip = c.clip_epsilon * (remaining if c.anneal_clip else 1.0)
        # the loss takes a clip in (0, 1): a smaller or annealed one stops at the floor
        return lr, max(clip, CLIP_FLOOR)

    def _novelty_coef(self, update: int) -> float:
        """``novelty_bonus``, falling linearly to 0 over ``novelty_steps`` (or the run)."""
        c = self.config
        horizon = c.horizon_updates(c.novelty_steps, self.ranks.world_size)
        return c.novelty_bonus * max(0.0, 1.0 - update / horizon)

    def _one_update(self) -> dict[str, Any]:
        update = self.counters["update"]
        lr, clip = self._schedule(update)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.novelty is not None:
            self.novelty.coef = self._novelty_coef(update)
        start = time.perf_counter()
        rollout = next(self._batches)
        collected = time.perf_counter()
        stats = self.ppo(rollout, clip_epsilon=clip)
        frozen = 0 < self.config.normalizer_steps <= self.counters["env_steps"]
        if self.agent.normalizer is not None and not frozen:
            obs = rollout.select(*self.agent.observation_keys)
            # every rank's statistics from every rank's observations: they stay identical
            self.agent.normalizer.update(gather_ranks(obs) if self.ranks.distributed else obs)
        end = time.perf_counter()
        elapsed, collect, learn = end - start, collected - start, end - collected
        returns, lengths, ends = self.collector.episodes.pop()
        if self.ranks.distributed:
            returns, lengths = gather_episodes(returns, lengths, ends)
        self.recent.extend(returns)
        self.recent_lengths.extend(lengths)
        steps = self.config.steps_per_update * self.ranks.world_size
        self.counters["update"] = update + 1
        self.counters["env_steps"] += steps
        self.counters["wall_time_s"] += elapsed
        self.counters["collect_time_s"] += collect
        self.counters["learn_time_s"] += learn
        self.counters["episodes"] += len(returns)
        return {
            "update": update + 1,
            "env_steps": self.counters["env_steps"],
            # microseconds: a fast machine collects a small update in 20 ms, where four
            # decimals would put collect_fps 0.25% off collect_s
            "wall_time_s": round(self.counters["wall_time_s"], 6),
            "fps": steps / elapsed,
            "collect_s": round(collect, 6),
            "learn_s": round(learn, 6),
            "collect_fps": steps / max(collect, 1e-9),
            # before the first training episode ends: left out (empty cells, no scalar)
            **(
                {
                    "episode_return_mean": float(np.mean(self.recent)),
                    "episode_length_mean": float(np.mean(self.recent_lengths)),
                }
                if self.recent
                else {}
            ),
            "episodes": self.counters["episodes"],
            "learning_rate": lr,
            "clip_epsilon": clip,
            **({"novelty_bonus": self.novelty.coef} if self.novelty is not None else {}),
            **stats,
        }

    def release(self) -> None:
        """Shuts the collector (and its env processes) down and releases the directory's lock.

        ``run`` calls it when it returns or raises, ``__init__`` when building fails.
        """
        collector = getattr(self, "collector", None)
        try:
            if collector is not None and not getattr(self, "_collector_closed", False):
                self._collector_closed = True
                collector.shutdown()
        finally:
            self._release_lock()

    def _release_lock(self) -> None:
        lock = getattr(self, "_lock", None)
        if lock is not None:
            lock.close()
            self._lock = None

    def __del__(self) -> None:
        # a trainer built but never run still lets go of its directory
        self.release()

    def run(self, *, stop_after_updates: int | None = None) -> dict[str, Any] | None:
        """Trains to ``total_steps``; returns the summary, or None if stopped early.

        A checkpoint is written every ``checkpoint_every`` updates, when a signal stops the
        run, and after the last update, always between updates. An exception (or a second
        Ctrl-C) writes none, so the last checkpoint is the consistent state to resume from.

        A trainer runs once: to go on after ``run`` stopped, resume its directory with a new
        ``Trainer(config.replace(resume=directory, overwrite=False))``.

        Args:
            stop_after_updates: stop (as on SIGTERM) once the run has done this many updates,
                counted from its first (a resumed run's earlier updates included): an int
                after the update it starts from, and at most the run's updates.

        Raises:
            RuntimeError: a second call (the first had closed the log files and the envs: a
                second run reopened ``metrics.csv`` as a new run's and lost the first's rows).
            ValueError: a bad ``stop_after_updates``.
        """
        if self._ran:
            raise RuntimeError(
                f"Trainer.run() was called already (the run is at update "
                f"{self.counters['update']} of {self.num_updates}): a trainer runs once; to go "
                f"on, resume it: Trainer(config.replace(resume={str(self.directory)!r}, "
                "overwrite=False)).run()"
            )
        if stop_after_updates is not None:
            first, last = self.counters["update"] + 1, self.num_updates
            if first > last:
                raise ValueError(
                    f"stop_after_updates={stop_after_updates!r}: the run has done all its "
                    f"{last} updates, so there is nothing to stop after; leave it out"
                )
            value = stop_after_updates
            whole = isinstance(value, numbers.Integral) and not isinstance(value, bool)
            if not (whole and first <= int(value) <= last):
                raise ValueError(
                    f"stop_after_updates must be an int in [{first}, {last}] (after the update "
                    f"the run starts from, {first - 1}, and at most its {last} updates; counted "
                    f"from the run's first update), got {stop_after_updates!r}"
                )
        self._ran = True
        if self._lock is None and fcntl_available() and self.ranks.main:
            self._lock = lock_run_directory(self.directory)
        try:
            return self._run(stop_after_updates)
        finally:
            self.release()

    def _run(self, stop_after_updates: int | None) -> dict[str, Any] | None:
        if self.resumed and self.counters["update"] >= self.num_updates:
            return self._finished_already()
        # from here a signal stops the run after its next update, with a checkpoint: one
        # while its log files were opened left them behind with nothing trained, and no word
        with _StopFlag() as stop:
            stopped = self._train(stop, stop_after_updates)
        if stopped and self.ranks.distributed:
            # the ranks leave together: torchrun stops every rank once one has exited, and
            # rank 0 may still be closing the run's files (a SIGTERM to one rank alone)
            wait_for_ranks()
        if stopped:
            log.info(
                "stopped at update %d; continue with --resume %s",
                self.counters["update"],
                self.directory,
            )
            return None
        return self.finish()  # a signal here raises: the final evaluation is interruptible

    def _train(self, stop: _StopFlag, stop_after_updates: int | None) -> bool:
        """The updates, with their logs and checkpoints; True if a signal stopped them."""
        c = self.config
        resume_from = None
        if self.resumed:
            resume_from = (self.counters["update"], self.counters["env_steps"])
        main = self.ranks.main
        metrics = MetricsLog(self.directory, resume_from=resume_from) if main else None
        per_update = c.steps_per_update * self.ranks.world_size
        bar = tqdm(
            total=self.num_updates * per_update,
            initial=self.counters["env_steps"],
            unit="step",
            disable=not (c.progress and main),
            dynamic_ncols=True,
        )
        stopped = False
        saved_update = self.saved_update
        saving: int | None = None  # the update whose checkpoint is being written
        try:
            while self.counters["update"] < self.num_updates:
                row = self._one_update()
                if metrics is not None:
                    metrics.write(row)
                bar.update(per_update)
                bar.set_postfix(
                    fps=f"{row['fps']:.0f}",
                    ret=f"{row['episode_return_mean']:.1f}"
                    if "episode_return_mean" in row
                    else "-",
                    time=time_split(row["collect_s"], row["learn_s"]),
                )
                done = self.counters["update"]
                stopped = stop.requested or done == stop_after_updates
                if self.ranks.distributed:  # all ranks stop after the same update
                    stopped = any_rank(stopped, self.device)
                if stopped or done % c.checkpoint_every == 0 or done == self.num_updates:
                    stop.saving = True
                    saving = done
                    if main:
                        started = time.perf_counter()
                        self.save()
                        self.counters["checkpoint_time_s"] += time.perf_counter() - started
                    self.saved_update = saved_update = done
                    saving = None
                    stop.saved()
                if stopped:
                    break
            stop.release()  # closing the logs, the plot and the evaluation: a signal raises
        except BaseException:
            stop.release()
            # the update trained or being trained when it stopped: the checkpoint of a
            # finished update may be what failed (a full disk)
            during = (
                f"while saving the checkpoint of update {saving}"
                if saving is not None
                else f"during update {self.counters['update'] + 1}"
            )
            if saved_update:
                log.error(
                    "the run stopped %s; the last checkpoint (update %d) is kept: continue "
                    "with --resume %s",
                    during,
                    saved_update,
                    self.directory,
                )
            else:
                log.error(
                    "the run stopped %s, before its first checkpoint: start it again with "
                    "--overwrite",
                    during,
                )
            raise
        finally:
            bar.close()
            if metrics is not None:
                metrics.close()
                _plot(self.directory, c)
        return stopped

    def leave_group(self) -> None:
        """Leaves the torchrun process group, if this run joined one (after ``run``)."""
        if self.ranks.distributed:
            leave_group()

    def _finished_already(self) -> dict[str, Any]:
        """The summary of a resumed run that has no update left to train.

        Its ``summary.json``, kept as it is, where it is the summary of this checkpoint; else
        (the run stopped in its final evaluation, or the file is damaged) ``finish()``. No
        metrics row or TensorBoard file is written either way; ``learning_curve.png`` is
        plotted where it is missing (a run killed between its last update and its plot).
        """
        path = self.directory / "summary.json"
        kept = None
        if self.ranks.main:
            keys = set(self._summary({}, in_sync=True))
            kept = _read_summary(path, self.counters, keys)
            if kept is None:
                log.info(
                    "%s has trained all its %d updates but holds no summary of them: "
                    "evaluating it now",
                    self.directory,
                    self.num_updates,
                )
            else:
                log.info(
                    "%s finished already (update %d of %d, %d env steps): its summary.json is "
                    "kept and nothing is trained. A longer run is a new run (another --output)",
                    self.directory,
                    self.counters["update"],
                    self.num_updates,
                    self.counters["env_steps"],
                )
        if self.ranks.main and not (self.directory / "learning_curve.png").exists():
            _plot(self.directory, self.config)
        found = kept is not None
        if self.ranks.distributed:  # every rank takes the same branch
            found = any_rank(found, self.device)
        if not found:
            return self.finish()
        return kept if kept is not None else self._summary({}, in_sync=True)

    def finish(self) -> dict[str, Any]:
        """Deterministic evaluation; writes (rank 0) and returns ``summary.json``'s content.

        In a data-parallel run every rank first checks that all hold the same parameters
        (``ranks_in_sync``); rank 0 alone evaluates and writes.
        """
        c = self.config
        in_sync = parameters_in_sync(self.agent) if self.ranks.distributed else True
        if not in_sync and self.ranks.main:
            log.warning(
                "the ranks' parameters differ at the end of the run (summary.json: "
                "ranks_in_sync false): rank 0's are evaluated and saved"
            )
        evaluation = (
            evaluate_agent(
                self.agent.cpu(), c.env, episodes=max(c.eval_episodes, 1), seed=c.seed + 10_000
            )
            if c.eval_episodes and self.ranks.main
            else {}
        )
        self.agent.to(self.device)
        summary = self._summary(evaluation, in_sync=in_sync)
        if self.ranks.main:
            write_json_atomic(self.directory / "summary.json", summary)
        self.summary_written = True  # an interrupt from here on finds the run complete
        return summary

    def _summary(self, evaluation: dict[str, Any], *, in_sync: bool) -> dict[str, Any]:
        """``summary.json``'s content: the counters, ``evaluation``'s figures, the config."""
        c = self.config
        wall = self.counters["wall_time_s"]
        return {
            "eval_return_mean": evaluation.get("eval_return_mean", math.nan),
            "eval_return_std": evaluation.get("eval_return_std", math.nan),
            "eval_episodes": c.eval_episodes,
            "env_steps": self.counters["env_steps"],
            "wall_time_s": wall,
            "fps": self.counters["env_steps"] / max(wall, 1e-9),
            "collect_time_s": self.counters["collect_time_s"],
            "learn_time_s": self.counters["learn_time_s"],
            "collect_fraction": self.counters["collect_time_s"] / max(wall, 1e-9),
            "updates": self.counters["update"],
            "eval_returns": evaluation.get("eval_returns", []),
            "eval_cut_episodes": evaluation.get("eval_cut_episodes", 0),
            "eval_wall_time_s": evaluation.get("eval_wall_time_s", 0.0),
            "checkpoint_time_s": self.counters["checkpoint_time_s"],
            "world_size": self.ranks.world_size,
            "ranks_in_sync": in_sync,
            "config": c.to_dict(),
        }


def _read_summary(path: Path, counters: dict[str, Any], keys: set[str]) -> dict[str, Any] | None:
    """``path``'s summary, where it is the run's at ``counters`` and complete.

    Complete: the same env steps and updates as ``counters``, and every one of ``keys`` (a
    summary written by an older version lacks some).
    """
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or not keys <= set(summary):
        return None
    same = summary.get("env_steps") == counters["env_steps"]
    return summary if same and summary.get("updates") == counters["update"] else None


def _resumed_config(
    config: TrainConfig, given: dict[str, Any] | None, run_directory: Path
) -> tuple[dict[str, Any], TrainConfig]:
    """The checkpoint ``config.resume`` names and the config resuming it.

    Raises:
        ValueError: no checkpoint (naming why), a bad one, or settings that would change the
            experiment.
    """
    file = checkpoint_file(config.resume)
    if not file.exists() and (run_directory / "metrics.csv").exists():
        # its rows say how far it got; the file may also have been removed since
        raise ValueError(
            f"no checkpoint at {str(file)!r}, though metrics.csv there logs "
            f"{_logged_updates(run_directory / 'metrics.csv')}: the run stopped before its "
            "first checkpoint, or the file was removed; put a copy back to resume, or start "
            "afresh with --overwrite (which also deletes the logged rows)"
        )
    try:
        checkpoint = load_checkpoint(file)
    except CheckpointError as err:
        if not file.is_file():
            raise
        # what is left to do: a damaged checkpoint cannot be resumed from
        raise CheckpointError(
            f"{err}; it cannot be resumed from: put back a good copy, or start the run "
            "again with --overwrite (which replaces its files)"
        ) from None
    saved = TrainConfig.from_dict(checkpoint["config"], where=f"the config in {str(file)!r}")
    _check_resident(file, checkpoint, saved, run_directory)
    given = {**(given or {}), "resume": config.resume}
    if (
        "output" in given
        and Path(given["output"]).expanduser().resolve() != run_directory.resolve()
    ):
        raise ValueError(
            f"output={given['output']!r} is not the resumed run's directory "
            f"{str(run_directory)!r}; a run resumes in its own directory"
        )
    given["output"] = str(run_directory)
    return checkpoint, check_resumable(saved, given)


def _check_resident(
    file: Path, checkpoint: dict[str, Any], saved: TrainConfig, run_directory: Path
) -> None:
    """Refuses a file resumed beside a ``checkpoint.pt`` of another run, or of a later update.

    The run resumes in the file's directory: its ``metrics.csv`` is cut back to the file's
    update and its ``checkpoint.pt`` and ``summary.json`` replaced. For another run's file
    (a copy dropped in beside it) that mixed two runs; for an older one of the same run it
    dropped the later updates with one INFO line.
    """
    resident = run_directory / "checkpoint.pt"
    if not resident.is_file() or resident.resolve() == file.resolve():
        return
    try:
        theirs = load_checkpoint(resident)
        their_config = TrainConfig.from_dict(theirs["config"])
    except (CheckpointError, KeyError, TypeError, ValueError):
        return  # a damaged checkpoint.pt: resuming a good copy beside it is the way back
    here = f"{str(file)!r} resumes in {str(run_directory)!r}"
    differ = [
        f"{f.name}: {getattr(their_config, f.name)!r} there, {getattr(saved, f.name)!r} here"
        for f in dataclasses.fields(TrainConfig)
        if f.name not in RUNTIME_FIELDS and getattr(their_config, f.name) != getattr(saved, f.name)
    ]
    if differ:
        raise ValueError(
            f"{here}, whose checkpoint.pt is another run's ({', '.join(differ[:3])}"
            f"{', ...' if len(differ) > 3 else ''}): resuming would mix the two runs' "
            f"metrics.csv and replace that run's checkpoint; copy {file.name} into a directory "
            "of its own as checkpoint.pt and resume that"
        )
    ours, later = checkpoint["counters"]["update"], theirs["counters"]["update"]
    if later > ours:
        raise ValueError(
            f"{here}, whose checkpoint.pt is of the same run at update {later}: resuming "
            f"update {ours} would drop updates {ours + 1}-{later} (their metrics.csv rows, "
            "checkpoint and summary); to go back to it, move checkpoint.pt away first, or "
            f"copy {file.name} into a directory of its own as checkpoint.pt"
        )


def _upgrade_collector_state(state: dict[str, Any], net: RecurrentActorCritic) -> dict[str, Any]:
    """A collector state of the old layout in today's; any other state unchanged.

    Before the actor and critic had their own state keys, a checkpoint kept the observation,
    ``is_init`` ``[W]`` and one state tensor per key, ``[W, layers, H]`` shared or
    ``[W, layers, 2H]`` (actor, then critic), not yet zeroed where ``is_init``.
    """
    if "carry" in state or "obs" not in state:
        return state
    is_init = state["is_init"].reshape(-1, 1)
    carry = {**state["obs"], "is_init": is_init}
    keep = (~is_init).view(-1, 1, 1)
    h = net.hidden_size
    keys = zip(net.actor_state_keys, net.critic_state_keys, state["state"], strict=True)
    for actor_key, critic_key, joined in keys:
        joined = joined * keep
        if net.shared_critic:
            carry[actor_key] = joined
        else:
            carry[actor_key], carry[critic_key] = joined[..., :h], joined[..., h:]
    return {**state, "carry": carry}


def _plot(directory: Path, config: TrainConfig) -> None:
    """The learning curve; a plotting failure is logged, never raised over the run's result."""
    try:
        plot_learning_curve(directory, title=f"{config.env} ({config.recurrence})")
    except Exception as err:  # matplotlib and the filesystem raise many types
        log.warning("learning_curve.png not written: %s", err)


def _check_device(name: str) -> torch.device:
    """``torch.device(name)``, refusing one this machine does not have with a clear message."""
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ValueError(f"device {name!r} is not a torch device ({err})") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available here")
    if device.type == "meta":
        raise ValueError(f"device {name!r} holds no data, so nothing can train on it")
    try:  # a type this torch build has no backend for (mps, xla on Linux), a missing index
        torch.empty(1, device=device)
    except (RuntimeError, AssertionError) as err:
        raise ValueError(
            f"device {name!r} cannot be used by this torch build here "
            f"({first_line(err, sentence=True)})"
        ) from None
    return device


def train(config: TrainConfig, *, given: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Runs ``Trainer(config, given=given).run()``; returns its summary (None if stopped).

    Example:
        >>> import tempfile
        >>> summary = train(TrainConfig(total_steps=64, num_workers=2, rollout_steps=32,
        ...                             eval_episodes=1, progress=False, log_level="WARNING",
        ...                             output=tempfile.mkdtemp()))
        >>> summary["env_steps"], "eval_return_mean" in summary
        (64, True)
    """
    return Trainer(config, given=given).run()


def _logged_updates(path: Path) -> str:
    """``"N updates"``: the rows of a ``metrics.csv`` (``"rows that cannot be read"``)."""
    try:
        rows = len(read_metrics(path))
    except (OSError, UnicodeDecodeError, csv.Error):
        return "rows that cannot be read"
    return f"{rows} update{'' if rows == 1 else 's'}"


def _brief(space: object, limit: int = 100) -> str:
    """``str(space)``, cut to ``limit`` characters (a Dict space's runs on)."""
    text = str(space)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _allocation(err: BaseException) -> str:
    """What an allocation error tried: ``it tried to allocate 256.0 TiB``, else its first line.

    torch's CPU allocator's message runs to 250 characters of which the size is the part a
    user acts on.
    """
    found = re.search(r"tried to allocate (\d+) bytes", str(err))
    if found is None:
        line = first_line(err)
        return line if len(line) <= 160 else line[:157].rsplit(" ", 1)[0] + " ..."
    size = float(found.group(1))
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"it tried to allocate {size:.1f} {unit}"
