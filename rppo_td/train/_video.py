"""Frames of an env for ``rppo-eval --video``: the render env, its checks, GIF and MP4 writers.

The recording itself (the agent stepping the env) is ``rppo_td.train._evaluate``'s; this module
knows envs and files, not agents. A video is a sequence of ``[H, W, 3]`` uint8 frames, every
frame of one size; an episode of ``n`` steps gives ``n + 1`` of them (after the reset and after
each step), and the episodes follow each other in one file.

A ``.gif`` is written with Pillow (a dependency of matplotlib, so always there); each episode's
last frame stays up for ``GIF_HOLD_S`` seconds so that episodes are told apart, and GIF
merges identical consecutive frames into one (their time is kept). An ``.mp4`` (H.264) is
written with ``imageio-ffmpeg`` (``pip install 'rppo_td[video]'``), every frame ``1 / fps``.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import load_env_creator

from rppo_td._validation import first_line
from rppo_td.envs import EnvError, make_env, resolve_env_id

__all__ = [
    "FPS_RANGES",
    "GIF_HOLD_S",
    "GIF_MAX_FPS",
    "VIDEO_SUFFIXES",
    "VideoWriter",
    "check_video_path",
    "default_fps",
    "fps_problem",
    "headless_rendering",
    "make_render_env",
    "render_frame",
    "whole_if_integral",
]

VIDEO_SUFFIXES = (".gif", ".mp4")
# GIF frame times are whole hundredths of a second, and browsers slow frames under 0.02 s
GIF_MAX_FPS = 50
#: the frame rates each kind of file keeps, ``(low, high)`` frames per second
FPS_RANGES = {".gif": (0.002, GIF_MAX_FPS), ".mp4": (0.001, 1000)}
_FPS_WHY = {
    # a GIF frame time is 16 bits of hundredths: at most 655.35 s
    ".gif": "a GIF's frame times are whole hundredths of a second, at most 655.35 s",
    # measured with imageio-ffmpeg's ffmpeg: 1e9 fps came out as 1001k, 1e-6 fps unreadable
    ".mp4": "ffmpeg does not write an .mp4 at other rates faithfully",
}
GIF_HOLD_S = 1.0
_DEFAULT_FPS = 30
_MP4_INSTALL = "pip install 'rppo_td[video]' (or pip install imageio-ffmpeg)"
_PYGAME_INSTALL = "pip install 'rppo_td[video]' (or pip install pygame-ce)"


def check_video_path(path: str | os.PathLike[str]) -> Path:
    """Checks a video path before anything runs: its suffix, and the MP4 writer where needed.

    Args:
        path: ends in ``.gif`` or ``.mp4`` (any case); a missing directory is created when
            the video is written, an existing file is overwritten.

    Returns:
        The path.

    Raises:
        ValueError: another suffix, a directory, or an ``.mp4`` without ``imageio-ffmpeg``.

    Example:
        >>> check_video_path("runs/poc.gif").suffix
        '.gif'
    """
    out = Path(path)
    suffix = out.suffix.lower()
    if not str(path):
        raise ValueError("--video is empty; give a file name ending in .gif or .mp4")
    if out.is_dir():
        raise ValueError(f"--video {str(path)!r} is a directory; give a file name")
    if suffix not in VIDEO_SUFFIXES:
        got = repr(out.suffix) if out.suffix else "no suffix"
        if not out.suffix and out.name.lower() in (".gif", ".mp4"):
            got += f" ({out.name!r} is a hidden file's whole name; give a name before it)"
        raise ValueError(
            f"--video {str(path)!r}: the suffix must be .gif or .mp4 (it chooses the format), "
            f"got {got}"
        )
    existing = out.absolute().parent
    while not existing.exists():
        existing = existing.parent
    problem = None if existing.is_dir() else "not a directory"
    if problem is None:
        try:  # a real write: root passes os.access on /sys and /proc, which refuse files
            with tempfile.TemporaryFile(dir=existing):
                pass
        except OSError as err:
            problem = err.strerror or str(err)
    if problem is not None:
        raise ValueError(
            f"--video {str(path)!r}: cannot create the file under {str(existing)!r} ({problem})"
        )
    if suffix == ".mp4":
        _ffmpeg()
    return out


def _ffmpeg() -> Any:
    try:
        import imageio_ffmpeg
    except ImportError:
        raise ValueError(f"writing an .mp4 needs imageio-ffmpeg: {_MP4_INSTALL}") from None
    return imageio_ffmpeg


def _declared_render_modes(name: str) -> list[str] | None:
    """The render modes the env's entry point declares in its ``metadata``, if it does."""
    entry_point = gym.spec(name).entry_point
    try:
        creator = entry_point if callable(entry_point) else load_env_creator(str(entry_point))
    except Exception:  # make_env reports an entry point that does not load
        return None
    metadata = getattr(creator, "metadata", None)
    modes = metadata.get("render_modes") if isinstance(metadata, dict) else None
    return list(modes) if modes is not None else None


