"""Shared helpers: the tests' own model of a request's history (the rows they appended), and the
code blocks of docs/python.md that tests run as written."""
import pathlib
import re

import numpy as np
import pytest

import dhisparse

PYTHON_DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"


def doc_python_block(heading):
    """The first python block under the docs/python.md section that starts with `heading`."""
    text = PYTHON_DOC.read_text()
    section = text[text.index(heading):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"docs/python.md: no python block under {heading!r}"
    return match.group(1)


def run_doc_block(heading):
    """Runs that block as a user would; returns its namespace."""
    ns = {}
    exec(compile(doc_python_block(heading), str(PYTHON_DOC), "exec"), ns)
    return ns


class History:
    """Rows the test appended, per (request, source): [payload layer, rows, row_bytes] uint8."""

    def __init__(self, layout, seed=0):
        self.layout = layout
        self.rng = np.random.default_rng(seed)
        self.rows = {}

    def new_rows(self, source, count):
        d = self.layout["sources"][source]
        return self.rng.integers(0, 256, size=(d["payload_layers"], count, d["row_bytes"]), dtype=np.uint8)

    def add(self, request, source, rows):
        old = self.rows.get((request, source))
        self.rows[(request, source)] = rows.copy() if old is None else np.concatenate([old, rows], axis=1)

    def count(self, request, source):
        r = self.rows.get((request, source))
        return 0 if r is None else r.shape[1]

    def row(self, request, source, layer, row):
        return self.rows[(request, source)][layer, row]


def check_rows(h, hist, source, requests, selections, locations, layers=None):
    """Every selected entry's location holds the test's own row in every payload layer checked;
    -1 entries give -1."""
    d = hist.layout["sources"][source]
    layers = range(d["payload_layers"]) if layers is None else layers
    pools = [np.asarray(h.pool(source, layer, like="numpy")) for layer in layers]
    for i, request in enumerate(requests):
        for e, row in enumerate(selections[i]):
            loc = locations[i, e]
            if row == -1:
                assert loc == -1
                continue
            assert 0 <= loc < h.pool_rows()
            for pool, layer in zip(pools, layers):
                np.testing.assert_array_equal(pool[loc], hist.row(request, source, layer, row),
                                              err_msg=f"request {request} row {row} layer {layer} at {loc}")


def random_selection(rng, frontier, top_k, width=None):
    """A -1 padded selection of distinct rows below `frontier`."""
    width = top_k if width is None else width
    n = min(frontier, int(rng.integers(1, width + 1)))
    sel = np.full(width, -1, dtype=np.int32)
    picked = rng.choice(frontier, size=n, replace=False).astype(np.int32)
    slots = rng.choice(width, size=n, replace=False)
    sel[slots] = picked
    return sel


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
