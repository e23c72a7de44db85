"""The engine step's batched operations through the binding (host backend): batched writes within
reservations, batched commits, streamed admission, and the manager's read-only hierarchy."""
import numpy as np
import pytest

import dhisparse
from conftest import History, check_rows, random_selection


def resolve_and_check(h, hist, requests, rng):
    """Resolves a random selection of every request on every source and checks the rows."""
    for s in range(len(hist.layout["sources"])):
        sel = np.stack([random_selection(rng, hist.count(r, s), h.top_k) for r in requests])
        loc = np.zeros_like(sel)
        h.resolve(s, requests, sel, loc)
        check_rows(h, hist, s, requests, sel, loc)


def test_batched_writes_equal_per_request_appends(rng):
    h = dhisparse.Hierarchy("tiny", {"max_requests": 3, "max_rows": 96})
    twin = dhisparse.Hierarchy("tiny", {"max_requests": 3, "max_rows": 96})
    hist = History(h.layout, seed=3)
    requests = [7, 8, 9]
    for r in requests:
        h.admit(r)
        twin.admit(r)
    h.reserve_ahead(8)
    assert all(h.reserved_rows(r, s) >= 8 for r in requests for s in range(2))
    for step in range(40):
        n = 1 if step % 5 else 2
        if step % 3:
            h.reserve_ahead(n)  # host pages for this step, outside the (captured) writes
        for s in range(2):
            if step % 3 == 0:
                for r in requests:
                    h.reserve_rows(r, s, n)
            rows = np.stack([hist.new_rows(s, n) for _ in requests])  # [C][layers][n][row_bytes]
            h.append_batch(s, requests, rows)
            for i, r in enumerate(requests):
                twin.append(r, s, rows[i])
                hist.add(r, s, rows[i])
                assert h.frontier(r, s) == twin.frontier(r, s) == hist.count(r, s)
    resolve_and_check(h, hist, requests, rng)
    for s in range(2):
        for r in requests:
            for row in range(0, hist.count(r, s), 7):
                assert h.host_row(r, s, 0, row) == bytes(hist.row(r, s, 0, row))


def test_batched_write_errors_leave_state_unchanged():
    h = dhisparse.Hierarchy("tiny", {"max_requests": 2, "max_rows": 64})
    h.admit(1)
    h.admit(2)
    h.reserve_rows(1, 0, 1)  # request 2 has no reservation
    before = [h.frontier(r, 0) for r in (1, 2)]
    ok = np.zeros((2, 2, 1, 64), np.uint8)
    with pytest.raises(dhisparse.CapacityExceeded, match="reserved rows"):
        h.append_batch(0, [1, 2], ok)
    with pytest.raises(dhisparse.DuplicateInBatch):
        h.append_batch(0, [1, 1], ok)
    with pytest.raises(dhisparse.UnknownRequest):
        h.append_batch(0, [1, 5], ok)
    with pytest.raises(dhisparse.SizeMismatch, match=r"\[requests\]\[2\]\[rows\]\[64\]"):
        h.append_batch(0, [1, 2], np.zeros((2, 2, 1, 32), np.uint8))
    with pytest.raises(dhisparse.SizeMismatch, match="requests=1"):
        h.append_batch(0, [1], ok)
    assert [h.frontier(r, 0) for r in (1, 2)] == before
    h.append_batch(0, [1], ok[:1])
    assert h.frontier(1, 0) == 1 and h.frontier(2, 0) == 0


