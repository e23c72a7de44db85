"""Host stores shared by tensor-parallel ranks through the binding (docs/multi-gpu.md): two ranks'
hierarchies over one in-process store, and two rank processes over one interprocess store.

Every rank runs the same script with the same rows (the test's own, drawn from one seed) and a
barrier between each step's appends and its resolves; every resolved location must hold the
test's row. The store must keep one copy of each history, and each rank must write exactly the
rows of the history pages it owns (page p: rank p mod N)."""
import gc
import multiprocessing
import os
import traceback
import uuid
import weakref

import numpy as np
import pytest

import dhisparse
from conftest import History, check_rows, random_selection

LAYOUT = "tiny"  # 8-row pages, a one-page tail; source 0: 2 layers of 64 B, source 1: 1 layer of 32 B
RANKS = 2
HOST_PAGES = 64
CONFIG = {"max_requests": 2, "max_rows": 256}
REQUESTS = (3, 5)
STEPS = 5
SEED = 21


def script(h, hist, stats):
    """One rank's part: admits, then per step appends (a prefill chunk longer than the tail first,
    then decode rows), yields (the caller's barrier), resolves fresh selections and checks every
    resolved row against `hist`. Every rank draws the same rows and selections."""
    rng = np.random.default_rng(SEED + 1)
    for r in REQUESTS:
        assert h.admit(r)
    for step in range(STEPS):
        for s in range(2):
            for i, r in enumerate(REQUESTS):
                n = 21 + 4 * i if step == 0 else int(rng.integers(1, 4))
                rows = hist.new_rows(s, n)
                h.append(r, s, rows)
                hist.add(r, s, rows)
        yield  # every rank has appended the step's rows before any rank resolves over them
        for s in range(2):
            sel = np.stack([random_selection(rng, hist.count(r, s), h.top_k) for r in REQUESTS])
            loc = np.full_like(sel, -7)
            got = h.resolve(s, list(REQUESTS), sel, loc)
            stats["host"] = stats.get("host", 0) + got.host
            check_rows(h, hist, s, REQUESTS, sel, loc)


def page_bytes(layout, source):
    d = layout["sources"][source]
    return layout["page_rows"] * d["payload_layers"] * d["row_bytes"]


