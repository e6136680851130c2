"""Many `meshlm diagnose parity` cases for the price of a few launches.

`meshlm diagnose parity` launches one job (torchrun's elastic agent, N ranks) per layout and then trains the
single-device reference in its own process. Most of a case's time on a small CPU is that start-up: a Python
process importing torch for the command, for the agent's every rank, and a rendezvous. :func:`run_cases` does
the same work for many cases at once, with the same meshlm functions:

- one launch (``launch_local``, the agent `meshlm diagnose parity` uses) per world size; its ranks join one
  process group and train the cases of that size one after another, each case exactly as `meshlm train`'s
  ranks train it (the same config with the parity overrides and the parity probe, the same run-directory
  handshake, the same callbacks), each into its own run directory, with dynamo's caches reset between cases;
- each distinct single-device reference once, in this process (cases whose reference config is identical
  share one: the same config on one device trains to the same bits on CPU);
- then, per case, the report `meshlm diagnose parity --json` prints: ``compare`` of the two runs' records and
  ``run_checks`` of their probes, with the case's tolerances.

A case that fails ends its launch: it is reported with its ranks' errors and the cases after it start in a new
launch, so one broken layout never hides another's result. `meshlm diagnose parity` itself stays covered by
tests/test_doctor.py and tests/test_cli.py.

Run as a script, this file is the rank side: ``python tests/parity_batch.py SPEC.json``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

DONE = "parity_case.done"


@dataclass
class Case:
    """One `meshlm diagnose parity [config] --nproc N --steps S --set ...` invocation."""

    nproc: int
    overrides: list[str]
    steps: int
    config: str | None = None
    loss_rtol: float | None = None
    grad_norm_rtol: float | None = None
    extra: dict = field(default_factory=dict)  # not read here: what the test wants to remember about the case


def _common(case: Case) -> list[str]:
    from meshlm.distributed.parity import COMPARE_OVERRIDES

    # as in meshlm/cli/diagnose.py run_parity
    return [*case.overrides, f"training.steps={case.steps}", *COMPARE_OVERRIDES, "diagnostics.parity_probe=true"]


def run_cases(cases: dict[str, Case], work: Path) -> dict[str, dict]:
    """name -> what `meshlm diagnose parity --json` reports for that case, with ``work`` (its two run
    directories) added; a case whose launch failed reports ``ok: false`` and ``error``."""
    from meshlm.config.loader import config_to_toml, load_config
    from meshlm.distributed.parallel_dims import ParallelDims
    from meshlm.distributed.parity import SINGLE_DEVICE
    from meshlm.train.run_dir import init_run_dir

    work = Path(work)
    plans, errors = {}, {}
    for name, case in cases.items():
        common = _common(case)
        layout_cfg = load_config(case.config, common)
        dims = ParallelDims.from_config(layout_cfg.parallel, case.nproc)
        ref_toml = config_to_toml(load_config(case.config, [*common, *SINGLE_DEVICE]))
        layout_dir = work / "layouts" / name
        init_run_dir(layout_dir, config_to_toml(layout_cfg), resume=False)
        plans[name] = {"case": case, "common": common, "dims": dims, "layout_dir": layout_dir, "ref_toml": ref_toml}
    for nproc in dict.fromkeys(c.nproc for c in cases.values()):
        errors.update(_launch_all(nproc, [n for n, c in cases.items() if c.nproc == nproc], plans, work))
    references = _references(plans, errors, work)
    return {name: _report(name, plans[name], references.get(plans[name]["ref_toml"]), errors.get(name))
            for name in cases}


def _launch_all(nproc: int, names: list[str], plans: dict, work: Path) -> dict[str, str]:
    """Launch ``nproc`` ranks for ``names``; after a failure, again for the cases after the failed one."""
    from meshlm.distributed.launch import LaunchError, launch_local
    from meshlm.config.loader import load_config

    errors: dict[str, str] = {}
    pending = list(names)
    while pending:
        spec = work / f"spec-{nproc}-{len(errors)}.json"
        spec.write_text(json.dumps([{"name": n, "config": plans[n]["case"].config, "overrides": plans[n]["common"],
                                     "run_dir": str(plans[n]["layout_dir"])} for n in pending]))
        timeout_s = load_config(plans[pending[0]]["case"].config, plans[pending[0]]["common"]).parallel.timeout_s
        try:
            launch_local(nproc, 0, [str(spec)], timeout_s, entry=(str(Path(__file__).resolve()),))
            pending = []
        except LaunchError as exc:
            done = [n for n in pending if (plans[n]["layout_dir"] / DONE).exists()]
            failed = next((n for n in pending if n not in done), None)
            if failed is None:  # every case finished; the ranks failed while leaving
                errors.update({n: f"the launch failed after the case finished: {exc}" for n in pending})
                break
            rank_errors = sorted(plans[failed]["layout_dir"].glob("error.rank*.txt"))
            detail = "\n".join(p.read_text()[-3000:] for p in rank_errors)
            errors[failed] = f"{exc}\n{detail}"
            pending = pending[pending.index(failed) + 1:]
    return errors


def _references(plans: dict, errors: dict, work: Path) -> dict[str, Path]:
    """The single-device reference run of each distinct reference config (of cases that trained)."""
    import torch

    from meshlm.config.loader import load_config
    from meshlm.distributed.parity import SINGLE_DEVICE
    from meshlm.doctor.callbacks import run_callbacks
    from meshlm.train.run_dir import init_run_dir
    from meshlm.train.trainer import Trainer

    out: dict[str, Path] = {}
    for name, plan in plans.items():
        if name in errors or plan["ref_toml"] in out:
            continue
        ref_cfg = load_config(plan["case"].config, [*plan["common"], *SINGLE_DEVICE])
        ref_dir = work / "references" / f"{len(out)}-{name}"
        init_run_dir(ref_dir, plan["ref_toml"], resume=False)
        torch._dynamo.reset()  # a compiled reference compiles its own blocks, as in a fresh process
        Trainer(ref_cfg, ref_dir, callbacks=run_callbacks(ref_cfg)).train()
        out[plan["ref_toml"]] = ref_dir
    return out


def _report(name: str, plan: dict, ref_dir: Path | None, error: str | None) -> dict:
    from meshlm.distributed.parity import compare, read_records
    from meshlm.doctor.parity_checks import FAIL, run_checks

    case, layout_dir = plan["case"], plan["layout_dir"]
    if error is not None or ref_dir is None:
        return {"case": name, "ok": False, "error": error, "work": {"layout": str(layout_dir)}}
    report = compare(plan["dims"].describe(), read_records(ref_dir), read_records(layout_dir))
    checks = run_checks(ref_dir, layout_dir)
    report.loss_rtol = case.loss_rtol if case.loss_rtol is not None else report.loss_rtol
    report.grad_norm_rtol = case.grad_norm_rtol if case.grad_norm_rtol is not None else report.grad_norm_rtol
    failed = [c["name"] for c in checks if c["status"] == FAIL]
    return {"case": name, **report.to_json(), "ok": report.ok and not failed, "checks": checks,
            "work": {"reference": str(ref_dir), "layout": str(layout_dir)}}


# ------------------------------------------------------------------------------------------------- rank side
def _train_cases(spec_path: str) -> int:
    """Each case as `meshlm train ... --run-dir DIR --resume auto` trains it on this rank (meshlm/cli/train.py
    ``_train``), all in one process group."""
    import torch
    import torch.distributed as dist

    from meshlm.config.loader import config_to_toml, load_config
    from meshlm.distributed.launch import init_distributed
    from meshlm.doctor.callbacks import run_callbacks
    from meshlm.train.run_dir import check_run_dir, write_run_dir
    from meshlm.train.trainer import Trainer

    cases = json.loads(Path(spec_path).read_text())
    first = load_config(cases[0]["config"], cases[0]["overrides"], inherit=True)
    init_distributed(first.parallel.timeout_s, first.training.device)
    rank = dist.get_rank()
    for case in cases:
        run_dir = Path(case["run_dir"])
        try:
            cfg = load_config(case["config"], case["overrides"], inherit=True)
            toml = config_to_toml(cfg)
            check_run_dir(run_dir, toml, resume=True)
            dist.barrier()
            if rank == 0:
                write_run_dir(run_dir, toml)
            torch._dynamo.reset()  # every case compiles its own blocks, as in a fresh process
            Trainer(cfg, run_dir, resume=True, callbacks=run_callbacks(cfg)).train()
            dist.barrier()
        except BaseException:
            (run_dir / f"error.rank{rank}.txt").write_text(f"[rank {rank}] case {case['name']}:\n"
                                                            f"{traceback.format_exc()}")
            dist.destroy_process_group()  # no barrier: the peers may never reach it
            raise
        if rank == 0:
            (run_dir / DONE).write_text("")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # as meshlm/cli/main.py
    code = _train_cases(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as meshlm/cli/main.py _exit_worker: no C++ static destructors after the work is written
