"""Host backend through the binding: exact rows, every bound operation, errors, lifetimes."""
import gc
import weakref

import numpy as np
import pytest

import dhisparse
from conftest import History, check_rows, random_selection

LAYOUT_NAMES = ["tiny", "glm53", "deepseek_v41_flash"]


def small_config(layout, **kw):
    """A config small enough for any layout: 3 requests, 4 pages of history."""
    cfg = {"max_requests": 3, "max_rows": 256}
    cfg.update(kw)
    return cfg


@pytest.mark.parametrize("layout", LAYOUT_NAMES)
def test_resolved_rows_are_the_appended_rows(layout, rng):
    requests = [11, 22, 33] if layout != "glm53" else [11, 22]  # glm53's pools are large
    h = dhisparse.Hierarchy(layout, small_config(layout, max_requests=len(requests)))
    info = h.layout
    assert h.hot_rows == dhisparse.LAYOUTS[layout] == 2 * info["top_k"] == 2 * h.top_k
    assert h.backend == "host"
    hist = History(info, seed=7)
    for r in requests:
        assert h.admit(r)
    top_k = info["top_k"]
    steps = 6 if layout != "glm53" else 3
    for step in range(steps):
        for s in range(len(info["sources"])):
            for r in requests:
                rows = hist.new_rows(s, int(rng.integers(1, 40)))
                h.append(r, s, rows)
                hist.add(r, s, rows)
                assert h.frontier(r, s) == hist.count(r, s)
            width = min(top_k, 48)
            sel = np.stack([random_selection(rng, hist.count(r, s), top_k, width) for r in requests])
            loc = np.full_like(sel, 12345)
            stats = h.resolve(s, requests, sel, loc)
            assert stats.selected == int((sel != -1).sum())
            assert stats.direct + stats.hot + stats.host == stats.selected
            check_rows(h, hist, s, requests, sel, loc)


def test_one_request_resolve_and_hot_cache_reuse(rng):
    h = dhisparse.Hierarchy("tiny", {"max_requests": 1, "max_rows": 64})
    hist = History(h.layout)
    assert repr(h.admit(5)) == "Admission(admitted=True, slot=0)"
    assert repr(h.admit(6)) == "Admission(admitted=False)"  # one slot: a wait, nothing changed
    rows = hist.new_rows(1, 40)
    h.append(5, 1, rows)
    hist.add(5, 1, rows)
    sel = np.array([0, 3, -1, 5, 39], dtype=np.int32)  # 39 is in the tail
    loc = np.zeros_like(sel)
    first = h.resolve(1, 5, sel, loc)
    assert (first.direct, first.host, first.hot, first.rows_copied) == (1, 3, 0, 3)
    assert first.bytes_copied == 3 * 32
    check_rows(h, hist, 1, [5], sel[None], loc[None])
    again = np.zeros_like(sel)
    second = h.resolve(1, [5], sel[None], again[None])
    assert (second.hot, second.host) == (3, 0)
    np.testing.assert_array_equal(again, loc)
    hot = h.hot_rows_of(5, 1)
    assert sorted(r for r in hot if r >= 0) == [0, 3, 5]
    assert sorted(h.lru_order_of(5, 1)) == list(range(h.hot_rows))
    assert [c.row for c in h.last_plan(1)] == []  # the second call copied nothing
    # payload/host_row read single rows as bytes
    assert h.payload(1, 0, int(loc[0])) == bytes(hist.row(5, 1, 0, 0))
    assert h.host_row(5, 1, 0, 3) == bytes(hist.row(5, 1, 0, 3))