def expected_books(hist, ranks):
    """From the test's own rows: host bytes of one copy, and the rows each rank must have written
    (the rows of the pages it owns)."""
    layout, p = hist.layout, hist.layout["page_rows"]
    in_use, written = 0, [0] * ranks
    for r in REQUESTS:
        for s in range(len(layout["sources"])):
            n = hist.count(r, s)
            in_use += -(-n // p) * page_bytes(layout, s)
            for row in range(n):
                written[(row // p) % ranks] += 1
    return in_use, written


def test_two_ranks_over_one_in_process_store():
    store = dhisparse.SharedHostStore(LAYOUT, RANKS, HOST_PAGES)
    assert (store.ranks, store.host_pages, store.backend) == (RANKS, HOST_PAGES, "host")
    assert store.request_capacity == RANKS * 256 and store.layout["name"] == LAYOUT
    assert [store.owner(p) for p in range(4)] == [0, 1, 0, 1]
    ranks = [dhisparse.Hierarchy(LAYOUT, CONFIG, store=store, rank=r) for r in range(RANKS)]
    assert [h.rank for h in ranks] == [0, 1] and all(h.shares_host_store for h in ranks)
    assert all(h.config.host_pages == HOST_PAGES and h.host_store_bytes == 0 for h in ranks)
    # the same calls on an independent hierarchy: what one rank alone holds on the host
    alone = dhisparse.Hierarchy(LAYOUT, dict(CONFIG, host_pages=HOST_PAGES))
    hists = [History(ranks[0].layout, seed=SEED) for _ in range(RANKS + 1)]
    stats = [{} for _ in range(RANKS + 1)]
    runs = [script(h, hist, st) for h, hist, st in zip(ranks + [alone], hists, stats)]
    for step in range(STEPS + 1):
        order = [1, 0, 2] if step % 2 else [0, 1, 2]  # the owner of page 0 sometimes comes last
        done = [next(runs[i], "done") for i in order]
        assert done.count("done") in (0, 3)
    assert all(st["host"] > 0 for st in stats)  # resolves read rows other ranks wrote

    in_use, written = expected_books(hists[0], RANKS)
    assert store.host_bytes_in_use == in_use == alone.host_bytes_in_use  # one copy, not one per rank
    assert all(h.host_bytes_in_use == in_use for h in ranks)
    assert [store.rows_written(r) for r in range(RANKS)] == written
    assert sum(written) == sum(hists[0].count(r, s) for r in REQUESTS for s in range(2))
    assert sum(store.bytes_written(r) for r in range(RANKS)) == sum(
        hists[0].count(r, s) * page_bytes(hists[0].layout, s) // hists[0].layout["page_rows"]
        for r in REQUESTS for s in range(2))
    assert store.requests == len(REQUESTS) and store.attached_ranks(REQUESTS[0]) == 0b11
    for r in REQUESTS:
        for s in range(2):
            pages = [store.host_page(r, s, p) for p in range(-(-hists[0].count(r, s) // hists[0].layout["page_rows"]))]
            assert all(g >= 0 and store.page_holders(s, g) == 0b11 for g in pages)
            assert store.has_host_copy(r, s, hists[0].count(r, s) - 1)

    for r in REQUESTS:
        ranks[0].complete(r)
    assert store.attached_ranks(REQUESTS[0]) == 0b10 and store.host_bytes_in_use == in_use
    for r in REQUESTS:
        ranks[1].complete(r)
    assert store.requests == 0 and store.host_bytes_in_use == 0
    assert [store.free_host_pages(s) for s in range(2)] == [HOST_PAGES] * 2


def test_a_read_before_the_owner_wrote_is_host_copy_pending():
    store = dhisparse.SharedHostStore(LAYOUT, RANKS, HOST_PAGES)
    h0, h1 = (dhisparse.Hierarchy(LAYOUT, CONFIG, store=store, rank=r) for r in range(RANKS))
    hist = History(h0.layout, seed=4)
    rows = hist.new_rows(1, 24)  # pages 0 and 2 are rank 0's, page 1 rank 1's; rank 1's tail: 16..23
    hist.add(9, 1, rows)
    h1.admit(9)
    h1.append(9, 1, rows)
    assert not store.has_host_copy(9, 1, 0) and store.has_host_copy(9, 1, 8)
    sel = np.array([[0, 8, 20]], np.int32)
    loc = np.full_like(sel, -7)
    before = (h1.hot_rows_of(9, 1), h1.lru_order_of(9, 1))
    with pytest.raises(dhisparse.HostCopyPending):
        h1.resolve(1, [9], sel, loc)
    assert (loc == -7).all() and (h1.hot_rows_of(9, 1), h1.lru_order_of(9, 1)) == before  # nothing changed
    h0.admit(9)
    h0.append(9, 1, rows)  # the owner writes its pages: the same read now succeeds
    h1.resolve(1, [9], sel, loc)
    check_rows(h1, hist, 1, [9], sel, loc)


def test_store_lookup_errors():
    store = dhisparse.SharedHostStore(LAYOUT, RANKS, HOST_PAGES)
    with pytest.raises(ValueError, match="made for layout 'tiny'"):
        dhisparse.Hierarchy("deepseek_v41_flash", CONFIG, store=store, rank=0)
    with pytest.raises(ValueError, match="store= needs rank="):
        dhisparse.Hierarchy(LAYOUT, CONFIG, store=store)
    with pytest.raises(ValueError, match="rank= needs store="):
        dhisparse.Hierarchy(LAYOUT, CONFIG, rank=0)
    with pytest.raises(TypeError, match="must be a SharedHostStore"):
        dhisparse.Hierarchy(LAYOUT, CONFIG, store=object(), rank=0)
    if not dhisparse.CUDA_BUILT:
        with pytest.raises(RuntimeError, match="without the CUDA backend"):
            dhisparse.SharedHostStore(LAYOUT, RANKS, HOST_PAGES, backend="cuda")
    else:
        with pytest.raises(ValueError, match="needs a store made with backend='cuda'"):
            dhisparse.Hierarchy(LAYOUT, CONFIG, store=store, rank=0, backend="cuda")
    with pytest.raises(ValueError, match="unknown layout"):
        dhisparse.SharedHostStore("nope", RANKS, HOST_PAGES)
    with pytest.raises(TypeError, match="create"):
        dhisparse.InterprocessHostStore(LAYOUT, "/x", 2, 8)
    with pytest.raises(dhisparse.InvalidConfiguration):
        dhisparse.SharedHostStore(LAYOUT, 0, HOST_PAGES)
    with pytest.raises(dhisparse.InvalidConfiguration, match="rank 2"):
        dhisparse.Hierarchy(LAYOUT, CONFIG, store=store, rank=2)
    with pytest.raises(dhisparse.InvalidConfiguration):
        dhisparse.Hierarchy(LAYOUT, dict(CONFIG, host_pages=HOST_PAGES + 1), store=store, rank=0)
    assert store.requests == 0


def test_store_outlives_its_hierarchies_and_frees_with_the_last():
    store = dhisparse.SharedHostStore(LAYOUT, RANKS, HOST_PAGES)
    h0 = dhisparse.Hierarchy(LAYOUT, CONFIG, store=store, rank=0)
    h1 = dhisparse.Hierarchy(LAYOUT, CONFIG, store=store, rank=1)
    h0.admit(1)
    h0.append(1, 1, np.zeros((1, 3, 32), np.uint8))
    refs = [weakref.ref(o) for o in (store, h0, h1)]
    del store
    gc.collect()
    assert refs[0]() is not None  # kept alive by the hierarchies
    assert h0.host_bytes_in_use == page_bytes(h0.layout, 1)
    del h0
    gc.collect()
    assert refs[1]() is None and refs[0]() is not None
    assert refs[0]().host_bytes_in_use == 0  # the freed rank dropped its holds
    h0 = dhisparse.Hierarchy(LAYOUT, CONFIG, store=refs[0](), rank=0)  # and its rank may be bound again
    del h0, h1
    gc.collect()
    assert all(r() is None for r in refs)


def unique_name(tag):
    return f"/dhisparse-pytest-{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _rank_process(name, rank, barrier, queue, seed):
    """A rank's process: opens the store by name, builds its rank's hierarchy, runs the script in
    lockstep with the other rank and reports the books it saw; any failure is reported as text."""
    try:
        store = dhisparse.InterprocessHostStore.open(LAYOUT, name, timeout_ms=20000)
        assert not store.creator and store.ranks == RANKS
        h = dhisparse.Hierarchy(LAYOUT, CONFIG, store=store, rank=rank)
        hist, stats = History(h.layout, seed=seed), {}
        for _ in script(h, hist, stats):
            barrier.wait()
        barrier.wait()  # every rank has appended everything
        in_use, written = expected_books(hist, RANKS)
        seen = {"in_use": (store.host_bytes_in_use, in_use),
                "written": ([store.rows_written(r) for r in range(RANKS)], written),
                "bound": ([store.rank_bound(r) for r in range(RANKS)], [True] * RANKS),
                "host_reads": stats["host"] > 0}
        barrier.wait()  # both read the books before either completes
        for r in REQUESTS:
            h.complete(r)
        queue.put((rank, "ok", seen))
    except BaseException:  # noqa: B902 (reported to the parent, which fails the test)
        queue.put((rank, "error", traceback.format_exc()))
        barrier.abort()
        raise


def run_rank_processes(seeds):
    """Creates a store under a new name, runs one process per rank over it, and returns their
    reports and the store (its books after both processes exited). The name is removed even when
    something fails."""
    ctx = multiprocessing.get_context("fork")
    name = unique_name("ranks")
    procs = []
    store = dhisparse.InterprocessHostStore.create(LAYOUT, name, RANKS, HOST_PAGES)
    try:
        assert store.creator and store.name == name
        barrier, queue = ctx.Barrier(RANKS, timeout=60), ctx.Queue()
        procs = [ctx.Process(target=_rank_process, args=(name, r, barrier, queue, seeds[r])) for r in range(RANKS)]
        for p in procs:
            p.start()
        reports = dict((rank, (status, seen)) for rank, status, seen in (queue.get(timeout=120) for _ in procs))
        for p in procs:
            p.join(timeout=60)
        return reports, [p.exitcode for p in procs], store
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        dhisparse.InterprocessHostStore.remove(name)  # the creator also unlinks it when freed
        with pytest.raises(dhisparse.SharedMemoryError):
            dhisparse.InterprocessHostStore.open(LAYOUT, name, timeout_ms=0)


def test_two_rank_processes_over_one_interprocess_store():
    reports, exitcodes, store = run_rank_processes([SEED, SEED])
    for rank, (status, seen) in sorted(reports.items()):
        assert status == "ok", f"rank {rank} failed:\n{seen}"
        for key, (got, want) in ((k, v) for k, v in seen.items() if k != "host_reads"):
            assert got == want, f"rank {rank}: {key} {got} != {want}"
        assert seen["host_reads"]
    assert exitcodes == [0] * RANKS
    # after both processes: every rank unbound, every page back, the rows each wrote still counted
    _, written = reports[0][1]["written"]
    assert [store.rows_written(r) for r in range(RANKS)] == written
    assert [store.rank_bound(r) for r in range(RANKS)] == [False] * RANKS
    assert store.requests == 0 and store.host_bytes_in_use == 0


def test_interprocess_store_errors_and_lifetime():
    name = unique_name("errors")
    store = dhisparse.InterprocessHostStore.create(LAYOUT, name, RANKS, HOST_PAGES)
    try:
        with pytest.raises(dhisparse.SharedMemoryError, match="exists already"):
            dhisparse.InterprocessHostStore.create(LAYOUT, name, RANKS, HOST_PAGES)
        with pytest.raises(dhisparse.SharedMemoryError, match="does not exist"):
            dhisparse.InterprocessHostStore.open(LAYOUT, name + "-missing", timeout_ms=0)
        with pytest.raises(dhisparse.InvalidConfiguration, match="another layout"):
            dhisparse.InterprocessHostStore.open("glm53", name, timeout_ms=0)
        with pytest.raises(dhisparse.InvalidConfiguration):
            dhisparse.InterprocessHostStore.create(LAYOUT, "/bad/name", RANKS, HOST_PAGES)
        opened = dhisparse.InterprocessHostStore.open(LAYOUT, name, timeout_ms=0)
        assert not opened.creator and opened.name == name and opened.host_pages == HOST_PAGES
        h0 = dhisparse.Hierarchy(LAYOUT, CONFIG, store=opened, rank=0)
        assert store.rank_bound(0) and not store.rank_bound(1)
        with pytest.raises(dhisparse.InvalidConfiguration, match="already has a hierarchy"):
            dhisparse.Hierarchy(LAYOUT, CONFIG, store=store, rank=0)  # bound through the other mapping
        with pytest.raises(dhisparse.InvalidConfiguration, match="no hierarchy to reclaim"):
            store.reclaim_rank(1)
        h0.admit(4)
        h0.append(4, 0, np.zeros((2, 9, 64), np.uint8))
        assert store.host_bytes_in_use == 2 * page_bytes(h0.layout, 0)
        # freeing: the opened store lives while its hierarchy does; the creator's unlinks the name
        refs = [weakref.ref(opened), weakref.ref(h0)]
        del opened
        gc.collect()
        assert refs[0]() is not None
        del h0
        gc.collect()
        assert all(r() is None for r in refs)
        assert not store.rank_bound(0) and store.host_bytes_in_use == 0
        assert dhisparse.InterprocessHostStore.mapping_bytes(LAYOUT, RANKS, HOST_PAGES) >= store.host_store_bytes
        del store
        gc.collect()
        with pytest.raises(dhisparse.SharedMemoryError):
            dhisparse.InterprocessHostStore.open(LAYOUT, name, timeout_ms=0)
        assert not dhisparse.InterprocessHostStore.remove(name)
    finally:
        dhisparse.InterprocessHostStore.remove(name)


def test_a_dead_rank_process_is_reclaimed():
    name = unique_name("dead")
    store = dhisparse.InterprocessHostStore.create(LAYOUT, name, RANKS, HOST_PAGES)
    try:
        ctx = multiprocessing.get_context("fork")

        def die_holding_rank_1():
            h = dhisparse.Hierarchy(LAYOUT, CONFIG, store=dhisparse.InterprocessHostStore.open(LAYOUT, name), rank=1)
            h.admit(2)
            h.append(2, 1, np.zeros((1, 5, 32), np.uint8))
            os._exit(0)  # no destructor runs: the rank and its page stay held

        p = ctx.Process(target=die_holding_rank_1)
        p.start()
        p.join(timeout=60)
        assert p.exitcode == 0
        assert store.rank_bound(1) and store.requests == 1 and store.host_bytes_in_use > 0
        store.reclaim_rank(1)
        assert not store.rank_bound(1) and store.requests == 0 and store.host_bytes_in_use == 0
        h1 = dhisparse.Hierarchy(LAYOUT, CONFIG, store=store, rank=1)  # the rank may be bound again
        assert h1.rank == 1
    finally:
        dhisparse.InterprocessHostStore.remove(name)
