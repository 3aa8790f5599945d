"""``rppo-eval --video``: recorded episodes, their frames, and the refusals."""

from __future__ import annotations

import gc
import json
import struct
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from PIL import Image, ImageSequence

from rppo_td.envs import POC_MEMORY_ID, EnvError, PocMemory
from rppo_td.evaluate import main as eval_main
from rppo_td.train import _evaluate
from rppo_td.train import main as train_main
from rppo_td.train._video import (
    VideoWriter,
    check_video_path,
    default_fps,
    make_render_env,
    render_frame,
)


def _train(directory, env: str) -> str:
    argv = ["--preset", "smoke", "--env", env, "--threads", "1", "--output", str(directory)]
    assert train_main(argv) == 0
    return str(directory / "checkpoint.pt")


@pytest.fixture(scope="module")
def poc_checkpoint(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("runs") / "poc", POC_MEMORY_ID)


def _eval(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert eval_main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def _refused(capsys, *argv: str) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        eval_main(list(argv))
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def _gif_frames(path) -> tuple[list[np.ndarray], list[int]]:
    with Image.open(path) as image:
        frames = [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(image)]
        image.seek(0)
        durations = [f.info["duration"] for f in ImageSequence.Iterator(image)]
    return frames, durations


def test_gif_holds_steps_plus_one_frames_per_episode_of_the_evaluated_policy(
    poc_checkpoint, tmp_path, capsys
):
    out = tmp_path / "new" / "folder" / "poc.gif"  # missing directories are created
    result = _eval(
        capsys,
        *("--checkpoint", poc_checkpoint, "--episodes", "4", "--video", str(out)),
        *("--video-episodes", "3", "--fps", "5"),
    )
    lengths = result["video_lengths"]
    assert result["video_episodes"] == 3 and len(lengths) == 3
    assert all(1 <= n <= 32 for n in lengths)
    assert result["video_frames"] == sum(n + 1 for n in lengths)
    # deterministic: the recorded episodes are the first evaluated ones, seed for seed
    np.testing.assert_allclose(result["video_returns"], result["eval_returns"][:3])
    frames, durations = _gif_frames(out)
    assert len(frames) == result["video_frames"]
    assert {f.shape for f in frames} == {(96, 384, 3)}
    # 1/5 s a frame, each episode's last frame held for 1 s
    ends = np.cumsum([n + 1 for n in lengths]) - 1
    assert [durations[i] for i in ends] == [1000] * 3
    assert sorted(set(np.delete(durations, ends))) == [200]
    # the first frame is the env's own render after the first evaluated reset
    env = PocMemory(render_mode="rgb_array")
    env.reset(seed=10_000)
    np.testing.assert_array_equal(frames[0], env.render())
    assert not list(out.parent.glob(".*partial*"))


def test_an_existing_file_is_overwritten_and_one_episode_is_the_default(
    poc_checkpoint, tmp_path, capsys
):
    out = tmp_path / "poc.GIF"
    out.write_bytes(b"old")
    result = _eval(
        capsys, "--checkpoint", poc_checkpoint, "--episodes", "2", "--video", str(out),
        "--stochastic",
    )  # fmt: skip
    assert result["video_episodes"] == 1 and result["video_fps"] == 4  # PocMemory's render_fps
    assert isinstance(result["video_fps"], int)
    assert len(_gif_frames(out)[0]) == result["video_lengths"][0] + 1


def test_a_failed_recording_keeps_the_old_file(poc_checkpoint, tmp_path, capsys, monkeypatch):
    out = tmp_path / "poc.gif"
    out.write_bytes(b"old")

    def failing(agent, env, writer, **kwargs):
        env.reset(seed=0)
        writer.add(render_frame(env, POC_MEMORY_ID))
        raise EnvError("env 'rppo_td/PocMemory-v0': step() raised RuntimeError: broken")

    monkeypatch.setattr(_evaluate, "record_agent", failing)
    err = _refused(capsys, "--checkpoint", poc_checkpoint, "--episodes", "1", "--video", str(out))
    assert "step() raised RuntimeError: broken" in err
    assert out.read_bytes() == b"old" and sorted(tmp_path.iterdir()) == [out]


def test_mp4_has_every_frame(poc_checkpoint, tmp_path, capsys):
    imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg")
    out = tmp_path / "poc.mp4"
    result = _eval(
        capsys, "--checkpoint", poc_checkpoint, "--episodes", "2", "--video", str(out),
        "--video-episodes", "2",
    )  # fmt: skip
    frames = sum(n + 1 for n in result["video_lengths"])
    assert result["video_frames"] == frames
    assert imageio_ffmpeg.count_frames_and_secs(str(out)) == (frames, frames / 4)
    # read_frames leaves ffmpeg's pipes to the garbage collector
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        reader = imageio_ffmpeg.read_frames(str(out))
        meta = next(reader)
        first = np.frombuffer(next(reader), dtype=np.uint8).reshape(96, 384, 3)
        reader.close()
        del reader
        gc.collect()
    assert meta["size"] == (384, 96) and meta["fps"] == 4
    env = PocMemory(render_mode="rgb_array")
    env.reset(seed=10_000)
    assert np.abs(first.astype(int) - env.render()).mean() < 8  # H.264 is lossy


def test_masked_cartpole_renders_the_full_env(tmp_path, capsys):
    pytest.importorskip("pygame")
    checkpoint = _train(tmp_path / "cartpole", "rppo_td/CartPoleNoVel-v1")
    out = tmp_path / "cartpole.gif"
    result = _eval(capsys, "--checkpoint", checkpoint, "--episodes", "1", "--video", str(out))
    steps = result["video_lengths"][0]
    assert result["video_frames"] == steps + 1 and result["video_fps"] == 50  # CartPole's
    frames, durations = _gif_frames(out)
    # a GIF merges a frame into the one before where they are identical (a cart that moved
    # less than a pixel), adding up their time: 20 ms a frame, the last held for 1 s
    assert 2 <= len(frames) <= steps + 1 and sum(durations) == 20 * steps + 1000
    assert frames[0].shape == (400, 600, 3)  # the full CartPole, not the masked observation


def test_refusals_before_anything_runs(poc_checkpoint, tmp_path, capsys, monkeypatch):
    def refused(*argv: str) -> str:
        return _refused(capsys, "--checkpoint", poc_checkpoint, *argv)

    assert "the suffix must be .gif or .mp4" in refused("--video", str(tmp_path / "x.avi"))
    assert "suffix must be .gif or .mp4" in refused("--video", str(tmp_path / "x"))
    assert "got no suffix" in refused("--video", str(tmp_path / "x"))
    hidden = refused("--video", str(tmp_path / ".gif"))  # a hidden file's name: said so
    assert "got no suffix ('.gif' is a hidden file's whole name; give a name before it)" in hidden
    assert "--video is empty" in refused("--video", "")
    (tmp_path / "folder.gif").mkdir()
    assert "is a directory" in refused("--video", str(tmp_path / "folder.gif"))
    assert "is a directory" in refused("--video", str(tmp_path))  # no suffix: a directory first
    (tmp_path / "file").write_text("")
    assert "(not a directory)" in refused("--video", str(tmp_path / "file" / "x.gif"))
    # a directory that refuses files, whatever its mode bits say (root passes os.access on
    # /sys): the evaluation ran first, then the write failed with ffmpeg's broken pipe
    import os
    from unittest import mock

    with mock.patch("tempfile.TemporaryFile", side_effect=PermissionError(13, "Permission denied")):
        err = refused("--video", str(tmp_path / "x.gif"))
    assert f"cannot create the file under {str(tmp_path)!r} (Permission denied)" in err
    assert os.access(tmp_path, os.W_OK)
    assert "--video-episodes needs --video PATH" in refused("--video-episodes", "2")
    assert "--fps needs --video PATH" in refused("--fps", "10")
    gif = str(tmp_path / "x.gif")
    err = refused("--episodes", "2", "--video", gif, "--video-episodes", "3")
    assert "--video-episodes must be in [1, --episodes = 2]" in err
    for bad in ("0", "-2", "nan", "inf"):
        assert "--fps must be a positive number" in refused("--video", gif, "--fps", bad)
    assert "--fps must be in [0.002, 50] for a .gif, got 60" in refused(
        "--video", gif, "--fps", "60"
    )
    # a GIF frame lasts at most 655.35 s (Pillow's OverflowError after the whole evaluation)
    assert "--fps must be in [0.002, 50] for a .gif" in refused("--video", gif, "--fps", "0.001")
    mp4 = str(tmp_path / "x.mp4")  # ffmpeg wrote 1e9 fps as 1001k, and 1e-6 fps unreadable
    for bad in ("1e9", "1e-6"):
        assert "--fps must be in [0.001, 1000] for a .mp4" in refused("--video", mp4, "--fps", bad)
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)
    err = refused("--video", str(tmp_path / "x.mp4"))
    assert "needs imageio-ffmpeg: pip install 'rppo_td[video]'" in err
    assert not list(tmp_path.glob("x*"))


