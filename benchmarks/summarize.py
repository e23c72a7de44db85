#!/usr/bin/env python3
"""Markdown tables and target verdicts from bench_cuda_resolver's Google Benchmark JSON.

Usage:
    python3 benchmarks/summarize.py bench_cuda_resolver.json [--strict]

Prints, for docs/benchmarks.md: the pinned-memcpy ceiling, one table per row size and translation
state (warm, and translation-cold when the run has it: median step time of every method, p10-p90
of dhisparse, effective host-recovery bandwidth, ratios against the same-run baselines, overhead
against resident), every sweep point of the copy-only claimed_gather (warps per SM) and of
one_cta_per_request (block size), the resolve after the indexer stand-in (plain and programmatic
launch), the C = 1 ~0-miss step queued on a busy and on an idle stream, the targets with
PASS/FAIL, every configuration more than 1.10x slower than the best copy-only run (each needs an
explanation), and any configuration that failed (wrong bytes, CUDA error).

Baselines with a sweep count by their best point: `one_cta_per_request` is the fastest block
size, `claimed_gather` the fastest warps-per-SM point, and *best copy* the fastest copy-only run
(naive_gather or any claimed_gather point). Ratios are recomputed here from the medians, so they
do not depend on the counters the binary adds. With --strict the exit status is 1 when a target
fails or cannot be evaluated, or a configuration reported an error.

Standard library only (Python 3.8+).
"""
import json
import re
import statistics
import sys

METHODS = ["resident", "naive_gather", "claimed_gather", "one_cta_per_request", "dhisparse", "dhisparse_graph",
           "indexer", "dhisparse_after_indexer", "dhisparse_programmatic", "dhisparse_idle"]
NAME_RE = re.compile(
    r"^resolve/(?P<method>[a-z_]+)/row_bytes:(?P<rb>\d+)/miss_pct:(?P<pct>[0-9.e+-]+)/C:(?P<C>\d+)"
    r"(?:/warps_per_sm:(?P<wps>\d+))?(?:/threads:(?P<threads>\d+))?(?:/translation:(?P<tr>warm|cold))?(?:/|$)")

ZERO_MISS_PCT = 0.1  # the "~0 misses" configuration
COPY_TARGET = 1.05   # dhisparse / best copy-only, every C >= COPY_TARGET_MIN_C
COPY_FLAG = 1.10     # above this, a configuration is listed for explanation
COPY_TARGET_MIN_C = 32
TRANSLATIONS = ("warm", "cold")


def load(path):
    with open(path) as f:
        data = json.load(f)
    return data.get("context", {}), data.get("benchmarks", [])


def collect(benchmarks):
    """Returns (memcpy entry or None, {(rb, pct, C): {method: stats}}, [errors])."""
    runs = {}  # name -> list of iteration entries (repetitions)
    errors = []
    memcpy = []
    for b in benchmarks:
        if b.get("run_type", "iteration") != "iteration":
            continue  # aggregates (mean/median/stddev of repetitions) are recomputed below
        name = b.get("run_name") or b.get("name", "")
        if b.get("error_occurred") or (b.get("skipped") and b.get("skip_message")):
            errors.append((name, b.get("error_message") or b.get("skip_message") or "error"))
            continue
        if name.startswith("pinned_memcpy"):
            memcpy.append(b)
            continue
        runs.setdefault(name, []).append(b)

    cells = {}
    for name, reps in runs.items():
        m = NAME_RE.match(name)
        if not m:
            continue
        key = (int(m.group("rb")), round(float(m.group("pct")), 6), int(m.group("C")), m.group("tr") or "warm")
        method = m.group("method")
        variant = None
        if m.group("wps"):
            variant = int(m.group("wps"))
        elif m.group("threads"):
            variant = int(m.group("threads"))

        def med(field, reps=reps):
            vals = [r[field] for r in reps if field in r]
            return statistics.median(vals) if vals else None

        stats = {
            "median_us": med("median_us"),
            "p10_us": med("p10_us"),
            "p90_us": med("p90_us"),
            "host_GBps": med("host_GBps"),
            "misses": med("misses_per_step"),
            "miss_bytes": med("miss_bytes_per_step"),
            "steps": med("timed_steps"),
            "repetitions": len(reps),
            "variant": variant,
        }
        cells.setdefault(key, {})[method if variant is None else f"{method}@{variant}"] = stats
    for c in cells.values():
        add_best_points(c)
    mc = None
    if memcpy:
        gbps = [b["GBps"] for b in memcpy if "GBps" in b]
        med_us = [b["median_us"] for b in memcpy if "median_us" in b]
        mc = {"GBps": statistics.median(gbps) if gbps else None,
              "median_us": statistics.median(med_us) if med_us else None,
              "bytes": memcpy[0].get("bytes")}
    return mc, cells, errors