def test_batched_commit_equals_per_request_commit():
    cfg = {"max_requests": 2, "max_rows": 64, "max_block": 3}
    h, twin = dhisparse.Hierarchy("tiny", cfg), dhisparse.Hierarchy("tiny", cfg)
    hist = History(h.layout, seed=5)
    for x in (h, twin):
        for r in (1, 2):
            x.admit(r)
    for r in (1, 2):
        rows = hist.new_rows(1, 20)
        h.append(r, 1, rows)
        twin.append(r, 1, rows)
        hist.add(r, 1, rows)
    blocks = {r: hist.new_rows(1, 3) for r in (1, 2)}
    q = np.full((2, 3, 2), -1, dtype=np.int32)
    q[:, 0, 0], q[:, 1, 0], q[:, 2, 0] = 20, 21, 22
    for x in (h, twin):
        for r in (1, 2):
            x.stage_block(r, 1, blocks[r], 3)
        x.verify(1, [1, 2], q, np.zeros_like(q))
    h.reserve_ahead(4)
    with pytest.raises(dhisparse.AcceptanceBeyondBlock):
        h.commit_batch(1, [1, 2], np.array([1, 3], np.int32))
    with pytest.raises(dhisparse.AcceptanceBeyondBlock):
        h.commit_batch(1, [1, 2], np.array([1, -1], np.int32))
    with pytest.raises(dhisparse.SizeMismatch):
        h.commit_batch(1, [1, 2], np.array([1], np.int32))
    assert h.frontier(1, 1) == h.frontier(2, 1) == 20  # nothing committed by the failed calls
    h.commit_batch(1, [1, 2], np.array([2, 0], np.int32))
    twin.commit(1, 1, 2)
    twin.commit(2, 1, 0)
    for r, accepted in ((1, 2), (2, 0)):
        assert h.frontier(r, 1) == twin.frontier(r, 1) == 20 + 1 + accepted
        for i in range(1 + accepted):
            assert h.host_row(r, 1, 0, 20 + i) == bytes(blocks[r][0, i])
    with pytest.raises(dhisparse.CommitWithoutVerify):
        h.commit_batch(1, [1], np.array([0], np.int32))