class _HumanOnly(PocMemory):
    metadata = {"render_modes": ["human"]}  # noqa: RUF012


class _NoRenderMode(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, dtype=np.float32), {}

    def step(self, action):
        return np.zeros(1, dtype=np.float32), 0.0, True, False, {}


class _DeclaredNoRenderMode(_NoRenderMode):
    metadata = {"render_modes": ["rgb_array"]}  # noqa: RUF012  (but __init__ takes none)


class _BadFrames(PocMemory):
    def render(self):
        return np.zeros((4, 4), dtype=np.float32)


for _name, _entry in (
    ("video_test/HumanOnly-v0", _HumanOnly),
    ("video_test/NoRenderMode-v0", _NoRenderMode),
    ("video_test/BadFrames-v0", _BadFrames),
    ("video_test/DeclaredNoRenderMode-v0", _DeclaredNoRenderMode),
):
    if _name not in gym.registry:
        gym.register(id=_name, entry_point=_entry)


def test_envs_that_cannot_render_frames_are_named():
    with pytest.raises(ValueError, match=r"HumanOnly-v0.*render modes are \['human'\]"):
        make_render_env("video_test/HumanOnly-v0")
    with pytest.raises(ValueError, match=r"NoRenderMode-v0.*it has no render modes"):
        make_render_env("video_test/NoRenderMode-v0")
    with pytest.raises(
        ValueError,
        match=r"modes are \['rgb_array'\] and its constructor takes no render_mode argument$",
    ):
        make_render_env("video_test/DeclaredNoRenderMode-v0")
    env = make_render_env("video_test/BadFrames-v0")
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"BadFrames-v0.*shape \(4, 4\).*\[H, W, 3\] uint8"):
        render_frame(env, "video_test/BadFrames-v0")


