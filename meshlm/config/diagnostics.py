"""``[diagnostics]``: what a training run records for the `meshlm diagnose` commands and the benchmarks.

Every switch is off by default and changes no training result; the diagnose commands set them on the runs they
launch (each rank reads them from its config, so multi-rank runs need no environment variables). The callbacks
that act on them live with their commands (meshlm/doctor/callbacks.py builds the set).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshlm.sections import option


@dataclass
class DiagnosticsConfig:
    measure_memory: bool = option(False, "Count the memory of the first measured step (the 2nd; the 3rd under "
                                         "DDP) by tensor and write RUN_DIR/memory_measured.rank<R>.json "
                                         "(`meshlm diagnose memory` sets it).")
    parity_probe: bool = option(False, "Write RUN_DIR/parity_probe.rank<R>.json: each rank's initial parameter "
                                       "hashes, RNG state, dropout modules and the samples it read "
                                       "(`meshlm diagnose parity` sets it).")
    profile: bool = option(False, "Sample (count and profile) steps on a single device too; multi-rank runs "
                                  "always sample (metrics.comm_sample_interval).")
    trace_dir: str = option("", "Keep a chrome trace of every profiled step in this folder, "
                                "trace.rank<R>.step<S>.json; implies profile (`meshlm diagnose slow --profile` "
                                "sets it).")
    peak_rss: bool = option(False, "At the end, write each rank's lifetime peak resident set size to "
                                   "RUN_DIR/peak_rss/rank-XXXXX.json (scripts/bench_scale_memory.py).")
