"""How a plan is shown: the JSON contract, the rich report, the memory chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meshlm.planner.plan import Plan
from meshlm.planner.search import Evaluation


def plan_json(plan: Plan, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{recommended, candidates, rejected}`` (the contract) plus the inputs and the explanation."""
    tr, hw = plan.training, plan.hw
    rejected = []
    for family, ev in sorted(plan.result.rejected.items()):
        entry = ev.to_json(tr, hw)
        entry["family"] = family
        rejected.append(entry)
    out = {
        "recommended": plan.recommended.to_json(tr, hw),
        "candidates": [ev.to_json(tr, hw) for ev in plan.result.candidates],
        "rejected": rejected,
        "model": {"name": plan.spec.name, "arch": plan.spec.arch, "family": plan.spec.count_shape().family,
                  "params": plan.spec.num_params()},
        "hardware": {"name": hw.name, "gpus": plan.gpus, "gpus_per_node": hw.gpus_per_node,
                     "memory_gib": hw.memory_gib, "peak_flops": hw.peak(tr.precision),
                     "intra_node_gbs": hw.intra_node_gbs, "inter_node_gbs": hw.inter_node_gbs},
        "training": {"seq_len": tr.seq_len, "global_batch_seqs": tr.global_batch, "global_batch_tokens": tr.tokens,
                     "precision": tr.precision, "optimizer": tr.optimizer, "efficiency": tr.efficiency,
                     "accounting": tr.accounting, "headroom": plan.headroom},
        "decision_order": plan.taught, "verdict": plan.verdict, "bottleneck": plan.bottleneck,
        "scaling": plan.scaling, "layouts_evaluated": plan.result.evaluated,
    }
    out.update(extra or {})
    return out


def _row(ev: Evaluation, plan: Plan) -> list[str]:
    j = ev.to_json(plan.training, plan.hw)
    lay = ev.layout
    mem = j["memory_gib"]
    degrees = f"{lay.dp_replicate}x{lay.dp_shard}x{lay.tp}x{lay.pp}"
    detail = lay.sharding + (f", {lay.pp_schedule} m={lay.microbatches}" if lay.pp > 1 else
                             f", mbs {lay.micro_batch_size}")
    if "tokens_per_s" not in j:
        return [degrees, detail, lay.activation_checkpointing, f"{mem['total']:.1f}", "-", "-", "-", "-", "-"]
    return [degrees, detail, lay.activation_checkpointing, f"{mem['total']:.1f}", f"{j['step_time_s']:.3g}",
            f"{j['tokens_per_s']:,.0f}", f"{100 * j['mfu']:.1f}%", f"{100 * j['comm_share']:.0f}%",
            f"{100 * j['bubble']:.0f}%"]


def render(plan: Plan, console, extra_lines: list[str] | None = None) -> None:
    """The human report (rich)."""
    from rich.table import Table

    tr, hw, rec = plan.training, plan.hw, plan.recommended
    console.print(f"[bold]{plan.spec.describe()}[/bold]")
    console.print(f"{plan.gpus} x {hw.describe()}")
    console.print(f"seq {tr.seq_len}, global batch {tr.global_batch} sequences ({tr.tokens:,} tokens), "
                  f"{tr.precision}, {tr.optimizer}, efficiency {tr.efficiency:.2f}, memory headroom "
                  f"{plan.headroom:g}")
    table = Table(title="layouts (dp_replicate x dp_shard x tp x pp), best first")
    for col in ("degrees", "data parallel / micro-batching", "AC", "GiB/GPU", "step s", "tokens/s", "MFU",
                "comm", "bubble"):
        table.add_column(col, justify="right" if col in ("GiB/GPU", "step s", "tokens/s", "MFU", "comm",
                                                         "bubble") else "left")
    table.add_row(*_row(rec, plan), style="bold green" if rec.feasible else "bold red")
    for ev in plan.result.candidates:
        table.add_row(*_row(ev, plan))
    console.print(table)
    head = "fixed layout" if plan.fixed else "recommended"
    status = "fits" if rec.feasible else f"DOES NOT FIT: {rec.reason}"
    mem = rec.memory.gib()
    console.print(f"[bold]{head}:[/bold] {rec.layout.describe()} — {rec.layout.family()}, {status}")
    console.print("  memory per GPU: " + ", ".join(f"{k} {v:.3g}" for k, v in mem.items()) + " GiB")
    if rec.time is not None:
        j = rec.to_json(tr, hw)
        t = j["time_s"]
        console.print(f"  step {j['step_time_s']:.3g} s = compute {t['compute']:.3g} + TP comm {t['tp_comm']:.3g} "
                      f"+ PP sends {t['pp_p2p']:.3g} + exposed DP comm {t['dp_exposed']:.3g} (of "
                      f"{t['dp_comm']:.3g}) + bubble {t['bubble']:.3g}; {j['tokens_per_s']:,.0f} tokens/s "
                      f"({j['tokens_per_s_per_gpu']:,.0f} per GPU), MFU {100 * j['mfu']:.1f}%")
    if plan.taught:
        console.print("[bold]decision order[/bold] (fits → DP; else ZeRO/FSDP; else TP inside a node; then PP):")
        for i, step in enumerate(plan.taught, 1):
            text = (f"fits — best {step['best']} at {step['tokens_per_s']:,.0f} tokens/s" if step["fits"]
                    else f"does not fit — {step['reason']}")
            console.print(f"  {i}. {step['step']}: {text}")
    if plan.verdict:
        console.print(plan.verdict)
    if plan.result.rejected:
        console.print("[bold]rejected[/bold]:")
        for family, ev in sorted(plan.result.rejected.items()):
            console.print(f"  {family}: {ev.reason}")
    if plan.bottleneck:
        b = plan.bottleneck
        console.print(f"[bold]bottleneck[/bold]: {b['bottleneck']} ({b['share']} of the step); first "
                      f"mitigation: {b['mitigation']}")
    if plan.scaling:
        s = plan.scaling
        console.print(f"scaling efficiency {100 * s['scaling_efficiency']:.0f}% per GPU vs the smallest cluster "
                      f"that fits ({s['smallest_gpus']} GPUs, {s['smallest_layout']})"
                      + (f"; {s['note']}" if "note" in s else ""))
    for line in extra_lines or []:
        console.print(line)


def memory_chart(plan: Plan, path: Path) -> Path:
    """Stacked bars of the memory breakdown per candidate (and rejected family), with the device's memory."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evs = [plan.recommended, *plan.result.candidates, *plan.result.rejected.values()]
    evs = [ev for ev in evs if ev.memory.total > 0][:12]
    keys = ("params", "grads", "optimizer", "activations", "buffers")
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(evs) + 2), 4.5))
    bottoms = [0.0] * len(evs)
    for key in keys:
        values = [ev.memory.gib()[key] for ev in evs]
        ax.bar(range(len(evs)), values, bottom=bottoms, label=key)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    ax.axhline(plan.hw.memory_gib, color="black", linestyle="--", linewidth=1, label=f"{plan.hw.name} memory")
    ax.set_xticks(range(len(evs)))
    ax.set_xticklabels([f"{ev.layout.family()}\n{ev.layout.dp_replicate}x{ev.layout.dp_shard}x{ev.layout.tp}x"
                        f"{ev.layout.pp}\n{ev.layout.activation_checkpointing}" for ev in evs], fontsize=7)
    ax.set_ylabel("GiB per GPU")
    ax.set_yscale("log" if max(bottoms) > 20 * plan.hw.memory_gib else "linear")
    ax.set_title(f"{plan.spec.name} on {plan.gpus} x {plan.hw.name}: memory per GPU")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
