"""Plain C compiled on first use and kept in a cache: what every C kernel of coclr is built and run with.

The kernels (:data:`KERNELS`: TV-L1's loops, the inference max-pool, the search's int8 pass, the CPU augmentation's
crop and normalisation) are plain C files, package data beside their module, each a :class:`Kernel` loaded with
ctypes; no torch headers, so a build takes about a second. Nothing is compiled at import.

* **Compiler**: ``$CC``, sysconfig's ``CC``, ``cc``, ``gcc`` or ``clang`` (:func:`find_compiler`), with
  :data:`FLAGS`: vectorised for this CPU, or for the instruction set PyTorch's capability is limited to
  (:func:`coclr.cpu.c_march`), IEEE float32 throughout; CI compiles each source with :data:`WARNINGS` too.
* **Cache.** The shared object lives in ``$COCLR_CACHE_DIR`` (else ``$XDG_CACHE_HOME/coclr``, else
  ``~/.cache/coclr``) under a name hashing the sources, the compiler's version, the flags and the CPU
  (:func:`cache_key`). It is compiled in a temporary folder inside it and moved in with
  :func:`coclr.atomic.atomic_open`, so concurrent processes or a kill never leave a broken file. A cache that cannot
  be written falls back to one private folder of the user under the temporary folder (:func:`fallback_cache_dir`),
  reused by every process.
* **Threads.** No OpenMP in the C code: independent pieces of work go to a pool of :func:`thread_count` Python
  threads (:func:`for_each`; ctypes releases the GIL).
"""

from __future__ import annotations

import errno
import hashlib
import os
import platform
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Generic, TypeVar

from coclr.atomic import atomic_open
from coclr.cpu import c_march
from coclr.threads import usable_cores

FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fPIC", "-shared")
"""Compiler flags: vectorised for this CPU (``-march``: :func:`compile_flags`), but IEEE float32 throughout (no
fast-math, no FMA contraction; ``-fno-math-errno`` only lets ``sqrtf`` vectorise, its results are the same)."""
PORTABLE_FLAGS = tuple(f for f in FLAGS if f != "-march=native")
"""Tried when the compiler does not know ``-march=native``."""
WARNINGS = ("-Wall", "-Wextra", "-Werror")
"""Warnings CI compiles every source with (the kernels' tests): none is allowed."""