def test_an_env_without_its_render_package_names_the_install(monkeypatch):
    env = make_render_env("rppo_td/CartPoleNoVel-v1")
    env.reset(seed=0)
    monkeypatch.setitem(sys.modules, "pygame", None)
    with pytest.raises(ValueError, match=r"CartPoleNoVel-v1.*pip install 'rppo_td\[video\]'"):
        render_frame(env, "rppo_td/CartPoleNoVel-v1")


def test_a_frame_that_changes_size_and_a_writer_without_frames_are_refused(tmp_path):
    env = make_render_env(POC_MEMORY_ID)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"changed the frame size from \(10, 10, 3\)"):
        render_frame(env, POC_MEMORY_ID, (10, 10, 3))
    with pytest.raises(ValueError, match="no frames to write"):
        VideoWriter(check_video_path(tmp_path / "empty.gif"), fps=4).close()
    assert not list(tmp_path.iterdir())


def test_poc_memory_frames_show_the_state():
    env = PocMemory(render_mode="rgb_array")
    obs, _ = env.reset(seed=0)
    right = obs[2] > 0
    first = env.render()
    frames = [first]
    for _ in range(7):
        env.step(int(right))
        frames.append(env.render())
    assert len({f.tobytes() for f in frames}) == len(frames)  # no two frames alike
    # the lamps are lit while the flags are shown, off afterwards
    lamp = (17, 16 + 10 * 32 + 16) if right else (17, 16 + 16)
    assert tuple(frames[1][lamp]) != (228, 228, 228) and tuple(frames[2][lamp]) == (228,) * 3
    # the agent (blue) is in the centre cell, then at the paying end
    centre = (48, 16 + 5 * 32 + 16)
    end = (48, lamp[1])
    assert tuple(first[centre]) == (40, 80, 200) and tuple(frames[-1][end]) == (40, 80, 200)
    assert PocMemory().render() is None
    with pytest.raises(ValueError, match="render_mode must be None or 'rgb_array'"):
        PocMemory(render_mode="human")


