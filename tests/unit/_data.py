"""A small hand-written rollout and nested key overrides shared by the tests."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from rppo_td import RolloutKeys

# every RolloutKeys key moved to a nested place (the transforms' key-override tests)
NESTED = RolloutKeys(
    state_value=("agent", "value"),
    next_state_value=("next", "agent", "value"),
    reward=("next", "agent", "reward"),
    terminated=("next", "agent", "terminated"),
    truncated=("next", "agent", "truncated"),
    done=("next", "agent", "done"),
    is_init=("agent", "is_init"),
    advantage=("agent", "advantage"),
    value_target=("agent", "value_target"),
    episode_id=("ids", "episode"),
    sequence_id=("ids", "sequence"),
    sequence_offset=("ids", "offset"),
    loss_mask=("ids", "mask"),
    worker_index=("ids", "worker"),
    time_index=("ids", "time"),
    rollout_steps=("ids", "steps"),
)


def small_rollout(num_workers: int = 2, num_steps: int = 5, seed: int = 0) -> TensorDict:
    """A ``[W, T]`` rollout with an LSTM state; worker 0 terminates at t=1 and is truncated at
    t=3 (with the default sizes), worker 1 never ends.
    """
    g = torch.Generator().manual_seed(seed)
    shape = (num_workers, num_steps)
    terminated = torch.zeros(*shape, 1, dtype=torch.bool)
    truncated = torch.zeros(*shape, 1, dtype=torch.bool)
    if num_steps >= 4:
        terminated[0, 1] = True
        truncated[0, 3] = True
    done = terminated | truncated
    is_init = torch.zeros(*shape, 1, dtype=torch.bool)
    is_init[:, 0] = True
    is_init[:, 1:] = done[:, :-1]
    return TensorDict(
        {
            "observation": torch.randn(*shape, 3, generator=g),
            "pixels": torch.randint(0, 256, (*shape, 1, 2, 2), generator=g, dtype=torch.uint8),
            "action": torch.randint(0, 2, shape, generator=g),
            "action_log_prob": torch.randn(*shape, generator=g),
            "state_value": torch.randn(*shape, 1, generator=g),
            "is_init": is_init,
            "recurrent_state_h": torch.randn(*shape, 1, 4, generator=g),
            "recurrent_state_c": torch.randn(*shape, 1, 4, generator=g),
            "next": {
                "observation": torch.randn(*shape, 3, generator=g),
                "reward": torch.randn(*shape, 1, generator=g),
                "state_value": torch.randn(*shape, 1, generator=g),
                "terminated": terminated,
                "truncated": truncated,
                "done": done,
            },
        },
        batch_size=shape,
    )
