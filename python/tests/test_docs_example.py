"""The decode loop of docs/python.md, run as written (GPU machine: pytest -m gpu python/tests).

Users copy that example; this keeps it working. The block is taken from the page itself, so an
edit of the page is what runs."""
import pytest

import dhisparse
from conftest import run_doc_block

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not dhisparse.CUDA_BUILT, reason="dhisparse built without the CUDA backend"),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]


def test_the_documented_decode_loop_runs_and_attends_over_the_selected_rows():
    ns = run_doc_block("## A decode loop: torch")  # the example, as a user would run it
    torch.cuda.synchronize()
    h, loc, sel, out = ns["h"], ns["loc"], ns["sel"], ns["out"]
    # After the last replay every selected row resolved to a location, and the attention output
    # is the softmax-weighted sum of the value rows at those locations (the test's own arithmetic).
    assert bool((loc[sel >= 0] >= 0).all()) and bool((loc[sel < 0] == -1).all())
    keys, vals, q = ns["keys"], ns["vals"], ns["q"]
    want = []
    for i in range(loc.shape[0]):
        rows = loc[i][loc[i] >= 0].long()
        p = torch.softmax(keys[rows].float() @ q[i].float(), dim=-1)
        want.append(p @ vals[rows].float())
    torch.testing.assert_close(out, torch.stack(want), rtol=1e-4, atol=1e-4)