def best_of(stats):
    """The lowest-median entry of a list of stats (None if none has a median)."""
    timed = [x for x in stats if x.get("median_us") is not None]
    return min(timed, key=lambda x: x["median_us"]) if timed else None


def add_best_points(c):
    """Adds to a configuration's cell the best point of each swept baseline under the base name
    (one_cta_per_request: the fastest block size; claimed_gather: the fastest warps per SM) and
    `best_copy`, the fastest copy-only run (naive_gather or any claimed_gather point)."""
    for base in ("one_cta_per_request", "claimed_gather"):
        points = [v for k, v in c.items() if k == base or k.startswith(base + "@")]
        best = best_of(points)
        if best is not None:
            c[base] = best
    best = best_of([v for k, v in c.items() if k == "naive_gather" or k.startswith("claimed_gather@")])
    if best is not None:
        c["best_copy"] = dict(best, source=next(k for k, v in c.items() if v is best))


def sweep_points(c, base):
    """[(variant, stats)] of a swept baseline, in variant order."""
    return sorted(((v["variant"], v) for k, v in c.items() if k.startswith(base + "@")), key=lambda x: x[0])


def for_translation(cells, tr):
    """The cells of one translation state, keyed (row bytes, miss %, C)."""
    return {k[:3]: v for k, v in cells.items() if k[3] == tr}


def fmt(v, digits=1):
    if v is None:
        return "–"
    if isinstance(v, str):
        return v
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def t(cell, method, field="median_us"):
    return (cell.get(method) or {}).get(field)


def gbps(cell, method):
    """Effective host-recovery bandwidth: missing bytes / median step time."""
    s = cell.get(method)
    if not s or not s.get("median_us") or s.get("miss_bytes") is None:
        return None
    return s["miss_bytes"] / (s["median_us"] * 1e3)


def pct_text(p):
    return f"{p:g}%"


def table_head(*columns):
    """A Markdown table's header row and separator."""
    return ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]


def variant_text(cell, method):
    v = (cell.get(method) or {}).get("variant")
    return "" if v is None else f" ({v})"


def results_tables(cells, memcpy_gbps, tr="warm"):
    out = []
    state = "warm translations" if tr == "warm" else "translation-cold"
    for rb in sorted({k[0] for k in cells}):
        keys = sorted(k for k in cells if k[0] == rb)
        out.append(f"### Rows of {rb} bytes, {state}: median step time (µs)\n")
        out.append("One step = one resolve of the whole batch (CUDA events). dhisparse with its p10–p90 spread; "
                   "one_cta_per_request at its fastest block size (threads), claimed_gather at its fastest warps "
                   "per SM, *best copy* the fastest copy-only run.\n")
        out += table_head("misses", "C", "misses/step", "resident", "naive_gather", "claimed_gather (w/SM)",
                          "best copy", "one_cta_per_request (threads)", "dhisparse (p10–p90)", "dhisparse_graph")
        for key in keys:
            _, pct, C = key
            c = cells[key]
            dh = t(c, "dhisparse")
            dh_cell = fmt(dh)
            if dh is not None and t(c, "dhisparse", "p10_us") is not None:
                dh_cell += f" ({fmt(t(c, 'dhisparse', 'p10_us'))}–{fmt(t(c, 'dhisparse', 'p90_us'))})"
            misses = next((s.get("misses") for s in c.values() if s.get("misses") is not None), None)
            row = [pct_text(pct), str(C), fmt(misses, 0), fmt(t(c, "resident")), fmt(t(c, "naive_gather")),
                   fmt(t(c, "claimed_gather")) + variant_text(c, "claimed_gather"), fmt(t(c, "best_copy")),
                   fmt(t(c, "one_cta_per_request")) + variant_text(c, "one_cta_per_request"), dh_cell,
                   fmt(t(c, "dhisparse_graph"))]
            out.append("| " + " | ".join(row) + " |")
        out.append("")
        out.append(f"### Rows of {rb} bytes, {state}: bandwidth and ratios\n")
        out.append("GB/s = missing bytes of the step / median step time. Time ratios are dhisparse / baseline "
                   "(lower is better); *speedup* = one_cta_per_request / dhisparse; *overhead* compares with "
                   "resident (every row in HBM).\n")
        out += table_head("misses", "C", "dhisparse GB/s", "one-CTA GB/s", "naive GB/s", "best copy GB/s",
                          "dhisparse BW / memcpy", "dhisparse / one-CTA", "speedup vs one-CTA", "dhisparse / naive",
                          "dhisparse / best copy", "overhead: dhisparse / resident", "dhisparse − resident (µs)",
                          "one-CTA / resident")
        for key in keys:
            _, pct, C = key
            c = cells[key]
            dh = t(c, "dhisparse")
            res = t(c, "resident")
            dh_bw = gbps(c, "dhisparse")
            row = [
                pct_text(pct), str(C),
                fmt(dh_bw), fmt(gbps(c, "one_cta_per_request")), fmt(gbps(c, "naive_gather")),
                fmt(gbps(c, "best_copy")),
                fmt(ratio(dh_bw, memcpy_gbps), 2),
                fmt(ratio(dh, t(c, "one_cta_per_request")), 2),
                fmt(ratio(t(c, "one_cta_per_request"), dh), 2),
                fmt(ratio(dh, t(c, "naive_gather")), 2),
                fmt(ratio(dh, t(c, "best_copy")), 2),
                fmt(ratio(dh, res), 2),
                fmt(None if dh is None or res is None else dh - res),
                fmt(ratio(t(c, "one_cta_per_request"), res), 2),
            ]
            out.append("| " + " | ".join(row) + " |")
        out.append("")
        out += sweep_table(cells, rb, state)
    return out


