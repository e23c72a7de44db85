#!/usr/bin/env python3
"""Tests of benchmarks/summarize.py: the ratios and target verdicts it derives from a
bench_cuda_resolver JSON, on synthetic runs whose answers are known.

Run: python3 tests/scripts/summarize_test.py (CTest runs it as test_summarize)."""
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))
import summarize  # noqa: E402

ROW_BYTES = 576


def run(method, pct, C, median, p10=None, p90=None, misses=None, suffix="", **extra):
    """One entry; `suffix` is the name's sweep point and translation (e.g. "/warps_per_sm:8/translation:cold")."""
    misses = misses if misses is not None else round(C * 2048 * pct / 100)
    b = {"name": f"resolve/{method}/row_bytes:{ROW_BYTES}/miss_pct:{pct:g}/C:{C}{suffix}/iterations:64/manual_time",
         "run_type": "iteration", "median_us": median, "p10_us": p10 if p10 is not None else median,
         "p90_us": p90 if p90 is not None else median, "misses_per_step": misses,
         "miss_bytes_per_step": misses * ROW_BYTES, "timed_steps": 64}
    b.update(extra)
    return b


def passing_run():
    """Every target met, each with a clear margin and no spread."""
    return [
        {"name": "pinned_memcpy", "run_type": "iteration", "GBps": 50.0, "median_us": 21475.0, "bytes": 2**30},
        run("one_cta_per_request", 20, 1, 60.0), run("dhisparse", 20, 1, 15.0),
        run("one_cta_per_request", 20, 8, 70.0), run("dhisparse", 20, 8, 50.0),
        # 52,429 misses x 576 B in 800 us = 37.7 GB/s = 0.75x of 50 GB/s, 2x one-CTA.
        run("one_cta_per_request", 20, 128, 1600.0), run("dhisparse", 20, 128, 800.0),
        run("dhisparse", 0.1, 1, 9.0), run("dhisparse_graph", 0.1, 1, 8.5),
        run("dhisparse", 0.1, 128, 9.5),
        # Copy-only runs where the copy target applies (C >= 32): dhisparse / best copy 0.8 and 0.73.
        run("naive_gather", 20, 128, 1100.0), run("claimed_gather", 20, 128, 1000.0, suffix="/warps_per_sm:8"),
        run("naive_gather", 0.1, 128, 13.0),
    ]


def summarize_runs(benchmarks, *flags):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"context": {"date": "test"}, "benchmarks": benchmarks}, f)
        path = f.name
    try:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = summarize.main(["summarize.py", path, *flags])
        return status, out.getvalue()
    finally:
        os.unlink(path)


def verdicts(text):
    """{target description: verdict} from the targets table."""
    found = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 5 and cells[0] == str(ROW_BYTES):
            found[cells[1]] = cells[4].strip("*")
    return found


def replaced(benchmarks, method, pct, C, **fields):
    out = []
    for b in benchmarks:
        if b["name"].startswith(f"resolve/{method}/row_bytes:{ROW_BYTES}/miss_pct:{pct:g}/C:{C}/"):
            b = dict(b, **fields)
        out.append(b)
    return out


C1 = "C=1, 20% misses: dhisparse time ≤ 1/3 of one_cta_per_request"
C8 = "C=8, 20% misses: dhisparse time ≤ 0.85× one_cta_per_request"
MEMCPY = "C=128, 20% misses: dhisparse bandwidth ≥ 0.70× pinned memcpy"
ONE_CTA = "C=128, 20% misses: dhisparse bandwidth ≥ 1.15× one_cta_per_request"
ZERO1 = "C=1, ~0 misses (0.1%): dhisparse step ≤ 10 µs"
ZERO128 = "C=128, ~0 misses (0.1%): dhisparse step ≤ 10 µs"


def copy_target(pct, C, tr="warm"):
    return f"C={C}, {pct:g}% misses, translation {tr}: dhisparse time ≤ 1.05× the best copy-only run"