def cache_dir() -> Path:
    """Where compiled objects are kept: ``$COCLR_CACHE_DIR``, else ``$XDG_CACHE_HOME/coclr``, else
    ``~/.cache/coclr``."""
    if os.environ.get("COCLR_CACHE_DIR"):
        return Path(os.environ["COCLR_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "coclr"


def find_compiler() -> list[str] | None:
    """The C compiler's command: ``$CC``, sysconfig's ``CC``, then ``cc``, ``gcc``, ``clang``; None if none runs."""
    candidates = [os.environ.get("CC", ""), sysconfig.get_config_var("CC") or "", "cc", "gcc", "clang"]
    for candidate in candidates:
        words = shlex.split(candidate)
        if words and shutil.which(words[0]):
            return words
    return None


def cpu_flags() -> str:
    """The CPU's instruction-set flags (``/proc/cpuinfo``), part of the cache key since ``-march=native`` is used."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def cache_key(source: str, compiler: Sequence[str], version: str, flags: Sequence[str]) -> str:
    """Hash of everything the compiled object depends on: the source, compiler and version, flags and the CPU."""
    parts = [source, " ".join(compiler), version, " ".join(flags), platform.machine(), cpu_flags()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


class CompileError(RuntimeError):
    """C kernels could not be built here (no compiler, or the compiler failed); the message says which."""


def compile_flags() -> tuple[str, ...]:
    """:data:`FLAGS` with the instruction set of :func:`coclr.cpu.c_march` (this CPU's, or the one PyTorch's
    capability is limited to) in place of ``-march=native``."""
    march = c_march()
    return tuple(flag for flag in (march if flag == "-march=native" else flag for flag in FLAGS) if flag)


def compile_sources(compiler: list[str], flags: Sequence[str], folder: Path, sources: Mapping[str, str],
                    stem: str) -> Path:
    """Compile ``sources`` (file name -> text, written into ``folder``; the first is the one compiled, the others
    are what it includes) into the shared object ``folder/<stem>.so``; raise :class:`CompileError` with the
    compiler's first error line."""
    for name, text in sources.items():
        (folder / name).write_text(text)
    out = folder / f"{stem}.so"
    result = subprocess.run([*compiler, *flags, "-o", str(out), str(folder / next(iter(sources))), "-lm"],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if "error" in line] or result.stderr.splitlines()
        raise CompileError(f"{' '.join(compiler)} failed: {lines[0] if lines else f'exit {result.returncode}'}")
    return out


def fallback_cache_dir() -> Path:
    """Where compiled objects are kept when :func:`cache_dir` cannot be written: one folder of this user under the
    temporary folder (``coclr-cache-<uid>``), reused by every process; made private, and refused unless it is a
    folder (not a link) that this user owns and nobody else may write, since code is loaded from it."""
    return Path(tempfile.gettempdir()) / f"coclr-cache-{os.getuid() if hasattr(os, 'getuid') else 'user'}"


def private_folder(path: Path) -> Path:
    """``path`` made (mode 0700) or found as a folder safe to load code from; raises ``OSError`` naming it."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:  # made by an earlier run, or by a process starting at the same time
        pass
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or (hasattr(os, "getuid") and info.st_uid != os.getuid()) \
            or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise OSError(errno.EPERM, "not a folder of this user that only it may write, so no code is loaded from "
                      "it: remove it, or set COCLR_CACHE_DIR to a folder you may write", str(path))
    return path


def build_library(stem: str, sources: Mapping[str, str], folder: Path | None = None) -> Path:
    """The path of ``sources`` compiled (:func:`compile_sources`) for this compiler and CPU: from the cache
    (``folder``, default :func:`cache_dir`), else compiled now and moved in atomically as ``<stem>-<key>.so``; when
    the cache cannot be written, from or into :func:`fallback_cache_dir` (one folder for every process, no temporary
    folder left behind). Raises :class:`CompileError` when there is no compiler, it fails, or neither folder can be
    written."""
    compiler = find_compiler()
    if compiler is None:
        raise CompileError("no C compiler found (set CC, or install gcc or clang)")
    try:
        version = subprocess.run([*compiler, "--version"], capture_output=True, text=True, check=False).stdout
    except OSError as error:
        raise CompileError(f"{' '.join(compiler)} does not run ({error})") from error
    source = "\0".join(f"{name}\0{text}" for name, text in sources.items())
    names = {flags: f"{stem}-{cache_key(source, compiler, version, flags)}.so"
             for flags in (compile_flags(), PORTABLE_FLAGS)}
    unwritable: list[str] = []
    for target in [folder] if folder is not None else [cache_dir(), None]:  # None: the fallback
        try:
            target = Path(target) if target is not None else private_folder(fallback_cache_dir())
            cached = [target / name for name in names.values() if (target / name).is_file()]
            if cached:
                return cached[0]
            target.mkdir(parents=True, exist_ok=True)
            build = tempfile.TemporaryDirectory(dir=target, prefix=".build-")  # beside the object: no stray folder
        except OSError as error:
            unwritable.append(f"{error.filename or target}: {error.strerror or error}")
            continue
        with build as tmp:
            errors = []
            for flags, name in names.items():
                try:
                    built = compile_sources(compiler, flags, Path(tmp), sources, stem)
                except CompileError as error:
                    errors.append(str(error))
                    continue
                with atomic_open(target / name, "wb", fsync=False) as file:
                    file.write(built.read_bytes())
                return target / name
            raise CompileError(errors[0])
    raise CompileError(f"no folder to keep the compiled C loops in: {'; '.join(unwritable)} (set COCLR_CACHE_DIR "
                       "to a folder you may write)")


Loaded = TypeVar("Loaded")

KERNELS = ("coclr.data.augment_cpu", "coclr.embed.search_cpu", "coclr.flow.tvl1_cpu", "coclr.models.pool_cpu")
"""The modules that hold a C kernel, each as its ``KERNEL`` (a :class:`Kernel`): the one list the tests (every
source listed, package data, compiled without a warning) and pyproject's package-data check read."""


class Kernel(Generic[Loaded]):
    """One C kernel of coclr: its source (package data beside its module, plus any files ``generated`` from Python,
    which it includes), built on first use (:func:`build_library`) and loaded once per process by ``opener`` (which
    declares the functions' ctypes signatures). :meth:`load` is None when it cannot be built, with one
    ``RuntimeWarning``, ``"<unavailable>: <what failed>"``."""

    def __init__(self, stem: str, source: Path, opener: Callable[[Path], Loaded], unavailable: str,
                 generated: Callable[[], Mapping[str, str]] | None = None) -> None:
        self.stem, self.source, self.opener, self.unavailable = stem, source, opener, unavailable
        self.generated = generated
        self._lock = threading.Lock()
        self._state: list[Loaded | CompileError] = []
        """the loaded library, or the error that kept it from loading (warned of once); empty until asked for"""

    def sources(self) -> dict[str, str]:
        """The files compiled, by name: the source first, then the generated files it includes."""
        return {self.source.name: self.source.read_text(), **(self.generated() if self.generated else {})}

    def build(self, folder: Path | None = None) -> Path:
        """The compiled library's path (:func:`build_library`; ``folder``: the cache)."""
        return build_library(self.stem, self.sources(), folder)

    def compile(self, compiler: list[str], flags: Sequence[str], folder: Path) -> Path:
        """The sources compiled into ``folder`` with ``flags``, uncached (:func:`compile_sources`: the tests)."""
        return compile_sources(compiler, flags, folder, self.sources(), self.stem)

    def load(self, warn: bool = True) -> Loaded | None:
        """The loaded library (built on first use), once per process; None when it cannot be, with one warning the
        first time a caller asks with ``warn`` (a caller that raises instead passes ``warn=False``)."""
        with self._lock:
            if not self._state:
                try:
                    self._state.append(self.opener(self.build()))
                except (CompileError, OSError) as error:
                    self._state.append(error if isinstance(error, CompileError) else CompileError(str(error)))
            loaded = self._state[0]
            if not isinstance(loaded, CompileError):
                return loaded
            if warn and not getattr(loaded, "warned", False):
                loaded.warned = True
                warnings.warn(f"{self.unavailable}: {loaded}", RuntimeWarning, stacklevel=2)
            return None

    def failure(self) -> CompileError | None:
        """What kept the library from loading, once :meth:`load` failed; else None."""
        with self._lock:
            return self._state[0] if self._state and isinstance(self._state[0], CompileError) else None

    def usable(self) -> bool:
        """Whether the kernel is to be used here, decided without compiling it: whether it loaded (or failed to)
        once asked for in this process, else whether a C compiler is found."""
        with self._lock:
            if self._state:
                return not isinstance(self._state[0], CompileError)
        return find_compiler() is not None

    def forget(self) -> None:
        """Forget what was loaded, so the next :meth:`load` builds and loads again (tests)."""
        with self._lock:
            self._state.clear()


_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}
"""Thread pools by (process id, size): a forked child starts its own (its parent's threads are not in it)."""
_POOLS_LOCK = threading.Lock()


def thread_count() -> int:
    """The threads C kernels use: PyTorch's (``torch.get_num_threads()``) where torch is loaded, else
    ``OMP_NUM_THREADS`` where set, else the CPUs this process may run on (torch is not imported for it)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.get_num_threads()
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "").split(",")[0]))
    except ValueError:
        return usable_cores()


def for_each(count: int, fn: Callable[[int], object]) -> list:
    """``[fn(i) for i in range(count)]``, on :func:`thread_count` threads when that and ``count`` exceed 1 (the C
    calls release the GIL); each item is one task, so uneven items balance."""
    threads = min(thread_count(), count)
    if threads <= 1:
        return [fn(i) for i in range(count)]
    key = (os.getpid(), threads)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = ThreadPoolExecutor(threads, thread_name_prefix="coclr-c")
    return list(pool.map(fn, range(count)))
