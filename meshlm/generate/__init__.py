"""Text generation from a trained model."""

from meshlm.generate.sampling import filter_logits, generate

__all__ = ["filter_logits", "generate"]
