"""benchmarks/kernels_sm90.py: the launches it compiles are the ones the code makes, a compiled kernel's resources
are read, and (slow) every default configuration compiles for sm_90 without spills. Skipped without Triton."""

from __future__ import annotations

import importlib.util

import pytest

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def test_without_triton_it_says_so_in_one_line_and_passes(monkeypatch, capsys):
    import kernels_sm90

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "triton" else
                        find_spec(name, *args))
    assert kernels_sm90.main([]) == 0
    assert capsys.readouterr().out == "kernels_sm90: skipped, triton is not installed (pip install triton)\n"


def test_an_expected_triton_version_that_is_not_the_one_imported_fails(monkeypatch, capsys):
    """``--expect-triton`` (how .ci/run checks the kernels under the side folder's Triton 3.6) fails on any other
    version, or without Triton, instead of checking the wrong Triton."""
    import kernels_sm90

    assert kernels_sm90._version_matches("3.6.0", "3.6") and kernels_sm90._version_matches("3.6.0", "3.6.0")
    assert not kernels_sm90._version_matches("3.60.0", "3.6") and not kernels_sm90._version_matches("3.9.0", "3.6")
    if importlib.util.find_spec("triton") is not None:
        assert kernels_sm90.main(["--expect-triton", "0.1"]) == 1
        assert "FAIL, Triton 0.1 expected" in capsys.readouterr().out
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "triton" else
                        find_spec(name, *args))
    assert kernels_sm90.main(["--expect-triton", "3.6"]) == 1
    assert "triton is not installed" in capsys.readouterr().out


@needs_triton
def test_the_recorded_launches_cover_every_kernel_channel_count_mode_and_median_size():
    import kernels_sm90
    from coclr.flow.tvl1_triton import TritonSettings

    launches = kernels_sm90.record_launches([TritonSettings()])
    by_kernel: dict[str, list] = {}
    for launch in launches:
        by_kernel.setdefault(launch.kernel, []).append(launch)
    passes = {(dict(launch.constants)["CH"], dict(launch.constants)["BW"], launch.default)
              for launch in by_kernel["_pass_kernel"]}
    # both channel counts: 64x32 blocks, and 64x64 for halos of 15 and more
    assert passes == {(2, 32, True), (2, 64, False), (3, 32, True), (3, 64, False)}
    stops = {(dict(launch.constants)["EXACT"], dict(launch.constants)["NMAX"]) for launch in by_kernel["_stop_kernel"]}
    assert stops == {(exact, nmax) for exact in (True, False) for nmax in (1, 2, 4, 8, 16, 32)}
    medians = {(dict(launch.constants)["CH"], dict(launch.constants)["KSIZE"])
               for launch in by_kernel["_median_kernel"]}
    assert medians == {(2, 3), (2, 5), (3, 3), (3, 5)}
    assert all(launch.default for launch in by_kernel["_median_kernel"])
    assert all(launch.default == (dict(launch.constants)["NMAX"] <= 8) for launch in by_kernel["_stop_kernel"])
    # S3D's four pools, forward and backward, each with blocks of 4, 32 and 64 channels: all default launches
    pools = [launch for launch in launches if launch.module == "coclr.models.pool_triton"]
    geometry = ("KT", "KH", "KW", "ST", "SH", "SW", "PT", "PH", "PW")
    assert {(launch.kernel, tuple(dict(launch.constants)[k] for k in geometry), dict(launch.constants)["BLOCK_C"])
            for launch in pools} == {(kernel, g, block) for kernel in ("_forward", "_backward") for block in (4, 32, 64)
                                     for g in ((1, 3, 3, 1, 2, 2, 0, 1, 1), (3, 3, 3, 2, 2, 2, 1, 1, 1),
                                               (2, 2, 2, 2, 2, 2, 0, 0, 0), (3, 3, 3, 1, 1, 1, 1, 1, 1))}
    assert all(launch.default for launch in pools)


@needs_triton
def test_a_kernel_compiles_for_sm90_and_its_resources_are_read():
    import kernels_sm90
    from coclr.flow import tvl1_triton
    from coclr.flow.tvl1_triton import TritonSettings

    launch = next(launch for launch in kernels_sm90.record_launches([TritonSettings()])
                  if launch.kernel == "_median_kernel" and dict(launch.constants)["KSIZE"] == 3)
    usage = kernels_sm90.compile_sm90(launch, tvl1_triton._median_kernel)
    assert 16 <= usage.registers <= 255 and usage.spill_bytes == 0 and usage.stack_bytes >= 0


@needs_triton
@pytest.mark.slow
def test_every_default_configuration_compiles_for_sm90_without_spills(capsys):
    import kernels_sm90

    assert kernels_sm90.main([]) == 0
    assert "all kernels compile for sm_90 without spills by default" in capsys.readouterr().out