class Targets(unittest.TestCase):
    def test_every_target_met(self):
        status, text = summarize_runs(passing_run(), "--strict")
        self.assertEqual(status, 0, text)
        self.assertEqual(set(verdicts(text).values()), {"PASS"})
        self.assertIn("0.250", text)  # C1: 15 / 60
        self.assertIn("37.7 GB/s = 0.755×", text)

    def test_each_threshold_failed_alone(self):
        cases = [(C1, ("dhisparse", 20, 1), {"median_us": 20.5, "p10_us": 20.5, "p90_us": 20.5}),
                 (C8, ("dhisparse", 20, 8), {"median_us": 60.0, "p10_us": 60.0, "p90_us": 60.0}),
                 (MEMCPY, ("dhisparse", 20, 128), {"median_us": 1000.0, "p10_us": 1000.0, "p90_us": 1000.0}),
                 (ZERO1, ("dhisparse", 0.1, 1), {"median_us": 10.5, "p10_us": 10.5, "p90_us": 10.5}),
                 (ZERO128, ("dhisparse", 0.1, 128), {"median_us": 13.0, "p10_us": 13.0, "p90_us": 13.0})]
        for target, (method, pct, C), fields in cases:
            with self.subTest(target=target):
                status, text = summarize_runs(replaced(passing_run(), method, pct, C, **fields), "--strict")
                found = verdicts(text)
                self.assertEqual(found[target], "FAIL")
                self.assertEqual([k for k, v in found.items() if v != "PASS"], [target])
                self.assertEqual(status, 1)

    def test_bandwidth_against_one_cta(self):
        status, text = summarize_runs(replaced(passing_run(), "one_cta_per_request", 20, 128, median_us=900.0,
                                               p10_us=900.0, p90_us=900.0))
        self.assertEqual(verdicts(text)[ONE_CTA], "FAIL")  # 900 / 800 = 1.125
        self.assertEqual(status, 0)  # without --strict a failed target does not fail the run

    def test_threshold_inside_the_spread_is_marked(self):
        # C1: median 19.5 / 60 = 0.325 passes, but p90 21 / p10 58 = 0.362 straddles 1/3.
        benchmarks = replaced(passing_run(), "dhisparse", 20, 1, median_us=19.5, p10_us=18.0, p90_us=21.0)
        benchmarks = replaced(benchmarks, "one_cta_per_request", 20, 1, p10_us=58.0, p90_us=62.0)
        status, text = summarize_runs(benchmarks, "--strict")
        self.assertEqual(verdicts(text)[C1], "PASS, inside the spread")
        self.assertIn("0.325 (p10–p90 0.290–0.362)", text)
        self.assertEqual(status, 0)  # the verdict is the median's
        # The ~0-miss step: median 10.2 fails, p10 9.6 is below the limit.
        benchmarks = replaced(passing_run(), "dhisparse", 0.1, 1, median_us=10.2, p10_us=9.6, p90_us=10.9)
        self.assertEqual(verdicts(summarize_runs(benchmarks)[1])[ZERO1], "FAIL, inside the spread")
        # Bandwidth: the p90 step gives the lowest ratio (800 -> 1100 us: 0.755 -> 0.549).
        benchmarks = replaced(passing_run(), "dhisparse", 20, 128, p90_us=1100.0)
        self.assertEqual(verdicts(summarize_runs(benchmarks)[1])[MEMCPY], "PASS, inside the spread")

    def test_missing_configurations(self):
        benchmarks = [b for b in passing_run() if "C:8/" not in b["name"] and b["name"] != "pinned_memcpy"]
        status, text = summarize_runs(benchmarks, "--strict")
        found = verdicts(text)
        self.assertEqual(found[C8], "MISSING")
        self.assertEqual(found[MEMCPY], "MISSING")
        self.assertEqual(found[C1], "PASS")
        self.assertIn("Pinned memcpy baseline: missing", text)
        self.assertEqual(status, 1)

    def test_failed_configuration_is_listed(self):
        benchmarks = passing_run() + [{"name": "resolve/dhisparse/row_bytes:576/miss_pct:5/C:1/manual_time",
                                       "run_type": "iteration", "error_occurred": True,
                                       "error_message": "location 3 holds the wrong bytes"}]
        status, text = summarize_runs(benchmarks, "--strict")
        self.assertIn("### Failed configurations", text)
        self.assertIn("location 3 holds the wrong bytes", text)
        self.assertEqual(status, 1)

    def test_repetitions_take_the_median(self):
        benchmarks = passing_run() + [run("dhisparse", 20, 1, 30.0), run("dhisparse", 20, 1, 16.0)]
        # dhisparse C1 20 %: medians 15, 30, 16 -> 16; 16 / 60 = 0.267
        self.assertIn("0.267", summarize_runs(benchmarks)[1])


