"""The roofline of ``coclr embed``'s network on one CPU core: how close the float32 S3D runs to the core's peak.

Prints, from one run on this machine:

* the FLOPs per window of the S3D backbone at the embedding's defaults (``--length`` 32 frames of ``--size``
  128x128, width 1.0): counted by ``torch.utils.flop_counter.FlopCounterMode`` on the plain (eager) network, whose
  convolutions are the fused network's (the folded BatchNorm and the fused ReLU add no multiply-adds); the counter
  counts the convolutions and matrix products (2 FLOPs per multiply-add), not the pooling, BatchNorm or ReLU;
* the network alone: the fused inference network ``coclr embed`` runs on the CPU
  (:func:`coclr.models.inference.fused_for_inference`, channels-last 3D, batches of ``--batch`` windows), timed on
  1 thread with freed memory reused (:func:`coclr.threads.reuse_freed_memory`) as ``coclr embed`` runs it, and
  its achieved FLOP/s; beside it the same network with PyTorch's max-pools in place of its C ones
  (:mod:`coclr.models.pool_cpu`), and the ratio of the two;
* the core's peak float32 rate measured from a matrix product: ``torch.mm`` of two ``--matrix`` square float32
  matrices on 1 thread (MKL's SGEMM: the best a float32 kernel reaches on this core);
* the network's rate as a fraction of that peak, and where one forward's time goes (``torch.profiler``: self CPU
  time by op; the convolutions' own rate).

The timings alternate (peak, network, PyTorch's pools, PyTorch's pools, network, peak, ``--repeats`` times), so
drifts of a shared machine's load hit both; the median and the best of each are given, with the load average and the
CPU's flags (:func:`coclr.cpu.describe`). ``--cpu avx2`` runs it with the kernels limited to AVX2
(:data:`coclr.cpu.AVX2_LIMIT`).

    python benchmarks/roofline_embed.py [--batch 16] [--repeats 2] [--cpu avx2]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from coclr.cpu import AVX2_LIMIT, describe, limits
from coclr.threads import reuse_freed_memory

HERE = Path(__file__).resolve()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=16, help="windows per forward (coclr embed's batch: 16)")
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--width", type=float, default=1.0)
    parser.add_argument("--matrix", type=int, default=2048, help="side of the square matrices of the peak")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of peak, network, network, peak")
    parser.add_argument("--cpu", choices=("native", "avx2"), default="native")
    args = parser.parse_args()
    if args.cpu == "avx2" and limits() != AVX2_LIMIT:
        os.execve(sys.executable, [sys.executable, str(HERE), *sys.argv[1:]], {**os.environ, **AVX2_LIMIT})
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch  # noqa: PLC0415 - after the limits are in the environment
    from torch.utils.flop_counter import FlopCounterMode  # noqa: PLC0415

    from bench_embed import save_random_encoder  # noqa: PLC0415 - beside this script (its folder is on sys.path)
    from coclr.models.inference import (
        fused_for_inference,  # noqa: PLC0415
        inference_layout,  # noqa: PLC0415
    )
    from coclr.models.loading import load_encoder  # noqa: PLC0415
    from coclr.models.pool_cpu import MaxPool3dInference  # noqa: PLC0415

    torch.set_num_threads(1)
    print(f"{describe()}; torch {torch.__version__}; 1 thread; load average {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        backbone, _ = load_encoder(save_random_encoder(Path(tmp) / "encoder.pth", args.width))
    backbone.eval()
    generator = torch.Generator().manual_seed(0)
    clips = torch.randn(args.batch, 3, args.length, args.size, args.size, generator=generator)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        backbone(clips[:1])
    flops_per_window = counter.get_total_flops()
    layout = inference_layout(torch.device("cpu"))
    network = fused_for_inference(backbone).to(memory_format=layout)
    torch_pools = copy.deepcopy(network)
    for parent in list(torch_pools.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, MaxPool3dInference):
                setattr(parent, name, torch.nn.MaxPool3d(child.kernel_size, child.stride, child.padding))
    inputs = clips.contiguous(memory_format=layout)
    a, b = (torch.randn(args.matrix, args.matrix, generator=generator) for _ in range(2))
    out = torch.empty(args.matrix, args.matrix)

    def run_network() -> None:
        with torch.no_grad():
            network(inputs)

    def run_torch_pools() -> None:
        with torch.no_grad():
            torch_pools(inputs)

    def run_peak() -> None:
        for _ in range(4):
            torch.mm(a, b, out=out)

    work = {"network": flops_per_window * args.batch, "torch_pools": flops_per_window * args.batch,
            "peak": 4 * 2 * args.matrix ** 3}
    calls = {"network": run_network, "torch_pools": run_torch_pools, "peak": run_peak}
    reuse_freed_memory()  # as coclr embed runs the network: freed activations reused (coclr.threads)
    for call in calls.values():  # warm-up: oneDNN's primitives and MKL's buffers
        call()
    rates: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.repeats):
        for name in ("peak", "network", "torch_pools", "torch_pools", "network", "peak"):
            start = time.perf_counter()
            calls[name]()
            rates[name].append(work[name] / (time.perf_counter() - start))
    load = os.getloadavg()[0]
    print(f"S3D width {args.width}, {args.length}x{args.size}x{args.size} window: "
          f"{flops_per_window / 1e9:.2f} GFLOP per window (convolutions and matrix products, 2 per multiply-add)")
    for name, label in (("network", f"network alone (fused, {layout}, batch {args.batch})"),
                        ("torch_pools", "the same with PyTorch's max-pools"),
                        ("peak", f"peak: torch.mm {args.matrix}x{args.matrix} float32")):
        values = rates[name]
        print(f"{label:<62} median {statistics.median(values) / 1e9:7.1f} GFLOP/s, best {max(values) / 1e9:7.1f} "
              f"({', '.join(f'{v / 1e9:.1f}' for v in values)})")
    speedup = statistics.median(rates["network"]) / statistics.median(rates["torch_pools"])
    print(f"with its C max-pools the network runs {speedup:.2f}x as fast as with PyTorch's (medians)")
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        network(inputs)
    by_op = sorted(((event.key, event.self_cpu_time_total) for event in profiler.key_averages()),
                   key=lambda item: -item[1])
    total = sum(seconds for _, seconds in by_op)
    convolution = sum(seconds for name, seconds in by_op if "convolution" in name)
    print("one forward, profiled (self CPU time by op): " + ", ".join(
        f"{name} {seconds / total:.0%}" for name, seconds in by_op[:5] if seconds / total >= 0.01))
    print(f"the convolutions alone: {work['network'] / (convolution / 1e6) / 1e9:.1f} GFLOP/s in that forward "
          f"({convolution / total:.0%} of its time)")
    median = statistics.median(rates["network"]) / statistics.median(rates["peak"])
    best = max(rates["network"]) / max(rates["peak"])
    seconds = flops_per_window / statistics.median(rates["network"])
    print(f"network / peak: {median:.2f} (medians), {best:.2f} (best of each); {seconds:.3f} s per window at the "
          f"median rate; load average after {load:.2f}")


if __name__ == "__main__":
    main()
