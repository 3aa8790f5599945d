"""Whole-sequence minibatch samplers."""

from rppo_td.sampling._replay import SequenceReplaySampler
from rppo_td.sampling._sampler import SequenceSampler

__all__ = ["SequenceReplaySampler", "SequenceSampler"]
