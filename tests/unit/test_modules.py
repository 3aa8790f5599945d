"""The agent's modules: encoders per space, heads per action space, step and recurrent mode."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from tensordict.nn import TensorDictSequential
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import set_recurrent_mode

from rppo_td.modules import (
    RecurrentActor,
    RecurrentActorCritic,
    RecurrentCritic,
    RecurrentPolicy,
    observation_leaves,
    observation_to_tensordict,
    recurrent_state_primer,
)

BOX = gym.spaces.Box(-1.0, 1.0, (3,), dtype=np.float32)
SPACES = {
    "box": BOX,
    "image_hwc": gym.spaces.Box(0, 255, (8, 8, 3), dtype=np.uint8),
    "image_chw": gym.spaces.Box(0, 255, (1, 10, 6), dtype=np.uint8),
    "image_gray": gym.spaces.Box(0, 255, (7, 9), dtype=np.uint8),
    "discrete": gym.spaces.Discrete(4),
    "multi_discrete": gym.spaces.MultiDiscrete([2, 3]),
    "tuple": gym.spaces.Tuple((BOX, gym.spaces.Discrete(3))),
    "dict": gym.spaces.Dict({"pos": BOX, "img": gym.spaces.Box(0, 255, (6, 6, 1), dtype=np.uint8)}),
}
ACTIONS = {
    "discrete": gym.spaces.Discrete(3),
    "multi_discrete": gym.spaces.MultiDiscrete([2, 4, 3]),
    "box": gym.spaces.Box(-2.0, 2.0, (2,), dtype=np.float32),
}


def _batch(space: gym.Space, shape: tuple[int, ...]) -> TensorDict:
    space.seed(0)
    flat = int(np.prod(shape))
    samples = [space.sample() for _ in range(flat)]
    obs = gym.vector.utils.concatenate(
        space, samples, gym.vector.utils.create_empty_array(space, flat)
    )
    td = observation_to_tensordict(obs, observation_leaves(space), (flat,))
    return td.reshape(shape)


def _step_rollout(net: RecurrentActorCritic, obs: TensorDict, is_init: torch.Tensor):
    """Runs actor and critic step by step over ``[W, T]`` as a collector does; the rollout.

    States entering a step are stored (zero where ``is_init``), the states after it carried.
    """
    policy = TensorDictSequential(RecurrentActor(net), RecurrentCritic(net))
    w, t = is_init.shape
    carry: dict[str, torch.Tensor] = {
        key: torch.randn(w, *net.state_shape) for key in net.state_keys
    }
    steps = []
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
        for i in range(t):
            td = obs[:, i].clone()
            td.set("is_init", is_init[:, i : i + 1])
            for key, value in carry.items():
                td.set(key, torch.where(is_init[:, i].view(-1, 1, 1), 0.0, value))
            policy(td)
            carry = {key: td.get(("next", key)) for key in net.state_keys}
            steps.append(td.exclude("next"))
    return torch.stack(steps, dim=1)


@pytest.mark.parametrize("obs_name", sorted(SPACES))
@pytest.mark.parametrize("act_name", sorted(ACTIONS))
@pytest.mark.parametrize("recurrence", ["lstm", "gru", "none"])
def test_step_and_recurrent_shapes(obs_name, act_name, recurrence):
    obs_space, act_space = SPACES[obs_name], ACTIONS[act_name]
    net = RecurrentActorCritic(obs_space, act_space, recurrence=recurrence, hidden_size=8)
    actor, critic = RecurrentActor(net), RecurrentCritic(net)
    w, length = 3, 4
    td = _batch(obs_space, (w,))
    td.set("is_init", torch.ones(w, 1, dtype=torch.bool))
    with set_exploration_type(ExplorationType.RANDOM):
        critic(actor(td))
    action_shape = (w,) if act_name == "discrete" else (w, act_space.shape[0])
    assert tuple(td["action"].shape) == action_shape
    assert td["action_log_prob"].shape == (w,)
    assert td["state_value"].shape == (w, 1)
    expected_keys = {"lstm": 4, "gru": 2, "none": 0}[recurrence]
    assert len(net.state_keys) == expected_keys
    for key in net.state_keys:
        assert td["next", key].shape == (w, 1, 8)
    seq = _batch(obs_space, (w, length))
    seq.set("is_init", torch.zeros(w, length, 1, dtype=torch.bool))
    seq.set("action", torch.stack([td["action"]] * length, dim=1))
    with set_recurrent_mode(True):
        dist = actor.get_dist(seq)
        value = critic(seq.clone())["state_value"]
    log_prob = dist.log_prob(seq["action"])
    assert log_prob.shape == dist.entropy().shape == (w, length)
    assert value.shape == (w, length, 1)
    (log_prob.sum() + value.sum()).backward()


@settings(max_examples=25, deadline=None)
@given(
    recurrence=st.sampled_from(["lstm", "gru"]),
    shared=st.booleans(),
    skip=st.booleans(),
    workers=st.integers(1, 3),
    steps=st.integers(1, 7),
    data=st.data(),
)
def test_recurrent_mode_equals_the_step_by_step_run(recurrence, shared, skip, workers, steps, data):
    # any is_init pattern: a row restarts from the stored state where is_init is True
    torch.manual_seed(0)
    net = RecurrentActorCritic(
        BOX,
        ACTIONS["discrete"],
        recurrence=recurrence,
        hidden_size=8,
        num_layers=2,
        shared_critic=shared,
        encoder_skip=skip,
    )
    flags = data.draw(st.lists(st.booleans(), min_size=workers * steps, max_size=workers * steps))
    is_init = torch.tensor(flags).view(workers, steps, 1)
    rollout = _step_rollout(net, _batch(BOX, (workers, steps)), is_init[..., 0])
    start = data.draw(st.integers(0, steps - 1))
    part = rollout[:, start:]  # a sequence may start anywhere: from its stored state
    with set_recurrent_mode(True), torch.no_grad():
        log_prob = RecurrentActor(net).get_dist(part).log_prob(part["action"])
        value = RecurrentCritic(net)(part.clone())["state_value"]
    torch.testing.assert_close(log_prob, part["action_log_prob"])
    torch.testing.assert_close(value, part["state_value"])


def test_is_init_resets_the_state():
    net = RecurrentActorCritic(BOX, ACTIONS["discrete"], hidden_size=8)
    obs = _batch(BOX, (2,))
    random_state = {key: torch.randn(2, *net.state_shape) for key in net.state_keys}
    reset = obs.clone().update({"is_init": torch.ones(2, 1, dtype=torch.bool), **random_state})
    zero = obs.clone().set("is_init", torch.zeros(2, 1, dtype=torch.bool))  # missing: zero
    for td in (reset, zero):
        RecurrentCritic(net)(RecurrentActor(net)(td))
    for key in net.state_keys:
        torch.testing.assert_close(reset["next", key], zero["next", key])


def test_deterministic_action_is_the_mode():
    net = RecurrentActorCritic(BOX, ACTIONS["box"], hidden_size=8)
    td = _batch(BOX, (4,)).set("is_init", torch.ones(4, 1, dtype=torch.bool))
    actor = RecurrentActor(net)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        a = actor(td.clone())["action"]
    b = actor(td.clone())["action"]  # TorchRL's default outside any exploration type
    with set_exploration_type(ExplorationType.RANDOM):
        c = actor(td.clone())["action"]
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, actor.get_dist(td).mode)
    assert not torch.equal(a, c)


def test_modules_refuse_missing_or_misshapen_inputs():
    net = RecurrentActorCritic(BOX, ACTIONS["discrete"], hidden_size=8)
    td = _batch(BOX, (2,))
    with pytest.raises(KeyError, match=r"is_init.*InitTracker"):
        RecurrentActor(net)(td.clone())
    td.set("is_init", torch.ones(2, 1, dtype=torch.bool))
    bad = td.clone().set("recurrent_state_h", torch.zeros(2, 1, 5))
    with pytest.raises(ValueError, match=r"'recurrent_state_h' must have shape \[2, 1, 8\]"):
        RecurrentActor(net)(bad)
    with pytest.raises(ValueError, match=r"is_init.*bool"):
        RecurrentActor(net)(td.clone().set("is_init", torch.ones(2, 1)))
    with set_recurrent_mode(True), pytest.raises(ValueError, match="time dimension"):
        RecurrentActor(net)(td[0])
    with pytest.raises(TypeError, match="RecurrentActorCritic"):
        RecurrentActor(torch.nn.Linear(2, 2))  # type: ignore[arg-type]
    # TorchRL's GymEnv names an image observation "pixels": a tensordict traceback was all
    image = gym.spaces.Box(0, 255, (8, 8, 3), dtype=np.uint8)
    pixels = TensorDict(
        {
            "pixels": torch.zeros(2, 8, 8, 3, dtype=torch.uint8),
            "is_init": torch.ones(2, 1, dtype=torch.bool),
        },
        batch_size=[2],
    )
    with pytest.raises(KeyError, match=r"lacks \['observation'\].*RenameTransform"):
        RecurrentActor(RecurrentActorCritic(image, ACTIONS["discrete"], hidden_size=8))(pixels)


def test_keys_and_primer():
    net = RecurrentActorCritic(BOX, ACTIONS["discrete"], hidden_size=8)
    actor, critic = RecurrentActor(net), RecurrentCritic(net)
    assert actor.in_keys == ["observation", "is_init", "recurrent_state_h", "recurrent_state_c"]
    assert critic.out_keys == [
        "state_value",
        ("next", "critic_recurrent_state_h"),
        ("next", "critic_recurrent_state_c"),
    ]
    shared = RecurrentActorCritic(BOX, ACTIONS["discrete"], hidden_size=8, shared_critic=True)
    assert shared.critic_state_keys == shared.actor_state_keys == shared.state_keys
    primer = recurrent_state_primer(net)
    assert set(primer.primers.keys()) == set(net.state_keys)
    with pytest.raises(ValueError, match="no recurrent state"):
        recurrent_state_primer(RecurrentActorCritic(BOX, ACTIONS["discrete"], recurrence="none"))


def test_observation_leaves_keys():
    keys = [key for key, _ in observation_leaves(SPACES["tuple"])]
    assert keys == [("observation", "0"), ("observation", "1")]
    assert [key for key, _ in observation_leaves(BOX)] == ["observation"]


@pytest.mark.parametrize(
    ("space", "match"),
    [
        (gym.spaces.Text(5), "observation space"),
        (gym.spaces.Discrete(3, start=1), "does not start at 0.*make_env shifts"),
        (gym.spaces.MultiDiscrete([2, 3], start=[0, -1]), "does not start at 0"),
        (gym.spaces.MultiDiscrete([[2, 3], [3, 2]]), "must be 1-D.*make_env flattens"),
        (gym.spaces.Dict({}), "no leaves"),
        (gym.spaces.Box(0, 1, (0,)), "has no entries"),
    ],
)
def test_unsupported_observation_space(space, match):
    with pytest.raises(ValueError, match=match):
        RecurrentActorCritic(space, ACTIONS["discrete"])


@pytest.mark.parametrize(
    ("space", "match"),
    [
        (gym.spaces.Box(-1, 1, (2, 2)), "not supported.*make_env"),
        (gym.spaces.Discrete(3, start=1), "starts at 1.*make_env"),
        (gym.spaces.MultiDiscrete([3, 2], start=[1, -2]), r"start \[1, -2\].*make_env"),
        (gym.spaces.MultiBinary(3), "not supported.*make_env"),
        (gym.spaces.Box(0, 3, (2,), dtype=np.int64), "must be floating point"),
        (gym.spaces.Box(-1, 1, (0,)), "no entries"),
    ],
)
def test_unsupported_action_space(space, match):
    # make_env converts the convertible ones (tests/unit/test_spaces.py); built directly,
    # the agent refuses them instead of sampling actions outside the space
    with pytest.raises(ValueError, match=f"action space.*{match}"):
        RecurrentActorCritic(BOX, space)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"recurrence": "rnn"}, "recurrence"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"num_layers": 0}, "num_layers"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RecurrentActorCritic(BOX, ACTIONS["discrete"], **kwargs)


@given(
    center=st.booleans(),
    scale=st.floats(0.01, 100.0),
    offset=st.floats(-100.0, 100.0),
    split=st.integers(1, 49),
    seed=st.integers(0, 2**16),
)
@example(center=True, scale=0.015625, offset=32.0, split=1, seed=0)  # a spread of 5e-4 x the offset
@settings(max_examples=30, deadline=None)
def test_observation_normalizer_running_statistics(center, scale, offset, split, seed):
    """Chunked updates give the statistics of all the data; the float leaf is divided by its
    root mean square about zero (zero stays zero), or with ``center`` standardised; the
    Discrete leaf passes through and the input is left as it was."""
    from rppo_td.modules._normalizer import ObservationNormalizer

    norm = ObservationNormalizer(observation_leaves(SPACES["tuple"]), center=center)
    assert norm.keys == [("observation", "0")]  # the Discrete leaf passes through
    generator = torch.Generator().manual_seed(seed)
    data = torch.randn(50, 3, dtype=torch.float64, generator=generator) * scale + offset
    for chunk in data.split([split, 50 - split]):
        norm.update(TensorDict({"observation": {"0": chunk.float()}}, [chunk.shape[0]]))
    mean, var = data.float().double().mean(0), data.float().double().var(0, unbiased=False)
    torch.testing.assert_close(norm.mean_0, mean, rtol=1e-6, atol=1e-6 * abs(offset))
    torch.testing.assert_close(norm.var_0, var, rtol=1e-5, atol=1e-5 * offset**2)
    x = torch.cat((data.float(), torch.zeros(1, 3)))
    td = TensorDict({"observation": {"0": x, "1": torch.zeros(51, dtype=torch.long)}}, [51])
    out = norm(td)
    atol = 1e-4
    if center:
        expected = (x.double() - mean) / (var + 1e-8).sqrt()
        # the shift is the mean in float32: off by up to one float32 spacing of the mean,
        # which the scale magnifies where the spread is small against the offset
        spacing = mean.abs() * torch.finfo(torch.float32).eps
        atol += float((spacing / (var + 1e-8).sqrt()).max())
    else:
        expected = x.double() / (mean.square() + var + 1e-8).sqrt()
        assert (out["observation", "0"][-1] == 0).all()  # the env's zero stays zero
    torch.testing.assert_close(
        out["observation", "0"], expected.clamp(-10, 10).float(), rtol=1e-4, atol=atol
    )
    assert out["observation", "1"] is td["observation", "1"]
    assert td["observation", "0"].dtype == torch.float32  # input left as it was
    assert torch.equal(td["observation", "0"], x)


@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.int64])
@pytest.mark.parametrize("center", [False, True])
def test_integer_vectors_are_normalised_as_float_ones_are(dtype, center):
    # an integer Box vector (counts in [0, 1000]) reached the network raw
    from rppo_td.modules._normalizer import ObservationNormalizer

    space = gym.spaces.Box(0, 200, (3,), dtype)
    as_float = gym.spaces.Box(0, 200, (3,), np.float32)
    ints = ObservationNormalizer(observation_leaves(space), center=center)
    floats = ObservationNormalizer(observation_leaves(as_float), center=center)
    assert ints.keys == ["observation"]
    data = torch.randint(0, 200, (64, 3), generator=torch.Generator().manual_seed(0))
    for norm, x in ((ints, data.to(getattr(torch, np.dtype(dtype).name))), (floats, data.float())):
        norm.update(TensorDict({"observation": x}, [64]))
    x = data.to(getattr(torch, np.dtype(dtype).name))
    out = ints(TensorDict({"observation": x}, [64]))["observation"]
    assert out.dtype == torch.float32
    torch.testing.assert_close(
        out, floats(TensorDict({"observation": data.float()}, [64]))["observation"]
    )


@pytest.mark.parametrize("shared", [True, False])
def test_policy_equals_actor_then_critic(shared):
    net = RecurrentActorCritic(BOX, ACTIONS["box"], hidden_size=8, shared_critic=shared)
    td = _batch(BOX, (2, 3))  # any batch shape
    td.set("is_init", torch.tensor([[True, False, False], [False, True, False]]).unsqueeze(-1))
    for key in net.state_keys:
        td.set(key, torch.randn(2, 3, *net.state_shape))
    fused = RecurrentPolicy(net)
    assert set(fused.in_keys) == set(RecurrentActor(net).in_keys + RecurrentCritic(net).in_keys)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        one = fused(td.clone())
        two = TensorDictSequential(RecurrentActor(net), RecurrentCritic(net))(td.clone())
    assert set(one.keys(True, True)) == set(two.keys(True, True))
    for key in one.keys(True, True):
        torch.testing.assert_close(one[key], two[key])


def test_large_images_take_the_nature_cnn_either_channel_order():
    from rppo_td.modules._encoders import _ImageEncoder

    last = _ImageEncoder(
        gym.spaces.Box(0, 255, (84, 84, 3), dtype=np.uint8), 32, channels_last=True
    )
    first = _ImageEncoder(
        gym.spaces.Box(0, 255, (3, 84, 84), dtype=np.uint8), 32, channels_last=False
    )
    first.load_state_dict(last.state_dict())  # the same layers, whichever order
    assert last.conv[0].kernel_size == (8, 8) and last.conv[0].stride == (4, 4)
    image = torch.randint(0, 256, (2, 5, 84, 84, 3), dtype=torch.uint8)
    out = last(image)
    assert out.shape == (2, 5, 32)
    torch.testing.assert_close(first(image.permute(0, 1, 4, 2, 3)), out)
    small = _ImageEncoder(
        gym.spaces.Box(0, 255, (12, 12, 3), dtype=np.uint8), 32, channels_last=True
    )
    assert small.conv[0].kernel_size == (3, 3)


@pytest.mark.parametrize(
    ("low", "high", "shape", "last"),
    [
        (0, 1, (8, 8, 3), True),  # a binary image: read as 0 and 1, not 0 and 1/255
        (0, 10, (3, 6, 6), False),
        (16, 235, (7, 9), True),  # grayscale, video range
    ],
)
def test_pixels_are_scaled_by_the_boxs_bounds(low, high, shape, last):
    """The conv sees ``(x - low) / (high - low)``: what a [0, 255] image's ``x / 255`` is."""
    from rppo_td.modules._encoders import _ImageEncoder

    space = gym.spaces.Box(low, high, shape, dtype=np.uint8)
    encoder = _ImageEncoder(space, 16, channels_last=last)
    plain = _ImageEncoder(gym.spaces.Box(0, 255, shape, dtype=np.uint8), 16, channels_last=last)
    plain.load_state_dict(encoder.state_dict())  # bounds are not parameters: old runs load
    seen = []
    encoder.conv[0].register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    image = torch.randint(low, high + 1, (2, 3, *shape), dtype=torch.uint8)
    image[0, 0] = high
    encoder(image)
    expected = (image.float() - low) / (high - low)
    if len(shape) == 2:
        expected = expected.unsqueeze(-1)
    if last:
        expected = expected.movedim(-1, -3)
    torch.testing.assert_close(seen[0], expected.reshape(seen[0].shape))
    assert seen[0].max() == 1.0 and seen[0].min() >= 0.0
    # the usual [0, 255] box: exactly x / 255 as before
    seen.clear()
    plain.conv[0].register_forward_pre_hook(lambda _, args: seen.append(args[0]))
    plain(image)
    want = image.float() / 255.0
    if len(shape) == 2:
        want = want.unsqueeze(-1)
    assert torch.equal(seen[0], (want.movedim(-1, -3) if last else want).reshape(seen[0].shape))