def test_locations_written_in_place_and_pool_view_is_live(rng):
    h = dhisparse.Hierarchy("tiny", {"max_requests": 2, "max_rows": 64})
    hist = History(h.layout)
    h.admit(1)
    rows = hist.new_rows(0, 30)
    h.append(1, 0, rows)
    hist.add(1, 0, rows)
    pool = h.pool(0, 1, like="numpy")
    assert pool.shape == (h.pool_rows(), 64) and pool.dtype == np.uint8 and not pool.flags.writeable
    raw = h.pool(0, 0)  # framework-neutral DLPack array
    assert np.from_dlpack(raw).shape == (h.pool_rows(), 64)
    sel = np.array([[2, 4, 6]], dtype=np.int32)
    loc = np.zeros((1, 3), dtype=np.int32)
    h.resolve(0, [1], sel, loc)  # the view taken before the call sees the copies
    for e in range(3):
        np.testing.assert_array_equal(pool[loc[0, e]], hist.row(1, 0, 1, sel[0, e]))
    base = np.zeros((2, 8), dtype=np.int32)
    view = base[:, :3]  # not contiguous: refused, never copied behind the caller's back
    with pytest.raises(dhisparse.SizeMismatch):
        h.resolve(0, [1], sel, view)
    with pytest.raises(TypeError):
        h.resolve(0, [1], sel.astype(np.int64), loc)
    with pytest.raises(dhisparse.SizeMismatch):
        h.resolve(0, [1, 1], sel, loc)  # C = 2 requests for a [1, k] selection


def test_follower_copies_and_optional_pages(rng):
    h = dhisparse.Hierarchy("tiny", {"max_requests": 2, "max_rows": 64, "optional_pages": 4})
    hist = History(h.layout)
    h.admit(3)
    rows = hist.new_rows(0, 40)
    h.append(3, 0, rows)
    hist.add(3, 0, rows)
    sel = np.array([[1, 9, 17]], dtype=np.int32)
    loc = np.zeros_like(sel)
    h.resolve(0, 3, sel, loc, mode=dhisparse.CopyLayers.producer_only)
    check_rows(h, hist, 0, [3], sel, loc, layers=[0])
    with pytest.raises(dhisparse.PendingFollowerCopies):
        h.resolve(0, 3, sel, loc)
    assert h.copy_follower(0, 1) == 3 * 64
    check_rows(h, hist, 0, [3], sel, loc)
    assert h.copy_follower(0, 1) == 0  # already copied
    # optional history: page 1 (rows 8..15) becomes direct
    free = h.free_optional_pages(0)
    assert h.map_optional_page(3, 0, 1)
    assert h.free_optional_pages(0) == free - 1
    assert h.optional_map_of(3, 0)[1] >= 0
    sel = np.array([[8, 12, 15, -1]], dtype=np.int32)
    loc = np.zeros_like(sel)
    stats = h.resolve(0, 3, sel, loc)
    assert stats.direct == 3
    check_rows(h, hist, 0, [3], sel, loc)
    h.unmap_optional_page(3, 0, 1)
    assert h.free_optional_pages(0) == free
    assert h.free_host_pages(0) > 0
    assert h.pool_bytes > 0
    req = type(h).requirements(dhisparse.HierarchyConfig(max_requests=2, max_rows=64, optional_pages=4))
    assert req["pool_bytes"] == h.pool_bytes
    assert h.space["rows"] == h.pool_rows()
    assert h.contains(3) and not h.contains(4) and h.slot_of(3) == 0 and h.admitted_count == 1
    assert h.config.optional_pages == 4 and h.config.tail_rows == 8  # defaults filled in
    h.complete(3)
    assert not h.contains(3)