def test_an_env_whose_close_ends_the_others_still_records(poc_checkpoint, tmp_path, capsys):
    """Like memory-gym's pygame.quit(): closing any env invalidates every env made before."""
    from rppo_td.envs import PocMemory

    state = {"generation": 0}
    original_init, original_reset, original_close = (
        PocMemory.__init__,
        PocMemory.reset,
        PocMemory.close,
    )

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self._generation = state["generation"]

    def reset(self, *args, **kwargs):
        if self._generation != state["generation"]:
            raise RuntimeError("Surface is not initialized")
        return original_reset(self, *args, **kwargs)

    def close(self):
        state["generation"] += 1
        return original_close(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PocMemory, "__init__", init)
        patch.setattr(PocMemory, "reset", reset)
        patch.setattr(PocMemory, "close", close)
        out = _eval(capsys, "--checkpoint", poc_checkpoint, "--video", str(tmp_path / "a.gif"))
    assert out["video_returns"] == out["eval_returns"][:1]
    assert (tmp_path / "a.gif").is_file()


def test_an_mp4_that_ffmpeg_cannot_write_is_refused_by_name(tmp_path, monkeypatch):
    """ffmpeg failing to open its output (it exits; the pipe to it breaks): one-line error."""
    from rppo_td.train import _video

    class BrokenFfmpeg:
        def write_frames(self, *args, **kwargs):
            def frames():
                yield
                raise BrokenPipeError(32, "Broken pipe\n\nFFMPEG COMMAND:\nffmpeg -y ...")

            return frames()

    monkeypatch.setattr(_video, "_ffmpeg", BrokenFfmpeg)
    writer = VideoWriter(check_video_path(tmp_path / "out.mp4"), fps=4)
    message = r"^cannot write the video '.*out\.mp4': \[Errno 32\] Broken pipe$"
    with pytest.raises(ValueError, match=message):
        writer.add(np.zeros((8, 8, 3), dtype=np.uint8))
    assert not list(tmp_path.iterdir())


def test_an_mp4_that_ffmpeg_leaves_unfinished_is_refused_and_the_old_file_kept(
    tmp_path, monkeypatch
):
    """ffmpeg failing at the end (a full disk: no index written) exits with an error that
    imageio-ffmpeg does not read; the file is checked instead, and the old video stays."""
    pytest.importorskip("imageio_ffmpeg")  # the video extra, not the test one
    from rppo_td.train import _video

    path = tmp_path / "old.mp4"
    path.write_bytes(b"the old video")
    checked = _video.mp4_problem

    def full_disk(partial):
        whole = partial.read_bytes()
        partial.write_bytes(whole[: len(whole) - 100])  # the index cut short
        return checked(partial)

    monkeypatch.setattr(_video, "mp4_problem", full_disk)
    writer = VideoWriter(check_video_path(path), fps=4)
    for value in range(6):
        writer.add(np.full((8, 8, 3), 40 * value, dtype=np.uint8))
    with pytest.raises(ValueError, match=r"^cannot write the video '.*old\.mp4': ffmpeg did not"):
        writer.close()
    assert path.read_bytes() == b"the old video"
    assert [p.name for p in tmp_path.iterdir()] == ["old.mp4"]
    # a whole file passes, and every cut of it is found
    monkeypatch.setattr(_video, "mp4_problem", checked)
    writer = VideoWriter(check_video_path(tmp_path / "new.mp4"), fps=4)
    for value in range(6):
        writer.add(np.full((8, 8, 3), 40 * value, dtype=np.uint8))
    whole = writer.close().read_bytes()
    assert checked(tmp_path / "new.mp4") is None
    cut = tmp_path / "cut.mp4"
    for end in range(0, len(whole), 7):
        cut.write_bytes(whole[:end])
        assert checked(cut) is not None, end