def test_grayscale_images_are_one_channel_images_and_other_pixel_boxes_are_refused():
    """``[H, W]`` uint8 (AtariPreprocessing's output) is ``[H, W, 1]``; other uint8 boxes of
    3+ dims are refused by name rather than fed to an MLP as raw 0-255 values."""
    from rppo_td.modules._encoders import _ImageEncoder

    gray = _ImageEncoder(gym.spaces.Box(0, 255, (84, 84), dtype=np.uint8), 16, channels_last=True)
    one = _ImageEncoder(gym.spaces.Box(0, 255, (84, 84, 1), dtype=np.uint8), 16, channels_last=True)
    one.load_state_dict(gray.state_dict())
    image = torch.randint(0, 256, (3, 2, 84, 84), dtype=torch.uint8)
    torch.testing.assert_close(gray(image), one(image.unsqueeze(-1)))
    assert gray(image).shape == (3, 2, 16)
    for shape in [(84, 84, 2), (2, 84, 84), (4, 84, 84, 3)]:
        space = gym.spaces.Dict({"frames": gym.spaces.Box(0, 255, shape, dtype=np.uint8)})
        with pytest.raises(ValueError, match=r"'frames'\).*not an image this library reads"):
            observation_leaves(space)
    # a uint8 vector stays a vector
    assert observation_leaves(gym.spaces.Box(0, 1, (5,), dtype=np.uint8))