def test_speculative_round(rng):
    h = dhisparse.Hierarchy("tiny", {"max_requests": 2, "max_rows": 64, "max_block": 3})
    hist = History(h.layout)
    for r in (1, 2):
        h.admit(r)
        rows = hist.new_rows(1, 20)
        h.append(r, 1, rows)
        hist.add(r, 1, rows)
    blocks = {}
    for r in (1, 2):
        assert h.block_rows(r, 1, 3) == 3
        blocks[r] = hist.new_rows(1, 3)
        h.stage_block(r, 1, blocks[r], 3)
        assert h.staged_rows(r, 1) == 3
    # query j sees rows up to frontier + j; anchor = 20
    q = np.full((2, 3, 4), -1, dtype=np.int32)
    q[:, 0, :2] = [0, 20]
    q[:, 1, :3] = [1, 20, 21]
    q[:, 2, :4] = [2, 5, 21, 22]
    loc = np.zeros_like(q)
    stats = h.verify(1, [1, 2], q, loc)
    assert stats.block == 2 * (1 + 2 + 2)
    assert h.verified_queries(1, 1) == 3
    pool = np.asarray(h.pool(1, 0, like="numpy"))
    for i, r in enumerate((1, 2)):
        model = np.concatenate([hist.rows[(r, 1)], blocks[r]], axis=1)
        for j in range(3):
            for e in range(4):
                if q[i, j, e] >= 0:
                    np.testing.assert_array_equal(pool[loc[i, j, e]], model[0, q[i, j, e]])
    h.commit(1, 1, 1)  # anchor + one proposal
    assert h.frontier(1, 1) == 22 and h.positions(1, 1) == 22
    assert h.host_row(1, 1, 0, 21) == bytes(blocks[1][0, 1])
    # a narrower round: K_r given per request
    h.stage_block(1, 1, hist.new_rows(1, 2), 2)
    q2 = np.full((1, 3, 2), -1, dtype=np.int32)
    q2[0, 0] = [22, 0]
    loc2 = np.zeros_like(q2)
    h.verify(1, [1], q2, loc2, query_counts=[1])
    assert h.verified_queries(1, 1) == 1
    h.commit(1, 1, 0)
    h.release_staging(1)  # dedicated staging: nothing held
    assert h.staging_holder() is None


POLICIES = list(dhisparse.POLICIES)


