"""Shared prefixes through the binding (host backend): requests admitted on a retained prefix read
its rows and their own, eviction keeps the budget, and the manager imports only the suffix."""
import numpy as np
import pytest

import dhisparse
from conftest import History, check_rows, random_selection


def fill(h, hist, request, counts):
    for s, n in enumerate(counts):
        rows = hist.new_rows(s, n)
        h.append(request, s, rows)
        hist.add(request, s, rows)


def inherit(hist, request, prefix_owner, rows):
    """The test's model: a request admitted on a prefix starts with the owner's first rows."""
    for s, n in enumerate(rows):
        hist.rows[(request, s)] = hist.rows[(prefix_owner, s)][:, :n].copy()


def resolve_all(h, hist, requests, rng):
    for s in range(2):
        sel = np.stack([random_selection(rng, hist.count(r, s), h.top_k) for r in requests])
        loc = np.zeros_like(sel)
        h.resolve(s, requests, sel, loc)
        check_rows(h, hist, s, requests, sel, loc)


def test_requests_share_a_retained_prefix(rng):
    h = dhisparse.Hierarchy("tiny", {"max_requests": 4, "max_rows": 128, "host_pages": 40})
    hist = History(h.layout, seed=21)
    assert h.admit(1)
    fill(h, hist, 1, (20, 13))
    assert h.retain_prefix(100, 1) == []  # nothing evicted
    assert h.contains_prefix(100) and h.retained_prefixes() == [100]
    assert (h.prefix_rows(100, 0), h.prefix_rows(100, 1)) == (20, 13)
    assert h.prefix_pages_held(0) == 3  # ceil(20 / 8) pages of source 0, by reference
    for r in (2, 3):
        assert h.admit(r, prefix=100)
        inherit(hist, r, 1, (20, 13))
        assert (h.frontier(r, 0), h.frontier(r, 1)) == (20, 13)
        fill(h, hist, r, (4 + r, 3))
    fill(h, hist, 1, (6, 6))
    resolve_all(h, hist, [1, 2, 3], rng)
    h.complete(1)  # the prefix keeps its pages
    resolve_all(h, hist, [2, 3], rng)
    with pytest.raises(dhisparse.DuplicatePrefix):
        h.retain_prefix(100, 2)
    with pytest.raises(dhisparse.PositionBeyondFrontier):
        h.retain_prefix(101, 2, rows=[999, 0])
    h.release_prefix(100)
    assert not h.contains_prefix(100) and h.retained_prefixes() == []
    with pytest.raises(dhisparse.UnknownPrefix):
        h.admit(9, prefix=100)
    assert not h.contains(9)
    resolve_all(h, hist, [2, 3], rng)  # the requests still hold the shared pages


def test_prefix_budget_evicts_least_recently_used():
    h = dhisparse.Hierarchy("tiny", {"max_requests": 3, "max_rows": 64, "host_pages": 30, "prefix_pages": 4})
    hist = History(h.layout, seed=4)
    for r, n in ((1, 24), (2, 16), (3, 40)):
        h.admit(r)
        fill(h, hist, r, (n, 8))
    assert h.retain_prefix(1, 1) == []        # 3 pages of source 0
    assert h.retain_prefix(2, 2) == [1]       # 3 + 2 > 4: the least recently used goes
    assert h.retained_prefixes() == [2] and h.prefix_pages_held(0) == 2
    with pytest.raises(dhisparse.PrefixBudgetExceeded):
        h.retain_prefix(3, 3)                 # 5 pages alone
    assert h.retained_prefixes() == [2]       # state unchanged
    with pytest.raises(dhisparse.UnknownPrefix):
        h.admit(7, prefix=1)


def test_manager_admits_on_a_prefix_importing_only_the_suffix(rng):
    m = dhisparse.ResidencyManager("tiny", {"max_requests": 3, "max_rows": 128, "optional_pages": 24},
                                   {"required_pages": 1}, policy="adaptive-mra")
    hist = History(m.hierarchy.layout, seed=6)
    system = [hist.new_rows(s, n) for s, n in enumerate((32, 16))]  # a system prompt, whole pages
    assert m.admit(1, system)
    for s in range(2):
        hist.add(1, s, system[s])
    m.retain_prefix(50, 1)
    suffix = [hist.new_rows(s, n) for s, n in enumerate((11, 5))]
    a = m.admit(2, suffix, prefix=50)
    assert a and a.status == dhisparse.AdmitStatus.admitted
    inherit(hist, 2, 1, (32, 16))
    for s in range(2):
        hist.add(2, s, suffix[s])
        assert m.imported_rows(2, s) == hist.count(2, s)
        assert m.hierarchy.frontier(2, s) == hist.count(2, s)
    assert m.audit() == "" and m.invariant_holds()
    resolve_all(m.hierarchy, hist, [1, 2], rng)
    m.complete(1)
    m.release_prefix(50)
    assert m.audit() == ""
    resolve_all(m.hierarchy, hist, [2], rng)
