"""Plain-text reports of ``diagnose oom`` and ``diagnose slow`` (``--json`` prints the same dicts)."""

from __future__ import annotations

from typing import Any


def _gib(mem: dict[str, float] | None) -> str:
    if not mem:
        return "-"
    parts = " + ".join(f"{mem[k]:.3g}" for k in ("params", "grads", "optimizer", "activations", "buffers"))
    return f"{mem['total']:.3g} GiB ({parts})"


def print_oom(r: dict[str, Any]) -> None:
    pred = r["predicted"]
    verdict = "fits" if r["fits"] else "does NOT fit"
    print(f"{r['config'] or 'defaults'} on {r['nproc']} x {r['hardware']} ({r['layout']}): {verdict}")
    print(f"  predicted per device: {_gib(pred['memory_gib'])} of {r['usable_gib']:.3g} GiB usable "
          "(params + grads + optimizer + activations + buffers)")
    if r["fits"]:
        return
    print("remedies, in the recommended order (each keeps the previous ones):")
    for i, rem in enumerate(r["remedies"], 1):
        if not rem["available"] or rem.get("memory_gib") is None:
            print(f"  {i}. {rem['remedy']}: not applicable — {rem['change']}")
            continue
        ratio = rem.get("step_time_ratio")
        cost = f", step time x{ratio:.2f}" if ratio else ""
        mark = "FITS" if rem["fits"] else "still too big"
        print(f"  {i}. {rem['remedy']}: {rem['change']} -> {_gib(rem['memory_gib'])}{cost}  [{mark}]")
    if r["recommended"]:
        where = f"wrote {r['emitted_config']}" if r["emitted_config"] else "the config (--emit-config FILE writes it)"
        print(f"first remedy that fits: {r['recommended']}; {where}:")
        if not r["emitted_config"]:
            print(r["config_toml"])
    elif r["devices_needed"]:
        print(f"nothing fits on {r['nproc']} device(s): the planner finds a layout from {r['devices_needed']} "
              f"devices (meshlm plan --gpus {r['devices_needed']} ...)")
    else:
        print("nothing fits: use larger devices, a smaller model or a shorter data.seq_len")


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def print_slow(r: dict[str, Any]) -> None:
    m, p = r["measured"], r["predicted"]
    print(f"{r['run_dir']}: {r['layout']} on {r['nproc']} rank(s); measured from {r['source']}")
    pred_step = f"{p['step_time_s']:.3g} s" if p["step_time_s"] else "n/a"
    print(f"  step time        {m['step_time_s']:.3g} s measured, {pred_step} predicted ({p['hardware'] or '?'})")
    print(f"  communication    {_pct(m['comm_share'])} of a profiled step, {_pct(p['comm_share'])} predicted")
    print(f"  data-loader wait {_pct(m['data_wait_share'])} of the step")
    print(f"  optimizer step   {_pct(m['optimizer_share'])} of a profiled step (not modelled by the planner)")
    print(f"  pipeline bubble  {_pct(p['bubble'])} predicted; waiting in pipeline receives "
          f"{_pct(m['pipeline_wait_share'])} measured (includes the bubble)")
    if r["ranks"]:
        heads = ("window s", "profiled s", "comm s", "busy s", "data s", "optim s")
        print(f"  {'rank':>4} " + " ".join(f"{h:>9}" for h in heads))
        for k in r["ranks"]:
            cells = [k[c] for c in ("step_time_s", "profiled_step_s", "comm_s", "busy_s", "data_wait_s",
                                    "optimizer_s")]
            print(f"  {k['rank']:>4} " + " ".join(f"{v:>9.4f}" if v is not None else f"{'-':>9}" for v in cells))
    print(f"  stragglers: {', '.join(map(str, r['stragglers'])) if r['stragglers'] else 'none'}")
    if m["comm_share"] is None:
        print("  (no profiled step in this run: single-device runs are not sampled; --profile STEPS measures one)")
    if not r["recommendations"]:
        print("no recommendation: no share above its threshold")
    for rec in r["recommendations"]:
        print(f"- {rec['change']}\n    because {rec['why']}")
    if r["traces"]:
        print(f"chrome traces: {', '.join(r['traces'])}")