@given(
    channels=st.sampled_from([1, 3, 4]),
    height=st.integers(1, 9),
    width=st.integers(1, 9),
    first=st.booleans(),
    layout=st.sampled_from(["auto", "given"]),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=60, deadline=None)
def test_images_are_read_along_their_channel_axis_or_refused_when_it_is_ambiguous(
    channels, height, width, first, layout, seed
):
    """An image's features do not depend on its layout: ``[C, H, W]`` and ``[H, W, C]`` with
    the same pixels give the same output. Under ``"auto"`` a shape whose two ends could both
    be channels (``[3, 4, 4]``) is refused, naming ``image_layout``, never guessed."""
    from rppo_td.modules._encoders import ObservationEncoder

    hwc = (height, width, channels)
    shape = (channels, height, width) if first else hwc
    given = "channels_first" if first else "channels_last"
    ambiguous = shape[0] in (1, 3, 4) and shape[-1] in (1, 3, 4)
    space = gym.spaces.Box(0, 255, shape, dtype=np.uint8)
    if layout == "auto" and ambiguous:
        with pytest.raises(ValueError, match=r"'observation'.*reads either way.*image_layout"):
            ObservationEncoder(observation_leaves(space), hidden_size=8)
        return
    torch.manual_seed(seed)
    enc = ObservationEncoder(
        observation_leaves(space), hidden_size=8, image_layout=layout if layout == "auto" else given
    )
    # the reference: the same weights on the [H, W, C] reading of the same pixels
    ref = ObservationEncoder(
        observation_leaves(gym.spaces.Box(0, 255, hwc, dtype=np.uint8)),
        hidden_size=8,
        image_layout="channels_last",
    )
    ref.load_state_dict(enc.state_dict())
    pixels = torch.randint(
        0, 256, (2, *hwc), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )
    image = pixels.permute(0, 3, 1, 2) if first else pixels
    out = enc(TensorDict({"observation": image}, batch_size=[2]))
    torch.testing.assert_close(out, ref(TensorDict({"observation": pixels}, batch_size=[2])))