def sweep_table(cells, rb, state):
    """Every sweep point's median (µs): claimed_gather per warps per SM, one_cta_per_request per
    block size (only when the run has sweep points)."""
    keys = sorted(k for k in cells if k[0] == rb)
    wps = sorted({v for k in keys for v, _ in sweep_points(cells[k], "claimed_gather")})
    threads = sorted({v for k in keys for v, _ in sweep_points(cells[k], "one_cta_per_request")})
    if not wps and not threads:
        return []
    out = [f"### Rows of {rb} bytes, {state}: sweep points (median µs)\n",
           "claimed_gather at each number of warps per SM; one_cta_per_request at each block size.\n"]
    out += table_head("misses", "C", *[f"claimed {w} w/SM" for w in wps], *[f"one-CTA {n} thr" for n in threads])
    for key in keys:
        _, pct, C = key
        c = cells[key]
        cg = dict(sweep_points(c, "claimed_gather"))
        oc = dict(sweep_points(c, "one_cta_per_request"))
        row = [pct_text(pct), str(C)] + [fmt((cg.get(w) or {}).get("median_us")) for w in wps] + \
              [fmt((oc.get(n) or {}).get("median_us")) for n in threads]
        out.append("| " + " | ".join(row) + " |")
    out.append("")
    return out


def launch_table(cells4):
    """The C = 1 ~0-miss step queued on a busy stream (the L2 flush still running: dhisparse)
    and on an idle one (dhisparse_idle: the host's launch latency inside the events)."""
    rows = []
    for (rb, pct, C, tr), c in sorted(cells4.items()):
        if C != 1 or pct != round(ZERO_MISS_PCT, 6) or t(c, "dhisparse_idle") is None:
            continue
        busy, idle = t(c, "dhisparse"), t(c, "dhisparse_idle")
        rows.append(f"| {tr} | {rb} | {fmt(busy, 2)} | {fmt(idle, 2)} | "
                    f"{fmt(None if busy is None else idle - busy, 2)} |")
    if not rows:
        return []
    out = ["### C = 1, ~0 misses: busy and idle stream (µs)\n",
           "*Busy*: the step queued while the L2 flush still runs (the usual timing: the host's launch "
           "latency is hidden); *idle*: the same step queued on an idle stream after the flush, so the "
           "host's launch latency falls inside the events.\n"]
    out += table_head("translation", "row bytes", "dhisparse, busy stream", "dhisparse, idle stream",
                      "launch gap (idle − busy)")
    return out + rows + [""]


def pipeline_tables(cells):
    """The resolve after the indexer stand-in, launched plainly and programmatically: the step's
    time beyond the indexer's alone (only configurations that ran the indexer)."""
    out = []
    for rb in sorted({k[0] for k in cells}):
        keys = sorted(k for k in cells if k[0] == rb and t(cells[k], "indexer") is not None)
        if not keys:
            continue
        out.append(f"### Rows of {rb} bytes: the resolve after the indexer (µs)\n")
        out.append("Indexer = the stand-in kernel that writes the step's selections; the next columns time "
                   "indexer + resolve, the resolve launched as usual or programmatically "
                   "(`set_programmatic_launch`); *added* = that time minus the indexer's alone.\n")
        out += table_head("misses", "C", "indexer", "dhisparse alone", "indexer + dhisparse", "added",
                          "indexer + dhisparse, programmatic", "added, programmatic")
        for key in keys:
            _, pct, C = key
            c = cells[key]
            idx = t(c, "indexer")
            plain, prog = t(c, "dhisparse_after_indexer"), t(c, "dhisparse_programmatic")
            row = [pct_text(pct), str(C), fmt(idx, 2), fmt(t(c, "dhisparse"), 2), fmt(plain, 2),
                   fmt(None if plain is None else plain - idx, 2), fmt(prog, 2),
                   fmt(None if prog is None else prog - idx, 2)]
            out.append("| " + " | ".join(row) + " |")
        out.append("")
    return out