def test_the_mp4_box_chain_check_without_ffmpeg(tmp_path):
    """mp4_problem on box chains built here (the test extra has no ffmpeg to write one)."""
    from rppo_td.train._video import mp4_problem

    def box(kind: bytes, payload: bytes = b"", wide: bool = False) -> bytes:
        if wide:  # size 1: the real size in the 8 bytes after the type
            return struct.pack(">I4sQ", 1, kind, 16 + len(payload)) + payload
        return struct.pack(">I4s", 8 + len(payload), kind) + payload

    whole = box(b"ftyp", b"isom") + box(b"mdat", b"x" * 40, wide=True) + box(b"moov", b"y" * 9)
    path = tmp_path / "v.mp4"
    path.write_bytes(whole)
    assert mp4_problem(path) is None
    for end in range(len(whole)):  # every cut is found
        path.write_bytes(whole[:end])
        assert mp4_problem(path) is not None, end
    path.write_bytes(box(b"ftyp") + box(b"mdat", b"x"))
    assert mp4_problem(path) == "no moov box"
    path.write_bytes(whole[:-1] + b"z" + b"extra")  # a box past the end of the file
    assert mp4_problem(path) is not None
    path.write_bytes(box(b"ftyp") + struct.pack(">I4s", 0, b"mdat") + b"rest" + box(b"moov"))
    assert mp4_problem(path) == "no moov box"  # size 0: the last box runs to the end


def test_gif_frames_keep_time_at_rates_that_are_not_whole_hundredths(tmp_path):
    """At 30 fps frames last 30 or 40 ms (a GIF stores hundredths): 30 frames take 1 s."""
    writer = VideoWriter(check_video_path(tmp_path / "clock.gif"), fps=30)
    for i in range(30):
        writer.add(np.full((4, 4, 3), 8 * i, dtype=np.uint8))
    _, durations = _gif_frames(writer.close())
    assert sum(durations) == 1000
    assert set(durations) == {30, 40}


def test_fractional_rates_are_kept(tmp_path):
    """A render_fps or --fps of 2.5 is 2.5 frames a second, not 2 or 3: each GIF frame lasts
    400 ms, and 7.5 fps keeps time over the film (133 or 134 ms, 15 frames in 2 s)."""

    class Env(gym.Env):
        metadata: dict = {}  # noqa: RUF012 (gymnasium's)

    env = Env()
    for given, mp4, gif in (
        (2.5, 2.5, 2.5), (120.0, 120.0, 50), (None, 30, 30), ("x", 30, 30), (-1, 30, 30),
        (float("nan"), 30, 30), (1e9, 1000, 50), (1e-4, 0.001, 0.002),
    ):  # fmt: skip
        env.metadata = {"render_fps": given}
        got = (default_fps(env, ".mp4"), default_fps(env, ".gif"))
        assert got == (mp4, gif), given
        # a whole rate is an int (written to the JSON as 50, not 50.0)
        assert all(isinstance(x, int) == float(x).is_integer() for x in got), got
    for fps, frames, each in ((2.5, 4, {400}), (7.5, 15, {130, 140})):
        writer = VideoWriter(check_video_path(tmp_path / f"{fps}.gif"), fps=fps)
        for i in range(frames):
            writer.add(np.full((4, 4, 3), 16 * i, dtype=np.uint8))
        _, durations = _gif_frames(writer.close())
        assert sum(durations) == round(1000 * frames / fps)
        assert set(durations) <= each
    for bad in (0, -1.0, float("nan"), float("inf"), True, "4", 0.0015):
        with pytest.raises(ValueError, match=r"fps must be (a|in)"):
            VideoWriter(check_video_path(tmp_path / "bad.gif"), fps=bad)
    writer = VideoWriter(check_video_path(tmp_path / "slowest.gif"), fps=0.002)
    writer.add(np.zeros((4, 4, 3), dtype=np.uint8))
    assert _gif_frames(writer.close())[1] == [500_000]  # 500 s, within a GIF's 655.35 s


def test_an_mp4_keeps_a_fractional_rate(tmp_path):
    imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg")
    writer = VideoWriter(check_video_path(tmp_path / "slow.mp4"), fps=2.5)
    for i in range(5):
        writer.add(np.full((16, 16, 3), 40 * i, dtype=np.uint8))
    out = writer.close()
    assert imageio_ffmpeg.count_frames_and_secs(str(out)) == (5, 2.0)


def test_an_empty_checkpoint_path_is_refused_by_name(capsys):
    err = _refused(capsys, "--checkpoint", "")
    assert "--checkpoint must name a run directory or its checkpoint.pt, got ''" in err