def test_a_given_image_layout_is_checked():
    from rppo_td.modules._encoders import ObservationEncoder

    space = gym.spaces.Box(0, 255, (84, 84, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match=r"image_layout='channels_first'.*C = 84.*1, 3 or 4"):
        ObservationEncoder(observation_leaves(space), hidden_size=8, image_layout="channels_first")
    with pytest.raises(ValueError, match=r"image_layout must be one of.*got 'nchw'"):
        RecurrentActorCritic(BOX, ACTIONS["discrete"], hidden_size=8, image_layout="nchw")


@given(head_layers=st.integers(0, 3), seed=st.integers(0, 2**16))
@settings(max_examples=15, deadline=None)
def test_the_policy_reads_the_core_through_head_layers_relu_layers(head_layers, seed):
    """The policy's logits are a nonlinear function of the core's output for head_layers >= 1.

    A read-out affine in the core's output cannot compare a remembered object with the one in
    view (an XOR), which MiniGrid Memory needs; the value head is as deep as the policy head.
    """
    torch.manual_seed(seed)
    net = RecurrentActorCritic(BOX, ACTIONS["discrete"], hidden_size=16, head_layers=head_layers)
    relus = sum(isinstance(m, torch.nn.ReLU) for m in net.policy_mlp.modules())
    assert (
        relus == head_layers == sum(isinstance(m, torch.nn.ReLU) for m in net.value_head.modules())
    )

    def logits(features):
        return net.action_head.linear(net.policy_mlp(features))  # the raw logits

    a, b = torch.randn(2, 64, 16).unbind(0)
    with torch.no_grad():
        # an affine map f has f(a) + f(b) == f(a + b) + f(0)
        gap = (logits(a) + logits(b) - logits(a + b) - logits(torch.zeros_like(a))).abs().max()
    assert (gap > 1e-5) == (head_layers > 0)


@given(
    recurrence=st.sampled_from(["lstm", "gru", "none"]),
    head_layers=st.integers(0, 2),
    shared=st.booleans(),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=20, deadline=None)
def test_encoder_skip_gives_the_heads_the_core_output_and_this_steps_encoder_features(
    recurrence, head_layers, shared, seed
):
    """With ``encoder_skip`` both heads read ``cat(core output, encoder features)`` of each
    step, ``[N, L, 2H]``; without recurrence there is no core and nothing changes."""
    kwargs = dict(recurrence=recurrence, hidden_size=8, head_layers=head_layers)
    torch.manual_seed(seed)
    net = RecurrentActorCritic(
        BOX, ACTIONS["discrete"], encoder_skip=True, shared_critic=shared, **kwargs
    )
    obs = net.normalize(_batch(BOX, (3, 5)))
    width = 16 if recurrence != "none" else 8
    first = next(m for m in net.value_head.modules() if isinstance(m, torch.nn.Linear))
    assert first.in_features == width
    if recurrence == "none":
        torch.manual_seed(seed)
        plain = RecurrentActorCritic(BOX, ACTIONS["discrete"], shared_critic=shared, **kwargs)
        assert {n: p.shape for n, p in net.named_parameters()} == {
            n: p.shape for n, p in plain.named_parameters()
        }
        return
    state = tuple(torch.randn(3, *net.state_shape) for _ in net.actor_state_keys)
    with torch.no_grad():
        for trunk in {net.actor_trunk, net.critic_trunk or net.actor_trunk}:
            encoded = trunk.encoder(obs)
            core = trunk.core(
                encoded,
                tuple(s.transpose(0, 1).contiguous() for s in state)
                if recurrence == "lstm"
                else state[0].transpose(0, 1).contiguous(),
            )
            features, _ = trunk(obs, state)
            torch.testing.assert_close(features, torch.cat((core[0], encoded), dim=-1))
        dist, _ = net.policy(obs, state, normalized=True)
        features, _ = net.actor_trunk(obs, state)
        expected = net.action_head(net.policy_mlp(features))
        torch.testing.assert_close(dist.base.logits, expected.base.logits)


@given(
    forget_bias=st.floats(-5.0, 5.0, allow_nan=False),
    num_layers=st.integers(1, 3),
    shared_critic=st.booleans(),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=20, deadline=None)
def test_forget_bias_shifts_only_the_forget_gates_of_every_lstm_layer(
    forget_bias, num_layers, shared_critic, seed
):
    """Every layer of every LSTM (actor and critic) has ``forget_bias`` added to its forget
    gate's input bias and nothing else changed: the same seed without it gives the rest."""
    kwargs = dict(hidden_size=8, num_layers=num_layers, shared_critic=shared_critic)
    torch.manual_seed(seed)
    plain = RecurrentActorCritic(BOX, ACTIONS["discrete"], **kwargs)
    torch.manual_seed(seed)
    shifted = RecurrentActorCritic(BOX, ACTIONS["discrete"], forget_bias=forget_bias, **kwargs)
    expected = {name: p.detach().clone() for name, p in plain.named_parameters()}
    for name in expected:
        if ".core.bias_ih_l" in name:
            expected[name][8:16] += forget_bias  # gates (input, forget, cell, output)
    cores = sum(".core.bias_ih_l" in name for name in expected)
    assert cores == num_layers * (1 if shared_critic else 2)
    for name, p in shifted.named_parameters():
        torch.testing.assert_close(p, expected[name], rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    ("recurrence", "forget_bias", "match"),
    [
        ("gru", 1.0, "recurrence is 'gru'"),
        ("none", 3.0, "recurrence is 'none'"),
        ("lstm", float("nan"), "finite number, got nan"),
        ("lstm", float("inf"), "finite number, got inf"),
    ],
)
def test_forget_bias_refuses_cores_without_a_forget_gate_and_non_finite_values(
    recurrence, forget_bias, match
):
    with pytest.raises(ValueError, match=match):
        RecurrentActorCritic(
            BOX, ACTIONS["discrete"], recurrence=recurrence, forget_bias=forget_bias
        )


def test_distributions_take_a_sample_shape_for_torchrls_entropy_fallback():
    # TorchRL's PPOLoss estimates the entropy from dist.sample((n,)) when dist.entropy() is
    # not finite, after reading dist.has_rsample
    from rppo_td.modules._heads import MultiCategorical, _Categorical, _DiagonalNormal

    for dist, event in (
        (_Categorical(torch.randn(3, 4)), ()),
        (MultiCategorical(torch.randn(3, 5), [2, 3]), (2,)),
        (_DiagonalNormal(torch.randn(3, 2), torch.zeros(2)), (2,)),
    ):
        assert dist.has_rsample is False
        draws = dist.sample(torch.Size([5]))
        assert draws.shape == (5, 3, *event)
        assert dist.log_prob(draws).shape == (5, 3)


@settings(max_examples=40, deadline=None)
@given(
    nvec=st.lists(st.integers(1, 6), min_size=1, max_size=6),
    batch=st.lists(st.integers(0, 3), min_size=0, max_size=2),
    seed=st.integers(0, 2**16),
)
def test_multi_discrete_one_hot_is_each_entrys_one_hot_side_by_side(nvec, batch, seed):
    from rppo_td.modules._encoders import _OneHot

    g = torch.Generator().manual_seed(seed)
    x = torch.stack([torch.randint(0, n, tuple(batch), generator=g) for n in nvec], -1)
    expected = torch.cat(
        [torch.nn.functional.one_hot(x[..., i], n) for i, n in enumerate(nvec)], -1
    ).float()
    out = _OneHot(nvec, multi=True)(x)
    assert out.dtype == torch.float32
    assert torch.equal(out, expected)


def test_multi_discrete_one_hot_refuses_an_entry_out_of_its_range_or_a_wrong_width():
    from rppo_td.modules._encoders import _OneHot

    encode = _OneHot([3, 4, 2], multi=True)
    with pytest.raises(ValueError, match=r"entry 1 must be a whole number in \[0, 4\), got 4"):
        encode(torch.tensor([[0, 1, 1], [2, 4, 0]]))
    with pytest.raises(ValueError, match=r"entry 2 must be a whole number in \[0, 2\), got -1"):
        encode(torch.tensor([[0, 1, -1]]))
    # one entry would broadcast against the three ranges and offsets
    with pytest.raises(ValueError, match=r"3 entries .* got shape \[2, 1\]"):
        encode(torch.tensor([[1], [0]]))
    # float32 whatever the default dtype, as the Discrete path
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert encode(torch.tensor([[0, 1, 1]])).dtype == torch.float32
    finally:
        torch.set_default_dtype(default)


@pytest.mark.parametrize("recurrent", [False, True])
@pytest.mark.parametrize("recurrence", ["lstm", "gru", "none"])
def test_dist_and_value_of_a_shared_trunk_equal_the_two_modules(recurrence, recurrent):
    space = SPACES["multi_discrete"]
    net = RecurrentActorCritic(
        space, ACTIONS["box"], recurrence=recurrence, hidden_size=8, shared_critic=True
    )
    actor, critic = RecurrentActor(net), RecurrentCritic(net)
    assert actor.shares_trunk_with(critic)
    td = _batch(space, (2, 3))
    td.set("is_init", torch.tensor([[True, False, False], [False, True, False]]).unsqueeze(-1))
    for key in net.state_keys:
        td.set(key, torch.randn(2, 3, *net.state_shape))
    with set_recurrent_mode(recurrent):
        dist, value = actor.get_dist_and_value(td)
        expected = actor.get_dist(td)
        expected_value = critic(td.clone())["state_value"]
    torch.testing.assert_close(dist.mode, expected.mode, rtol=0, atol=0)
    sample = expected.sample()
    torch.testing.assert_close(dist.log_prob(sample), expected.log_prob(sample), rtol=0, atol=0)
    torch.testing.assert_close(value, expected_value, rtol=0, atol=0)
    alone = RecurrentActorCritic(space, ACTIONS["box"], recurrence=recurrence, hidden_size=8)
    assert not RecurrentActor(alone).shares_trunk_with(RecurrentCritic(alone))
    with pytest.raises(ValueError, match="shared_critic=True"):
        RecurrentActor(alone).get_dist_and_value(td)


def test_a_subclass_that_changes_the_dist_or_the_value_does_not_share_the_trunk():
    net = RecurrentActorCritic(BOX, ACTIONS["discrete"], hidden_size=8, shared_critic=True)

    class ScaledCritic(RecurrentCritic):
        def forward(self, tensordict):
            out = super().forward(tensordict)
            out.set("state_value", 100 * out.get("state_value"))
            return out

    class TemperedActor(RecurrentActor):
        def get_dist(self, tensordict):
            return super().get_dist(tensordict)

    class PlainActor(RecurrentActor):  # changes nothing that makes the outputs
        pass

    assert RecurrentActor(net).shares_trunk_with(RecurrentCritic(net))
    assert PlainActor(net).shares_trunk_with(RecurrentCritic(net))
    assert not RecurrentActor(net).shares_trunk_with(ScaledCritic(net))
    assert not TemperedActor(net).shares_trunk_with(RecurrentCritic(net))
    assert not RecurrentActor(net).shares_trunk_with(RecurrentCritic(net, is_init_key="init"))


def test_a_normalising_agent_pickles():
    # its load hook was a lambda: torch.save(net) and TorchRL's multi-process collectors failed
    import pickle

    net = RecurrentActorCritic(
        BOX, gym.spaces.Discrete(2), hidden_size=4, normalize_observations=True
    )
    assert net.normalizer is not None
    net.normalizer.update(TensorDict({"observation": torch.randn(16, 3)}, [16]))
    copy = pickle.loads(pickle.dumps(net))
    torch.testing.assert_close(copy.state_dict(), net.state_dict())


def test_an_empty_normaliser_update_changes_nothing():
    from rppo_td.modules._normalizer import ObservationNormalizer

    norm = ObservationNormalizer(observation_leaves(BOX), center=True)
    norm.update(TensorDict({"observation": torch.empty(0, 3)}, [0]))  # once 0 / 0: NaN
    batch = TensorDict({"observation": torch.randn(32, 3)}, [32])
    norm.update(batch)
    before = {k: v.clone() for k, v in norm.state_dict().items()}
    norm.update(TensorDict({"observation": torch.empty(0, 3)}, [0]))
    for key, value in norm.state_dict().items():
        torch.testing.assert_close(value, before[key])
    assert torch.isfinite(norm(batch)["observation"]).all()


@given(
    lengths=st.lists(st.integers(1, 6), min_size=1, max_size=6),
    center=st.booleans(),
)
def test_a_normaliser_update_on_padded_sequences_counts_their_real_steps_only(lengths, center):
    # the padding's zeros were merged as observations: mean 4.9 -> 2.9, variance 0.7 -> 6.3
    from rppo_td.modules._normalizer import ObservationNormalizer

    width = max(lengths)
    mask = torch.arange(width) < torch.tensor(lengths)[:, None]  # [N, Lp], a prefix each
    obs = torch.zeros(len(lengths), width, 3)
    obs[mask] = 5 + torch.randn(int(mask.sum()), 3)
    padded = TensorDict({"observation": obs, "loss_mask": mask}, mask.shape)
    real = TensorDict({"observation": obs[mask]}, [int(mask.sum())])
    from_padded, from_real = (
        ObservationNormalizer(observation_leaves(BOX), center=center) for _ in range(2)
    )
    from_padded.update(padded)
    from_real.update(real)
    torch.testing.assert_close(from_padded.state_dict(), from_real.state_dict())
    # a renamed mask is named; a mask of another shape or dtype is refused, nothing merged
    renamed = ObservationNormalizer(observation_leaves(BOX), center=center)
    renamed.update(padded.rename_key_("loss_mask", "m"), loss_mask="m")
    torch.testing.assert_close(renamed.state_dict(), from_real.state_dict())
    before = {k: v.clone() for k, v in renamed.state_dict().items()}
    bad = padded.clone().set("m", mask.long())
    with pytest.raises(ValueError, match=r"'m' must be bool with the batch shape .*int64"):
        renamed.update(bad, loss_mask="m")
    wide = padded.clone()
    wide.batch_size = mask.shape[:1]  # a [N] batch: the [N, Lp] mask is not its shape
    with pytest.raises(ValueError, match=r"'m' must be bool with the batch shape \[\d+\]"):
        renamed.update(wide, loss_mask="m")
    for key, value in renamed.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_a_normaliser_update_refuses_what_is_not_a_tensordict():
    from rppo_td.modules._normalizer import ObservationNormalizer

    with pytest.raises(TypeError, match=r"ObservationNormalizer.update takes a TensorDict.*dict"):
        ObservationNormalizer(observation_leaves(BOX)).update({"observation": torch.zeros(2, 3)})


def test_dtype_casts_leave_the_normaliser_statistics_in_float64():
    # net.half() then net.float() cast the float64 statistics: the count overflowed to inf
    # and the variances turned NaN at the next update
    net = RecurrentActorCritic(
        BOX, gym.spaces.Discrete(2), hidden_size=4, normalize_observations=True
    )
    norm = net.normalizer
    assert norm is not None
    for _ in range(3):
        norm.update(TensorDict({"observation": 5 + 3 * torch.randn(40_000, 3)}, [40_000]))
    before = {k: v.clone() for k, v in norm.state_dict().items()}
    net.half()
    net.float()
    net.to(torch.float32)
    for key, value in norm.state_dict().items():
        assert value.dtype == torch.float64, key
        assert torch.equal(value, before[key]), key
    norm.update(TensorDict({"observation": 5 + 3 * torch.randn(64, 3)}, [64]))
    assert norm.count.item() == 120_064
    assert torch.isfinite(torch.stack([norm.var_0, norm.mean_0])).all()


def test_a_normaliser_update_refuses_what_it_would_merge_wrongly():
    from rppo_td.modules._normalizer import ObservationNormalizer

    norm = ObservationNormalizer(observation_leaves(BOX))
    before = {k: v.clone() for k, v in norm.state_dict().items()}
    nan = torch.zeros(8, 3)
    nan[2, 1] = float("nan")
    for obs, message in (
        (TensorDict({"observation": nan}, [8]), "'observation' holds a NaN or an infinity"),
        (
            TensorDict({"observation": torch.zeros(4, 2)}, [4]),
            r"'observation' must have the space's shape \[3\] after its batch dims, got \[4, 2\]",
        ),
        (TensorDict({"other": torch.zeros(4, 3)}, [4]), "needs the observation 'observation'"),
    ):
        with pytest.raises(ValueError, match=message):
            norm.update(obs)
    for key, value in norm.state_dict().items():
        assert torch.equal(value, before[key]), key
    # a (1,) space's leaf given as [B], as the forward pass takes it, is merged
    one = ObservationNormalizer(observation_leaves(gym.spaces.Box(-1.0, 1.0, (1,))))
    one.update(TensorDict({"observation": torch.tensor([1.0, 3.0])}, [2]))
    assert one.count.item() == 2 and one.mean_0.tolist() == [2.0]


def test_the_normaliser_refuses_an_overflow_a_bad_clip_and_gives_float32():
    from rppo_td.modules._normalizer import ObservationNormalizer

    # finite float64 values whose squares overflow: the variance was NaN for good
    wide = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)
    norm = ObservationNormalizer(observation_leaves(wide))
    before = {k: v.clone() for k, v in norm.state_dict().items()}
    huge = torch.tensor([[2e154, 0.0], [-2e154, 1.0]], dtype=torch.float64)
    with pytest.raises(ValueError, match="'observation' holds values whose squares overflow"):
        norm.update(TensorDict({"observation": huge}, [2]))
    for key, value in norm.state_dict().items():
        assert torch.equal(value, before[key]), key
    # a negative clip made every output -1, NaN every output NaN
    for clip in (-1.0, float("nan"), None, 0):
        with pytest.raises(ValueError, match="clip must be a finite number > 0"):
            ObservationNormalizer(observation_leaves(wide), clip=clip)
    # float32 out, as documented: a float64 leaf stayed float64, a float16 one of a ()-shaped
    # space stayed float16 (a 0-dim scale does not promote)
    assert (
        norm(TensorDict({"observation": huge / 1e150}, [2]))["observation"].dtype == torch.float32
    )
    scalar = ObservationNormalizer(observation_leaves(gym.spaces.Box(-1.0, 1.0, ())))
    half = TensorDict({"observation": torch.ones(3, dtype=torch.float16)}, [3])
    assert scalar(half)["observation"].dtype == torch.float32
    # leaves of a Dict space with different row counts shared one count
    two = gym.spaces.Dict(
        {"a": gym.spaces.Box(-1.0, 1.0, (1,)), "b": gym.spaces.Box(-1.0, 1.0, (2,))}
    )
    both = ObservationNormalizer(observation_leaves(two))
    rows = TensorDict({"observation": {"a": torch.zeros(4, 5), "b": torch.zeros(4, 2)}}, [4])
    with pytest.raises(ValueError, match=r"different numbers of rows .*: 20, .*: 4\}"):
        both.update(rows)
    assert both.count.item() == 0


