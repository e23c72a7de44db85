#!/usr/bin/env python3
"""Plots of bench_decode's JSON (schema dhisparse.bench_decode.v1): PNG files for docs/.

  python3 benchmarks/plot_decode.py RESULTS.json [--out DIR] [--prefix decode]

writes, per model:
  DIR/PREFIX-<model>-tokens.png      tokens/s against target C, one line per policy and context,
                                     stand-in on (solid) and off (dashed)
  DIR/PREFIX-<model>-breakdown.png   step-time breakdown (index, top-k, resolve, follower copies,
                                     attention, writes, stand-in): stacked medians per policy and C,
                                     one panel per context
and prints the per-configuration table with the projection to the whole model (see
docs/benchmarks.md): projected step = (step - stand-in) * model_sources / slice_sources + stand-in.

Loading and the series are standard library only (tests/scripts/plot_decode_test.py checks them);
matplotlib is imported only to draw.
"""
import argparse
import json
import os
import sys

SCHEMA = "dhisparse.bench_decode.v1"
PHASES = ["index", "top_k", "resolve", "follower_copies", "attention", "writes", "stand_in"]
POLICIES = ["resident", "fixed-budget", "adaptive"]


def load(path):
    """The document at `path`; raises ValueError when it is not bench_decode's JSON."""
    with open(path) as f:
        doc = json.load(f)
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {doc.get('schema')!r}, expected {SCHEMA!r}")
    return doc


def measured(doc):
    """Rows that ran (no failure note, a step time)."""
    return [r for r in doc["results"] if not r.get("note", "").startswith("FAILED") and (r.get("p50_ms") or 0) > 0]


def projection_factor(doc, model):
    """Model sources over the slice's: how many times the measured attention path a whole step has."""
    s = doc.get("settings", {})
    return s.get("model_sources", {}).get(model, 1) / max(1, s.get("slice_sources", 1))


def projected_step_ms(doc, row):
    """The whole model's step estimate from a slice's: attention path scaled, stand-in once."""
    stand_in = row["phase_ms"].get("stand_in", 0.0) if row.get("stand_in") else 0.0
    return (row["p50_ms"] - stand_in) * projection_factor(doc, row["model"]) + stand_in


def projected_tokens_per_s(doc, row):
    """The whole model's tokens/s estimate: the live sessions' tokens of a step (1 + accepted, on
    average, for a speculative row) over the projected step."""
    proj = projected_step_ms(doc, row)
    return row["live"] * (row.get("tokens_per_step") or 1.0) * 1000.0 / proj if proj > 0 else 0.0


def series_name(row):
    """The policy, with "+spec" for a speculative row (bench_decode --spec), so the two never share a line."""
    return row["policy"] + ("+spec" if (row.get("spec_block") or 1) > 1 else "")


def tokens_series(doc, model):
    """{(policy, context, stand_in): [(C, tokens/s), ...] sorted by C} for `model` (policy: series_name)."""
    out = {}
    for r in measured(doc):
        if r["model"] != model:
            continue
        out.setdefault((series_name(r), r["context"], bool(r["stand_in"])), []).append((r["target_c"], r["tokens_per_s"]))
    return {k: sorted(v) for k, v in out.items()}


def breakdown(doc, model, context):
    """[(label, {phase: ms})] for the stand-in-on rows of `model` at `context`, by C then policy."""
    rows = [r for r in measured(doc) if r["model"] == model and r["context"] == context and r.get("stand_in", True)]
    order = {p: i for i, p in enumerate(POLICIES)}
    rows.sort(key=lambda r: (r["target_c"], order.get(r["policy"], 99)))
    return [(f"C{r['target_c']}\n{series_name(r)}", {p: r["phase_ms"].get(p, 0.0) for p in PHASES}) for r in rows]


def models(doc):
    seen = []
    for r in doc["results"]:
        if r["model"] not in seen:
            seen.append(r["model"])
    return seen


def table(doc):
    lines = [f"{'model':<20} {'policy':<17} {'context':>7} {'C':>4} {'stand-in':>8} {'admit':>9} {'p50 ms':>8} "
             f"{'tok/s':>10} {'proj. ms':>9} {'proj. tok/s':>11} {'host %':>7} {'mismatch':>8}"]
    for r in measured(doc):
        proj = projected_step_ms(doc, r)
        ptok = projected_tokens_per_s(doc, r)
        lines.append(f"{r['model']:<20} {series_name(r):<17} {r['context']:>7} {r['target_c']:>4} "
                     f"{'on' if r['stand_in'] else 'off':>8} {str(r['admitted']) + '/' + str(r['planner_count']):>9} "
                     f"{r['p50_ms']:>8.3f} {r['tokens_per_s']:>10.1f} {proj:>9.3f} {ptok:>11.1f} "
                     f"{100 * r['host_share']:>7.2f} {r['mismatches']:>8}")
    return "\n".join(lines)


def plot(doc, out_dir, prefix):
    """Writes the PNGs; returns their paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    written = []
    device = doc.get("settings", {}).get("device", "")
    for model in models(doc):
        series = tokens_series(doc, model)
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for (policy, context, stand_in), pts in sorted(series.items()):
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o", linestyle="-" if stand_in else "--",
                    label=f"{policy}, {context // 1000}K{'' if stand_in else ', no stand-in'}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("target concurrency C")
        ax.set_ylabel("tokens/s (measured slice)")
        ax.set_title(f"{model}: decode throughput {device}".strip())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        path = os.path.join(out_dir, f"{prefix}-{model}-tokens.png")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)

        contexts = sorted({r["context"] for r in measured(doc) if r["model"] == model})
        fig, axes = plt.subplots(len(contexts), 1, figsize=(max(7, 0.9 * len(breakdown(doc, model, contexts[0]))), 4 * len(contexts)),
                                 squeeze=False)
        for ax, context in zip(axes[:, 0], contexts):
            bars = breakdown(doc, model, context)
            bottom = [0.0] * len(bars)
            for phase in PHASES:
                vals = [b[1][phase] for b in bars]
                ax.bar(range(len(bars)), vals, bottom=bottom, label=phase)
                bottom = [x + y for x, y in zip(bottom, vals)]
            ax.set_xticks(range(len(bars)))
            ax.set_xticklabels([b[0] for b in bars], fontsize=6)
            ax.set_ylabel("ms (phase medians)")
            ax.set_title(f"{model}, {context // 1000}K: step-time breakdown")
            ax.legend(fontsize=7, ncol=4)
        path = os.path.join(out_dir, f"{prefix}-{model}-breakdown.png")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json")
    ap.add_argument("--out", default="docs/plots")
    ap.add_argument("--prefix", default="decode")
    a = ap.parse_args(argv)
    doc = load(a.json)
    print(table(doc))
    for p in plot(doc, a.out, a.prefix):
        print("wrote", p)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