class _RendersRGBA:
    """An env stand-in whose ``render()`` gives a ``(4, 6, 4)`` RGBA frame: red 10, opaque."""

    def render(self):
        frame = np.zeros((4, 6, 4), dtype=np.uint8)
        frame[..., 0], frame[..., 3] = 10, 255
        return frame


def test_an_rgba_frame_loses_its_alpha():
    # 4 bytes a pixel fed to the MP4 writer's rgb24 stream garble the video
    frame = render_frame(_RendersRGBA(), "fake")
    assert frame.shape == (4, 6, 3)
    assert (frame[..., 0] == 10).all() and (frame[..., 1:] == 0).all()


def test_odd_sided_mp4_frames_are_padded_with_their_edges(tmp_path):
    # H.264 wants even sides: without the padding imageio stretched the frame instead
    imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg")
    frame = np.zeros((17, 15, 3), dtype=np.uint8)
    frame[-1], frame[:, -1] = 255, 255  # last row and last column white
    writer = VideoWriter(check_video_path(tmp_path / "odd.mp4"), fps=4)
    for _ in range(3):
        writer.add(frame)
    out = writer.close()
    with warnings.catch_warnings():  # read_frames leaves ffmpeg's pipes to the collector
        warnings.simplefilter("ignore", ResourceWarning)
        reader = imageio_ffmpeg.read_frames(str(out))
        meta = next(reader)
        got = np.frombuffer(next(reader), dtype=np.uint8).reshape(18, 16, 3).astype(int)
        reader.close()
        del reader
        gc.collect()
    assert meta["size"] == (16, 18)
    assert got[:15, :13].mean() < 8  # H.264 is lossy
    assert np.abs(got[16:] - 255).mean() < 24 and np.abs(got[:, 14:] - 255).mean() < 24


@pytest.mark.parametrize("suffix", [".gif", ".mp4"])
def test_a_video_name_of_up_to_255_bytes_is_written(poc_checkpoint, tmp_path, capsys, suffix):
    # the partial file, .<stem>.partial<suffix>, passed the 255-byte limit for names of 247
    # bytes or more: a traceback, and its cleanup raised the same error again
    out = tmp_path / ("v" * (255 - len(suffix)) + suffix)
    result = _eval(capsys, "--checkpoint", poc_checkpoint, "--episodes", "1", "--video", str(out))
    assert result["video_episodes"] == 1 and out.stat().st_size > 0
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no partial file left


def test_every_name_length_up_to_255_bytes_writes_its_video(tmp_path):
    # the partial file's name passes 255 bytes from a video name of 247 bytes (.gif): each
    # length about that bound is written, a multi-byte name too, and no partial file is left
    names = ["v" * (n - 4) + ".gif" for n in range(240, 256)] + ["é" * 125 + "v.gif"]
    for name in names:
        assert len(name.encode()) <= 255
        writer = VideoWriter(check_video_path(tmp_path / name), fps=4)
        writer.add(np.zeros((4, 4, 3), dtype=np.uint8))
        assert writer.close() == tmp_path / name
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)


def test_long_video_names_get_partial_files_of_their_own():
    # two videos written at once into one folder must not share a partial file (an mp4 is
    # streamed into it frame by frame)
    from pathlib import Path

    from rppo_td.train._video import _partial_path

    partials = {_partial_path(Path("out") / (c * 251 + ".mp4")) for c in "abc"}
    assert len(partials) == 3
    assert all(len(p.name.encode()) <= 255 and p.parent == Path("out") for p in partials)
    assert _partial_path(Path("out/v.gif")) == Path("out/.v.partial.gif")


def test_a_failed_cleanup_does_not_hide_the_error(tmp_path, monkeypatch):
    # the partial file's removal raising again named the cleanup's error, not the write's
    from rppo_td.train import _video

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    def refused(self, missing_ok=False):
        raise PermissionError(13, "Permission denied")

    writer = VideoWriter(check_video_path(tmp_path / "out.gif"), fps=4)
    writer.add(np.zeros((4, 4, 3), dtype=np.uint8))
    monkeypatch.setattr(_video.os, "replace", full_disk)
    monkeypatch.setattr(_video.Path, "unlink", refused)
    with pytest.raises(ValueError, match=r"out\.gif': \[Errno 28\] No space left on device$"):
        writer.close()