def test_a_reset_zeroes_even_a_nan_stored_state():
    net = RecurrentActorCritic(BOX, gym.spaces.Discrete(2), hidden_size=4)
    td = TensorDict(
        {"observation": torch.randn(3, 3), "is_init": torch.ones(3, 1, dtype=torch.bool)}, [3]
    )
    zero = td.clone()
    for i, key in enumerate(net.state_keys):  # the actor's and the critic's
        td.set(key, torch.full((3, *net.state_shape), float("nan") if i % 2 else float("inf")))
        zero.set(key, torch.zeros(3, *net.state_shape))
    policy = RecurrentPolicy(net)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        out, ref = policy(td.clone()), policy(zero.clone())
    for key in ("state_value", "action_log_prob"):
        torch.testing.assert_close(out[key], ref[key])


def test_observations_of_another_shape_or_an_image_not_uint8_are_refused():
    # a [B, 1] observation of a Box(3) space broadcast against the statistics, silently
    net = RecurrentActorCritic(BOX, gym.spaces.Discrete(2), hidden_size=4)
    td = TensorDict({"observation": torch.randn(5, 1), "is_init": torch.ones(5, 1).bool()}, [5])
    with pytest.raises(ValueError, match=r"'observation' must have the space's shape \[3\]"):
        RecurrentCritic(net)(td)
    image = gym.spaces.Box(0, 255, (8, 8, 3), dtype=np.uint8)
    net = RecurrentActorCritic(image, gym.spaces.Discrete(2), hidden_size=4)
    floats = TensorDict(
        {"observation": torch.rand(2, 8, 8, 3), "is_init": torch.ones(2, 1).bool()}, [2]
    )
    with pytest.raises(ValueError, match="image observation 'observation' must be uint8"):
        RecurrentCritic(net)(floats)
    RecurrentCritic(net)(floats.set("observation", floats["observation"].mul(255).to(torch.uint8)))


