"""Every C source of coclr: a kernel of coclr.native's list, package data (a wheel holds it), and compiled without a
warning by every C compiler found, for this CPU, for AVX2 and for plain x86-64 (the builds the cache can make)."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
import zipfile

import pytest

from coclr import native
from coclr.data import augment_cpu
from coclr.embed import search_cpu
from coclr.flow import tvl1_cpu
from coclr.models import pool_cpu
from conftest import REPO_ROOT

KERNELS = {module.__name__: module.KERNEL for module in (augment_cpu, search_cpu, tvl1_cpu, pool_cpu)}
"""Each module's C kernel, by module name."""


def test_every_c_source_is_a_listed_kernel():
    assert set(KERNELS) == set(native.KERNELS)  # coclr.native's list: the one the loaders and docs name
    assert all(isinstance(kernel, native.Kernel) for kernel in KERNELS.values())
    assert {kernel.source for kernel in KERNELS.values()} == set((REPO_ROOT / "src" / "coclr").rglob("*.c"))
    assert len({kernel.stem for kernel in KERNELS.values()}) == len(KERNELS)  # one cache name each


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_the_c_source_is_package_data(name):
    """pyproject's package-data names the source, so a wheel holds it (an editable install reads it from src/)."""
    tomllib = pytest.importorskip("tomllib")
    package_data = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    source = KERNELS[name].source
    assert source.is_file()
    assert any(source.match(pattern) for pattern in package_data[name.rsplit(".", 1)[0]])


@pytest.mark.skipif(native.find_compiler() is None, reason="no C compiler found (set CC or install gcc)")
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_the_c_source_compiles_without_warnings(name, tmp_path):
    """CI's check of the C: every compiler found (gcc, clang) with the cache's flags and ``-Wall -Wextra -Werror``,
    for each instruction set the cache builds for on this machine."""
    compilers = {tuple(native.find_compiler())} | {(c,) for c in ("gcc", "clang") if shutil.which(c)}
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    for compiler in sorted(compilers):
        for march in ("-march=native", *(("-march=x86-64-v3", "-march=x86-64") if x86 else ())):
            folder = tmp_path / f"{compiler[0]}{march}"
            folder.mkdir()
            flags = [flag for flag in (*native.FLAGS, *native.WARNINGS) if flag != "-march=native"] + [march]
            KERNELS[name].compile(list(compiler), flags, folder)


@pytest.mark.slow
def test_a_wheel_holds_the_c_sources(tmp_path):
    """A wheel built from a copy of the project holds every C source beside its module."""
    pytest.importorskip("setuptools")
    pytest.importorskip("wheel")
    project = tmp_path / "project"
    shutil.copytree(REPO_ROOT / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO_ROOT / name, project / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w",
                    str(tmp_path / "wheel"), str(project)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "wheel").glob("coclr-*.whl")
    expected = {str(kernel.source.relative_to(REPO_ROOT / "src")) for kernel in KERNELS.values()}
    assert expected <= set(zipfile.ZipFile(wheel).namelist())
