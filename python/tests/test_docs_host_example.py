"""The numpy decode loop of docs/python.md, run as written (host backend: runs in CI).

Users copy that example; this keeps it working. The block is taken from the page itself, so an
edit of the page is what runs."""
import numpy as np

from conftest import run_doc_block


def test_the_documented_host_loop_runs_and_reads_the_written_rows():
    ns = run_doc_block("## A decode loop on the host backend")
    h, kv = ns["h"], ns["kv"]
    # The loop ran its 40 steps and completed request 1: frontiers are the test's own count of the
    # rows the block wrote (prefill 100 + 20 r, one row a step), and a last resolve of request 2's
    # newest rows reads them back.
    assert not h.contains(1) and h.contains(2) and h.contains(3)
    for r in (2, 3):
        for s in range(2):
            assert h.frontier(r, s) == 100 + 20 * r + 40 == kv[r, s].shape[1]
    sel = np.arange(kv[2, 0].shape[1] - h.top_k, kv[2, 0].shape[1], dtype=np.int32).reshape(1, -1)
    loc = np.empty_like(sel)
    h.resolve(0, [2], sel, loc)
    for l in range(2):
        assert (h.pool(0, l, like="numpy")[loc[0]] == kv[2, 0][l, sel[0]]).all()
