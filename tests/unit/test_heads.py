"""The action heads' distributions against torch's own (sums over entries, modes)."""

from __future__ import annotations

import torch
from torch.distributions import Categorical, Independent, Normal

from rppo_td.modules._heads import ActionHead, MultiCategorical


def test_a_multi_discrete_mode_is_each_entrys_most_likely_category():
    logits = torch.tensor([[0.0, 2.0, 1.0, 3.0, 0.0], [5.0, 0.0, -1.0, -2.0, 4.0]])
    dist = MultiCategorical(logits, [3, 2])
    assert dist.mode.tolist() == [[1, 0], [0, 1]]
    action = torch.tensor([[2, 1], [1, 0]])
    parts = [Categorical(logits=logits[:, :3]), Categorical(logits=logits[:, 3:])]
    expected = parts[0].log_prob(action[:, 0]) + parts[1].log_prob(action[:, 1])
    torch.testing.assert_close(dist.log_prob(action), expected)
    torch.testing.assert_close(dist.entropy(), parts[0].entropy() + parts[1].entropy())


def test_a_box_heads_log_prob_and_entropy_are_sums_over_its_dimensions():
    # a mean over D gave another PPO ratio (exp of the mean log-ratio) and a D-times smaller
    # entropy bonus, with no error; with D = 1 the two agree, so D = 3 here
    torch.manual_seed(0)
    head = ActionHead("box", 4, [3])
    with torch.no_grad():
        head.linear.weight.normal_()
        head.log_std.copy_(torch.tensor([-0.5, 0.0, 0.7]))
    features = torch.randn(5, 4)
    dist = head(features)
    mean = head.linear(features)
    reference = Independent(Normal(mean, head.log_std.exp().expand_as(mean)), 1)
    action = torch.randn(5, 3)
    torch.testing.assert_close(dist.log_prob(action), reference.log_prob(action))
    torch.testing.assert_close(dist.entropy(), reference.entropy())
    torch.testing.assert_close(dist.mode, mean)
    assert dist.log_prob(action).shape == (5,) and dist.entropy().shape == (5,)