@pytest.mark.parametrize("policy", POLICIES)
def test_residency_manager(policy, rng):
    cfg = {"max_requests": 3, "max_rows": 64, "optional_pages": 24}
    m = dhisparse.ResidencyManager("tiny", cfg, {"required_pages": 1, "reserve_pages": 1}, policy=policy)
    assert m.policy == policy and m.capacity_pages == 24 and m.backend == "host"
    assert m.residency_config.required_pages == 1
    h = m.hierarchy
    hist = History(h.layout)
    imports = [hist.new_rows(0, 33), hist.new_rows(1, 17)]
    a = m.admit(10, imports)
    assert a and a.status == dhisparse.AdmitStatus.admitted
    assert repr(a) == (f"ResidencyAdmission(status=AdmitStatus.admitted, slot={a.slot}, reclaimed_requests=0, "
                       f"reclaimed_pages=0, mapped_pages={a.mapped_pages})")
    for s, rows in enumerate(imports):
        hist.add(10, s, rows)
        assert m.imported_rows(10, s) == rows.shape[1]
    pinned = policy == "resident"
    keeps = policy != "fixed-budget"
    assert m.pinned_pages_per_request == (8 if pinned else 0)
    expect_pages = (33 // 8) if keeps else 0
    assert m.optional_pages_of(10, 0) == expect_pages
    led = m.ledger(0)
    assert led.capacity == 24 and led.reserve == 1 and led.holds() and m.invariant_holds()
    assert led.required == 1 + (8 - expect_pages if pinned else 0)
    assert m.audit() == ""
    # decode rows through the manager, resolve through its hierarchy, exact bytes
    rows = hist.new_rows(0, 7)
    m.append(10, 0, rows)
    hist.add(10, 0, rows)
    sel = np.array([[0, 9, 17, 25, 32, 39, -1]], dtype=np.int32)
    loc = np.zeros_like(sel)
    stats = h.resolve(0, [10], sel, loc)
    if keeps:
        assert stats.direct >= 4  # the imported complete pages resolve in place
    check_rows(h, hist, 0, [10], sel, loc)
    m.admit(11)
    assert m.contains(11) and m.admitted_count == 2
    assert set(m.reclaim_sequence()) == {10, 11}
    assert m.repopulate() >= 0
    m.complete(10)
    assert not m.contains(10) and m.audit() == ""
    c = m.counters
    assert (c.admissions, c.completions) == (2, 1) and c.repopulate_calls == 1


def test_residency_waits_and_reclaim():
    cfg = {"max_requests": 2, "max_rows": 64, "optional_pages": 8}
    m = dhisparse.ResidencyManager("tiny", cfg, {"required_pages": 2}, policy="adaptive-mra")
    hist = History(m.hierarchy.layout)
    big = [hist.new_rows(0, 48), hist.new_rows(1, 48)]
    assert m.admit(1, big).mapped_pages > 0
    second = m.admit(2, [hist.new_rows(0, 8), hist.new_rows(1, 8)])
    assert second and second.reclaimed_requests in (0, 1)
    third = m.admit(3)
    assert not third and third.status == dhisparse.AdmitStatus.wait_for_slot
    assert m.counters.waits_for_slot == 1
    assert m.audit() == ""


def test_config_from_dataclass_and_dict():
    import dataclasses

    @dataclasses.dataclass
    class Cfg:
        max_requests: int = 2
        max_rows: int = 32
        host_pages: int = 0
        tail_rows: int = 0
        optional_pages: int = 2
        max_block: int = 1

    h = dhisparse.Hierarchy("tiny", Cfg())
    assert h.config.max_rows == 32 and h.config.optional_pages == 2
    c = dhisparse.HierarchyConfig(max_rows=16)
    c.max_requests = 4
    assert dhisparse.Hierarchy("tiny", c).config.max_requests == 4
    assert "max_rows=16" in repr(c)
    with pytest.raises(ValueError):
        dhisparse.Hierarchy("nope", c)
    with pytest.raises(ValueError):
        dhisparse.ResidencyManager("tiny", c, policy="nope")
    with pytest.raises(TypeError):
        dhisparse.Hierarchy("tiny", 3)


def test_torch_cpu_tensors_without_copies():
    torch = pytest.importorskip("torch")
    h = dhisparse.Hierarchy("tiny", {"max_requests": 1, "max_rows": 32})
    hist = History(h.layout)
    h.admit(1)
    rows = hist.new_rows(0, 20)
    h.append(1, 0, torch.from_numpy(rows))
    hist.add(1, 0, rows)
    sel = torch.tensor([[0, 5, 19, -1]], dtype=torch.int32)
    loc = torch.zeros_like(sel)
    h.resolve(0, [1], sel, loc)
    check_rows(h, hist, 0, [1], sel.numpy(), loc.numpy())
    pool = h.pool(0, 0, like="torch")
    assert isinstance(pool, torch.Tensor) and pool.shape == (h.pool_rows(), 64)
    assert torch.equal(pool[loc[0, :3].long()], torch.from_numpy(rows[0, [0, 5, 19]]))


def test_objects_are_freed_when_deleted():
    h = dhisparse.Hierarchy("tiny", {"max_rows": 16})
    ref = weakref.ref(h)
    pool = h.pool(0, 0, like="numpy")
    del h
    gc.collect()
    assert ref() is not None  # the view keeps its hierarchy alive
    del pool
    gc.collect()
    assert ref() is None
    m = dhisparse.ResidencyManager("glm53", {"max_requests": 1, "max_rows": 128, "optional_pages": 4})
    mref = weakref.ref(m)
    inner = m.hierarchy
    del m
    gc.collect()
    assert mref() is not None  # the hierarchy of a manager keeps the manager alive
    del inner
    gc.collect()
    assert mref() is None


def test_every_bound_operation_is_exercised():
    """Every public member of the host classes is called somewhere in these tests (a new binding
    without a test fails here)."""
    import pathlib

    here = pathlib.Path(__file__).parent
    text = "".join(p.read_text() for p in sorted(here.glob("*.py")) if p.name != "test_cuda.py")
    for cls in (dhisparse._core.HostHierarchy_tiny, dhisparse._core.HostResidencyManager_tiny_adaptive_mra):
        names = [n for n in dir(cls) if not n.startswith("_")]
        missing = [n for n in names if f".{n}" not in text.replace("type(h).requirements", ".requirements")]
        assert not missing, f"{cls.__name__}: not exercised: {missing}"


def test_default_stream_is_torch_current_stream_of_the_objects_device(monkeypatch):
    """With stream=None a call on an object of GPU d uses torch's current stream of d, not of the
    current device (objects take only streams of their own GPU). A stand-in torch records what
    the provider asks for; the CUDA tests check the C++ side passes the object's device."""
    import sys
    import types

    asked = []

    class Stream:
        def __init__(self, device):
            self.cuda_stream = 0x1000 + (0 if device is None else device)

    def current_stream(device=None):
        asked.append(device)
        return Stream(device)

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: True, current_stream=current_stream))
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert dhisparse._current_stream(3) == 0x1003
    assert dhisparse._current_stream() == 0x1000
    assert asked == [3, None]
    monkeypatch.delitem(sys.modules, "torch")
    assert dhisparse._current_stream(3) == 0  # no torch: the legacy default stream