@pytest.mark.parametrize("policy", list(dhisparse.POLICIES))
def test_streamed_admission(policy, rng):
    m = dhisparse.ResidencyManager("tiny", {"max_requests": 2, "max_rows": 128, "optional_pages": 24},
                                   {"required_pages": 1}, policy=policy)
    hist = History(m.hierarchy.layout, seed=9)
    a = m.admit(4)  # admitted before its history exists
    assert a and a.status == dhisparse.AdmitStatus.admitted
    mapped = 0
    for chunk in (5, 11, 16, 9):  # a prefill delivered in chunks, sources interleaved
        for s in (1, 0):
            rows = hist.new_rows(s, chunk)
            mapped += m.import_history(4, s, rows)
            hist.add(4, s, rows)
            assert m.imported_rows(4, s) == hist.count(4, s)
    pages = sum(hist.count(4, s) // 8 for s in range(2))
    if policy == "fixed-budget":
        assert mapped == 0
    else:  # adaptive policies map spare pages for streamed history too; resident maps every page
        assert mapped == pages == sum(m.optional_pages_of(4, s) for s in range(2))
    assert m.audit() == "" and m.invariant_holds()
    decode = hist.new_rows(0, 1)
    m.append(4, 0, decode)
    hist.add(4, 0, decode)
    with pytest.raises(dhisparse.ImportAfterDecode, match="decode rows on source 0"):
        m.import_history(4, 0, hist.new_rows(0, 2))
    m.import_history(4, 1, (more := hist.new_rows(1, 2)))  # source 1 has no decode rows yet
    hist.add(4, 1, more)
    step = m.hierarchy
    for s in range(2):
        sel = random_selection(rng, hist.count(4, s), step.top_k)[None]
        loc = np.zeros_like(sel)
        step.resolve(s, [4], sel, loc)
        check_rows(step, hist, s, [4], sel, loc)
    m.complete(4)
    assert m.audit() == "" and m.admitted_count == 0


def test_manager_hierarchy_is_read_only_apart_from_the_step():
    m = dhisparse.ResidencyManager("tiny", {"max_requests": 2, "max_rows": 64, "optional_pages": 8})
    m.admit(1)
    h = m.hierarchy
    assert isinstance(h, dhisparse.ManagedHierarchy)
    for name in ("admit", "complete", "append", "append_batch", "reserve_ahead", "map_optional_page",
                 "unmap_optional_page"):
        with pytest.raises(AttributeError, match="call the manager's own member"):
            getattr(h, name)
        assert name not in dir(h)
    with pytest.raises(AttributeError, match="read-only"):
        h.config = None
    assert h.contains(1) and h.frontier(1, 0) == 0 and "resolve" in dir(h)
    assert m.audit() == ""


def test_step_wide_writes_and_commits(rng):
    """append_step/commit_step over every source equal per-request appends and commits."""
    cfg = {"max_requests": 3, "max_rows": 96, "max_block": 3}
    h, twin = dhisparse.Hierarchy("tiny", cfg), dhisparse.Hierarchy("tiny", cfg)
    hist = History(h.layout, seed=11)
    requests = [4, 5, 6]
    for x in (h, twin):
        for r in requests:
            x.admit(r)
    assert h.backup_pending is False
    for step in range(12):
        h.reserve_ahead(2)
        n = 1 + step % 2
        rows = [np.stack([hist.new_rows(s, n) for _ in requests]) for s in range(2)]
        if step == 5:
            rows[1] = None  # a step that writes source 0 only
        h.append_step(requests, rows)
        h.join_backup()
        for s in range(2):
            if rows[s] is None:
                continue
            for i, r in enumerate(requests):
                twin.append(r, s, rows[s][i])
                hist.add(r, s, rows[s][i])
        for r in requests:
            for s in range(2):
                assert h.frontier(r, s) == twin.frontier(r, s) == hist.count(r, s)
    resolve_and_check(h, hist, requests, rng)
    # all or nothing: a bad source array, a duplicate request, a missing reservation
    before = [h.frontier(r, s) for r in requests for s in range(2)]
    good = [np.zeros((3, 2, 1, 64), np.uint8), np.zeros((3, 1, 1, 32), np.uint8)]
    with pytest.raises(dhisparse.SizeMismatch, match="one array"):
        h.append_step(requests, good[:1])
    with pytest.raises(dhisparse.SizeMismatch, match=r"\[requests\]\[1\]\[rows\]\[32\]"):
        h.append_step(requests, [good[0], good[0]])
    with pytest.raises(dhisparse.DuplicateInBatch):
        h.append_step([4, 4, 5], good)
    h.reserve_rows(4, 1, 0)
    wide = [np.zeros((3, 2, 40, 64), np.uint8), None]
    with pytest.raises(dhisparse.CapacityExceeded, match="append_step"):
        h.append_step(requests, wide)
    assert [h.frontier(r, s) for r in requests for s in range(2)] == before
    # a speculative round on both sources, committed in one call
    q = np.full((3, 3, 2), -1, np.int32)
    blocks = {}
    for s in range(2):
        for x in (h, twin):
            for r in requests:
                if x is h:
                    blocks[(r, s)] = hist.new_rows(s, 3)
                x.stage_block(r, s, blocks[(r, s)], 3)
        for i, r in enumerate(requests):
            f = hist.count(r, s)
            q[i, :, 0] = [f, f + 1, f + 2]
        for x in (h, twin):
            x.verify(s, requests, q, np.zeros_like(q))
    h.reserve_ahead(3)
    accepted = np.array([2, 0, 1], np.int32)
    with pytest.raises(dhisparse.AcceptanceBeyondBlock):
        h.commit_step(requests, np.array([2, 3, 1], np.int32))
    h.commit_step(requests, accepted)
    for s in range(2):
        for i, r in enumerate(requests):
            twin.commit(r, s, int(accepted[i]))
            assert h.frontier(r, s) == twin.frontier(r, s) == hist.count(r, s) + 1 + accepted[i]
            for j in range(1 + accepted[i]):
                assert h.host_row(r, s, 0, hist.count(r, s) + j) == bytes(blocks[(r, s)][0, j])


@pytest.mark.parametrize("policy", ["adaptive-mra", "resident"])
def test_manager_step_wide_writes(policy, rng):
    m = dhisparse.ResidencyManager("tiny", {"max_requests": 2, "max_rows": 64, "optional_pages": 24},
                                   {"required_pages": 1}, policy=policy)
    hist = History(m.hierarchy.layout, seed=2)
    for r in (1, 2):
        assert m.admit(r)
    for step in range(20):
        m.reserve_ahead(1)
        rows = [np.stack([hist.new_rows(s, 1) for _ in (1, 2)]) for s in range(2)]
        m.append_step([1, 2], rows)
        for s in range(2):
            for i, r in enumerate((1, 2)):
                hist.add(r, s, rows[s][i])
    pinned = policy == "resident"
    for r in (1, 2):
        for s in range(2):
            assert m.hierarchy.frontier(r, s) == 20
            assert m.optional_pages_of(r, s) == (20 // 8 if pinned else 0)  # a pinning policy maps completed pages
    assert m.audit() == "" and m.invariant_holds()
    sel = np.stack([random_selection(rng, 20, m.hierarchy.top_k) for _ in (1, 2)])
    loc = np.zeros_like(sel)
    m.hierarchy.resolve(0, [1, 2], sel, loc)
    check_rows(m.hierarchy, hist, 0, [1, 2], sel, loc)


def test_batched_stages_equal_per_request_stages():
    """stage_blocks (one source) and stage_step (every source) equal per-request stage_block; the
    rounds then verify and commit alike."""
    cfg = {"max_requests": 2, "max_rows": 64, "max_block": 3}
    h, twin = dhisparse.Hierarchy("tiny", cfg), dhisparse.Hierarchy("tiny", cfg)
    hist = History(h.layout, seed=13)
    requests = [1, 2]
    for x in (h, twin):
        for r in requests:
            x.admit(r)
    for r in requests:
        for s in range(2):
            rows = hist.new_rows(s, 10)
            h.append(r, s, rows)
            twin.append(r, s, rows)
            hist.add(r, s, rows)
    for round_ in range(2):
        blocks = [np.stack([hist.new_rows(s, 3) for _ in requests]) for s in range(2)]
        if round_ == 0:
            with pytest.raises(dhisparse.BlockTooWide):
                h.stage_blocks(1, requests, blocks[1], 4)
            with pytest.raises(dhisparse.DuplicateInBatch):
                h.stage_step([1, 1], blocks, 3)
            assert h.staged_rows(1, 1) == 0  # nothing staged by the failed calls
            h.stage_blocks(0, requests, blocks[0], 3)
            h.stage_blocks(1, requests, blocks[1], 3)
        else:
            h.stage_step(requests, blocks, 3)
        for s in range(2):
            for i, r in enumerate(requests):
                twin.stage_block(r, s, blocks[s][i], 3)
                assert h.staged_rows(r, s) == twin.staged_rows(r, s) == 3
        q = np.full((2, 3, 2), -1, np.int32)
        for s in range(2):
            for i, r in enumerate(requests):
                f = hist.count(r, s)
                q[i, :, 0] = [f, f + 1, f + 2]
                q[i, :, 1] = [0, f - 1, 5]
            locs = []
            for x in (h, twin):
                loc = np.zeros_like(q)
                x.verify(s, requests, q, loc)
                locs.append(loc)
            np.testing.assert_array_equal(locs[0], locs[1])
            pool = np.asarray(h.pool(s, 0, like="numpy"))
            for i, r in enumerate(requests):
                model = np.concatenate([hist.rows[(r, s)], blocks[s][i]], axis=1)
                for j in range(3):
                    for e in range(2):
                        np.testing.assert_array_equal(pool[locs[0][i, j, e]], model[0, q[i, j, e]])
        h.reserve_ahead(3)
        h.commit_step(requests, np.array([1, 2], np.int32))
        for s in range(2):
            for i, r in enumerate(requests):
                twin.commit(r, s, 1 + i)
                hist.add(r, s, blocks[s][i][:, :2 + i])
                assert h.frontier(r, s) == twin.frontier(r, s) == hist.count(r, s)
