"""CUDA backend through the binding (run on a GPU machine: pytest python/tests -m gpu).

The decode loop captures the step's KV writes (append_view), resolve_view and a torch sparse
attention over the pool views in a torch.cuda.CUDAGraph, replays it for 100 steps with changing selections, and compares with the
same steps run eagerly on a second hierarchy and with the test's own rows."""
import numpy as np
import pytest

import dhisparse

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not dhisparse.CUDA_BUILT, reason="dhisparse built without the CUDA backend"),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]


def fp16_rows(gen, layers, count, row_bytes):
    """Rows whose bytes are fp16 values (so attention over them is finite), as uint8 [L, n, row_bytes]."""
    vals = torch.randn(layers, count, row_bytes // 2, generator=gen, dtype=torch.float32).to(torch.float16)
    return vals.view(torch.uint8).contiguous()


def attention(pools, loc, q):
    """Sparse attention over the pool views: keys from payload layer 0, values from layer 1 at the
    resolved locations; -1 entries are masked. pools: uint8 [rows, row_bytes]; loc [C, k]; q [C, d]."""
    valid = loc >= 0
    idx = loc.clamp(min=0).long()
    keys = pools[0][idx].view(torch.float16).float()    # [C, k, d]
    vals = pools[1][idx].view(torch.float16).float()
    scores = torch.einsum("ckd,cd->ck", keys, q.float()).masked_fill(~valid, float("-inf"))
    p = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.einsum("ck,ckd->cd", p, vals)


def model_attention(history, requests, sel, q):
    """The same attention from the test's own rows (no dhisparse)."""
    out = []
    for i, r in enumerate(requests):
        rows = history[r]  # uint8 [2, n, 64]
        s = sel[i]
        keep = s >= 0
        keys = rows[0][s[keep].long()].view(torch.float16).float()
        vals = rows[1][s[keep].long()].view(torch.float16).float()
        p = torch.softmax(keys @ q[i].float(), dim=-1)
        out.append(p @ vals)
    return torch.stack(out)


def test_decode_loop_in_a_cuda_graph():
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(3)
    rng = np.random.default_rng(5)
    C, K, STEPS, SOURCE = 8, 16, 100, 0  # tiny: top_k 16, source 0 has layers 0 (keys) and 1 (values)
    cfg = {"max_requests": C, "max_rows": 512}
    graph_h = dhisparse.Hierarchy("tiny", cfg, backend="cuda")
    eager_h = dhisparse.Hierarchy("tiny", cfg, backend="cuda")
    requests = list(range(100, 100 + C))
    history = {}
    for r in requests:
        graph_h.admit(r)
        eager_h.admit(r)
        rows = fp16_rows(gen, 2, 40, 64)
        history[r] = rows
        graph_h.append(r, SOURCE, rows.to(dev))  # device rows
        eager_h.append(r, SOURCE, rows)          # host rows, staged by the library
    pools = [graph_h.pool(SOURCE, layer, like="torch") for layer in (0, 1)]
    eager_pools = [eager_h.pool(SOURCE, layer, like="torch") for layer in (0, 1)]
    assert pools[0].device.type == "cuda" and pools[0].shape == (graph_h.pool_rows(), 64)

    slots = torch.tensor([graph_h.slot_of(r) for r in requests], dtype=torch.int32, device=dev)
    sel = torch.full((C, K), -1, dtype=torch.int32, device=dev)
    loc = torch.zeros((C, K), dtype=torch.int32, device=dev)
    count = torch.tensor([C], dtype=torch.int32, device=dev)
    q = torch.randn(C, 32, generator=gen).to(torch.float16).to(dev)
    out = torch.zeros((C, 32), device=dev)

    # The step's new KV rows, as the engine's KV-producing kernel leaves them: one buffer per
    # payload layer, token i of the step at row i.
    step_rows = [torch.zeros((C, 64), dtype=torch.uint8, device=dev) for _ in (0, 1)]
    layer_ptrs = dhisparse.layer_pointers(step_rows)
    ones = torch.ones(C, dtype=torch.int32, device=dev)

    def new_token():
        """The next token's rows: into the step buffers (graph), per request (eager), and the model."""
        new = {r: fp16_rows(gen, 2, 1, 64) for r in requests}
        for layer in (0, 1):
            step_rows[layer].copy_(torch.stack([new[r][layer, 0] for r in requests]).to(dev))
        for r in requests:
            history[r] = torch.cat([history[r], new[r]], dim=1)
            eager_h.append(r, SOURCE, new[r].to(dev))
        graph_h.reserve_ahead(1)  # host pages for the write, outside the graph

    def step():
        # on torch's current (capture) stream: write, resolve, attend
        graph_h.append_view(SOURCE, slots, ones, layer_ptrs)
        graph_h.resolve_view(SOURCE, slots, sel, loc, count)
        out.copy_(attention(pools, loc, q))

    new_token()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        sel[:, 0] = 0
        step()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph_h.check_errors()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()

    eager_loc = torch.zeros_like(loc)
    eager_h.resolve(SOURCE, requests, sel.clone(), eager_loc)  # mirror the warm-up
    for t in range(STEPS):
        new_token()  # the graph writes it (append_view), the eager twin per request
        n = C if t % 5 else C - 3  # the batch size changes between replays too
        host_sel = np.full((C, K), -1, dtype=np.int32)
        for i, r in enumerate(requests):
            frontier = history[r].shape[1]
            width = int(rng.integers(1, K + 1))
            host_sel[i, :width] = rng.choice(frontier, size=width, replace=False)
        sel.copy_(torch.from_numpy(host_sel))
        count.fill_(n)
        loc.fill_(-7)
        g.replay()
        eager_loc.fill_(-7)
        eager_h.resolve(SOURCE, requests[:n], sel[:n], eager_loc[:n])
        eager_out = attention(eager_pools, eager_loc[:n], q[:n])
        torch.cuda.synchronize()
        assert torch.equal(loc[:n], eager_loc[:n]), f"step {t}: graph and eager locations differ"
        torch.testing.assert_close(out[:n], eager_out, rtol=1e-5, atol=1e-6)  # graph vs eager
        assert (loc[n:] == -7).all()  # entries past the count are left alone
        # the rows at the locations are the test's own rows, in both payload layers
        s_cpu = sel[:n].cpu()
        l_cpu = loc[:n].cpu()
        for layer in (0, 1):
            got = pools[layer][loc[:n].clamp(min=0).long()].cpu()
            for i, r in enumerate(requests[:n]):
                keep = s_cpu[i] >= 0
                assert torch.equal(got[i][keep], history[r][layer][s_cpu[i][keep].long()]), f"step {t} layer {layer}"
                assert (l_cpu[i][~keep] == -1).all()
        if t % 10 == 0:
            graph_h.sync_books()
            assert all(graph_h.frontier(r, SOURCE) == eager_h.frontier(r, SOURCE) == history[r].shape[1]
                       for r in requests)
        expected = model_attention(history, requests[:n], s_cpu, q[:n].cpu()).to(dev)
        torch.testing.assert_close(out[:n], expected, rtol=1e-4, atol=1e-4)
    graph_h.check_errors()
    eager_h.check_errors()
    # the pointer-level call resolves the same batch to the same locations as the array call
    ptr_loc = torch.full_like(loc, -7)
    graph_h.resolve_view_ptr(SOURCE, slots.data_ptr(), sel.data_ptr(), ptr_loc.data_ptr(), count.data_ptr(),
                             stride=K, capacity=C)
    eager_loc.fill_(-7)
    eager_h.resolve(SOURCE, requests[:n], sel[:n], eager_loc[:n])
    graph_h.check_errors()
    assert torch.equal(ptr_loc[:n], eager_loc[:n])
    for r in requests:
        assert graph_h.hot_rows_of(r, SOURCE) == eager_h.hot_rows_of(r, SOURCE)


def test_cuda_matches_host_reference():
    """Same calls on both backends: the same locations and hot-cache state."""
    rng = np.random.default_rng(9)
    cfg = {"max_requests": 4, "max_rows": 256, "optional_pages": 4}
    host = dhisparse.Hierarchy("glm53", cfg)
    dev = dhisparse.Hierarchy("glm53", cfg, backend="cuda")
    requests = [1, 2, 3]
    for r in requests:
        host.admit(r)
        dev.admit(r)
        rows = rng.integers(0, 256, size=(4, 200, 576), dtype=np.uint8)
        host.append(r, 0, rows)
        dev.append(r, 0, torch.from_numpy(rows).cuda())
    host.map_optional_page(2, 0, 1)
    dev.map_optional_page(2, 0, 1)
    for step in range(5):
        sel = np.full((3, 2048), -1, dtype=np.int32)
        for i in range(3):
            sel[i, :150] = rng.choice(200, size=150, replace=False)
        hloc = np.zeros_like(sel)
        hstats = host.resolve(0, requests, sel, hloc)
        dloc = torch.zeros(sel.shape, dtype=torch.int32, device="cuda")
        dev.resolve(0, requests, torch.from_numpy(sel).cuda(), dloc)
        dev.check_errors()
        np.testing.assert_array_equal(dloc.cpu().numpy(), hloc)
        dstats = dev.last_stats(0)
        assert sum(s.selected for s in dstats) == hstats.selected
        assert sum(s.host for s in dstats) == hstats.host
        for r in requests:
            assert dev.hot_rows_of(r, 0) == host.hot_rows_of(r, 0)
            assert dev.lru_order_of(r, 0) == host.lru_order_of(r, 0)
        for layer in range(4):
            pool = dev.pool(0, layer, like="torch")
            hpool = np.asarray(host.pool(0, layer, like="numpy"))
            idx = torch.from_numpy(hloc[hloc >= 0]).long().cuda()
            assert torch.equal(pool[idx].cpu(), torch.from_numpy(hpool[hloc[hloc >= 0]]))


def test_device_errors_are_raised_by_check_errors():
    h = dhisparse.Hierarchy("tiny", {"max_requests": 2, "max_rows": 64}, backend="cuda")
    h.admit(1)
    h.append(1, 1, torch.zeros((1, 10, 32), dtype=torch.uint8, device="cuda"))
    slots = torch.tensor([h.slot_of(1)], dtype=torch.int32, device="cuda")
    sel = torch.tensor([[0, 10]], dtype=torch.int32, device="cuda")  # row 10 is beyond the frontier
    loc = torch.zeros_like(sel)
    count = torch.ones(1, dtype=torch.int32, device="cuda")
    h.resolve_view(1, slots, sel, loc, count)
    with pytest.raises(dhisparse.PositionBeyondFrontier):
        h.check_errors()
    with pytest.raises(dhisparse.SelectionTooLong):
        h.resolve(1, [1], torch.zeros((1, 17), dtype=torch.int32, device="cuda"),
                  torch.zeros((1, 17), dtype=torch.int32, device="cuda"))
    with pytest.raises(TypeError):
        h.resolve(1, [1], sel.cpu(), loc.cpu())  # host arrays on the CUDA backend
    with pytest.raises(dhisparse.SizeMismatch):
        h.append(1, 1, torch.zeros(33, dtype=torch.uint8, device="cuda"), count=1)


def test_torch_tensors_and_streams_through_the_exchange_api_when_offered():
    """torch >= 2.10 publishes the DLPack C exchange API: tensors are then imported without
    `__dlpack__` and stream=None asks torch from C; either way the binding sees the same memory
    and stream."""
    offered = hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
    t = torch.arange(24, dtype=torch.int32, device="cuda").view(4, 6)[1:3]
    got = dhisparse._core._array_import(t)
    assert got["path"] == ("exchange" if offered else "dlpack")
    assert got["data"] == t.data_ptr() and got["shape"] == (2, 6) and got["strides"] == (6, 1)
    assert got["dtype"] == (0, 32, 1) and got["device"] == (2, t.device.index)
    out = dhisparse._core._array_import(t, writable=True)  # an array the call writes: torch's owned description
    assert out["path"] == got["path"] and out["data"] == t.data_ptr() and out["strides"] == (6, 1)
    dev = torch.cuda.current_device()
    side = torch.cuda.Stream()
    if offered:  # stream=None answered from C: a provider that fails shows it is not asked

        def not_asked(device):
            raise AssertionError("the Python stream provider was asked")

        dhisparse._core._set_stream_provider(not_asked)
        assert dhisparse._core._set_stream_api(torch.Tensor.__dlpack_c_exchange_api__)
    try:
        with torch.cuda.stream(side):
            assert dhisparse._core._default_stream(dev) == side.cuda_stream
        assert dhisparse._core._default_stream(dev) == torch.cuda.current_stream().cuda_stream
    finally:
        dhisparse._core._set_stream_provider(dhisparse._current_stream)
        dhisparse._stream_api_source = None  # registered again on next use
    dhisparse._current_stream()  # the package registers torch's API when it first sees torch
    assert dhisparse._stream_api_source is torch
    # A torch.cuda.Stream passed as `stream=` is its handle.
    h = dhisparse.Hierarchy("tiny", {"max_requests": 2, "max_rows": 64}, backend="cuda", stream=side)
    assert h.stream == side.cuda_stream
    h.admit(1)
    h.append(1, 0, torch.zeros((2, 4, 64), dtype=torch.uint8, device="cuda"), stream=side)
    h.check_errors(stream=side)
    assert h.frontier(1, 0) == 4


def test_default_stream_is_of_the_objects_device():
    """stream=None asks the provider for the object's own device (C++ side of the per-device default)."""
    h = dhisparse.Hierarchy("tiny", {"max_requests": 2, "max_rows": 64}, backend="cuda")
    asked = []

    def provider(device):
        asked.append(device)
        return dhisparse._current_stream(device)

    dhisparse._core._set_stream_provider(provider)  # (forgets torch's C stream API, which would bypass it)
    try:
        h.admit(1)
        h.synchronize()
    finally:
        dhisparse._core._set_stream_provider(dhisparse._current_stream)
        dhisparse._stream_api_source = None  # registered again on next use
    assert asked and set(asked) == {h.device}
    if torch.cuda.device_count() > 1:  # an object of GPU 1 driven while GPU 0 is current
        with torch.cuda.device(1):
            other = dhisparse.Hierarchy("tiny", {"max_requests": 2, "max_rows": 64}, backend="cuda")
        assert other.device == 1 and torch.cuda.current_device() == 0
        other.admit(1)
        other.append(1, 1, torch.zeros((1, 4, 32), dtype=torch.uint8, device="cuda:1"))
        other.synchronize()


def test_cuda_speculative_round_and_residency():
    gen = torch.Generator().manual_seed(1)
    h = dhisparse.Hierarchy("tiny", {"max_requests": 2, "max_rows": 64, "max_block": 3}, backend="cuda")
    h.admit(1)
    rows = fp16_rows(gen, 1, 20, 32)
    h.append(1, 1, rows.cuda())
    block = fp16_rows(gen, 1, 3, 32)
    h.stage_block(1, 1, block.cuda(), 3)
    q = torch.full((1, 3, 2), -1, dtype=torch.int32)
    q[0, 0] = torch.tensor([0, 20])
    q[0, 1] = torch.tensor([20, 21])
    q[0, 2] = torch.tensor([22, 5])
    loc = torch.zeros_like(q).cuda()
    h.verify(1, [1], q.cuda(), loc)
    h.check_errors()
    pool = h.pool(1, 0, like="torch")
    model = torch.cat([rows, block], dim=1)[0]
    for j in range(3):
        for e in range(2):
            assert torch.equal(pool[loc[0, j, e].long()].cpu(), model[q[0, j, e].long()])
    h.commit(1, 1, 2)
    torch.cuda.synchronize()
    assert h.frontier(1, 1) == 23 and h.host_row(1, 1, 0, 22) == bytes(block[0, 2].numpy())
    # a second round committed from device buffers (capturable: commit_view)
    block2 = fp16_rows(gen, 1, 3, 32)
    h.stage_block(1, 1, block2.cuda(), 3)
    q2 = torch.full((1, 3, 2), -1, dtype=torch.int32, device="cuda")
    q2[0, :, 0] = torch.tensor([23, 24, 25])
    h.verify(1, [1], q2, torch.zeros_like(q2))
    h.reserve_ahead(3)
    h.commit_view(1, torch.tensor([h.slot_of(1)], dtype=torch.int32, device="cuda"),
                  torch.tensor([1], dtype=torch.int32, device="cuda"))
    h.check_errors()
    h.sync_books()
    assert h.frontier(1, 1) == 25 and h.host_row(1, 1, 0, 24) == bytes(block2[0, 1].numpy())

    m = dhisparse.ResidencyManager("tiny", {"max_requests": 2, "max_rows": 64, "optional_pages": 16},
                                   {"required_pages": 1}, policy="adaptive-mra", backend="cuda")
    imports = [fp16_rows(gen, 2, 24, 64).cuda(), fp16_rows(gen, 1, 24, 32).cuda()]
    a = m.admit(5, imports)
    assert a and a.mapped_pages > 0
    m.drain()
    assert m.audit() == "" and m.invariant_holds() and m.ledger(0).optional == m.optional_pages_of(5, 0)
    sel = torch.tensor([[0, 9, 17, 23]], dtype=torch.int32, device="cuda")
    loc = torch.zeros_like(sel)
    m.hierarchy.resolve(0, [5], sel, loc)
    m.hierarchy.check_errors()
    p0 = m.hierarchy.pool(0, 0, like="torch")
    assert torch.equal(p0[loc[0].long()], imports[0][0][sel[0].long()])
    # streamed admission: admitted first, the prefill imported in chunks from device memory
    assert m.admit(6)
    streamed = fp16_rows(gen, 2, 40, 64).cuda()
    mapped = sum(m.import_history(6, 0, streamed[:, a:b].contiguous()) for a, b in ((0, 13), (13, 29), (29, 40)))
    m.drain()
    assert mapped == m.optional_pages_of(6, 0) > 0 and m.imported_rows(6, 0) == 40 and m.audit() == ""
    sel = torch.tensor([[0, 12, 13, 28, 39]], dtype=torch.int32, device="cuda")
    loc = torch.zeros_like(sel)
    m.hierarchy.resolve(0, [6], sel, loc)
    m.hierarchy.check_errors()
    for layer in (0, 1):
        pool = m.hierarchy.pool(0, layer, like="torch")
        assert torch.equal(pool[loc[0].long()], streamed[layer][sel[0].long()])
    with pytest.raises(AttributeError, match="manager's own member"):
        m.hierarchy.admit(9)
    m.complete(5)
    m.complete(6)
    m.drain()
    assert m.audit() == "" and m.admitted_count == 0


def test_step_wide_write_with_backup_in_a_cuda_graph():
    """append_step_view writes every source in one launch, its host backup forked onto a side stream
    and joined, captured once and replayed; every row lands in the pools and the host store."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(8)
    C, STEPS = 4, 30
    h = dhisparse.Hierarchy("tiny", {"max_requests": C, "max_rows": 256}, backend="cuda")
    requests = list(range(20, 20 + C))
    for r in requests:
        h.admit(r)
    info = h.layout["sources"]
    assert h.step_layers == sum(s["payload_layers"] for s in info)
    # one row buffer per (source, payload layer), token e of the step at row e
    bufs = [None] * h.step_layers
    for s, d in enumerate(info):
        for layer in range(d["payload_layers"]):
            bufs[h.step_layer_index(s, layer)] = torch.zeros((C, d["row_bytes"]), dtype=torch.uint8, device=dev)
    layer_rows = dhisparse.layer_pointers(bufs)
    slots = torch.tensor([h.slot_of(r) for r in requests], dtype=torch.int32, device=dev)
    ones = torch.ones(C, dtype=torch.int32, device=dev)
    backup = torch.cuda.Stream()
    history = {(r, s): [] for r in requests for s in range(len(info))}

    def next_rows():
        for s, d in enumerate(info):
            for layer in range(d["payload_layers"]):
                new = fp16_rows(gen, 1, C, d["row_bytes"])[0]  # [C, row_bytes]
                bufs[h.step_layer_index(s, layer)].copy_(new.to(dev))
                for i, r in enumerate(requests):
                    if layer == 0:
                        history[(r, s)].append({})
                    history[(r, s)][-1][layer] = new[i].clone()
        h.reserve_ahead(1)

    def step():
        h.append_step_view(slots, ones, layer_rows, backup=backup.cuda_stream)
        h.join_backup()

    next_rows()
    step()  # eager once, then captured
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    for _ in range(STEPS):
        next_rows()
        g.replay()
    torch.cuda.synchronize()
    h.check_errors()
    h.sync_books()
    for r in requests:
        for s, d in enumerate(info):
            assert h.frontier(r, s) == STEPS + 1
            for row in range(0, STEPS + 1, 3):
                for layer in range(d["payload_layers"]):
                    assert h.host_row(r, s, layer, row) == bytes(history[(r, s)][row][layer].numpy())
    sel = torch.tensor([[0, 7, STEPS]] * C, dtype=torch.int32, device=dev)
    loc = torch.zeros_like(sel)
    h.resolve(0, requests, sel, loc)
    h.check_errors()
    pool = h.pool(0, 1, like="torch")
    for i, r in enumerate(requests):
        for e, row in enumerate((0, 7, STEPS)):
            assert torch.equal(pool[loc[i, e].long()].cpu(), history[(r, 0)][row][1])


def test_cuda_requests_share_a_retained_prefix():
    gen = torch.Generator().manual_seed(12)
    h = dhisparse.Hierarchy("tiny", {"max_requests": 3, "max_rows": 128, "host_pages": 40}, backend="cuda")
    h.admit(1)
    prompt = fp16_rows(gen, 2, 20, 64)
    h.append(1, 0, prompt.cuda())
    assert h.retain_prefix(7, 1, rows=[20, 0]) == [] and h.retained_prefixes() == [7]
    h.admit(2, prefix=7)
    own = fp16_rows(gen, 2, 5, 64)
    h.append(2, 0, own.cuda())
    model = torch.cat([prompt, own], dim=1)
    sel = torch.tensor([[0, 8, 19, 20, 24]], dtype=torch.int32, device="cuda")
    loc = torch.zeros_like(sel)
    h.resolve(0, [2], sel, loc)
    h.check_errors()
    for layer in (0, 1):
        pool = h.pool(0, layer, like="torch")
        assert torch.equal(pool[loc[0].long()].cpu(), model[layer][sel[0].long().cpu()])
    h.release_prefix(7)
    with pytest.raises(dhisparse.UnknownPrefix):
        h.admit(3, prefix=7)


def test_speculative_round_over_device_views_in_a_cuda_graph():
    """stage_blocks_view, verify_view and commit_view (all capturable) captured as one round and
    replayed: the same locations and frontiers as the per-request calls on a twin."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(14)
    C, K, k, ROUNDS = 2, 3, 4, 20
    cfg = {"max_requests": C, "max_rows": 256, "max_block": K}
    h = dhisparse.Hierarchy("tiny", cfg, backend="cuda")
    twin = dhisparse.Hierarchy("tiny", cfg, backend="cuda")
    requests = [1, 2]
    for x in (h, twin):
        for r in requests:
            x.admit(r)
    for r in requests:
        rows = fp16_rows(gen, 1, 16, 32).cuda()
        h.append(r, 1, rows)
        twin.append(r, 1, rows)
    block = torch.zeros((C * K, 32), dtype=torch.uint8, device=dev)  # entry e's block at rows e*K ..
    layer_rows = dhisparse.layer_pointers([block])
    slots = torch.tensor([h.slot_of(r) for r in requests], dtype=torch.int32, device=dev)
    counts = torch.full((C,), K, dtype=torch.int32, device=dev)
    first = torch.arange(0, C * K, K, dtype=torch.int32, device=dev)
    sel = torch.full((C, K, k), -1, dtype=torch.int32, device=dev)
    loc = torch.zeros_like(sel)
    sel_ptrs, loc_ptrs = dhisparse.verify_pointers(sel, loc)
    lengths = torch.full((C * K,), k, dtype=torch.int32, device=dev)
    count = torch.tensor([C], dtype=torch.int32, device=dev)
    accepted = torch.zeros(C, dtype=torch.int32, device=dev)

    def round_():
        h.stage_blocks_view(1, slots, counts, layer_rows, first=first, max_block=K)
        h.verify_view(1, count, slots, counts, lengths, sel_ptrs, loc_ptrs)
        h.commit_view(1, slots, accepted)

    def prepare(t):
        new = fp16_rows(gen, 1, C * K, 32)[0]
        block.copy_(new.to(dev))
        frontier = 16 + sum(1 + (i % K) for i in range(t))  # the model: accepted = t % K each round
        q = torch.full((C, K, k), -1, dtype=torch.int32)
        for j in range(K):
            q[:, j, 0] = frontier + j
            q[:, j, 1] = j
        sel.copy_(q.to(dev))
        accepted.fill_(t % K)
        h.reserve_ahead(K)
        return new, q

    new, q = prepare(0)
    round_()  # eager first
    torch.cuda.synchronize()
    h.check_errors()
    g = torch.cuda.CUDAGraph()
    for t in range(ROUNDS):
        if t > 0:
            new, q = prepare(t)
            if t == 1:
                with torch.cuda.graph(g):
                    round_()
            g.replay()
        torch.cuda.synchronize()
        h.check_errors()
        for i, r in enumerate(requests):
            twin.stage_block(r, 1, new[i * K:(i + 1) * K].unsqueeze(0).contiguous().cuda(), K)
        twin_loc = torch.zeros_like(loc)
        twin.verify(1, requests, q.cuda(), twin_loc)
        for r in requests:
            twin.commit(r, 1, t % K)
        torch.cuda.synchronize()
        assert torch.equal(loc, twin_loc), f"round {t}: verify locations differ"
        h.sync_books()
        for r in requests:
            assert h.frontier(r, 1) == twin.frontier(r, 1)


def test_cuda_manager_admits_on_a_prefix():
    gen = torch.Generator().manual_seed(15)
    m = dhisparse.ResidencyManager("tiny", {"max_requests": 3, "max_rows": 128, "optional_pages": 24},
                                   {"required_pages": 1}, policy="adaptive-mra", backend="cuda")
    system = [fp16_rows(gen, 2, 32, 64).cuda(), fp16_rows(gen, 1, 16, 32).cuda()]
    assert m.admit(1, system)
    m.drain()
    m.retain_prefix(50, 1)
    suffix = [fp16_rows(gen, 2, 11, 64).cuda(), fp16_rows(gen, 1, 5, 32).cuda()]
    assert m.admit(2, suffix, prefix=50)
    m.drain()
    assert m.audit() == "" and m.imported_rows(2, 0) == 43
    model = torch.cat([system[0], suffix[0]], dim=1)
    sel = torch.tensor([[0, 31, 32, 42]], dtype=torch.int32, device="cuda")
    loc = torch.zeros_like(sel)
    m.hierarchy.resolve(0, [2], sel, loc)
    m.hierarchy.check_errors()
    for layer in (0, 1):
        assert torch.equal(m.hierarchy.pool(0, layer, like="torch")[loc[0].long()], model[layer][sel[0].long()])
    m.complete(1)
    m.complete(2)
    m.release_prefix(50)
    m.drain()
    assert m.audit() == ""


def test_two_cuda_ranks_over_one_pinned_shared_store():
    """Two CUDA ranks on device 0 over one pinned in-process store: the same appends on both, a
    synchronisation between the appends and the resolves (the owner's host writes before the
    other rank's device reads), and every resolved location holds the test's own row."""
    from conftest import History, random_selection

    rng = np.random.default_rng(17)
    cfg = {"max_requests": 2, "max_rows": 256}
    store = dhisparse.SharedHostStore("tiny", 2, 64, backend="cuda")
    assert store.backend == "cuda" and store.ranks == 2
    ranks = [dhisparse.Hierarchy("tiny", cfg, backend="cuda", store=store, rank=r) for r in range(2)]
    assert [h.rank for h in ranks] == [0, 1] and all(h.shares_host_store for h in ranks)
    hist = History(ranks[0].layout, seed=8)
    requests = [4, 6]
    for h in ranks:
        for r in requests:
            assert h.admit(r)
    host_reads = 0
    for step in range(4):
        for s in range(2):
            for r in requests:
                rows = hist.new_rows(s, 30 if step == 0 else int(rng.integers(1, 4)))  # a chunk past the tail first
                hist.add(r, s, rows)
                for h in ranks:
                    h.append(r, s, torch.from_numpy(rows).cuda())
        torch.cuda.synchronize()  # every rank's host writes are done before any rank reads
        for s in range(2):
            sel = np.stack([random_selection(rng, hist.count(r, s), 16) for r in requests])
            for h in ranks:
                loc = torch.full(sel.shape, -7, dtype=torch.int32, device="cuda")
                h.resolve(s, requests, torch.from_numpy(sel).cuda(), loc)
                h.check_errors()
                host_reads += sum(st.host for st in h.last_stats(s))
                got = loc.cpu().numpy()
                for layer in range(hist.layout["sources"][s]["payload_layers"]):
                    pool = h.pool(s, layer, like="torch")
                    for i, r in enumerate(requests):
                        for e, row in enumerate(sel[i]):
                            if row == -1:
                                assert got[i, e] == -1
                                continue
                            np.testing.assert_array_equal(pool[int(got[i, e])].cpu().numpy(),
                                                          hist.row(r, s, layer, row),
                                                          err_msg=f"rank {h.rank} request {r} row {row}")
    assert host_reads > 0
    written = sum(hist.count(r, s) for r in requests for s in range(2))
    assert store.rows_written(0) + store.rows_written(1) == written
    assert store.host_bytes_in_use == ranks[0].host_bytes_in_use == ranks[1].host_bytes_in_use
    for h in ranks:
        for r in requests:
            h.complete(r)
    torch.cuda.synchronize()
    assert store.requests == 0 and store.host_bytes_in_use == 0