@pytest.mark.parametrize("cast", ["double", "half", "bfloat16"])
def test_a_network_cast_from_float32_is_refused_by_name(cast):
    # it failed inside a Linear with "mat1 and mat2 must have the same dtype"
    net = RecurrentActorCritic(BOX, gym.spaces.Discrete(2), hidden_size=4)
    td = TensorDict({"observation": torch.randn(5, 3), "is_init": torch.ones(5, 1).bool()}, [5])
    getattr(net, cast)()
    for module in (RecurrentActor(net), RecurrentCritic(net)):
        with pytest.raises(ValueError, match="computes in float32, and its parameters are"):
            module(td.clone())
    net.float()
    RecurrentPolicy(net)(td.clone())


@pytest.mark.parametrize("batch", [[], [3, 0]])
def test_recurrent_mode_without_a_step_is_refused_by_name(batch):
    # [3, 0] once failed with an IndexError from inside the module
    net = RecurrentActorCritic(BOX, gym.spaces.Discrete(2), hidden_size=4)
    td = TensorDict(
        {"observation": torch.zeros(*batch, 3), "is_init": torch.zeros(*batch, 1).bool()}, batch
    )
    with set_recurrent_mode(True), pytest.raises(ValueError, match="at least one step"):
        RecurrentCritic(net)(td)


