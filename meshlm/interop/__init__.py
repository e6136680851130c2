"""Interoperability with other ecosystems: Hugging Face checkpoints in and out (see docs/interop.md)."""

from meshlm.interop.hf import convert_from_hf, convert_to_hf
from meshlm.interop.hf_config import SUPPORTED_ARCHITECTURES

__all__ = ["SUPPORTED_ARCHITECTURES", "convert_from_hf", "convert_to_hf"]
