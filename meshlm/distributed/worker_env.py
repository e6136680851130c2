"""Whether this process is a torchrun rank, read from the environment alone.

Kept apart from launch.py (which needs torch.distributed) so that the CLI can ask before it imports torch.
"""

from __future__ import annotations

import os


def in_worker() -> bool:
    """True inside a torchrun/elastic worker (torchrun sets these for every rank)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def rank_prefix() -> str:
    """``[rank R] `` inside a worker (for error lines), else empty."""
    return f"[rank {os.environ['RANK']}] " if in_worker() and "RANK" in os.environ else ""
