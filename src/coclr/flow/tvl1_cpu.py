"""Fused CPU loops of the PyTorch TV-L1 (:mod:`coclr.flow.tvl1`): the inner iterations and the median in plain C.

On the CPU the PyTorch scheme is bound by memory passes (about 15 whole-image operations per inner iteration and
~160 min/max passes per median). Here one C call runs a whole warp of one pair (every outer iteration: the median
filter of u and v, then the inner iterations with the mode's stop test) in one sweep over the rows per iteration:
row ``y``'s primal update (thresholding, divergence, the squared change) is followed by row ``y - 1``'s forward
gradient and dual projection, so each array is read and written about once per iteration, from the caches.

* **Plain C, compiled on first use** (:mod:`coclr.native`: the compiler, flags, cache and its fallback):
  ``tvl1_cpu.c`` beside this module (package data), with the medians' ``tvl1_median.h`` generated beside it in the
  build folder, loaded with ctypes on float32 contiguous buffers. Nothing is compiled at import, nor to decide
  whether the loops are used (``KERNEL.usable()``). Under ``ATEN_CPU_CAPABILITY=avx2`` the loops are
  compiled for AVX2 (:func:`coclr.cpu.c_march`).
* **Fallback.** No compiler, or a failed compile: one warning naming what failed, and ``kernels="auto"`` runs the
  PyTorch operations (``kernels="c"`` raises instead).
* **Determinism.** No ``-ffast-math`` and ``-ffp-contract=off`` (no FMA contraction), so every operation is the
  IEEE float32 operation PyTorch's scheme does, in the same order; the per-iteration squared change that drives the
  exact stop test is summed in float64, in 8 fixed lanes per row and the rows in order. A pair's flow depends on
  nothing but the pair: not the CPU, the thread count or the chunk size.
* **Threads.** No OpenMP in the C code (a second runtime beside torch's, and per-iteration barriers, are what
  made 2 threads slower than 1 under load): pairs are independent, one C call per pair and warp on
  :func:`coclr.native.for_each`'s threads.
* **The median** is the comparator network of :func:`coclr.flow.median.median_plan`, generated into straight-line
  C (as ``_median_triton`` does for Triton): sort each padded column, select per rank row, take the median of the
  candidates; the x loops are plain element-wise code the compiler vectorises.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from coclr import native
from coclr.flow.median import Comparator, comparator_statements, median_plan
from coclr.interrupts import check_stop

MEDIAN_SIZES = (3, 5)
"""The median sizes compiled (OpenCV's float ``medianBlur`` sizes; :class:`~coclr.flow.params.TVL1Params`)."""
CompileError = native.CompileError
"""The loops cannot be built here (:class:`coclr.native.CompileError`)."""
SOURCE = Path(__file__).with_name("tvl1_cpu.c")
"""The C loops (package data, installed beside this module); they include :data:`MEDIAN_HEADER`."""
MEDIAN_HEADER = "tvl1_median.h"
"""The medians' C, generated from the comparator networks when compiling (:func:`median_header`), beside the
source in the build folder."""


def _comparator_lines(network: Sequence[Comparator], names: Sequence[str]) -> list[str]:
    """One C statement per comparator of ``network`` on the variables ``names``."""
    return comparator_statements(network, names, "t = MINF({a}, {b}); {b} = MAXF({a}, {b}); {a} = t;",
                                 "{a} = MINF({a}, {b});", "{b} = MAXF({a}, {b});")


def _loop(signature: str, body: list[str]) -> str:
    inner = "\n".join("        " + line for line in body)
    return f"static void {signature}\n{{\n    float t;\n    for (int x = 0; x < n; x++) {{\n{inner}\n    }}\n}}\n"


def median_source(ksize: int) -> str:
    """C of the ``ksize x ksize`` median from :func:`~coclr.flow.median.median_plan`: ``median{k}_columns`` sorts
    the columns of ``k`` padded rows into ``k`` rank rows; ``median{k}_select`` runs each rank row's selection and
    the final selection over ``n`` outputs."""
    column_sort, rows, final = median_plan(ksize)
    ins = ", ".join(f"const float *restrict s{i}" for i in range(ksize))
    outs = ", ".join(f"float *restrict o{i}" for i in range(ksize))
    body = [f"float v{i} = s{i}[x];" for i in range(ksize)]
    body += _comparator_lines(column_sort, [f"v{i}" for i in range(ksize)])
    body += [f"o{i}[x] = v{i};" for i in range(ksize)]
    columns = _loop(f"median{ksize}_columns({ins}, {outs}, const int n)", body)
    ranks = ", ".join(f"const float *restrict c{i}" for i in range(ksize))
    body = [f"float v{i}{j} = c{i}[x + {j}];" for i in range(ksize) for j in range(ksize)]
    candidates: list[str] = []
    for rank, (cols, network) in enumerate(rows):
        names = [f"v{rank}{j}" for j in range(ksize)]
        body += _comparator_lines(network, names)
        candidates += [names[j] for j in cols]
    body += _comparator_lines(final, candidates)
    body.append(f"out[x] = {candidates[len(candidates) // 2]};")
    select = _loop(f"median{ksize}_select({ranks}, float *restrict out, const int n)", body)
    return columns + "\n" + select


def _dispatch_source() -> str:
    """``median_dispatch``: per output row, the generated column sort and selection of the median size."""
    cases = []
    for k in MEDIAN_SIZES:
        pads = ", ".join(f"pad + (ptrdiff_t)(y + {i}) * pw" for i in range(k))
        rank_rows = ", ".join(f"ranks + {i} * pw" for i in range(k))
        cases.append(f"    case {k}:\n        for (int y = 0; y < h; y++) {{\n"
                     f"            median{k}_columns({pads}, {rank_rows}, pw);\n"
                     f"            median{k}_select({rank_rows}, dst + (ptrdiff_t)y * w, w);\n"
                     f"        }}\n        break;")
    body = "\n".join(cases)
    return ("static void median_dispatch(float *dst, int h, int w, int k, const float *pad, float *ranks)\n{\n"
            "    const ptrdiff_t pw = w + 2 * (k / 2);\n"
            f"    switch (k) {{\n{body}\n    }}\n}}\n")


def median_header() -> str:
    """:data:`MEDIAN_HEADER`: the medians of every size of :data:`MEDIAN_SIZES` and their dispatch."""
    generated = "\n".join(median_source(k) for k in MEDIAN_SIZES)
    return ("/* Generated by coclr.flow.tvl1_cpu.median_header from the networks of coclr.flow.median. */\n"
            + generated + "\n" + _dispatch_source())


def generated_sources() -> dict[str, str]:
    """The files generated for the C source to include, by name: :data:`MEDIAN_HEADER`."""
    return {MEDIAN_HEADER: median_header()}


# ----------------------------------------------------------------------------------------------------------------
# loading (coclr.native)


_FLOAT_P = ctypes.c_void_p


class Library:
    """The loaded C functions with their ctypes signatures."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        ints = [ctypes.c_int] * 3
        floats = [ctypes.c_float] * 4
        self.warp = lib.tvl1_warp
        self.warp.argtypes = [_FLOAT_P] * 6 + ints + [ctypes.c_int] * 5 + floats
        self.warp.restype = ctypes.c_longlong
        self.pass_ = lib.tvl1_pass
        self.pass_.argtypes = [_FLOAT_P] * 6 + ints + [ctypes.c_int] * 2 + floats + [ctypes.POINTER(ctypes.c_int)]
        self.pass_.restype = ctypes.c_int
        self.median = lib.tvl1_median
        self.median.argtypes = [_FLOAT_P] * 2 + [ctypes.c_int] * 4
        self.median.restype = ctypes.c_int


KERNEL = native.Kernel("tvl1_cpu", SOURCE, Library, "TV-L1 C kernels unavailable, CPU flow runs without them "
                       "(slower)", generated_sources)
"""The C loops (:class:`coclr.native.Kernel`): built and loaded on first use; ``KERNEL.usable()`` says, without
compiling them, whether they are to be used here (a compiler that then fails leaves ``kernels="auto"`` on PyTorch
operations, with a warning)."""


# ----------------------------------------------------------------------------------------------------------------
# the Passes implementation


def _pointer(tensor: Tensor, pair: int) -> int:
    return tensor.data_ptr() + pair * tensor.stride(0) * tensor.element_size()


def _checked(*tensors: Tensor) -> list[Tensor]:
    """Contiguous float32 CPU copies or views of ``tensors`` (the C loops index dense buffers)."""
    return [t.to(torch.float32).contiguous() for t in tensors]


class CPasses:
    """Passes of inner iterations and the median with the C loops (CPU tensors); state: the loaded library and
    ``stop`` (a :class:`threading.Event`, or None): once it is set, each call ends before its next pair's C call with
    :class:`~coclr.interrupts.Interrupted` (a C call cannot be stopped; one pair's warp takes a fraction of a second).

    Besides the :class:`~coclr.flow.tvl1.Passes` protocol it runs whole warps (:meth:`run_warp`), one C call per
    pair, which :class:`~coclr.flow.tvl1.ScaleSolver` uses when present: no Python between iterations."""

    name = "c"
    fused = True
    """A pass stops a pair at the iteration its exact test fires, with no roll-back, so exact mode runs long passes."""

    def __init__(self, library: Library, stop: threading.Event | None = None) -> None:
        self.lib = library
        self.stop = stop

    def run_pass(self, flow: Tensor, px: Tensor, py: Tensor, image_grad: Tensor, rho_const: Tensor,
                 neg_inv_grad_sq: Tensor, active: Tensor, n: int, threshold: float, lambda_theta: float,
                 theta: float, tau_over_theta: float, exact: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``n`` iterations of the pairs with ``active [B]`` set, the others unchanged, with the mode's stop test;
        returns the new ``(flow, px, py, active)``."""
        flow, px, py = (t.clone() for t in _checked(flow, px, py))
        grad, rho, ninv = _checked(image_grad, rho_const, neg_inv_grad_sq)
        batch, channels, height, width = flow.shape
        flags = active.tolist()

        def one(b: int) -> bool:
            check_stop(self.stop)
            if not flags[b]:
                return False
            stopped = ctypes.c_int(0)
            done = self.lib.pass_(*(_pointer(t, b) for t in (flow, px, py, grad, rho, ninv)), channels, height,
                                  width, n, int(exact), threshold, lambda_theta, theta, tau_over_theta,
                                  ctypes.byref(stopped))
            if done < 0:
                raise MemoryError("TV-L1 C kernels: out of memory")
            return not stopped.value

        still = native.for_each(batch, one)
        return flow, px, py, torch.tensor(still, dtype=torch.bool, device=active.device)

    def median(self, flow: Tensor, active: Tensor, ksize: int) -> Tensor:
        """``flow`` with the ``ksize x ksize`` median applied to u and v of the pairs still iterating."""
        (flow,) = _checked(flow)
        out = flow.clone()
        batch, _, height, width = flow.shape
        flags = active.tolist()

        def one(b: int) -> None:
            check_stop(self.stop)
            if flags[b] and self.lib.median(_pointer(flow, b), _pointer(out, b), 2, height, width, ksize) < 0:
                raise MemoryError("TV-L1 C kernels: out of memory")

        native.for_each(batch, one)
        return out

    def run_warp(self, flow: Tensor, px: Tensor, py: Tensor, image_grad: Tensor, rho_const: Tensor,
                 neg_inv_grad_sq: Tensor, threshold: float, steps: tuple[float, float, float], outer: int,
                 inner: int, ksize: int, exact: bool, stop_every: int) -> tuple[Tensor, Tensor, Tensor, int]:
        """A whole warp of every pair: ``outer`` rounds of the median (``ksize > 1``) and up to ``inner``
        iterations with the mode's stop test; returns the new ``(flow, px, py)`` and the pair-iterations run."""
        flow, px, py = (t.clone() for t in _checked(flow, px, py))
        grad, rho, ninv = _checked(image_grad, rho_const, neg_inv_grad_sq)
        batch, channels, height, width = flow.shape

        def one(b: int) -> int:
            check_stop(self.stop)
            done = self.lib.warp(*(_pointer(t, b) for t in (flow, px, py, grad, rho, ninv)), channels, height,
                                 width, outer, inner, ksize if ksize > 1 else 0, int(exact), stop_every, threshold,
                                 *steps)
            if done < 0:
                raise MemoryError("TV-L1 C kernels: out of memory")
            return done

        return flow, px, py, sum(native.for_each(batch, one))


def c_passes(required: bool = False, stop: threading.Event | None = None) -> CPasses | None:
    """:class:`CPasses` (stopped by ``stop``) if the C kernels build here; else None (``required``: raise
    :class:`CompileError`)."""
    library = KERNEL.load(warn=not required)
    if library is None and required:
        raise CompileError(f"the C loops cannot be built here: {KERNEL.failure()}")
    return None if library is None else CPasses(library, stop)