@pytest.mark.parametrize("layout", LAYOUT_NAMES)
def test_planner_sizes_a_hierarchy_by_the_documented_rules(layout):
    """dhisparse.plan against the derivation of docs/memory-planner.md, computed here from the layout."""
    lay = dhisparse._lookup("Hierarchy", layout, "host").layout
    p_rows, m = lay["page_rows"], lay["sources"][0]["positions_per_row"]
    n, ctx, live = 6, 20_000, 50_000
    max_rows = -(-ctx // m)
    ppr = -(-max_rows // p_rows)
    row_set = p_rows * sum(s["payload_layers"] * s["row_bytes"] for s in lay["sources"])
    fixed = dhisparse.plan(layout, slots=n, max_context_tokens=ctx, gpu_bytes=64 << 30,
                           live_context_tokens=live, residency="fixed-budget")
    c = fixed.config
    assert (c.max_requests, c.max_rows, c.tail_rows, c.optional_pages) == (n, max_rows, p_rows, 0)
    assert c.host_pages == min(n * ppr, (live + n * (m * p_rows - 1)) // (m * p_rows))
    assert fixed.pages_per_request == ppr and fixed.default_host_pages == n * ppr
    assert fixed.host_page_bytes == fixed.optional_page_bytes == row_set
    assert fixed.bytes.host_store_bytes == c.host_pages * row_set == fixed.bytes.cuda_pinned_bytes
    assert fixed.hot_rows == dhisparse.LAYOUTS[layout] and fixed.residency_mode == "fixed-budget"
    resident = dhisparse.plan(layout, slots=n, max_context_tokens=ctx, gpu_bytes=64 << 30,
                              residency="resident", required_pages=1, reserve_pages=2)
    assert resident.config.optional_pages == n * (max_rows // p_rows + 1) + 2
    assert (resident.residency.required_pages, resident.residency.reserve_pages) == (1, 2)
    adaptive = dhisparse.plan(layout, slots=n, max_context_tokens=ctx, gpu_bytes=64 << 30)
    assert adaptive.config.optional_pages <= adaptive.optional_pages_budget
    assert adaptive.bytes.cuda_device_bytes + adaptive.gpu_bytes_left == 64 << 30
    mra = dhisparse.plan(layout, slots=n, max_context_tokens=ctx, gpu_bytes=64 << 30, residency="adaptive-mra")
    assert mra.residency_mode == "adaptive" and mra.config.optional_pages == adaptive.config.optional_pages


def test_planner_errors_name_the_input_and_its_config_builds_a_hierarchy():
    with pytest.raises(dhisparse.InvalidConfiguration, match="planner: gpu_bytes: "):
        dhisparse.plan("tiny", slots=3, max_context_tokens=512, gpu_bytes=0)
    with pytest.raises(dhisparse.InvalidConfiguration, match="planner: residency: 'lru' is not one of"):
        dhisparse.plan("tiny", slots=3, max_context_tokens=512, gpu_bytes=1 << 24, residency="lru")
    with pytest.raises(ValueError, match="unknown layout"):
        dhisparse.plan("llama", slots=3, max_context_tokens=512, gpu_bytes=1 << 24)
    p = dhisparse.plan("tiny", slots=3, max_context_tokens=512, gpu_bytes=1 << 24, max_block=4)
    h = dhisparse.Hierarchy("tiny", p.config)
    assert h.config.max_requests == 3 and h.config.max_block == 4
    assert h.requirements(p.config)["host_store_bytes"] == p.bytes.host_store_bytes
    m = dhisparse.ResidencyManager("tiny", p.config, p.residency)
    assert m.capacity_pages == p.config.optional_pages
