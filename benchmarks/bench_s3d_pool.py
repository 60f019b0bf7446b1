"""CPU cost of S3D's inception max-pools: ``InceptionMaxPool3d`` (channels-last copy) against ``nn.MaxPool3d``.

Times, in one run, a forward and backward pass of each inception block's pool at the shapes the backbone
gives it, and of the whole backbone with either pool, and prints the ratios. The default is the CPU demo's
size; ``--width 1 --size 128 --length 32 --batch 2`` is the paper's network.

    python benchmarks/bench_s3d_pool.py
    python benchmarks/bench_s3d_pool.py --width 1 --size 128 --length 32 --batch 2 --repeats 1
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from torch import nn

from coclr.models.s3d import S3D, InceptionMaxPool3d, SepInception


def seconds_per_pass(modules: list[nn.Module], x: torch.Tensor, repeats: int, rounds: int = 3) -> list[float]:
    """Per module, the time of ``module(x).sum().backward()``: the best over ``rounds`` interleaved rounds of
    the mean of ``repeats`` passes (interleaving and the minimum keep a busy machine's noise out of the ratio)."""
    x = x.detach().requires_grad_()
    best = [float("inf")] * len(modules)
    for module in modules:
        module(x).sum().backward()
    for _ in range(rounds):
        for index, module in enumerate(modules):
            started = time.perf_counter()
            for _ in range(repeats):
                module(x).sum().backward()
            best[index] = min(best[index], (time.perf_counter() - started) / repeats)
    return best


def with_plain_pools(model: S3D) -> S3D:
    """``model`` with every ``InceptionMaxPool3d`` replaced by the ``nn.MaxPool3d`` it specialises (in place)."""
    for block in model.modules():
        if isinstance(block, SepInception):
            block.branch3[0] = nn.MaxPool3d(3, stride=1, padding=1)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=float, default=0.125, help="S3D width multiplier")
    parser.add_argument("--size", type=int, default=32, help="frame height and width")
    parser.add_argument("--length", type=int, default=8, help="frames per clip")
    parser.add_argument("--batch", type=int, default=32, help="clips per pass")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--repeats", type=int, default=10, help="timed passes per figure")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    model = S3D(width=args.width).train()
    x = torch.randn(args.batch, 3, args.length, args.size, args.size)
    pool_inputs = {}
    hooks = [module.register_forward_hook(lambda m, inputs, out, name=name: pool_inputs.setdefault(name, inputs[0]))
             for name, module in model.named_modules() if isinstance(module, InceptionMaxPool3d)]
    with torch.no_grad():
        model(x)
    for hook in hooks:
        hook.remove()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads; S3D width {args.width}, "
          f"batch {args.batch} x {args.length}x{args.size}x{args.size}; forward + backward, ms")
    print(f"{'pool':24s} {'input shape':24s} {'nn.MaxPool3d':>12s} {'Inception':>10s} {'ratio':>6s}")
    for name, pool_input in pool_inputs.items():
        plain, ours = seconds_per_pass([nn.MaxPool3d(3, stride=1, padding=1), InceptionMaxPool3d()], pool_input,
                                       args.repeats)
        shape = str(tuple(pool_input.shape))
        print(f"{name:24s} {shape:24s} {plain * 1e3:12.2f} {ours * 1e3:10.2f} {plain / ours:6.2f}")
    plain_model = with_plain_pools(copy.deepcopy(model))
    plain, ours = seconds_per_pass([plain_model, model], x, args.repeats)
    print(f"{'whole backbone':49s} {plain * 1e3:12.1f} {ours * 1e3:10.1f} {plain / ours:6.2f}")


if __name__ == "__main__":
    main()