def test_index_observations_are_checked_by_key():
    # before: one-hot or [B, 1] Discrete leaves failed inside the LSTM ("Expected input to be
    # 2D or 3D"), out of range inside one_hot, and 0.99 was read as 0 without a word
    space = gym.spaces.Dict(
        {"d": gym.spaces.Discrete(4), "m": gym.spaces.MultiDiscrete([3, 4]), "b": BOX}
    )
    net = RecurrentActorCritic(space, gym.spaces.Discrete(2), hidden_size=4)
    policy = RecurrentPolicy(net)

    def step(**leaves):
        obs = {"d": torch.tensor([0, 3]), "m": torch.tensor([[0, 1], [2, 3]])}
        obs |= {"b": torch.zeros(2, 3)} | leaves
        return policy(TensorDict({"observation": obs, "is_init": torch.ones(2, 1).bool()}, [2]))

    step()
    step(d=torch.tensor([0.0, 3.0]))  # whole floats are indices
    key = r"observation \('observation', 'd'\)"
    with pytest.raises(ValueError, match=key + r" must have the space's shape \[\] \(an index"):
        step(d=torch.nn.functional.one_hot(torch.tensor([0, 3]), 4))
    with pytest.raises(ValueError, match=key + r": Discrete observation must be a whole number"):
        step(d=torch.tensor([0, 4]))
    with pytest.raises(ValueError, match=key + r": .* in \[0, 4\), got 0.5"):
        step(d=torch.tensor([0.0, 0.5]))
    with pytest.raises(ValueError, match=r"'m'\): MultiDiscrete observation entry 1 .* got 1.5"):
        step(m=torch.tensor([[0.0, 1.5], [2.0, 3.0]]))
    binary = RecurrentActorCritic(gym.spaces.MultiBinary([2, 2]), gym.spaces.Discrete(2))
    td = TensorDict({"observation": torch.ones(2, 4), "is_init": torch.ones(2, 1).bool()}, [2])
    with pytest.raises(ValueError, match=r"shape \[2, 2\] after its batch dims, got \[4\]"):
        RecurrentPolicy(binary)(td)


def test_spaces_and_settings_refused_by_name():
    # before: a Dict of int keys built a net whose converter looked up "0" (KeyError)
    with pytest.raises(ValueError, match=r"must be str, got 0 \(int\)"):
        RecurrentActorCritic(gym.spaces.Dict({0: BOX}), gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match=r"\(key \('observation', 'mission'\)\)"):
        RecurrentActorCritic(gym.spaces.Dict({"mission": gym.spaces.Text(3)}), ACTIONS["box"])
    # a numpy int is an int; "no" is not a bool (it counted as True)
    assert RecurrentActorCritic(BOX, ACTIONS["box"], hidden_size=np.int64(4)).hidden_size == 4
    with pytest.raises(ValueError, match="shared_critic must be True or False, got 'no'"):
        RecurrentActorCritic(BOX, ACTIONS["box"], shared_critic="no")


