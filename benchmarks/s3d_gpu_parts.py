"""Where full S3D's forward and backward spend their time on a GPU; its convolutions as 2-D ones, its pools as Triton
kernels.

    python benchmarks/s3d_gpu_parts.py --out parts.json [--batch 64] [--tiny] [--parts pools,model,step,stepprofile]

Parts, each written to ``--out`` as soon as it is measured (S3D alone, bf16 autocast and channels_last_3d on
CUDA, fp32 on the CPU, cuDNN's autotuner on):

- ``profile``: clips/s of the query's forward and backward, and the device time by operator and kernel over two
  profiled iterations.
- ``convs``: every convolution of S3D is a 1x1x1, a (1, k, k) spatial or a (k, 1, 1) temporal one, each a 2-D
  convolution of a view of the same channels_last_3d memory (frames folded into the batch for the spatial ones,
  height and width merged for the temporal ones). Each convolution, at the shape it meets in the forward, as
  ``conv3d`` and as that ``conv2d`` (forward and both gradients, interleaved A B B A; outputs checked to agree).
- ``pools``: each max-pool at its shape, PyTorch's ``max_pool3d`` against :mod:`coclr.models.pool_triton`
  (forward and backward, A B B A; values checked equal, and each form's gradient against the exact sum).
- ``model``: the forward and backward of the whole network with each pool (A B B A), then ``profile`` with the
  Triton pools.
- ``step``: the trainer's step (``benchmarks/gpu_suite.py``'s step part: InfoNCE and CoCLR, bf16 +
  channels_last, the batch of ``--batch``) with each pool, A B B A.
- ``stepprofile``: the device time of that step by kernel and operator (the network beside augmentation, loss,
  optimiser and momentum update) and the share of its wall time the device was busy.

On the CPU (``--tiny``: a narrow network on small clips) it only checks that the script runs; its figures mean
nothing there.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import gpu_suite  # benchmarks/: the store, the trainer's set-up and step of its step part
from coclr.atomic import atomic_write_json
from coclr.models.s3d import S3D
from gpu_suite import synchronize

CL3 = torch.channels_last_3d


def autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


def fold(conv: nn.Conv3d):
    """The 2-D form of ``conv`` (no bias): a function of the 5-D input giving the 5-D output, or None."""
    (kt, kh, kw), (st, sh, sw), (pt, ph, pw) = conv.kernel_size, conv.stride, conv.padding
    if conv.groups != 1 or conv.dilation != (1, 1, 1) or not isinstance(conv.padding, tuple):
        return None
    if kt == 1 and st == 1 and pt == 0:  # spatial (and 1x1x1): frames into the batch
        def spatial(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            n, c, t, h, w = x.shape
            frames = x.permute(0, 2, 1, 3, 4).reshape(n * t, c, h, w)
            out = F.conv2d(frames, weight[:, :, 0], stride=(sh, sw), padding=(ph, pw))
            return out.reshape(n, t, *out.shape[1:]).permute(0, 2, 1, 3, 4)
        return spatial
    if kh == kw == 1 and sh == sw == 1 and ph == pw == 0:  # temporal: height and width merged
        def temporal(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            n, c, t, h, w = x.shape
            out = F.conv2d(x.reshape(n, c, t, h * w), weight[..., 0], stride=(st, 1), padding=(pt, 0))
            return out.reshape(*out.shape[:3], h, w)
        return temporal
    return None


def profile_part(model: nn.Module, clips: torch.Tensor, iterations: int, report: dict, profiled: bool = True) -> None:
    device = clips.device

    def step() -> None:
        with autocast(device):
            out = model(clips)
        out.float().mean().backward()

    for _ in range(3):
        step()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(iterations):
        step()
    synchronize(device)
    seconds = (time.perf_counter() - start) / iterations
    report["clips_per_s"] = clips.shape[0] / seconds
    print(f"forward + backward: {clips.shape[0] / seconds:,.1f} clips/s ({seconds * 1e3:.1f} ms per batch "
          f"of {clips.shape[0]})", flush=True)
    if not profiled:
        return
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        for _ in range(2):
            step()
        synchronize(device)
    report.update(device_table(profiler, 2, device, LEAF_OPS))


def device_table(profiler, iterations: int, device: torch.device, ops: set[str] | None = None) -> dict:
    """The device time per iteration of a profile: its kernels (on the CPU, its operators' own time), the largest
    first, and the operators named in ``ops`` (all ``aten::`` operators when None) with their kernels' time."""
    from torch.autograd import DeviceType

    events = profiler.key_averages()
    if device.type == "cuda":
        kernels = [(e.self_device_time_total, e.count, e.key) for e in events
                   if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0]
        total_attr = "device_time_total"
    else:
        kernels = [(e.self_cpu_time_total, e.count, e.key) for e in events if e.self_cpu_time_total > 0]
        total_attr = "cpu_time_total"
    kernels.sort(reverse=True)
    total = sum(k[0] for k in kernels) or 1.0
    table = {"device_us_per_iteration": total / iterations,
             "top": [{"name": name[:160], "us_per_iteration": us / iterations, "share": us / total,
                      "count": count / iterations} for us, count, name in kernels[:40]]}
    by_op = {e.key: getattr(e, total_attr) / iterations for e in events
             if e.key.startswith("aten::") and (ops is None or e.key in ops) and getattr(e, total_attr) > 0}
    table["ops_us_per_iteration"] = dict(sorted(by_op.items(), key=lambda kv: -kv[1])[:40])
    print(f"device time per iteration {total / iterations / 1e3:.1f} ms; by operator (ms per iteration, "
          f"an operator's time holds its callees'):", flush=True)
    for key, us in table["ops_us_per_iteration"].items():
        print(f"  {key}: {us / 1e3:.2f} ({us * iterations / total:.1%})")
    print("top kernels:")
    for row in table["top"][:25]:
        print(f"  {row['us_per_iteration'] / 1e3:7.2f} ms {row['share']:6.1%} x{row['count']:<5g} {row['name'][:110]}")
    return table


LEAF_OPS = {"aten::cudnn_convolution", "aten::convolution_backward", "aten::mkldnn_convolution",
            "aten::cudnn_batch_norm", "aten::cudnn_batch_norm_backward", "aten::native_batch_norm",
            "aten::native_batch_norm_backward", "aten::_batch_norm_impl_index",
            "aten::max_pool3d_with_indices", "aten::max_pool3d_with_indices_backward", "aten::relu_",
            "aten::threshold_backward", "aten::cat", "aten::copy_", "aten::add_", "aten::mul", "aten::fill_",
            "aten::mean", "aten::to", "aten::slice_backward", "aten::narrow", "aten::zero_"}


def conv_shapes(model: nn.Module, clips: torch.Tensor) -> list[tuple[str, nn.Conv3d, torch.Size]]:
    seen = []
    hooks = [m.register_forward_hook(lambda m, args, out, name=name: seen.append((name, m, args[0].shape)))
             for name, m in model.named_modules() if isinstance(m, nn.Conv3d)]
    with torch.no_grad(), autocast(clips.device):
        model(clips)
    for hook in hooks:
        hook.remove()
    return seen


def time_forward_backward(fn, x: torch.Tensor, weight: torch.Tensor, grad: torch.Tensor, repeats: int) -> float:
    device = x.device
    for _ in range(2):
        with autocast(device):
            out = fn(x, weight)
        out.backward(grad)
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        with autocast(device):
            out = fn(x, weight)
        out.backward(grad)
    synchronize(device)
    return (time.perf_counter() - start) / repeats


def convs_part(model: nn.Module, clips: torch.Tensor, repeats: int, report: dict) -> None:
    device = clips.device
    rows, totals = [], {"conv3d": 0.0, "folded": 0.0}
    for name, conv, shape in conv_shapes(model, clips):
        folded = fold(conv)
        if folded is None:
            rows.append({"name": name, "folded": None})
            continue
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        x = torch.randn(shape, device=device, dtype=dtype).contiguous(memory_format=CL3).requires_grad_()
        weight = conv.weight.detach().clone().requires_grad_()

        def plain(x, weight, conv=conv):
            return F.conv3d(x, weight, stride=conv.stride, padding=conv.padding)

        with torch.no_grad(), autocast(device):
            a, b = plain(x, weight).float(), folded(x, weight).float()
        if a.shape != b.shape:
            raise AssertionError(f"{name}: folded shape {tuple(b.shape)} != {tuple(a.shape)}")
        error = ((a - b).abs().max() / a.abs().max().clamp_min(1e-12)).item()
        if error > 2e-2:
            raise AssertionError(f"{name}: the folded convolution differs by {error:.3g} of the largest output")
        grad = torch.randn_like(a).to(dtype).contiguous(memory_format=CL3)
        seconds = {"conv3d": 0.0, "folded": 0.0}
        for form in ("conv3d", "folded", "folded", "conv3d"):
            seconds[form] += time_forward_backward(plain if form == "conv3d" else folded, x, weight, grad, repeats) / 2
        for form in seconds:
            totals[form] += seconds[form]
        rows.append({"name": name, "kernel": list(conv.kernel_size), "stride": list(conv.stride),
                     "input": list(shape), "out_channels": conv.out_channels, "max_rel_diff": error,
                     "conv3d_ms": seconds["conv3d"] * 1e3, "folded_ms": seconds["folded"] * 1e3})
        print(f"  {name:28s} k{tuple(conv.kernel_size)} in {tuple(shape)}: conv3d {seconds['conv3d'] * 1e3:7.3f} ms, "
              f"folded {seconds['folded'] * 1e3:7.3f} ms ({seconds['conv3d'] / seconds['folded']:.2f}x)", flush=True)
        del x, weight, grad, a, b
    report["convs"] = rows
    report["totals_ms"] = {form: s * 1e3 for form, s in totals.items()}
    report["ratio"] = totals["conv3d"] / totals["folded"] if totals["folded"] else None
    print(f"all convolutions, forward and both gradients: conv3d {totals['conv3d'] * 1e3:.1f} ms, folded "
          f"{totals['folded'] * 1e3:.1f} ms ({report['ratio']:.2f}x)", flush=True)


@contextlib.contextmanager
def pools(kind: str):
    """S3D's pools as PyTorch's (``torch``) or the Triton kernels (``triton``, where they apply)."""
    from coclr.models import s3d

    if kind == "triton":
        yield
        return
    saved = s3d._triton_pool
    s3d._triton_pool = lambda: None
    try:
        yield
    finally:
        s3d._triton_pool = saved


def exact_gradient(x: torch.Tensor, geometry: tuple, grad: torch.Tensor) -> torch.Tensor:
    """The max-pool's input gradient summed in float64 at PyTorch's argmax (the first maximum in (t, h, w) order): what
    either form should give up to the rounding of each input's sum. PyTorch's CUDA backward adds in the gradient's
    dtype (atomic adds), so in bfloat16 an input that is the maximum of many windows is off by several roundings."""
    _, index = F.max_pool3d(x.float(), *geometry, return_indices=True)
    n, c = x.shape[:2]
    flat = torch.zeros(n, c, x[0, 0].numel(), dtype=torch.float64, device=x.device)
    flat.scatter_add_(2, index.reshape(n, c, -1), grad.double().reshape(n, c, -1))
    return flat.reshape(x.shape)


def pools_part(model: nn.Module, clips: torch.Tensor, repeats: int, report: dict) -> None:
    from coclr.models.pool_triton import max_pool3d
    from coclr.models.s3d import MaxPool3d

    seen = []
    hooks = [m.register_forward_hook(lambda m, args, out, name=name: seen.append((name, m, args[0].shape)))
             for name, m in model.named_modules() if isinstance(m, MaxPool3d)]
    with torch.no_grad(), autocast(clips.device):
        model(clips)
    for hook in hooks:
        hook.remove()
    rows, totals = [], {"torch": 0.0, "triton": 0.0}
    dtype = torch.bfloat16 if clips.device.type == "cuda" else torch.float32
    for name, pool, shape in seen:
        window, stride, padding = pool.geometry
        x = torch.relu(torch.randn(shape, device=clips.device, dtype=dtype)).contiguous(memory_format=CL3)
        x.requires_grad_()
        geometry = (window, stride, padding)
        forms = {"torch": lambda x, w, geometry=geometry: F.max_pool3d(x, *geometry),
                 "triton": lambda x, w, geometry=geometry: max_pool3d(x, *geometry)}
        a, b = forms["torch"](x, None), forms["triton"](x, None)
        if not torch.equal(a, b):
            raise AssertionError(f"{name}: the Triton pool's values differ from max_pool3d's")
        grad = torch.randn_like(a)
        ga, = torch.autograd.grad(a, x, grad)
        gb, = torch.autograd.grad(b, x, grad)
        exact = exact_gradient(x.detach(), geometry, grad)
        scale = grad.float().abs().max().item()
        error = {form: (g.double() - exact).abs().max().item() / scale for form, g in (("torch", ga), ("triton", gb))}
        if error["triton"] > 2 ** -7 * exact.abs().max().item() / scale:  # more than bfloat16's rounding of the sum
            raise AssertionError(f"{name}: the Triton pool's gradient is off the exact sum by {error['triton']:.3g}")
        seconds = {"torch": 0.0, "triton": 0.0}
        for form in ("torch", "triton", "triton", "torch"):
            seconds[form] += time_forward_backward(forms[form], x, None, grad, repeats) / 2
        for form in seconds:
            totals[form] += seconds[form]
        rows.append({"name": name, "window": list(window), "stride": list(stride), "input": list(shape),
                     "grad_error_torch": error["torch"], "grad_error_triton": error["triton"],
                     "torch_ms": seconds["torch"] * 1e3, "triton_ms": seconds["triton"] * 1e3})
        print(f"  {name:24s} k{window} s{stride} in {tuple(shape)}: max_pool3d {seconds['torch'] * 1e3:7.3f} ms, "
              f"triton {seconds['triton'] * 1e3:7.3f} ms ({seconds['torch'] / seconds['triton']:.2f}x); gradient off "
              f"the exact sum by {error['torch']:.2g} / {error['triton']:.2g} of the largest", flush=True)
        del x, a, b, ga, gb, grad, exact
    report["pools"] = rows
    report["totals_ms"] = {form: v * 1e3 for form, v in totals.items()}
    report["ratio"] = totals["torch"] / totals["triton"]
    print(f"all pools, forward and backward: max_pool3d {totals['torch'] * 1e3:.1f} ms, triton "
          f"{totals['triton'] * 1e3:.1f} ms ({report['ratio']:.2f}x)", flush=True)


def model_part(model: nn.Module, clips: torch.Tensor, iterations: int, report: dict) -> None:
    rates = {"torch": 0.0, "triton": 0.0}
    for kind in ("torch", "triton", "triton", "torch"):
        with pools(kind):
            part = {}
            profile_part(model, clips, iterations, part, profiled=False)
            rates[kind] += part["clips_per_s"] / 2
    report["clips_per_s"] = rates
    report["ratio"] = rates["triton"] / rates["torch"]
    print(f"forward + backward with the Triton pools: {report['ratio']:.2f}x ({rates['torch']:,.1f} -> "
          f"{rates['triton']:,.1f} clips/s)", flush=True)
    report["profile"] = {}
    profile_part(model, clips, iterations, report["profile"])


def step_suite(tmp: Path, batch: int, tiny: bool) -> gpu_suite.Suite:
    """A gpu_suite ``Suite`` for the trainer's step at ``batch`` (full S3D on CUDA, the tiny network elsewhere), with
    its step store of ``2 * batch`` videos in ``tmp``."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sizes = gpu_suite.TINY if tiny or device.type != "cuda" else gpu_suite.FULL
    sizes = dataclasses.replace(sizes, batches=(batch,), train_videos=2 * batch, test_videos=0)
    suite = gpu_suite.Suite(device, tmp, sizes, sizes)
    suite.stores["step"] = gpu_suite.pool_store(tmp / "step_store", sizes)
    return suite


def step_part(batch: int, tiny: bool, report: dict) -> None:
    """The trainer's step through benchmarks/gpu_suite.py's step part, with PyTorch's and the Triton pools."""
    with tempfile.TemporaryDirectory() as tmp:
        suite = step_suite(Path(tmp), batch, tiny)
        amp, cl = ("bf16", True) if suite.cuda else ("none", False)
        cases = [gpu_suite.StepCase("infonce", batch, amp, cl), gpu_suite.StepCase("coclr", batch, amp, cl)]
        rates: dict[str, dict[str, float]] = {}
        saved, gpu_suite.step_cases = gpu_suite.step_cases, lambda suite: cases
        try:
            for kind in ("torch", "triton", "triton", "torch"):
                suite.rows.clear()
                suite.parts["step"] = {"status": "pending"}
                with pools(kind):
                    gpu_suite.part_step(suite, gpu_suite.Budget(600))
                for row in suite.rows:
                    if row.unit == "samples/s":
                        rates.setdefault(row.case, {"torch": 0.0, "triton": 0.0})[kind] += row.value / 2
        finally:
            gpu_suite.step_cases = saved
    report["samples_per_s"] = rates
    for case, rate in rates.items():
        print(f"{case}: {rate['torch']:,.1f} -> {rate['triton']:,.1f} samples/s with the Triton pools "
              f"({rate['triton'] / rate['torch']:.2f}x)", flush=True)


def step_profile_part(batch: int, tiny: bool, report: dict) -> None:
    """The device time of the trainer's whole step (InfoNCE and CoCLR, bf16 + channels_last on CUDA, the Triton
    pools): the network's operators beside augmentation, loss, optimiser and momentum update, and the share of the
    step's wall time the device was busy."""
    from torch.profiler import ProfilerActivity, profile

    from coclr.train.run import start_run
    from coclr.train.setup import torch_settings

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with tempfile.TemporaryDirectory() as tmp, torch_settings(False, device):
        suite = step_suite(Path(tmp), batch, tiny)
        amp, cl = ("bf16", "true") if suite.cuda else ("none", "false")
        for method in ("infonce", "coclr"):
            config = gpu_suite.training_config(suite, suite.stores["step"], Path(tmp) / f"run_{method}",
                                               *gpu_suite.method_overrides(suite, method), f"run.batch_size={batch}",
                                               f"run.amp={amp}", f"run.channels_last={cl}", "data.decode=workers",
                                               "method.wait_for_full_queue=false")
            with start_run(config) as trainer:
                trainer._set_train_mode()
                clips = gpu_suite.one_batch(suite, config.views, batch)
                for _ in range(3):
                    trainer.train_step(clips, queue_full=True)
                synchronize(device)
                steps = 3
                start = time.perf_counter()
                with profile(activities=activities) as profiler:
                    for _ in range(steps):
                        trainer.train_step(clips, queue_full=True)
                    synchronize(device)
                wall = (time.perf_counter() - start) / steps
                print(f"{method} step, batch {batch}: {wall * 1e3:.1f} ms a step under the profiler", flush=True)
                table = device_table(profiler, steps, device)
                table["wall_ms_per_step"] = wall * 1e3
                table["busy_share"] = table["device_us_per_iteration"] / 1e3 / table["wall_ms_per_step"]
                print(f"{method}: the device busy {table['busy_share']:.0%} of the step", flush=True)
                report[method] = table
            del trainer, clips
            gpu_suite.release_memory(device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("s3d_gpu_parts.json"))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--tiny", action="store_true", help="a narrow network on small clips (checks the script)")
    parser.add_argument("--parts", default="profile,convs,pools,model,step,stepprofile")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cudnn.benchmark = True
    width, size = (0.125, (8, 32, 32)) if args.tiny else (1.0, (32, 128, 128))
    batch = 2 if args.tiny else args.batch
    model = S3D(width=width).to(device).to(memory_format=CL3).train()
    clips = torch.randn(batch, 3, *size, device=device).contiguous(memory_format=CL3)
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "batch": batch, "width": width, "clip": list(size)}
    print(f"S3D width {width} at {size}, batch {batch}, on {report['device']}, torch {torch.__version__}", flush=True)
    for part in args.parts.split(","):
        print(f"== {part} ==", flush=True)
        report[part] = {}
        try:
            if part == "profile":
                profile_part(model, clips, 2 if args.tiny else 10, report[part])
            elif part == "convs":
                convs_part(model, clips, 2 if args.tiny else 10, report[part])
            elif part == "pools":
                pools_part(model, clips, 2 if args.tiny else 10, report[part])
            elif part == "model":
                model_part(model, clips, 2 if args.tiny else 10, report[part])
            elif part == "step":
                step_part(batch, args.tiny, report[part])
            elif part == "stepprofile":
                step_profile_part(batch, args.tiny, report[part])
            else:
                raise ValueError(f"unknown part {part!r}")
        except Exception as error:  # the other part's figures are still written
            import traceback

            traceback.print_exc()
            report[part]["error"] = f"{type(error).__name__}: {error}"
        atomic_write_json(args.out, report)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
