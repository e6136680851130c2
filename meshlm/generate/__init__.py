"""Text generation from a trained model: one SamplingParams, one sampler (meshlm/generate/sampling.py)."""

from meshlm.generate.params import SamplingError, SamplingParams
from meshlm.generate.sampling import filter_logits, generate

__all__ = ["SamplingError", "SamplingParams", "filter_logits", "generate"]
