"""Overhead of resolve through the Python binding against the C++ call (GPU machine).

For C = 1 and C = 128 requests (deepseek_v41_flash, top_k 512, every selected row a hot-cache hit
after the first call, so the kernels are short) it reports host microseconds per call of
  cpp        resolve(source, batch_view, stream) issued back to back from C++ (_time_resolve_view),
  py         the same call through the binding, stream passed as an int,
  py-torch   the same with stream=None (torch's current stream looked up per call),
  py-ptr     resolve_view_ptr: the same call over data_ptr()s taken once (no array import),
and GPU microseconds per step of
  eager      the back-to-back calls above (CUDA events around them),
  graph      one resolve_view captured in a torch.cuda.CUDAGraph, replayed.
Usage: python python/benchmarks/bench_binding.py [--iterations 500] [--repeats 5]
"""
import argparse
import statistics
import time

import torch

import dhisparse


def median_of(repeats, fn):
    return statistics.median(fn() for _ in range(repeats))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    n = args.iterations
    dev = torch.device("cuda")
    print(f"torch {torch.__version__}; DLPack C exchange API offered: "
          f"{hasattr(torch.Tensor, '__dlpack_c_exchange_api__')}")
    print(f"{'C':>4} {'cpp us':>8} {'py us':>8} {'py-torch':>9} {'py-ptr':>8} {'added us':>9} {'ptr added':>10} "
          f"{'eager gpu':>10} {'graph gpu':>10}")
    for c in (1, 128):
        h = dhisparse.Hierarchy("deepseek_v41_flash", {"max_requests": c, "max_rows": 4096}, backend="cuda")
        top_k = h.top_k
        for r in range(c):
            h.admit(r)
            h.append(r, 0, torch.randint(0, 255, (1, 2048, 288), dtype=torch.uint8, device=dev))
        stream = torch.cuda.Stream()
        s = stream.cuda_stream
        slots = torch.tensor([h.slot_of(r) for r in range(c)], dtype=torch.int32, device=dev)
        sel = torch.stack([torch.randperm(2048 - 64, device=dev)[:top_k] for _ in range(c)]).int().contiguous()
        loc = torch.empty_like(sel)
        count = torch.tensor([c], dtype=torch.int32, device=dev)
        with torch.cuda.stream(stream):
            h.resolve_view(0, slots, sel, loc, count, stream=s)  # fill the hot caches
            h.check_errors(stream=s)

            def cpp():
                return h._time_resolve_view(n, 0, slots, sel, loc, count, stream=s) * 1e6

            def py(explicit):
                stream.synchronize()
                t0 = time.perf_counter()
                if explicit:
                    for _ in range(n):
                        h.resolve_view(0, slots, sel, loc, count, stream=s)
                else:
                    for _ in range(n):
                        h.resolve_view(0, slots, sel, loc, count)
                t1 = time.perf_counter()
                stream.synchronize()
                return (t1 - t0) / n * 1e6

            ptrs = (slots.data_ptr(), sel.data_ptr(), loc.data_ptr(), count.data_ptr())

            def py_ptr():
                stream.synchronize()
                t0 = time.perf_counter()
                for _ in range(n):
                    h.resolve_view_ptr(0, *ptrs, stride=top_k, capacity=c, stream=s)
                t1 = time.perf_counter()
                stream.synchronize()
                return (t1 - t0) / n * 1e6

            def gpu_eager():
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(stream)
                for _ in range(n):
                    h.resolve_view(0, slots, sel, loc, count, stream=s)
                b.record(stream)
                b.synchronize()
                return a.elapsed_time(b) * 1e3 / n

            cpp_us = median_of(args.repeats, cpp)
            py_us = median_of(args.repeats, lambda: py(True))
            pyt_us = median_of(args.repeats, lambda: py(False))
            ptr_us = median_of(args.repeats, py_ptr)
            eager_gpu = median_of(args.repeats, gpu_eager)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            h.resolve_view(0, slots, sel, loc, count)

        def gpu_graph():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            cur = torch.cuda.current_stream()
            a.record(cur)
            for _ in range(n):
                g.replay()
            b.record(cur)
            b.synchronize()
            return a.elapsed_time(b) * 1e3 / n

        graph_gpu = median_of(args.repeats, gpu_graph)
        h.check_errors()
        print(f"{c:>4} {cpp_us:8.2f} {py_us:8.2f} {pyt_us:9.2f} {ptr_us:8.2f} {py_us - cpp_us:9.2f} "
              f"{ptr_us - cpp_us:10.2f} {eager_gpu:10.2f} {graph_gpu:10.2f}")
        del g, h


if __name__ == "__main__":
    main()