def make_render_env(env_id: str) -> gym.Env:
    """``make_env(env_id, render_mode="rgb_array")``, refused where it cannot give frames.

    The env is the whole env, as ``make_env`` builds it: a wrapper that masks observations
    (``rppo_td/CartPoleNoVel-v1``) still renders the full state.

    Args:
        env_id: see ``rppo_td.envs.resolve_env_id``.

    Returns:
        The env, ``render_mode == "rgb_array"``.

    Raises:
        ValueError: the env declares no ``rgb_array`` mode, takes no ``render_mode``, or
            ignores it (the message names the env and the modes it has), or a bad id.

    Example:
        >>> make_render_env("rppo_td/PocMemory-v0").render_mode
        'rgb_array'
    """
    name = resolve_env_id(env_id)
    modes = _declared_render_modes(name)
    if modes is not None and "rgb_array" not in modes:
        raise ValueError(_no_frames(name, modes))
    try:
        env = make_env(env_id, render_mode="rgb_array")
    except EnvError as err:
        # "got an unexpected keyword argument 'render_mode'", or a class without __init__'s
        # "takes no arguments"
        cause = str(err.__cause__)
        if isinstance(err.__cause__, TypeError) and (
            "render_mode" in cause or "takes no arguments" in cause
        ):
            # it may declare rgb_array all the same: its constructor cannot be given it
            raise ValueError(_no_frames(name, modes or [], takes_mode=False)) from None
        raise
    if env.render_mode != "rgb_array":
        env.close()
        raise ValueError(_no_frames(name, list(env.metadata.get("render_modes", []))))
    return env


def _no_frames(name: str, modes: list[str], *, takes_mode: bool = True) -> str:
    has = f"its render modes are {modes}" if modes else "it has no render modes"
    if not takes_mode:
        has += " and its constructor takes no render_mode argument"
    return f"env {name!r} cannot record a video: --video needs render_mode 'rgb_array', {has}"


