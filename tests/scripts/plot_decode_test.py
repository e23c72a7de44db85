#!/usr/bin/env python3
"""Tests of benchmarks/plot_decode.py on a synthetic bench_decode JSON whose answers are known
(the field names are those decode_model.hpp's to_json writes; tests/host/decode_model.cpp checks
that side). The PNGs are drawn only where matplotlib is installed, into a temporary directory.

Run: python3 tests/scripts/plot_decode_test.py (CTest runs it as test_plot_decode)."""
import contextlib
import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))
import plot_decode  # noqa: E402

PHASES = ["index", "top_k", "resolve", "follower_copies", "attention", "writes", "stand_in"]


def row(model, policy, context, c, p50, stand_in=True, note="", live=None, stand_in_ms=1.0):
    live = c if live is None else live
    phases = {p: 0.1 for p in PHASES}
    phases["stand_in"] = stand_in_ms
    return {"model": model, "policy": policy, "context": context, "target_c": c, "stand_in": stand_in,
            "spec_block": 1, "admitted": live, "planner_count": live, "live": live, "p50_ms": p50, "p90_ms": p50,
            "tokens_per_s": live * 1000.0 / p50 if p50 else 0.0, "direct_share": 0.5, "hot_share": 0.4,
            "host_share": 0.1, "wait_steps": 0, "wait_s": 0, "fill_s": 0, "phase_ms": phases, "mismatches": 0,
            "bytes_checked": 100, "steps": 48, "note": note}


def synthetic():
    return {"schema": "dhisparse.bench_decode.v1",
            "settings": {"device": "synthetic", "slice_sources": 1,
                         "model_sources": {"glm-5.3": 21, "deepseek-v4.1-flash": 8}},
            "results": [
                row("glm-5.3", "adaptive", 32000, 64, 4.0),
                row("glm-5.3", "adaptive", 32000, 4, 2.0),
                row("glm-5.3", "resident", 32000, 64, 3.0, live=63),
                row("glm-5.3", "resident", 32000, 4, 2.0, stand_in=False, stand_in_ms=0.0),
                row("glm-5.3", "fixed-budget", 32000, 4, 0.0, note="FAILED: out of memory"),
                row("deepseek-v4.1-flash", "fixed-budget", 100000, 16, 1.5),
            ]}


class PlotDecodeTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.tmp.name, "r.json")
        with open(self.path, "w") as f:
            json.dump(synthetic(), f)
        self.doc = plot_decode.load(self.path)

    def tearDown(self):
        self.tmp.cleanup()

    def test_speculative_rows_are_their_own_series(self):
        spec = row("glm-5.3", "adaptive", 32000, 4, 3.0)
        spec["spec_block"] = 8
        doc = dict(self.doc, results=self.doc["results"] + [spec])
        series = plot_decode.tokens_series(doc, "glm-5.3")
        self.assertEqual(series[("adaptive", 32000, True)], [(4, 2000.0), (64, 16000.0)])
        self.assertEqual(series[("adaptive+spec", 32000, True)], [(4, 4 * 1000.0 / 3.0)])
        labels = [label for label, _ in plot_decode.breakdown(doc, "glm-5.3", 32000)]
        self.assertIn("C4\nadaptive+spec", labels)

    def test_schema_checked(self):
        bad = os.path.join(self.tmp.name, "bad.json")
        with open(bad, "w") as f:
            json.dump({"schema": "other"}, f)
        with self.assertRaises(ValueError):
            plot_decode.load(bad)

    def test_failed_rows_left_out(self):
        self.assertEqual(len(plot_decode.measured(self.doc)), 5)

    def test_projection(self):
        self.assertEqual(plot_decode.projection_factor(self.doc, "glm-5.3"), 21)
        self.assertEqual(plot_decode.projection_factor(self.doc, "deepseek-v4.1-flash"), 8)
        r = self.doc["results"][0]  # 4.0 ms with a 1.0 ms stand-in: 3.0 * 21 + 1.0
        self.assertAlmostEqual(plot_decode.projected_step_ms(self.doc, r), 64.0)
        off = self.doc["results"][3]  # stand-in off: the whole step scales
        self.assertAlmostEqual(plot_decode.projected_step_ms(self.doc, off), 42.0)
        self.assertAlmostEqual(plot_decode.projected_tokens_per_s(self.doc, r), 64 * 1000.0 / 64.0)
        spec = dict(r, spec_block=8, tokens_per_step=2.5)  # a speculative step emits 2.5 tokens a session
        self.assertAlmostEqual(plot_decode.projected_tokens_per_s(self.doc, spec), 64 * 2.5 * 1000.0 / 64.0)

    def test_series_sorted_by_c(self):
        s = plot_decode.tokens_series(self.doc, "glm-5.3")
        self.assertEqual([c for c, _ in s[("adaptive", 32000, True)]], [4, 64])
        self.assertAlmostEqual(s[("adaptive", 32000, True)][1][1], 64 * 1000.0 / 4.0)
        self.assertIn(("resident", 32000, False), s)
        self.assertNotIn(("fixed-budget", 32000, True), s)

    def test_breakdown_order(self):
        b = plot_decode.breakdown(self.doc, "glm-5.3", 32000)
        self.assertEqual([label for label, _ in b], ["C4\nadaptive", "C64\nresident", "C64\nadaptive"])
        self.assertEqual(b[0][1]["stand_in"], 1.0)

    def test_table_and_plots(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                import matplotlib  # noqa: F401
                have_mpl = True
            except ImportError:
                have_mpl = False
            if have_mpl:
                self.assertEqual(plot_decode.main([self.path, "--out", self.tmp.name, "--prefix", "t"]), 0)
            else:
                print(plot_decode.table(self.doc))
        self.assertIn("63/63", out.getvalue())
        if have_mpl:
            for name in ["t-glm-5.3-tokens.png", "t-glm-5.3-breakdown.png", "t-deepseek-v4.1-flash-tokens.png"]:
                with open(os.path.join(self.tmp.name, name), "rb") as f:
                    self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


if __name__ == "__main__":
    unittest.main()
