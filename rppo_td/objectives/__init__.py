"""Losses and value estimators for padded recurrent sequences, on TorchRL's objectives.

``RecurrentPPOLoss`` is TorchRL's ``ClipPPOLoss`` masked by ``loss_mask`` ``[B, Lp]``;
``GAEEstimator`` is a TorchRL value estimator on rppo_td's GAE over ``[W, T]`` rollouts.
"""

from rppo_td.objectives._loss import RecurrentPPOLoss
from rppo_td.objectives._value import GAEEstimator

__all__ = ["GAEEstimator", "RecurrentPPOLoss"]