def test_the_normaliser_is_off_unless_asked_for():
    # before: on by default, never updated outside rppo-train: the identity then a clamp to
    # [-10, 10], so 20, 100 and 400 gave one output
    wide = gym.spaces.Box(0.0, 500.0, (1,))
    net = RecurrentActorCritic(wide, gym.spaces.Discrete(2), hidden_size=4)
    assert net.normalizer is None
    obs = TensorDict({"observation": torch.tensor([[20.0], [400.0]])}, [2])
    assert torch.equal(net.normalize(obs)["observation"], obs["observation"])
    on = RecurrentActorCritic(wide, ACTIONS["box"], normalize_observations=True)
    assert on.normalizer is not None


def test_the_primer_refuses_an_env_taking_one_hot_actions():
    # before: TorchRL's GymEnv read each index as a one-hot vector: CartPole got action 0
    # at every step, and the run learnt nothing, with no error
    from torchrl.envs import GymEnv, InitTracker, TransformedEnv

    env = gym.make("CartPole-v1")
    net = RecurrentActorCritic(env.observation_space, env.action_space, hidden_size=4)
    one_hot = TransformedEnv(GymEnv("CartPole-v1"), InitTracker())
    with pytest.raises(ValueError, match="categorical_action_encoding=True"):
        one_hot.append_transform(recurrent_state_primer(net))
    with pytest.raises(ValueError, match="categorical_action_encoding=True"):
        TransformedEnv(GymEnv("CartPole-v1"), recurrent_state_primer(net))
    indices = TransformedEnv(GymEnv("CartPole-v1", categorical_action_encoding=True))
    indices.append_transform(InitTracker())
    indices.append_transform(recurrent_state_primer(net))
    assert indices.reset()["recurrent_state_h"].shape == (1, 4)


@settings(max_examples=40, deadline=None)
@given(
    low=st.one_of(st.floats(-1e3, 1e3), st.just(-np.inf)),
    width=st.one_of(st.floats(0.1, 1e3), st.just(np.inf)),
    seed=st.integers(0, 2**16),
)
@example(low=-2.0, width=4.0, seed=0)  # Pendulum's
@example(low=5.0, width=1.0, seed=0)
def test_box_actions_start_inside_their_bounds(low, width, seed):
    # the mean started about 0 whatever the bounds: with [5, 6] every sample was clipped to 5,
    # every action the same to the env, and nothing was learnt
    high = low + width if np.isfinite(low) else width - 500.0  # (-inf, inf) when width is
    space = gym.spaces.Box(np.float32(low), np.float32(high), (2,), np.float32)
    torch.manual_seed(seed)
    net = RecurrentActorCritic(gym.spaces.Box(-1, 1, (3,)), space, hidden_size=4)
    features = torch.randn(5, net.action_head.linear.in_features)
    out = net.action_head.linear(features)
    mean = net.action_head(features).mode
    if np.isfinite(low) and np.isfinite(high):
        expected = torch.full((2,), (float(space.low[0]) + float(space.high[0])) / 2)
    else:
        expected = torch.full((2,), float(np.clip(0.0, space.low[0], space.high[0])))
    torch.testing.assert_close(mean - out, expected.expand_as(out), rtol=1e-6, atol=1e-4)
    assert "action_head.center" not in net.state_dict()  # it follows from the space
    if float(space.low[0]) <= 0.0 <= float(space.high[0]) and low == -high:
        assert torch.equal(mean, out)  # symmetric spaces: the arithmetic of before


def _separate_lstm_net() -> RecurrentActorCritic:
    torch.manual_seed(0)
    return RecurrentActorCritic(BOX, gym.spaces.Discrete(2), recurrence="lstm", hidden_size=8)


def _zero_state(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(rows, 1, 8), torch.zeros(rows, 1, 8)


def test_a_separate_critic_runs_on_its_own_trunk():
    # the values (and the critic's scanned states) taken from the actor's trunk: the value
    # loss moving the policy's features, the critic's own trunk dead weight, no error
    net = _separate_lstm_net()
    obs = TensorDict({"observation": torch.randn(2, 5, 3)}, batch_size=[2, 5])
    value, final = net.value(obs, _zero_state(2))
    value.sum().backward()
    assert all(p.grad is None for p in net.actor_trunk.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in net.critic_trunk.parameters())
    with torch.no_grad():
        _, scanned = net.scan(obs, _zero_state(2), torch.zeros(2, 5, dtype=torch.bool), critic=True)
        _, actor = net.scan(obs, _zero_state(2), torch.zeros(2, 5, dtype=torch.bool))
    for a, b in zip(scanned, final, strict=True):
        torch.testing.assert_close(a, b.detach())
    assert not torch.equal(scanned[0], actor[0])


def test_an_inactive_position_neither_steps_nor_resets_the_state():
    # is_init at a skipped (padded) position zeroed the state carried past it
    net = _separate_lstm_net()
    obs = TensorDict({"observation": torch.randn(1, 3, 3)}, batch_size=[1, 3])
    with torch.no_grad():
        entering, _ = net.scan(
            obs,
            _zero_state(1),
            is_init=torch.tensor([[False, True, False]]),
            active=torch.tensor([[True, False, True]]),
        )
        _, after_first = net.scan(obs[:, :1], _zero_state(1), torch.zeros(1, 1, dtype=torch.bool))
    for state, expected in zip(entering, after_first, strict=True):
        torch.testing.assert_close(state[:, 2], expected)  # what position 0 left
        assert state[:, 2].abs().sum() > 0


def test_a_grayscale_image_is_one_channel():
    # an [H, W] image read as H channels of width 1 trains, on rows as channels
    net = RecurrentActorCritic(
        gym.spaces.Box(0, 255, (10, 12), np.uint8), gym.spaces.Discrete(2), hidden_size=8
    )
    conv = next(m for m in net.actor_trunk.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.in_channels == 1


@pytest.mark.parametrize("recurrence", ["lstm", "gru"])
def test_a_float64_default_dtype_builds_and_runs_the_float32_network(recurrence):
    # torch.set_default_dtype(torch.float64) built float64 layers, which the network's own
    # check then refused as "cast by .double()?"; its zero start state was float64 too
    spaces = (gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-1, 1, (2,)))
    kwargs = dict(recurrence=recurrence, hidden_size=8, normalize_observations=True)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        net = RecurrentActorCritic(*spaces, **kwargs)
        assert {p.dtype for p in net.parameters()} == {torch.float32}
        obs = torch.rand(4, 3, dtype=torch.float32)
        td = TensorDict({"observation": obs, "is_init": torch.ones(4, 1, dtype=torch.bool)}, [4])
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            ours = RecurrentPolicy(net)(td.clone())
    finally:
        torch.set_default_dtype(before)
    same = RecurrentActorCritic(*spaces, **kwargs)
    same.load_state_dict(net.state_dict())
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        theirs = RecurrentPolicy(same)(td.clone())
    assert (ours == theirs).all()
    assert ours["action"].dtype == torch.float32
