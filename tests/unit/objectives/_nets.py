"""Small recurrent actor-critics and rollouts stepped through them one step at a time.

``step_rollout`` is the loop oracle for recurrent values: it runs the network's ``nn.LSTM`` /
``nn.GRU`` one step at a time per worker, zeroes the state where an episode starts, and stores
the state entering every step (as TorchRL's primer does in a collector), so the values it
returns are ``V(o_t | h_t)`` and ``V(o_{t+1} | h_{t+1})`` by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.modules import GRUModule, LSTMModule, ProbabilisticActor, ValueOperator

OBS, H, ACTIONS = 3, 8, 2


@dataclass
class Agent:
    """A shared recurrent core with a policy head and a value head."""

    kind: str
    core: LSTMModule | GRUModule
    policy_head: nn.Linear
    value_head: nn.Linear
    actor: ProbabilisticActor
    critic: TensorDictSequential

    @property
    def state_keys(self) -> list[str]:
        return (
            ["recurrent_state_h", "recurrent_state_c"]
            if self.kind == "lstm"
            else ["recurrent_state"]
        )

    def run(self, obs: torch.Tensor, states: list[torch.Tensor]):
        """Runs the core over ``obs`` ``[N, L, OBS]`` from ``states`` (each ``[N, layers, H]``)."""
        start = [s.transpose(0, 1).contiguous() for s in states]
        if self.kind == "lstm":
            out, (h, c) = self.core.lstm(obs, (start[0], start[1]))
            return out, [h.transpose(0, 1), c.transpose(0, 1)]
        out, h = self.core.gru(obs, start[0])
        return out, [h.transpose(0, 1)]


def make_agent(kind: str = "lstm", seed: int = 0) -> Agent:
    torch.manual_seed(seed)
    if kind == "lstm":
        core = LSTMModule(input_size=OBS, hidden_size=H, in_key="observation", out_key="embed")
    else:
        core = GRUModule(input_size=OBS, hidden_size=H, in_key="observation", out_key="embed")
    policy_head = nn.Linear(H, ACTIONS)
    value_head = nn.Linear(H, 1)
    actor = ProbabilisticActor(
        TensorDictSequential(core, TensorDictModule(policy_head, ["embed"], ["logits"])),
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )
    critic = TensorDictSequential(core, ValueOperator(value_head, in_keys=["embed"]))
    return Agent(kind, core, policy_head, value_head, actor, critic)


def step_rollout(
    agent: Agent, W: int = 3, T: int = 12, seed: int = 1
) -> tuple[TensorDict, torch.Tensor, torch.Tensor]:
    """A ``[W, T]`` rollout and its oracle values ``(V(o_t), V(o_{t+1}))``, each ``[W, T, 1]``.

    Worker 0 terminates after t = 3, worker 1 is truncated after t = 5 (and again after
    t = 8 on wider rollouts), worker 2 never ends; rows start mid-episode from a random state.
    """
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(W, T, OBS, generator=g)
    final = torch.randn(W, T, OBS, generator=g)  # the pre-reset observation after a done
    terminated = torch.zeros(W, T, 1, dtype=torch.bool)
    truncated = torch.zeros(W, T, 1, dtype=torch.bool)
    terminated[0, 3] = True
    truncated[1 % W, 5] = True
    if T > 9:
        truncated[1 % W, 8] = True
    done = terminated | truncated
    is_init = torch.zeros(W, T, 1, dtype=torch.bool)
    is_init[:, 1:] = done[:, :-1]
    is_init[0, 0] = True
    next_obs = torch.where(done, final, torch.cat([obs[:, 1:], final[:, -1:]], 1))
    n_states = len(agent.state_keys)
    states = [torch.zeros(W, T, 1, H) for _ in range(n_states)]
    next_states = [torch.zeros(W, T, 1, H) for _ in range(n_states)]
    value = torch.zeros(W, T, 1)
    next_value = torch.zeros(W, T, 1)
    with torch.no_grad():
        for w in range(W):
            state = [0.5 * torch.randn(1, 1, H, generator=g) for _ in range(n_states)]
            for t in range(T):
                if is_init[w, t]:
                    state = [torch.zeros(1, 1, H) for _ in range(n_states)]
                for k in range(n_states):
                    states[k][w, t] = state[k][0]
                out, after = agent.run(obs[w, t].view(1, 1, OBS), state)
                value[w, t] = agent.value_head(out[0, 0])
                for k in range(n_states):
                    next_states[k][w, t] = after[k][0]
                out_next, _ = agent.run(next_obs[w, t].view(1, 1, OBS), after)
                next_value[w, t] = agent.value_head(out_next[0, 0])
                state = after
    root = {"observation": obs, "is_init": is_init, "action": torch.randint(0, ACTIONS, (W, T))}
    following = {
        "observation": next_obs,
        "is_init": torch.zeros(W, T, 1, dtype=torch.bool),
        "reward": torch.randn(W, T, 1, generator=g),
        "terminated": terminated,
        "truncated": truncated,
        "done": done,
    }
    for key, s, n in zip(agent.state_keys, states, next_states, strict=True):
        root[key] = s
        following[key] = n
    rollout = TensorDict({**root, "next": following}, batch_size=[W, T])
    return rollout, value, next_value