def spread_text(lo, hi, digits):
    return "" if lo is None or hi is None else f" (p10–p90 {fmt(lo, digits)}–{fmt(hi, digits)})"


def verdict_text(ok, lo, hi, threshold):
    """PASS/FAIL from the medians; marked when the threshold falls inside the p10-p90 spread of
    the same quantity, where another run may well read the other way."""
    if ok is None:
        return "MISSING"
    text = "PASS" if ok else "FAIL"
    if lo is not None and hi is not None and lo <= threshold <= hi:
        text += ", inside the spread"
    return text


def targets(cells, memcpy_gbps):
    """The issue's targets, per row size. Returns (lines, all_ok).

    Each verdict compares medians; beside it, the same quantity from the p10 and p90 step times
    (dhisparse's and the baseline's, taken at their extremes), so a verdict whose threshold lies
    inside that spread says so."""
    rows = []
    all_ok = True

    def cell(rb, pct, C):
        return cells.get((rb, round(pct, 6), C), {})

    def time_ratio_spread(c, num, den):
        """(lowest, highest) of num/den over their p10-p90 step times."""
        return ratio(t(c, num, "p10_us"), t(c, den, "p90_us")), ratio(t(c, num, "p90_us"), t(c, den, "p10_us"))

    for rb in sorted({k[0] for k in cells}):
        checks = []  # (description, measured, required, ok, lo, hi, threshold)
        for C, limit, required, desc in (
                (1, 1 / 3, "≤ 0.333", "C=1, 20% misses: dhisparse time ≤ 1/3 of one_cta_per_request"),
                (8, 0.85, "≤ 0.85", "C=8, 20% misses: dhisparse time ≤ 0.85× one_cta_per_request")):
            c = cell(rb, 20.0, C)
            r = ratio(t(c, "dhisparse"), t(c, "one_cta_per_request"))
            lo, hi = time_ratio_spread(c, "dhisparse", "one_cta_per_request")
            checks.append((desc, fmt(r, 3) + spread_text(lo, hi, 3), required, None if r is None else r <= limit,
                           lo, hi, limit))
        c = cell(rb, 20.0, 128)
        bw = gbps(c, "dhisparse")
        r = ratio(bw, memcpy_gbps)
        med = t(c, "dhisparse")
        # Bandwidth scales as 1 / step time: the p90 step gives the lowest bandwidth.
        lo = None if r is None else ratio(r * med, t(c, "dhisparse", "p90_us"))
        hi = None if r is None else ratio(r * med, t(c, "dhisparse", "p10_us"))
        checks.append(("C=128, 20% misses: dhisparse bandwidth ≥ 0.70× pinned memcpy",
                       (f"{fmt(bw)} GB/s = {fmt(r, 3)}×" + spread_text(lo, hi, 3)) if r is not None else "–",
                       "≥ 0.70×", None if r is None else r >= 0.70, lo, hi, 0.70))
        r = ratio(bw, gbps(c, "one_cta_per_request"))
        lo, hi = time_ratio_spread(c, "one_cta_per_request", "dhisparse")
        checks.append(("C=128, 20% misses: dhisparse bandwidth ≥ 1.15× one_cta_per_request",
                       fmt(r, 3) + spread_text(lo, hi, 3), "≥ 1.15×", None if r is None else r >= 1.15, lo, hi, 1.15))
        for C in (1, 128):
            c = cell(rb, ZERO_MISS_PCT, C)
            v = t(c, "dhisparse")
            g = t(c, "dhisparse_graph")
            lo, hi = t(c, "dhisparse", "p10_us"), t(c, "dhisparse", "p90_us")
            measured = (f"{fmt(v, 2)} µs" + spread_text(lo, hi, 1) +
                        (f", graph {fmt(g, 2)} µs" if g is not None else ""))
            checks.append((f"C={C}, ~0 misses ({ZERO_MISS_PCT:g}%): dhisparse step ≤ 10 µs", measured, "≤ 10 µs",
                           None if v is None else v <= 10.0, lo, hi, 10.0))
        for desc, measured, required, ok, lo, hi, threshold in checks:
            if ok is not True:
                all_ok = False
            rows.append(f"| {rb} | {desc} | {measured} | {required} | **{verdict_text(ok, lo, hi, threshold)}** |")
    lines = table_head("row bytes", "target", "measured", "required", "verdict") + rows
    return lines, all_ok


