"""The benchmark's PNG plots (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Mapping

from lab.bench.plan import BATCH_SIZES, CONCURRENCIES, GRID_MODELS, SWEEP_CONCURRENCY


def write_plots(results: Mapping, out_dir: Path | str) -> List[Path]:
    """PNG plots (matplotlib, Agg) into ``out_dir``: latency.png (p50/p90/p99 per
    concurrency and model), throughput.png, length.png, batch.png. Returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meas = [m for m in results["measurements"] if not m.get("error")]
    grid = [m for m in meas if m["section"] == "grid"]
    paths = []
    stamp = f"{results['machine']['cpu_model']}, {results['machine']['cores']} cores; {results['created_utc']} UTC"

    fig, axes = plt.subplots(1, 3, figsize=(13, 4), sharey=True)
    for ax, p in zip(axes, (50, 90, 99)):
        for model in GRID_MODELS:
            pts = sorted((m["concurrency"], m[f"p{p}_ms"]) for m in grid if m["model"] == model)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=model)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(CONCURRENCIES, [str(c) for c in CONCURRENCIES])
        ax.set_title(f"p{p} latency")
        ax.set_xlabel("concurrency")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("ms")
    axes[0].legend()
    fig.suptitle(f"Latency per concurrency (perf_analyzer, gRPC, batch 1) — {stamp}", fontsize=9)
    fig.tight_layout()
    paths.append(out_dir / "latency.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for model in GRID_MODELS:
        pts = sorted((m["concurrency"], m["throughput"]) for m in grid if m["model"] == model)
        if pts:
            ax.plot(*zip(*pts), marker="o", label=model)
    ax.set_xscale("log", base=2)
    ax.set_xticks(CONCURRENCIES, [str(c) for c in CONCURRENCIES])
    ax.set_xlabel("concurrency")
    ax.set_ylabel("infer/s")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title(f"Throughput per concurrency\n{stamp}", fontsize=9)
    fig.tight_layout()
    paths.append(out_dir / "throughput.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    for section, key, labels, title in (
        ("length", "dataset", ("short", "medium", "long"), f"Text length (concurrency {SWEEP_CONCURRENCY})"),
        ("batch", "batch_size", BATCH_SIZES, f"Client batch (concurrency {SWEEP_CONCURRENCY})"),
    ):
        sel = [m for m in meas if m["section"] == section]
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for model in dict.fromkeys(m["model"] for m in sel):
            xs = [i for i, lab in enumerate(labels) for m in sel if m["model"] == model and m[key] == lab]
            for ax, metric in zip(axes, ("throughput", "p99_ms")):
                ys = [m[metric] for lab in labels for m in sel if m["model"] == model and m[key] == lab]
                ax.plot(xs, ys, marker="o", label=model)
        if section == "length":
            ticks = [f"{lab}\n({results['datasets'].get(lab, {}).get('tokens_p50', 0):.0f} tokens median)" for lab in labels]
        else:
            ticks = [str(lab) for lab in labels]
        for ax, ylabel in zip(axes, ("throughput (infer/s)", "p99 latency (ms)")):
            ax.set_xticks(range(len(labels)), ticks)
            ax.set_xlabel("text length set" if section == "length" else "client batch size (texts per request)")
            ax.set_ylabel(ylabel)
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.legend()
        fig.suptitle(f"{title} — {stamp}", fontsize=9)
        fig.tight_layout()
        paths.append(out_dir / f"{section}.png")
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    return paths

