"""Parity's report: ``report.json``, ``report.md``, ``logits.png``, ``thresholds.json``."""

from __future__ import annotations

import io
import json
import os
import platform
from pathlib import Path
from typing import Mapping

import numpy as np

from orchestrator.tooling.files import write_atomic
from orchestrator.tooling.modeling.contract import num_cores
from orchestrator.tooling.modeling.parity.metrics import paired_ratio, threshold_logit


def environment() -> dict:
    import importlib.metadata as md

    from orchestrator.tooling.host import cpu_model

    cpu = cpu_model()
    env = {"python": platform.python_version(), "platform": platform.platform(), "cpu": cpu,
           "cores": num_cores(),
           "load_average_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None}
    for p in ("onnxruntime", "transformers", "tokenizers", "numpy", "tritonclient"):
        try:
            env[p] = md.version(p)
        except md.PackageNotFoundError:
            env[p] = None
    return env


def _fmt(x, nd=4) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def _confusion_md(c: dict, ref: str, cand: str) -> list:
    return [
        f"| `{ref}` \\ `{cand}` | positive | negative |",
        "|---|---:|---:|",
        f"| positive | {c['ref_pos_cand_pos']} | {c['ref_pos_cand_neg']} |",
        f"| negative | {c['ref_neg_cand_pos']} | {c['ref_neg_cand_neg']} |",
    ]


def render_markdown(report: dict) -> str:
    """``report.md`` from the ``report.json`` dict."""
    r = report["result"]
    ref = r["reference"]["name"]
    rec = report["recommendation"]
    L = [f"# Parity report: {', '.join(f'`{c}`' for c in r['candidates'])} vs `{ref}`", ""]
    L += [f"Created {report['created_utc']} UTC by `{report['command']}`.", ""]
    d = report["data"]
    L += [f"- Data: {d['source']}; {d['texts']:,} texts, {d['positives']:,} positive "
          f"(sha256 of the label/text lines `{d['sha256'][:16]}...`).",
          f"- Backend: {report['backend']}.",
          f"- Machine: {report['environment']['cpu']}, {report['environment']['cores']} cores, 1-minute load "
          f"{report['environment']['load_average_1min']} at the start; onnxruntime {report['environment']['onnxruntime']}.",
          f"- Batches: {len(report['batches'])} of up to {report['batch_size']} texts, each padded to its longest text "
          f"(lengths {min(b[1] for b in report['batches'])} to {max(b[1] for b in report['batches'])} tokens).", ""]
    L += ["## Recommendation", "", rec["reason"], ""]
    L += ["## Logit agreement", "",
          "d = candidate logit - reference logit, over every text.", "",
          "| candidate | mean \\|d\\| | max d | min d | max \\|d\\| | max \\|probability diff\\| |",
          "|---|---:|---:|---:|---:|---:|"]
    for name, c in r["candidates"].items():
        g = c["logits"]
        L.append(f"| `{name}` | {g['mean_abs_diff']:.3g} | {g['max_diff']:.3g} | {g['min_diff']:.3g} | "
                 f"{g['max_abs_diff']:.3g} | {g['max_abs_prob_diff']:.3g} |")
    L += ["", "![candidate vs reference scores and their differences](logits.png)", ""]
    rr = r["reference"]
    m = rr["vs_labels"]
    L += ["## Reference threshold", "",
          f"Target precision {r['target_precision']}: the smallest threshold among `{ref}`'s probabilities whose "
          f"precision against the labels is at least the target is **{rr['threshold']:.6f}** "
          f"(logit {_fmt(rr['threshold_logit'])}). There `{ref}` calls {rr['positive_verdicts']:,} of "
          f"{r['texts']:,} texts positive: precision {_fmt(m['precision'])}, recall {_fmt(m['recall'])}, "
          f"accuracy {_fmt(m['accuracy'])} (at 0.5: precision {_fmt(rr['at_0_5']['precision'])}, recall "
          f"{_fmt(rr['at_0_5']['recall'])}, accuracy {_fmt(rr['at_0_5']['accuracy'])}).", ""]
    L += ["## Candidates at the reference threshold", "",
          "| model | flips | ref+ cand- | ref- cand+ | accuracy | precision | recall |",
          "|---|---:|---:|---:|---:|---:|---:|",
          f"| `{ref}` (reference) | - | - | - | {_fmt(m['accuracy'])} | {_fmt(m['precision'])} | {_fmt(m['recall'])} |"]
    for name, c in r["candidates"].items():
        a = c["at_reference_threshold"]
        L.append(f"| `{name}` | {a['vs_reference']['flips']} | {a['vs_reference']['ref_pos_cand_neg']} | "
                 f"{a['vs_reference']['ref_neg_cand_pos']} | {_fmt(a['vs_labels']['accuracy'])} | "
                 f"{_fmt(a['vs_labels']['precision'])} | {_fmt(a['vs_labels']['recall'])} |")
    L.append("")
    for name, c in r["candidates"].items():
        L += [f"Confusion of `{name}` against `{ref}`'s verdicts (rows: reference):", ""]
        L += _confusion_md(c["at_reference_threshold"]["vs_reference"], ref, name) + [""]
    L += ["## Re-tuned thresholds", ""]
    retuned = {n: c for n, c in r["candidates"].items() if c["best_threshold"]}
    if not retuned:
        L += ["Every candidate gives the reference's verdicts at the reference threshold: nothing to re-tune.", ""]
    for name, c in retuned.items():
        b = c["best_threshold"]
        same = " (the reference threshold is already the best)" if b["threshold"] == rr["threshold"] else ""
        L += [f"`{name}`: threshold **{b['threshold']:.6f}**{same} (logit {_fmt(b['threshold_logit'])}) gives "
              f"{b['vs_reference']['flips']} flip(s) (was {c['at_reference_threshold']['vs_reference']['flips']}); "
              f"precision {_fmt(b['vs_labels']['precision'])}, recall {_fmt(b['vs_labels']['recall'])}, "
              f"accuracy {_fmt(b['vs_labels']['accuracy'])}.", ""]
        L += _confusion_md(b["vs_reference"], ref, name) + [""]
    L += ["## Speed and size", "", f"Measured in this run: {report['latency_source']}.", "",
          "| model | file bytes | median ms/batch | mean | p90 | texts/s | vs reference (paired) |",
          "|---|---:|---:|---:|---:|---:|---:|"]
    lat = report["latency"]
    for name in [ref, *r["candidates"]]:
        mdl = report["models"][name]
        la = lat.get(name)
        if la:
            rel = paired_ratio(la, lat[ref])
            L.append(f"| `{name}` | {mdl['bytes']:,} | {la['median_ms']:.1f} | {la['mean_ms']:.1f} | "
                     f"{la['p90_ms']:.1f} | {la['texts_per_s']:.0f} | {rel:.2f}x |")
        else:
            L.append(f"| `{name}` | {mdl['bytes']:,} | n/a | n/a | n/a | n/a | n/a |")
    L += ["", f"ms per batch of up to {report['batch_size']} texts, {report['timing_passes']} timed pass(es) over the "
          "data after one warm-up batch, models interleaved batch by batch; \"vs reference\" is the median over "
          "batches of the per-batch time ratio.", ""]
    if report.get("cross_check"):
        cc = report["cross_check"]
        L += ["## Cross-check", "", f"The same batches through {cc['backend']}: token ids identical: "
              f"{cc['token_ids_identical']}; max |logit difference| to the main run: "
              + ", ".join(f"`{k}` {v:.3g}" for k, v in cc["max_abs_logit_diff"].items()) + ".", ""]
        if cc.get("latency"):
            L += ["Round-trip latency there (HTTP; not comparable with in-process numbers): "
                  + ", ".join(f"`{k}` {v['median_ms']:.1f} ms/batch median" for k, v in cc["latency"].items()) + ".", ""]
    L += ["## Thresholds", "", "`thresholds.json` (probabilities for the `THRESHOLD` input; candidates: "
          "their operating threshold):", "", "```json", json.dumps(report["thresholds"], indent=2), "```", ""]
    L += ["## Definitions", "",
          "- Score: the logit (one-logit models) or logit[1] - logit[0] (two-logit models), divided by the model's "
          "`head.json` temperature when it has a calibration (as the router and postprocess serve it); probability = "
          "sigmoid(score) in float64 rounded to float32, verdict = probability >= threshold (the `postprocess` model's rule).",
          "- Reference threshold: the smallest threshold among the reference's probabilities on these texts whose "
          "precision TP/(TP+FP) against the labels is at least the target (any threshold between the next lower "
          "probability and it gives the same verdicts).",
          "- Flips: texts whose candidate verdict differs from the reference's at the same threshold.",
          "- Best candidate threshold (only when there are flips): among the reference threshold, the candidate's "
          "probabilities and a value just above its largest one, the threshold with the fewest flips; ties go to the "
          "one closest to the reference threshold, then the smaller.",
          f"- Recommendation: a candidate qualifies with at most {rec['rule']['max_flip_rate']:.2%} of the texts "
          "flipped at its operating threshold (its precision there is reported, not a condition: the reference "
          "threshold sits exactly at the target, so one flip can move a candidate just below it); it replaces the reference "
          f"if its latency (median of per-batch ratios) is at most {1 - rec['rule']['speed_margin']:.2f}x the reference's, or "
          f"within {rec['rule']['speed_margin']:.0%} with a file at most {rec['rule']['size_margin']:.1f}x the size. "
          "Speed is the one measured here; other hardware (a GPU, TensorRT) needs its own run.",
          "", "Source: `orchestrator/tooling/modeling/parity/` (`orchestrator parity`).", ""]
    return "\n".join(L)


def plot_logits(path: Path, ref_name: str, ref_scores: np.ndarray, cand_scores: Mapping[str, np.ndarray],
                ref_threshold: float) -> None:
    """PNG, one row per candidate: candidate vs reference score (with y = x and the reference
    threshold's logit), the difference vs the reference score, and a histogram of the
    differences (log count axis). Scores in logits (:func:`binary_scores`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(cand_scores)
    fig, axes = plt.subplots(n, 3, figsize=(13, 3.6 * n), squeeze=False)
    t_logit = threshold_logit(ref_threshold)
    for row, (name, s) in enumerate(cand_scores.items()):
        ax = axes[row][0]
        ax.scatter(ref_scores, s, s=4, alpha=0.5, linewidths=0)
        lo, hi = float(min(ref_scores.min(), s.min())), float(max(ref_scores.max(), s.max()))
        ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8, label="y = x")
        if t_logit is not None:
            ax.axvline(t_logit, color="red", linewidth=0.8, linestyle="--", label="reference threshold")
            ax.axhline(t_logit, color="red", linewidth=0.8, linestyle="--")
        ax.set_xlabel(f"{ref_name} score (logit)")
        ax.set_ylabel(f"{name} score (logit)")
        ax.set_title(f"{name} vs {ref_name}")
        ax.legend(loc="upper left", fontsize=8)
        d = s - ref_scores
        ax = axes[row][1]
        ax.scatter(ref_scores, d, s=4, alpha=0.5, linewidths=0, color="tab:green")
        ax.axhline(0, color="black", linewidth=0.8)
        if t_logit is not None:
            ax.axvline(t_logit, color="red", linewidth=0.8, linestyle="--")
        ax.set_xlabel(f"{ref_name} score (logit)")
        ax.set_ylabel(f"d = {name} - {ref_name}")
        ax.set_title("difference vs reference score")
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        ax = axes[row][2]
        ax.hist(d, bins=60, color="tab:orange")
        ax.set_yscale("log")
        ax.set_xlabel(f"d = {name} - {ref_name} (logit)")
        ax.set_ylabel("texts")
        ax.ticklabel_format(axis="x", style="sci", scilimits=(-2, 3))
        ax.set_title(f"max |d| {np.max(np.abs(d)):.2g}, mean |d| {np.mean(np.abs(d)):.2g}")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=80)
    plt.close(fig)
    write_atomic(path, png.getvalue(), 0o644)


def render_markdown_multi(report: dict) -> str:
    """``report.md`` for a multiclass or multilabel head: flips, thresholds, recommendation."""
    r = report["result"]
    ref = r["reference"]["name"]
    L = [f"# Parity report: {', '.join(f'`{c}`' for c in r['candidates'])} vs `{ref}`", "",
         f"Created {report['created_utc']} UTC by `{report['command']}`.", "",
         f"- Head: {r['head']}.", f"- Data: {report['data']['source']}; {report['data']['texts']:,} texts.",
         f"- Backend: {report['backend']}.", "", "## Recommendation", "", report["recommendation"]["reason"], "",
         "## Flips", "",
         "A flip: a text whose top label changed (multiclass) or with some label's verdict changed (multilabel) "
         "at the reference's thresholds (multilabel: per label, the smallest with precision >= "
         f"{r['target_precision']} on that label's column).",
         "", "| candidate | max \\|logit d\\| | max \\|probability d\\| | flips | operating thresholds |", "|---|---:|---:|---:|---|"]
    for name, c in r["candidates"].items():
        L.append(f"| `{name}` | {c['logits']['max_abs_diff']:.3g} | {c['logits']['max_abs_prob_diff']:.3g} | "
                 f"{c['at_reference_threshold']['vs_reference']['flips']} | {c['operating_threshold']} |")
    L += ["", "## Thresholds", "", "```json", json.dumps(report["thresholds"], indent=2), "```", ""]
    return "\n".join(L)


def write_report(report: dict, out: Path, ref_scores, cand_scores) -> dict:
    """Write ``report.json``, ``report.md``, ``thresholds.json`` and, for binary heads
    (``ref_scores`` given, in logits), ``logits.png`` into ``out``; return ``{name: path}``."""
    out.mkdir(parents=True, exist_ok=True)
    names = ("report.json", "report.md", "thresholds.json") + (("logits.png",) if ref_scores is not None else ())
    paths = {k: out / k for k in names}
    paths["report.json"].write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    from orchestrator.tooling.modeling.parity.calibration import calibration_markdown

    multi = "head" in report["result"]
    text = render_markdown_multi(report) if multi else render_markdown(report)
    section = calibration_markdown(report.get("calibration") or {})
    if section:
        text = text.rstrip("\n") + "\n\n" + "\n".join(section)
    paths["report.md"].write_text(text, encoding="utf-8")
    paths["thresholds.json"].write_text(json.dumps(report["thresholds"], indent=2) + "\n", encoding="utf-8")
    if ref_scores is not None:
        plot_logits(paths["logits.png"], report["result"]["reference"]["name"], ref_scores, cand_scores,
                    report["result"]["reference"]["threshold"])
    return paths