def copy_targets(cells4):
    """dhisparse ≤ 1.05× the best copy-only run at every C ≥ 32, every miss rate, row size and
    translation state in the run. Returns (target rows, flagged lines, all_ok): flagged are the
    configurations above 1.10×, each of which needs an explanation."""
    rows, flagged = [], []
    all_ok = True
    for (rb, pct, C, tr), c in sorted(cells4.items(), key=lambda kv: (kv[0][3] != "warm", kv[0])):
        if C < COPY_TARGET_MIN_C or t(c, "dhisparse") is None:
            continue
        r = ratio(t(c, "dhisparse"), t(c, "best_copy"))
        lo = ratio(t(c, "dhisparse", "p10_us"), t(c, "best_copy", "p90_us"))
        hi = ratio(t(c, "dhisparse", "p90_us"), t(c, "best_copy", "p10_us"))
        ok = None if r is None else r <= COPY_TARGET
        if ok is not True:
            all_ok = False
        source = (c.get("best_copy") or {}).get("source", "–").replace("@", " at ")
        desc = (f"C={C}, {pct_text(pct)} misses, translation {tr}: dhisparse time ≤ {COPY_TARGET:.2f}× the best "
                f"copy-only run")
        rows.append(f"| {rb} | {desc} | {fmt(r, 3)}{spread_text(lo, hi, 3)} (best copy: {source}) | "
                    f"≤ {COPY_TARGET:.2f} | **{verdict_text(ok, lo, hi, COPY_TARGET)}** |")
        if r is not None and r > COPY_FLAG:
            flagged.append(f"- rows of {rb} B, C = {C}, {pct_text(pct)} misses, translation {tr}: dhisparse "
                           f"{fmt(t(c, 'dhisparse'))} µs = {fmt(r, 2)}× the best copy-only run ({source}, "
                           f"{fmt(t(c, 'best_copy'))} µs)")
    return rows, flagged, all_ok


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    strict = "--strict" in argv[1:]
    if len(args) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    context, benchmarks = load(args[0])
    memcpy, cells, errors = collect(benchmarks)
    memcpy_gbps = memcpy["GBps"] if memcpy else None

    out = ["## bench_cuda_resolver results", ""]
    ctx = []
    for k in ("host_name", "date", "executable", "num_cpus", "library_build_type",
              "dhisparse_timed_steps", "dhisparse_warmup_steps", "dhisparse_baseline_timed_steps",
              "dhisparse_baseline_warmup_steps", "dhisparse_history_rows", "dhisparse_flush_l2",
              "dhisparse_warps_per_sm", "dhisparse_claim_rows", "dhisparse_one_cta_threads",
              "dhisparse_translation"):
        if k in context:
            ctx.append(f"{k}={context[k]}")
    if ctx:
        out += ["Context: " + ", ".join(ctx), ""]
    if memcpy:
        out += [f"Pinned host→device cudaMemcpyAsync ({fmt((memcpy.get('bytes') or 0) / 2**30, 0)} GiB, median): "
                f"**{fmt(memcpy_gbps)} GB/s** ({fmt(memcpy.get('median_us'))} µs)", ""]
    else:
        out += ["Pinned memcpy baseline: missing (bandwidth ratios cannot be computed)", ""]
    warm = for_translation(cells, "warm")
    for tr in TRANSLATIONS:
        part = for_translation(cells, tr)
        if part:
            out += results_tables(part, memcpy_gbps, tr)
    out += pipeline_tables(warm)
    out += launch_table(cells)
    out += ["### Targets", ""]
    out.append("Targets 1–6 are judged with warm translations, against one_cta_per_request at its fastest block "
               "size; the copy-only target at every C ≥ 32 in every translation state of the run.")
    out.append("")
    tl, ok = targets(warm, memcpy_gbps)
    copy_rows, flagged, copy_ok = copy_targets(cells)
    out += tl + copy_rows + [""]
    ok = ok and copy_ok
    if flagged:
        out += [f"### Above {COPY_FLAG:.2f}× the best copy-only run (each needs an explanation)", ""]
        out += flagged + [""]
    if errors:
        out += ["### Failed configurations", ""]
        out += [f"- `{n}`: {msg}" for n, msg in errors]
        out.append("")
    print("\n".join(out))
    if strict and (not ok or errors):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