def render_frame(env: gym.Env, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """``env.render()`` checked: an ``[H, W, 3]`` uint8 frame (an alpha channel is dropped).

    Args:
        env: from ``make_render_env``, after ``reset``.
        name: the env id, for messages.
        shape: the first frame's ``(H, W, 3)``; every later frame must match it.

    Returns:
        The frame, ``[H, W, 3]`` uint8.

    Raises:
        ValueError: a package the renderer needs is missing (naming it), or the frame is not
            an ``[H, W, 3]``/``[H, W, 4]`` uint8 array, or changes size.
        EnvError: ``render()`` raised.

    Example:
        >>> env = make_render_env("rppo_td/PocMemory-v0")
        >>> _ = env.reset(seed=0)
        >>> render_frame(env, "rppo_td/PocMemory-v0").shape
        (96, 384, 3)
    """
    try:
        frame = env.render()
    except gym.error.DependencyNotInstalled as err:
        # gymnasium's own advice names pygame's gymnasium extra; rppo_td's names its own
        hint = (
            f"; rppo_td's video extra has pygame-ce: {_PYGAME_INSTALL}"
            if "pygame" in str(err)
            else ""
        )
        raise ValueError(f"env {name!r} cannot render frames: {err}{hint}") from None
    except Exception as err:
        raise EnvError(f"env {name!r}: render() raised {type(err).__name__}: {err}") from err
    if not (
        isinstance(frame, np.ndarray)
        and frame.dtype == np.uint8
        and frame.ndim == 3
        and frame.shape[2] in (3, 4)
    ):
        got = (
            f"an array of shape {frame.shape} and dtype {frame.dtype}"
            if isinstance(frame, np.ndarray)
            else type(frame).__name__
        )
        raise ValueError(
            f"env {name!r}: render() returned {got}, expected an [H, W, 3] uint8 frame"
        )
    frame = frame[..., :3]
    if shape is not None and frame.shape != shape:
        raise ValueError(
            f"env {name!r}: render() changed the frame size from {shape} to {frame.shape}"
        )
    return frame


@contextmanager
def headless_rendering() -> Iterator[None]:
    """``SDL_VIDEODRIVER=dummy`` inside, unless it is set: SDL needs no display to draw frames.

    pygame-based renderers (gymnasium's CartPole) initialise SDL's display even for
    ``rgb_array``; on a machine without one, SDL's default driver prints errors or fails.
    """
    previous = os.environ.get("SDL_VIDEODRIVER")
    if previous:
        yield
        return
    os.environ["SDL_VIDEODRIVER"] = "dummy"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("SDL_VIDEODRIVER", None)
        else:
            os.environ["SDL_VIDEODRIVER"] = previous


def default_fps(env: gym.Env, suffix: str) -> float:
    """The env's ``metadata["render_fps"]``, brought into ``FPS_RANGES[suffix]`` (a GIF: <= 50).

    A fractional rate is kept (``2.5``: each frame 0.4 s). 30 where the env gives none, or
    no positive finite number.
    """
    try:
        fps = float(env.metadata.get("render_fps") or _DEFAULT_FPS)
    except (TypeError, ValueError):
        fps = _DEFAULT_FPS
    if not _positive_rate(fps):
        fps = _DEFAULT_FPS
    low, high = FPS_RANGES[suffix]
    return whole_if_integral(min(max(fps, low), high))


def _positive_rate(fps: float) -> bool:
    """Whether ``fps`` is a frame rate at all: a positive finite number."""
    return math.isfinite(fps) and fps > 0


def fps_problem(fps: float, suffix: str) -> str | None:
    """Why ``fps`` cannot be the frame rate of a ``suffix`` video, or None where it can.

    ``suffix`` is one of ``VIDEO_SUFFIXES``. The reason reads after the setting's name
    (``"fps " + reason``).

    Example:
        >>> fps_problem(0.001, ".gif").split(":")[0]
        'must be in [0.002, 50] for a .gif, got 0.001'
        >>> fps_problem(0.001, ".mp4") is None
        True
    """
    if not _positive_rate(fps):
        return f"must be a positive number, got {fps:g}"
    low, high = FPS_RANGES[suffix]
    if low <= fps <= high:
        return None
    return f"must be in [{low:g}, {high:g}] for a {suffix}, got {fps:g}: {_FPS_WHY[suffix]}"


def whole_if_integral(fps: float) -> float:
    """``fps`` as an ``int`` where it is a whole number (``4.0`` -> ``4``), else as it is."""
    return int(fps) if float(fps).is_integer() else fps


def mp4_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole MP4 file, or None where it is.

    An MP4 is a chain of boxes (a 4-byte size, a 4-byte type, 8 more bytes of size where the
    size is 1) that must fill the file exactly and hold the media (``mdat``) and its index
    (``moov``, which ffmpeg writes last): a write cut short leaves a box running past the end
    of the file, or no ``moov``.
    """
    size = path.stat().st_size
    kinds = set()
    offset = 0
    with path.open("rb") as f:
        while offset < size:
            f.seek(offset)
            header = f.read(8)
            if len(header) < 8:
                return f"a box header cut at byte {offset} of {size}"
            box, kind = struct.unpack(">I4s", header)
            if box == 1:
                wide = f.read(8)
                if len(wide) < 8:
                    return f"a box header cut at byte {offset} of {size}"
                box = struct.unpack(">Q", wide)[0]
            elif box == 0:  # the last box, to the end of the file
                box = size - offset
            if box < 8 or offset + box > size:
                name = kind.decode("latin-1")
                return f"a '{name}' box of {box} bytes at byte {offset} of a {size}-byte file"
            kinds.add(kind)
            offset += box
    missing = [name for name in ("mdat", "moov") if name.encode() not in kinds]
    return f"no {' or '.join(missing)} box" if missing else None


class VideoWriter:
    """Writes ``[H, W, 3]`` uint8 frames to a GIF or an MP4, chosen by the path's suffix.

    Frames go to a hidden ``.<name>.partial<suffix>`` beside the path, which ``close``
    renames over the path (an existing file is replaced), so a failed recording leaves no
    half file; ``discard`` removes it. Missing directories are created.

    Args:
        path: from ``check_video_path``.
        fps: frames per second, fractional or not, in ``FPS_RANGES`` for the suffix.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> writer = VideoWriter(Path(folder) / "grey.gif", fps=10)
        >>> for value in (0, 128, 255):
        ...     writer.add(np.full((8, 16, 3), value, dtype=np.uint8), last=value == 255)
        >>> writer.close().stat().st_size > 0
        True
    """

    def __init__(self, path: Path, *, fps: float) -> None:
        self.path = check_video_path(path)
        self.suffix = self.path.suffix.lower()
        if isinstance(fps, bool) or not isinstance(fps, (int, float)):
            raise ValueError(f"fps must be a number, got {fps!r}")
        problem = fps_problem(fps, self.suffix)
        if problem is not None:
            raise ValueError(f"fps {problem}")
        self.fps = fps
        self.frames = 0
        self._partial = _partial_path(self.path)
        self._gif: list[Any] = []  # Pillow palette images
        self._durations: list[int] = []
        self._clock_cs = 0.0  # the GIF's true time so far, and what its durations add up to
        self._written_cs = 0
        self._mp4: Any = None

    def add(self, frame: np.ndarray, *, last: bool = False) -> None:
        """Appends one ``[H, W, 3]`` uint8 frame; ``last`` marks an episode's last frame."""
        if self.suffix == ".gif":
            from PIL import Image

            self._gif.append(Image.fromarray(frame).convert("P", palette=Image.Palette.ADAPTIVE))
            hold = GIF_HOLD_S if last else 0.0
            # a GIF stores whole hundredths of a second: each frame ends at the hundredth
            # nearest its true end, so that the video keeps time (at 30 fps: 30, 40, 30 ms)
            self._clock_cs += 100 * max(1.0 / self.fps, hold)
            end = round(self._clock_cs)
            self._durations.append(10 * (end - self._written_cs))
            self._written_cs = end
        else:
            self._add_mp4(frame)
        self.frames += 1

    def _add_mp4(self, frame: np.ndarray) -> None:
        # H.264 in yuv420p needs even sides: pad with the edge row or column
        frame = np.pad(frame, ((0, frame.shape[0] % 2), (0, frame.shape[1] % 2), (0, 0)), "edge")
        try:
            if self._mp4 is None:
                self._partial.parent.mkdir(parents=True, exist_ok=True)
                self._mp4 = _ffmpeg().write_frames(
                    str(self._partial),
                    (frame.shape[1], frame.shape[0]),
                    fps=self.fps,
                    codec="libx264",
                    macro_block_size=2,
                    output_params=["-f", "mp4"],
                )
                self._mp4.send(None)
            self._mp4.send(np.ascontiguousarray(frame))
        except OSError as err:
            # ffmpeg could not open or write the file (it exits, and the pipe to it breaks)
            self.discard()
            raise self._cannot_write(err) from err

    def close(self) -> Path:
        """Finishes the file and puts it at ``path``; returns ``path``.

        Raises:
            ValueError: nothing was added, or the file cannot be written (naming it).
        """
        if self.frames == 0:
            raise ValueError("no frames to write")
        try:
            self._finish()
        except OSError as err:
            raise self._cannot_write(err) from err
        return self.path

    def _cannot_write(self, err: OSError) -> ValueError:
        """The one-line error for ``err``: its first line (ffmpeg's go on with its command)."""
        return ValueError(f"cannot write the video {str(self.path)!r}: {first_line(err)}")

    def _finish(self) -> None:
        try:
            if self.suffix == ".gif":
                self._partial.parent.mkdir(parents=True, exist_ok=True)
                first, *rest = self._gif
                first.save(
                    self._partial,
                    format="GIF",
                    save_all=True,
                    append_images=rest,
                    duration=self._durations,
                    loop=0,
                )
                self._gif, self._durations = [], []
            else:
                self._mp4.close()
                self._mp4 = None
                # imageio-ffmpeg does not read ffmpeg's exit status: a file ffmpeg could not
                # finish (a full disk) would pass for a video
                problem = mp4_problem(self._partial)
                if problem is not None:
                    raise OSError(
                        f"ffmpeg did not finish it ({problem}; its messages above say why)"
                    )
            os.replace(self._partial, self.path)
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        """Drops the frames and the partial file."""
        if self._mp4 is not None:
            mp4, self._mp4 = self._mp4, None
            with suppress(OSError, RuntimeError):  # ffmpeg may be gone already
                mp4.close()
        self._gif, self._durations = [], []
        self._clock_cs, self._written_cs = 0.0, 0
        with suppress(OSError):  # a cleanup: the error being handled is the news
            self._partial.unlink(missing_ok=True)


def _partial_path(path: Path) -> Path:
    """Where a video is written before it is moved to ``path``: beside it, hidden.

    ``.<stem>.partial<suffix>``, or ``.<digest>.partial<suffix>`` where that name would pass
    the file system's 255 bytes (a legal video name of 247 bytes or more).
    """
    name = f".{path.stem}.partial{path.suffix}"
    if len(os.fsencode(name)) > 255:
        digest = hashlib.sha1(os.fsencode(path.name)).hexdigest()[:16]
        name = f".{digest}.partial{path.suffix}"
    return path.with_name(name)