class Sweeps(unittest.TestCase):
    def test_one_cta_counts_by_its_fastest_block_size(self):
        benchmarks = [b for b in passing_run() if not b["name"].startswith("resolve/one_cta_per_request/")]
        for C, times in ((1, (70.0, 60.0, 65.0)), (8, (75.0, 70.0, 90.0)), (128, (1700.0, 1650.0, 1600.0))):
            for threads, median in zip((256, 512, 1024), times):
                benchmarks.append(run("one_cta_per_request", 20, C, median, suffix=f"/threads:{threads}"))
        status, text = summarize_runs(benchmarks, "--strict")
        self.assertEqual(set(verdicts(text).values()), {"PASS"}, text)
        self.assertIn("0.250", text)  # C1: 15 / 60, the 512-thread point
        self.assertIn("1,600 (1024)", text)  # C128's best: 1024 threads
        self.assertIn("| one-CTA 256 thr | one-CTA 512 thr | one-CTA 1024 thr |", text)
        self.assertEqual(status, 0)

    def test_best_copy_is_the_fastest_copy_only_run(self):
        benchmarks = passing_run() + [run("claimed_gather", 20, 128, 950.0, suffix="/warps_per_sm:32"),
                                      run("claimed_gather", 20, 128, 1200.0, suffix="/warps_per_sm:4")]
        text = summarize_runs(benchmarks)[1]
        # 800 / 950 = 0.842, the 32-warp point
        self.assertIn("0.842 (p10–p90 0.842–0.842) (best copy: claimed_gather at 32)", text)
        self.assertIn("| claimed 4 w/SM | claimed 8 w/SM | claimed 32 w/SM |", text)

    def test_copy_target_fails_and_flags_above_1_10(self):
        slightly = replaced(passing_run(), "claimed_gather", 20, 128, median_us=740.0, p10_us=740.0, p90_us=740.0)
        status, text = summarize_runs(slightly, "--strict")
        self.assertEqual(verdicts(text)[copy_target(20, 128)], "FAIL")  # 800 / 740 = 1.081
        self.assertNotIn("needs an explanation", text)
        self.assertEqual(status, 1)
        far = replaced(passing_run(), "claimed_gather", 20, 128, median_us=700.0, p10_us=700.0, p90_us=700.0)
        text = summarize_runs(far)[1]
        self.assertEqual(verdicts(text)[copy_target(20, 128)], "FAIL")  # 1.143
        self.assertIn("1.14× the best copy-only run (claimed_gather at 8, 700.0 µs)", text)

    def test_copy_target_only_from_c32(self):
        found = verdicts(summarize_runs(passing_run() + [run("naive_gather", 20, 8, 10.0)])[1])
        self.assertNotIn(copy_target(20, 8), found)
        self.assertIn(copy_target(20, 128), found)

    def test_missing_copy_run_is_missing(self):
        benchmarks = [b for b in passing_run() if "miss_pct:0.1/C:128" not in b["name"] or "dhisparse" in b["name"]]
        status, text = summarize_runs(benchmarks, "--strict")
        self.assertEqual(verdicts(text)[copy_target(0.1, 128)], "MISSING")
        self.assertEqual(status, 1)

    def test_translation_states_are_kept_apart(self):
        cold = [run("dhisparse", 20, 128, 900.0, suffix="/translation:cold"),
                run("naive_gather", 20, 128, 950.0, suffix="/translation:cold")]
        warm_named = [dict(b, name=b["name"].replace("/iterations", "/translation:warm/iterations"))
                      for b in passing_run()]
        status, text = summarize_runs(warm_named + cold, "--strict")
        found = verdicts(text)
        self.assertEqual(found[copy_target(20, 128, "cold")], "PASS")  # 900 / 950
        self.assertIn("0.947 (p10–p90 0.947–0.947) (best copy: naive_gather)", text)
        self.assertEqual(found[C1], "PASS")  # warm-named entries read as before
        self.assertIn("### Rows of 576 bytes, translation-cold: median step time", text)
        self.assertEqual(status, 0)

    def test_busy_and_idle_stream(self):
        text = summarize_runs(passing_run() + [run("dhisparse_idle", 0.1, 1, 14.5)])[1]
        self.assertIn("| warm | 576 | 9.00 | 14.50 | 5.50 |", text)


class Pipeline(unittest.TestCase):
    def test_added_time_beyond_the_indexer(self):
        benchmarks = passing_run() + [run("indexer", 0.1, 1, 2.5), run("dhisparse_after_indexer", 0.1, 1, 14.75),
                                      run("dhisparse_programmatic", 0.1, 1, 12.0)]
        text = summarize_runs(benchmarks)[1]
        self.assertIn("the resolve after the indexer", text)
        rows = [line for line in text.splitlines() if line.startswith("| 0.1% | 1 | 2.50 |")]
        self.assertEqual(len(rows), 1, text)
        # indexer, dhisparse alone, indexer + dhisparse, added, programmatic, added programmatic
        self.assertEqual([c.strip() for c in rows[0].strip("|").split("|")][2:],
                         ["2.50", "9.00", "14.75", "12.25", "12.00", "9.50"])

    def test_no_table_without_the_indexer(self):
        self.assertNotIn("the resolve after the indexer", summarize_runs(passing_run())[1])


if __name__ == "__main__":
    unittest.main()
