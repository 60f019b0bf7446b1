"""coclr search: exact chunked cosine search against brute force, rows and files as queries, windows with times,
FAISS when installed, the JSON and HTML outputs."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from coclr.cli import main as cli_main
from coclr.embed.embedder import Embedder
from coclr.embed.output import Embeddings
from coclr.embed.search import faiss_available, nearest, search
from test_embed import SMALL, moving_square, write_video
from test_eval_helpers import save_tiny_encoder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An embedding folder of six small videos (and the encoder and videos it was made from)."""
    root = tmp_path_factory.mktemp("search")
    encoder = save_tiny_encoder(root / "encoder.pth")
    videos = [write_video(root / "videos" / f"v{n}.mp4", moving_square(14 + 4 * n, seed=n)) for n in range(6)]
    status = cli_main(["embed", str(root / "videos"), "--checkpoint", str(encoder), "--out", str(root / "out"),
                       "--length", "8", "--size", "32", "--short-side", "32", "--workers", "0", "--quiet"])
    assert status == 0
    return root / "out", encoder, videos


def brute_force(gallery: np.ndarray, query: np.ndarray, center: bool = False) -> np.ndarray:
    gallery = np.asarray(gallery, np.float64)
    query = np.asarray(query, np.float64).reshape(1, -1)
    if center:
        mean = gallery.mean(axis=0)
        gallery, query = gallery - mean, query - mean
    gallery = gallery / np.linalg.norm(gallery, axis=1, keepdims=True)
    query = query / np.linalg.norm(query, axis=1, keepdims=True)
    return (query @ gallery.T)[0]


@pytest.mark.parametrize("center", [False, True])
def test_chunked_search_equals_brute_force(center):
    rng = np.random.default_rng(0)
    gallery = rng.normal(size=(1000, 24)).astype(np.float32)
    query = rng.normal(size=(1, 24)).astype(np.float32)
    scores, rows = nearest(gallery, query, 7, center=center, chunk=64)
    expected = brute_force(gallery, query, center)
    assert rows[0].tolist() == np.argsort(-expected, kind="stable")[:7].tolist()
    np.testing.assert_allclose(scores[0], np.sort(expected)[::-1][:7], atol=1e-5)
    if faiss_available():
        faiss_scores, faiss_rows = nearest(gallery, query, 7, backend="faiss", center=center, chunk=64)
        assert faiss_rows[0].tolist() == rows[0].tolist()
        np.testing.assert_allclose(faiss_scores, scores, atol=1e-5)


def test_queries_of_another_width_are_refused_not_reshaped(folder):
    """Eight 16-dimensional queries against a 128-dimensional gallery were merged into one query of 128."""
    from coclr.errors import DataError

    gallery = np.random.default_rng(0).normal(size=(50, 128)).astype(np.float32)
    assert nearest(gallery, gallery[3], 2)[1].tolist() == [[3, *nearest(gallery, gallery[3:4], 2)[1][0][1:]]]
    for queries in (gallery[:8, :16], gallery[:2, :64], gallery[0, :64], gallery[None, :2]):
        with pytest.raises(DataError, match=r"queries must be vectors of the gallery's 128 dimensions .* got shape"):
            nearest(gallery, queries, 3)
    embeddings = Embeddings(folder[0])
    with pytest.raises(DataError, match=r"search takes one query vector, got shape \(2, "):
        search(embeddings, embeddings.videos[:2], k=2)
    row = np.asarray(embeddings.videos[1])
    assert search(embeddings, row[None], k=2, exclude=1) == search(embeddings, row, k=2, exclude=1)  # (learn's form)
    # a NaN query was blamed on the folder ("the searched rows hold NaN"); k=2.5 was NumPy's "Partition index" error
    with pytest.raises(DataError, match="query 0 holds NaN or infinite values"):
        search(embeddings, np.full_like(row, np.nan), k=2)
    from coclr.errors import ConfigError

    for k in (2.5, True, "3"):
        with pytest.raises(ConfigError, match="-k: must be a whole number of at least 1"):
            search(embeddings, row, k=k)


@pytest.mark.skipif(not faiss_available(), reason="faiss-cpu is not installed (optional)")
def test_faiss_backend_on_a_folder(folder):
    out, _, _ = folder
    embeddings = Embeddings(out)
    exact = search(embeddings, embeddings.videos[2], 4, exclude=2)
    via_faiss = search(embeddings, embeddings.videos[2], 4, exclude=2, backend="faiss")
    assert [h.row for h in via_faiss] == [h.row for h in exact]


def test_search_by_row_leaves_the_query_out_and_ranks_by_cosine(folder, capsys):
    out, _, videos = folder
    embeddings = Embeddings(out)
    assert cli_main(["search", str(out), "--query", "3", "-k", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    rows = [hit["row"] for hit in result["hits"]]
    scores = brute_force(embeddings.videos, embeddings.videos[3])
    scores[3] = -np.inf
    assert rows == np.argsort(-scores, kind="stable")[:3].tolist()
    assert result["query"] == embeddings.video_records[3]["path"]
    assert all(hit["path"] == embeddings.video_records[hit["row"]]["path"] for hit in result["hits"])


def test_windows_search_gives_where_in_which_video(folder, capsys):
    out, _, _ = folder
    embeddings = Embeddings(out)
    window = 5
    assert cli_main(["search", str(out), "--query", str(window), "--windows", "-k", "4", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    hits, own = result["hits"], embeddings.window_records[window]
    assert (result["row"], result["start"], result["end"]) == (window, own["start"], own["end"])  # which stretch
    assert cli_main(["search", str(out), "--query", str(window), "--windows", "-k", "1"]) == 0
    printed = capsys.readouterr().out  # the query's stretch as precise as its hits' (it was rounded to 0.1 s)
    assert f"(window row {window}, {own['start']:.2f}-{own['end']:.2f} s)" in printed
    scores = brute_force(embeddings.windows, embeddings.windows[window])
    scores[window] = -np.inf
    assert [h["row"] for h in hits] == np.argsort(-scores, kind="stable")[:4].tolist()
    for hit in hits:
        record = embeddings.window_records[hit["row"]]
        assert (hit["start"], hit["end"], hit["video_row"]) == (record["start"], record["end"], record["video"])
        assert hit["path"] == embeddings.video_records[record["video"]]["path"]


def test_a_query_video_outside_the_folder_is_embedded_with_its_settings(folder, tmp_path, capsys):
    out, encoder, _ = folder
    query = write_video(tmp_path / "query.mp4", moving_square(26, seed=4))  # v4's content, 26 frames of 30
    assert cli_main(["search", str(out), "--query", str(query), "-k", "2", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    embeddings = Embeddings(out)
    vector = Embedder(encoder, workers=0, **SMALL).embed(query).vector
    scores = brute_force(embeddings.videos, vector)
    assert [h["row"] for h in hits] == np.argsort(-scores, kind="stable")[:2].tolist()
    np.testing.assert_allclose([h["score"] for h in hits], np.sort(scores)[::-1][:2], atol=1e-5)


def test_html_page_shows_the_query_and_its_neighbours(folder, tmp_path, capsys):
    out, _, videos = folder
    page = tmp_path / "hits.html"
    assert cli_main(["search", str(out), "--query", str(videos[1]), "--windows", "-k", "3", "--html",
                     str(page)]) == 0
    text = page.read_text()
    assert len(re.findall(r'<img src="data:image/gif;base64,', text)) == 4  # the query and three windows
    assert text.count(">#") == 3 and "v1.mp4" in text and " s (" in text


def test_a_search_beside_a_running_embed_says_so(folder, capsys):
    """It said to run the embed command again to merge its results, which the running embed's lock refused."""
    from coclr.runfolder import LOCK_FILE
    from conftest import locked_by_another_process

    out, _, _ = folder
    with locked_by_another_process(out / LOCK_FILE) as pid:
        assert cli_main(["search", str(out), "--query", "1", "-k", "1"]) == 0
    assert f"a coclr embed is writing {out} now (pid {pid} on" in capsys.readouterr().err


def test_bad_queries_are_one_line_errors(folder, capsys):
    out, _, _ = folder
    assert cli_main(["search", str(out), "--query", "99"]) == 2
    assert "row 99 is out of range (6 rows" in capsys.readouterr().err
    assert cli_main(["search", str(out), "--query", "nothing.mp4"]) == 2
    assert "--query: nothing.mp4: no such file, nor a row number; give a video file" in capsys.readouterr().err
    assert cli_main(["search", str(out), "--query", "-1"]) == 2
    assert "--query: -1: no such file, and rows are numbered from 0; give a video file" in capsys.readouterr().err
    assert cli_main(["search", str(out), "--query", "1", "--device", "foo"]) == 2  # (a row's query took any device)
    assert "device: 'foo' is not a torch device" in capsys.readouterr().err
    assert cli_main(["search", str(out), "--query", str(out)]) == 2
    assert f"--query: {out}: a folder, not a video file" in capsys.readouterr().err
    assert cli_main(["search", str(out.parent), "--query", "1"]) == 2
    assert "not a coclr embed output folder" in capsys.readouterr().err


def test_a_query_row_of_a_folder_without_rows_says_why(tmp_path, capsys):
    encoder = save_tiny_encoder(tmp_path / "encoder.pth")
    (tmp_path / "videos").mkdir()
    (tmp_path / "videos" / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(2000))
    out = tmp_path / "out"
    assert cli_main(["embed", str(tmp_path / "videos"), "--checkpoint", str(encoder), "--out", str(out),
                     "--workers", "0", "--quiet"]) == 3
    capsys.readouterr()
    assert cli_main(["search", str(out), "--query", "0"]) == 2
    err = capsys.readouterr().err
    assert "no video rows to search yet" in err and "failed.jsonl" in err and "out of range" not in err


# ------------------------------------------------------------------------------ exact scores, ties, prepared rows


def exact_reference(gallery, queries, k, center):
    """Slow and obviously exact: the quantised unit rows of coclr.eval.exact, dot products by math.fsum of the
    (exact) float64 products, ranked by score descending then row ascending."""
    import math

    from coclr.eval.exact import gallery_mean, unit_rows

    mean = gallery_mean(gallery) if center else None
    g, q = unit_rows(gallery, mean).astype(np.float64), unit_rows(queries, mean).astype(np.float64)
    rows, scores = [], []
    for query in q:
        sims = [math.fsum(query * row) for row in g]
        order = sorted(range(len(sims)), key=lambda j: (-sims[j], j))[:k]
        rows.append(order)
        scores.append([sims[j] for j in order])
    return np.array(scores), np.array(rows)


def _tied_rows(seed=0, count=3000, dim=16):
    rng = np.random.default_rng(seed)
    gallery = (rng.normal(size=(count, dim)) + 1.0).astype(np.float32)
    copies = rng.integers(0, 40, count // 2)
    gallery[rng.permutation(count)[: count // 2]] = gallery[copies]  # half the rows repeat one of 40
    near = rng.permutation(count)[:200]  # and some differ from one of them by a few float32 ulps: float32
    gallery[near] = gallery[copies[:200]] * (1 + rng.integers(-3, 4, (200, dim)) * 2.0 ** -23)  # cannot order them
    queries = np.concatenate([gallery[[3, 17, 25]], rng.normal(size=(4, dim)).astype(np.float32) + 1.0])
    return gallery, queries


_SEARCH_IN_A_PROCESS = """
import hashlib
import numpy as np
from test_search import _tied_rows
from coclr.embed.search import nearest
gallery, queries = _tied_rows()
scores, rows = nearest(gallery, queries, 25, center={center}, chunk={chunk})
print(hashlib.sha256(scores.tobytes() + rows.tobytes()).hexdigest())
"""


@pytest.mark.parametrize("center", [False, True])
def test_exact_search_is_the_same_for_every_chunk_and_thread_count_ties_included(center):
    """Byte-identical rows tie and rank by row (search --center ranked them by rounding noise); every chunk size
    and BLAS thread count gives the same bits, those of a slow exact reference and of retrieval's
    topk_neighbours."""
    import hashlib
    import os
    import subprocess
    import sys
    from pathlib import Path

    from coclr.eval.retrieval import topk_neighbours

    gallery, queries = _tied_rows()
    expected_scores, expected_rows = exact_reference(gallery, queries, 25, center)
    assert (np.diff(expected_scores, axis=1) == 0).sum() > 20  # ties inside the top 25
    for chunk in (7, 100, 1024, 10**6):
        scores, rows = nearest(gallery, queries, 25, center=center, chunk=chunk)
        np.testing.assert_array_equal(rows, expected_rows)
        np.testing.assert_array_equal(scores, expected_scores)
    retrieval_scores, retrieval_rows = topk_neighbours(queries, gallery, 25, center=center, gallery_chunk=333)
    np.testing.assert_array_equal(retrieval_rows, expected_rows)
    np.testing.assert_array_equal(retrieval_scores, expected_scores.astype(np.float32))
    digest = hashlib.sha256(expected_scores.tobytes() + expected_rows.astype(np.int64).tobytes()).hexdigest()
    paths = os.pathsep.join([str(Path(__file__).parents[1] / "src"), str(Path(__file__).parent)])
    for threads, chunk in ((1, 4096), (2, 500)):
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads),
               "MKL_NUM_THREADS": str(threads), "PYTHONPATH": paths}
        code = _SEARCH_IN_A_PROCESS.format(center=center, chunk=chunk)
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == digest


def _copy_folder(folder, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(folder[0], out)
    return out


def test_search_center_ranks_identical_rows_by_row(folder, tmp_path, capsys):
    out = _copy_folder(folder, tmp_path)
    videos = np.load(out / "videos.npy")
    videos[[2, 4]] = videos[0]
    videos[5] = videos[1]
    np.save(out / "videos.npy", videos)
    for center in ([], ["--center"]):
        assert cli_main(["search", str(out), "--query", "0", "-k", "5", "--json", *center]) == 0
        hits = json.loads(capsys.readouterr().out)["hits"]
        assert [h["row"] for h in hits][:2] == [2, 4] and hits[0]["score"] == hits[1]["score"]
        assert [h["row"] for h in hits][2:4] == [1, 5] and hits[2]["score"] == hits[3]["score"]


def test_prepared_rows_are_kept_beside_the_folder_and_never_served_stale(folder, tmp_path, capsys):
    import os

    from coclr.embed.search import folder_rows, prepare_search, prepared_paths

    out = _copy_folder(folder, tmp_path)
    prepare_search(out)
    paths = prepared_paths(out, "videos", False)
    rows_path = paths["prepared"]
    assert all(path.is_file() for path in paths.values())
    assert json.loads(paths["record"].read_text())["source_checksum"].startswith("sha256:")
    prepared = folder_rows(Embeddings(out))
    np.testing.assert_array_equal(prepared.block(0, 6), np.load(rows_path))
    from coclr.embed.search_cpu import quantise_rows

    quantised, scales, error, norm = quantise_rows(np.load(rows_path))  # the int8 copy is that of the rows
    np.testing.assert_array_equal(prepared.int8.bytes, quantised)
    np.testing.assert_array_equal(prepared.int8.scales, scales)
    assert (prepared.int8.error, prepared.int8.norm) == (error, norm)
    inode = os.stat(rows_path).st_ino
    for key in ("i8", "i8_scales"):  # a prepared copy that changed is not used: the rows are prepared again
        data = paths[key].read_bytes()
        paths[key].write_bytes(data)
        assert folder_rows(Embeddings(out)).int8 is not None and os.stat(rows_path).st_ino != inode
        inode = os.stat(rows_path).st_ino
    inode = os.stat(rows_path).st_ino

    def top(query="0"):
        assert cli_main(["search", str(out), "--query", query, "-k", "5", "--json"]) == 0
        return [h["row"] for h in json.loads(capsys.readouterr().out)["hits"]]

    before = top()
    assert os.stat(rows_path).st_ino == inode  # reused, not rewritten
    os.utime(out / "videos.npy")  # same bytes, new identity: checksummed again, kept
    assert top() == before and os.stat(rows_path).st_ino == inode
    # The rows change in place, with the size and modification time put back: never served stale.
    videos = np.load(out / "videos.npy")
    stat = os.stat(out / "videos.npy")
    changed = videos[[0, 5, 4, 3, 2, 1]]
    with open(out / "videos.npy", "r+b") as file:
        file.seek(os.path.getsize(out / "videos.npy") - changed.nbytes)
        file.write(changed.tobytes())
    os.utime(out / "videos.npy", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    after = top()
    assert after == [{0: 0, 1: 5, 2: 4, 3: 3, 4: 2, 5: 1}[row] for row in before]
    assert os.stat(rows_path).st_ino != inode


def test_json_lines_are_parsed_as_read_and_equal_the_eager_reader(folder, tmp_path):
    from coclr.embed.output import JsonLines, read_jsonl
    from coclr.errors import DataError

    for name in ("videos.jsonl", "windows.jsonl"):
        lazy, eager = JsonLines(folder[0] / name), read_jsonl(folder[0] / name)
        assert len(lazy) == len(eager) and list(lazy) == eager and lazy[-1] == eager[-1] and lazy[1:3] == eager[1:3]
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"row": 0}\n{"row": 1\n')
    lines = JsonLines(bad)
    assert len(lines) == 2 and lines[0] == {"row": 0}
    with pytest.raises(DataError, match=r"bad.jsonl: damaged \(record 2 is not JSON"):
        lines[1]
    with pytest.raises(IndexError):
        lines[2]
    assert len(JsonLines(tmp_path / "missing.jsonl")) == 0


def _many_queries():
    """Tied and near-tied rows, and more queries than MANY_QUERIES (the compute-bound first passes)."""
    from coclr.embed.search import MANY_QUERIES

    gallery, queries = _tied_rows(count=2500, dim=64)
    rng = np.random.default_rng(1)
    queries = np.concatenate([queries, gallery[rng.integers(0, 2500, 40)], rng.normal(size=(10, 64)) + 1.0])
    assert len(queries) >= MANY_QUERIES
    return gallery, queries


def test_every_first_pass_gives_the_exact_answer_for_many_queries():
    """Each first pass (NumPy's float32 product; the bfloat16 one, AMX/AVX-512 BF16 where the CPU has them and
    PyTorch's generic kernels elsewhere; the int8 one in C) only chooses candidates: on the same rows each gives the
    exact reference's answer, ties and near ties included, at every chunk size; the bfloat16 products stay within
    the bound the candidates are chosen with (the int8 ones: tests/test_search_cpu.py)."""
    import torch

    from coclr.embed.search import FIRST_PASSES, Int8Rows, UnitRows, exact_topk
    from coclr.embed.search_cpu import quantise_rows
    from coclr.errors import ConfigError
    from coclr.eval.exact import bfloat16_bits, bfloat16_dot_bound, unit_rows

    gallery, queries = _many_queries()
    units, query_units = unit_rows(gallery), unit_rows(queries)
    bits = bfloat16_bits(units)
    np.testing.assert_array_equal(bits, torch.from_numpy(units).bfloat16().view(torch.int16).numpy().view(np.uint16))
    expected_scores, expected_rows = exact_reference(gallery, queries, 12, False)
    assert FIRST_PASSES == ("float32", "bfloat16", "int8")
    prepared = UnitRows.of_array(units, None, bits, Int8Rows(*quantise_rows(units)))
    for first in FIRST_PASSES:
        for chunk in (300, 4096):  # 4096: a first block of 1024 columns (cut into GROUP parts), then 1476
            for subset in (slice(None), slice(0, 5)):  # many queries (C scores the candidates), and a few (NumPy)
                scores, rows = exact_topk(prepared, query_units[subset], 12, chunk, first=first)
                np.testing.assert_array_equal(rows, expected_rows[subset], err_msg=first)
                np.testing.assert_array_equal(scores, expected_scores[subset], err_msg=first)
    for first in ("bfloat16", "int8"):  # no such copy of these rows
        with pytest.raises(ConfigError, match=f"first pass: '{first}'"):
            exact_topk(UnitRows.of_array(units), query_units, 12, first=first)
    bf16 = lambda b: torch.from_numpy(b.view(np.int16)).view(torch.bfloat16)  # noqa: E731
    approx = (bf16(bfloat16_bits(query_units)) @ bf16(bits).T).float().numpy().astype(np.float64)
    exact = query_units.astype(np.float64) @ units.astype(np.float64).T
    assert np.abs(approx - exact).max() <= bfloat16_dot_bound(64) / 2


def test_without_c_many_queries_get_the_same_answer(monkeypatch):
    """Without a C compiler the candidates of many queries are scored exactly by NumPy, with the same answer."""
    from coclr.embed import search_cpu
    from coclr.embed.search import Int8Rows, UnitRows, exact_topk, first_pass_kind
    from coclr.eval.exact import unit_rows

    gallery, queries = _many_queries()
    units = unit_rows(gallery)
    prepared = UnitRows.of_array(units, None, None, Int8Rows(*search_cpu.quantise_rows(units)))
    expected = exact_topk(prepared, unit_rows(queries), 12, 700)
    monkeypatch.setattr(search_cpu.KERNEL, "load", lambda warn=True: None)
    assert first_pass_kind(prepared, len(queries)) == "float32"
    found = exact_topk(prepared, unit_rows(queries), 12, 700)
    np.testing.assert_array_equal(found[0], expected[0])
    np.testing.assert_array_equal(found[1], expected[1])


def test_over_floor_finds_every_score_at_the_floor_in_grouped_and_plain_blocks():
    """The grouped candidate scan (blocks whose rows divide into GROUP parts) and the plain one name exactly the
    (row, query) pairs of a ``[rows, queries]`` block at or above the query's floor, the floor itself included."""
    from coclr.embed.search import GROUP, _over_floor

    rng = np.random.default_rng(3)
    for width in (GROUP * 8, GROUP * 8 + 5, 100):
        scores = rng.standard_normal((width, 9)).astype(np.float32)
        floor = np.quantile(scores, 0.97, axis=0).astype(np.float32)
        floor[0] = scores[7, 0]  # a score equal to its floor is a candidate
        floor[1] = np.inf  # a query with none
        rows, queries = _over_floor(scores, floor)
        found = set(zip(rows.tolist(), queries.tolist()))
        expected = {(int(a), int(b)) for a, b in zip(*np.nonzero(scores >= floor))}
        assert found == expected and len(rows) == len(expected) and (7, 0) in found


def test_the_first_pass_is_chosen_by_the_cpu_flags(monkeypatch):
    """From MANY_QUERIES queries: bfloat16 for rows with a bfloat16 copy where the CPU has AVX512_BF16 or AMX and
    neither PyTorch nor oneDNN is limited below them, else int8 for rows with an int8 copy where its C builds;
    float32 for fewer queries, for rows without those copies, and without C (never a timing)."""
    import coclr.cpu
    from coclr.embed import search as search_module
    from coclr.embed import search_cpu
    from coclr.embed.search import MANY_QUERIES, Int8Rows, UnitRows, first_pass_kind

    units = np.eye(4, dtype=np.float32)
    with16, without = UnitRows.of_array(units, None, np.zeros((4, 4), np.uint16)), UnitRows.of_array(units)
    both = UnitRows.of_array(units, None, np.zeros((4, 4), np.uint16), Int8Rows(*search_cpu.quantise_rows(units)))
    int8 = "int8" if search_cpu.KERNEL.load(warn=False) is not None else "float32"  # "float32" without C
    for name in coclr.cpu.AVX2_LIMIT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    cascade_lake = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"}
    sapphire_rapids = cascade_lake | {"avx512_bf16", "amx_tile", "amx_bf16"}
    zen3 = {"avx2", "fma"}
    for flags, native in ((cascade_lake, False), (zen3, False), (sapphire_rapids, True),
                          (cascade_lake | {"avx512_bf16"}, True), (set(), False)):
        monkeypatch.setattr(coclr.cpu, "cpu_flags", lambda flags=flags: set(flags))
        assert coclr.cpu.native_bfloat16() is native
        assert search_module.native_bfloat16() is native  # the search asks the same function
        assert first_pass_kind(with16, MANY_QUERIES) == ("bfloat16" if native else "float32")
        assert first_pass_kind(both, MANY_QUERIES) == ("bfloat16" if native else int8)
        assert first_pass_kind(with16, MANY_QUERIES - 1) == first_pass_kind(both, MANY_QUERIES - 1) == "float32"
        assert first_pass_kind(without, MANY_QUERIES) == "float32"
    monkeypatch.setattr(coclr.cpu, "cpu_flags", lambda: set(sapphire_rapids))
    for name, value, native in (("ATEN_CPU_CAPABILITY", "avx2", False), ("ATEN_CPU_CAPABILITY", "avx512", True),
                                ("ONEDNN_MAX_CPU_ISA", "AVX2", False), ("ONEDNN_MAX_CPU_ISA", "AVX512_CORE", False),
                                ("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX", True), ("DNNL_MAX_CPU_ISA", "avx2", False)):
        monkeypatch.setenv(name, value)
        assert coclr.cpu.native_bfloat16() is native, (name, value)
        monkeypatch.delenv(name)
    for name, value in coclr.cpu.AVX2_LIMIT.items():
        monkeypatch.setenv(name, value)
    assert not coclr.cpu.native_bfloat16() and "emulated AVX2 kind" in coclr.cpu.describe()
    assert first_pass_kind(both, MANY_QUERIES) == int8
    monkeypatch.setattr(search_cpu, "MAX_DIM", 3)  # rows too long for the int32 sums
    assert first_pass_kind(both, MANY_QUERIES) == "float32"
    monkeypatch.setattr(search_cpu, "MAX_DIM", 4)
    monkeypatch.setattr(search_cpu.KERNEL, "load", lambda warn=True: None)  # no C compiler
    assert first_pass_kind(both, MANY_QUERIES) == "float32"


_TOPK_IN_A_PROCESS = """
import hashlib, json
import torch
from test_search import _many_queries
from coclr.embed.search import Int8Rows, UnitRows, exact_topk, first_pass_kind
from coclr.embed.search_cpu import kernel, quantise_rows
from coclr.eval.exact import bfloat16_bits, unit_rows
gallery, queries = _many_queries()
units = unit_rows(gallery)
rows = UnitRows.of_array(units, None, bfloat16_bits(units), Int8Rows(*quantise_rows(units)))
scores, found = exact_topk(rows, unit_rows(queries), 12, 700)
print(json.dumps({"digest": hashlib.sha256(scores.tobytes() + found.tobytes()).hexdigest(),
                  "first": first_pass_kind(rows, len(queries)), "kernel": kernel(),
                  "capability": torch.backends.cpu.get_cpu_capability()}))
"""


def test_the_answer_is_the_same_with_the_cpu_limited_to_avx2():
    """A child process with PyTorch, oneDNN, MKL, OpenBLAS and NumPy limited to AVX2 (coclr.cpu.AVX2_LIMIT: the
    AVX2-only CPU kind, emulated) and one with this CPU as is give the same scores and rows, those of the exact
    reference, whichever first pass each chose (the int8 one, in C compiled for AVX2 under the limit)."""
    import hashlib
    import os
    import subprocess
    import sys
    from pathlib import Path

    from coclr.cpu import AVX2_LIMIT

    gallery, queries = _many_queries()
    expected_scores, expected_rows = exact_reference(gallery, queries, 12, False)
    digest = hashlib.sha256(expected_scores.tobytes() + expected_rows.astype(np.int64).tobytes()).hexdigest()
    paths = os.pathsep.join([str(Path(__file__).parents[1] / "src"), str(Path(__file__).parent)])
    base = {k: v for k, v in os.environ.items() if k not in AVX2_LIMIT}
    results = []
    for limit in ({}, AVX2_LIMIT):
        env = {**base, **limit, "PYTHONPATH": paths, "OMP_NUM_THREADS": "1"}
        run = subprocess.run([sys.executable, "-c", _TOPK_IN_A_PROCESS], capture_output=True, text=True, env=env,
                             timeout=300)
        assert run.returncode == 0, run.stderr
        results.append(json.loads(run.stdout.strip().splitlines()[-1]))
    assert [r["digest"] for r in results] == [digest, digest]
    limited = results[1]
    assert limited["capability"] in ("AVX2", "DEFAULT")
    from coclr.native import find_compiler

    if find_compiler() is not None:  # the int8 pass ran, compiled for AVX2 under the limit
        assert limited["first"] == "int8" and limited["kernel"] == "avx2"
        assert results[0]["kernel"] in ("avx2", "avx512_vnni")


def test_an_html_path_that_is_a_folder_is_one_line(folder, tmp_path, capsys):
    out, _, _ = folder
    page = tmp_path / "page.html"
    page.mkdir()
    assert cli_main(["search", str(out), "--query", "1", "-k", "2", "--html", str(page)]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1 and str(page) in err and "is a folder" in err


def test_an_html_path_that_cannot_be_written_is_one_line_before_the_search(folder, tmp_path, capsys):
    """An unwritable place (/proc refuses new files to root too) or a link to nothing: refused before the search,
    naming the user's path (not a temporary file's), and the link left as it was."""
    out, _, _ = folder
    assert cli_main(["search", str(out), "--query", "1", "-k", "2", "--html", "/proc/page.html"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no hits printed: refused before the search
    assert captured.err.strip().endswith("/proc/page.html: /proc, where it would be written, cannot be written by "
                                         "this user (permission denied, or a read-only file system); give another "
                                         "output file")
    link = tmp_path / "page.html"
    link.symlink_to(tmp_path / "missing" / "page.html")
    assert cli_main(["search", str(out), "--query", "1", "-k", "2", "--html", str(link)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "a link to " in captured.err and "which does not exist" in captured.err
    assert link.is_symlink() and not link.exists()


def test_rows_of_removed_or_changed_files_are_never_served(tmp_path, capsys):
    """Between two embed runs, a hit whose file was removed or changed is left out (the next row takes its place)
    and the command says so in one line; only the candidates' files are looked at."""
    from pathlib import Path

    encoder = save_tiny_encoder(tmp_path / "encoder.pth")
    for n in range(5):
        write_video(tmp_path / "videos" / f"v{n}.mp4", moving_square(14 + 4 * n, seed=n))
    out = tmp_path / "out"
    assert cli_main(["embed", str(tmp_path / "videos"), "--checkpoint", str(encoder), "--out", str(out),
                     "--length", "8", "--size", "32", "--short-side", "32", "--workers", "0", "--quiet"]) == 0
    embeddings = Embeddings(out)
    query = np.asarray(embeddings.videos[0])
    everything = [hit.path for hit in search(embeddings, query, k=5)]
    removed, changed = everything[1], everything[3]
    Path(removed).unlink()
    with open(changed, "ab") as file:
        file.write(b"\0")
    stale: list[str] = []
    hits = search(Embeddings(out), query, k=3, stale=stale)
    assert [hit.path for hit in hits] == [p for p in everything if p not in (removed, changed)]
    assert [hit.rank for hit in hits] == [1, 2, 3] and sorted(stale) == sorted([removed, changed])
    capsys.readouterr()
    row = Embeddings(out).row_of(everything[0])
    assert cli_main(["search", str(out), "--query", str(row), "-k", "2", "--json"]) == 0
    captured = capsys.readouterr()
    served = [hit["path"] for hit in json.loads(captured.out)["hits"]]
    assert served == [everything[2], everything[4]]
    note = [line for line in captured.err.splitlines() if "left out" in line]
    assert len(note) == 1 and "2 embedded file(s) changed or were removed" in note[0]


def test_a_query_is_resolved_by_the_library(folder, tmp_path):
    """coclr search's query rules live in the library (what every caller gets): a row number, a file as embedded
    (its row, left out of video hits), a changed file embedded again, anything else one error naming it."""
    import os
    import shutil
    from pathlib import Path

    from coclr.embed.search import resolve_query
    from coclr.errors import DataError

    embeddings = Embeddings(folder[0])
    row = resolve_query(embeddings, "1")
    assert row.exclude == row.row == 1 and np.array_equal(row.vector, embeddings.videos[1])
    assert row.label == embeddings.video_records[1]["path"]
    path = embeddings.video_records[2]["path"]
    stored = resolve_query(embeddings, path)
    assert stored.exclude == 2 and stored.row is None and np.array_equal(stored.vector, embeddings.videos[2])
    assert resolve_query(embeddings, path, windows=True).exclude is None  # a video is not one of the windows
    copy = tmp_path / "copy" / Path(path).name
    copy.parent.mkdir()
    shutil.copy(path, copy)
    os.utime(copy, ns=(0, 0))
    fresh = resolve_query(embeddings, str(copy))  # not a row of the folder: embedded now, as the folder's were
    assert fresh.exclude is None and float(fresh.vector @ embeddings.videos[2]) > 0.999
    with pytest.raises(DataError, match="no such file, nor a row number"):
        resolve_query(embeddings, "no-such-file.mp4")
    with pytest.raises(DataError, match="out of range"):
        resolve_query(embeddings, str(len(embeddings.video_records)))
    for digit in ("\u00b2", "\uff11", "\u0661"):  # digits to str.isdigit: a traceback, or taken as rows 1
        with pytest.raises(DataError, match="no such file, nor a row number"):
            resolve_query(embeddings, digit)


def test_a_search_that_cannot_run_is_refused_before_a_query_video_is_embedded(folder, tmp_path, capsys,
                                                                              monkeypatch):
    """`-k 0` with a video file as the query embedded the video first (seconds to minutes), then was refused."""
    from coclr.embed import search as module

    out, _, videos = folder

    def embedded(*args, **kwargs):
        raise AssertionError("the query was embedded before the refusal")

    monkeypatch.setattr(module, "resolve_query", embedded)
    assert cli_main(["search", str(out), "--query", str(videos[0]), "-k", "0"]) == 2
    assert "-k: must be a whole number of at least 1, got 0" in capsys.readouterr().err
    monkeypatch.setattr(module, "faiss_available", lambda: False)
    assert cli_main(["search", str(out), "--query", str(videos[0]), "--backend", "faiss"]) == 2
    assert "faiss is not installed" in capsys.readouterr().err


def test_rows_read_before_an_embed_committed_are_not_kept_as_the_new_files(folder, tmp_path):
    """A search read the arrays, a coclr embed committed new rows of the same shape, then the search prepared what it
    had read and recorded it against the new file: every later search served the old rows."""
    import os
    import shutil

    from coclr.embed.search import PREPARED_DIR, folder_rows, prepared_paths
    from coclr.eval.exact import unit_rows

    out = _copy_folder(folder, tmp_path)
    shutil.rmtree(out / PREPARED_DIR, ignore_errors=True)  # (the module's folder may have been searched already)
    read_before = Embeddings(out)
    old = np.load(out / "videos.npy")
    new = np.ascontiguousarray(old[::-1])
    with open(out / "videos.npy.next", "wb") as file:  # the commit: the file replaced at once
        np.save(file, new)
    os.replace(out / "videos.npy.next", out / "videos.npy")
    np.testing.assert_array_equal(folder_rows(read_before).block(0, len(old)), unit_rows(old))  # what it read
    assert not prepared_paths(out, "videos", False)["record"].exists()
    np.testing.assert_array_equal(folder_rows(Embeddings(out)).block(0, len(new)), unit_rows(new))


def test_a_killed_preparations_temporary_files_are_removed(folder, tmp_path):
    from coclr.atomic import PARTIAL_SUFFIX
    from coclr.embed.search import PREPARED_DIR, folder_rows

    out = _copy_folder(folder, tmp_path)
    (out / PREPARED_DIR).mkdir(exist_ok=True)
    left = out / PREPARED_DIR / f".videos.plain.npy.{2**31 - 1}.x1{PARTIAL_SUFFIX}"  # its writer's process is gone
    left.write_bytes(b"\0" * 64)
    folder_rows(Embeddings(out))
    assert not left.exists()


def test_a_folder_read_while_an_embed_commits_is_said_to_be_written(folder, tmp_path):
    """Mid-commit, a search said the run "was interrupted" and to run the embed command again (which its lock would
    refuse): the files are read again, and while the writer stays, it is named."""
    import subprocess
    import sys

    from coclr.embed.output import COMMIT_FILE
    from coclr.errors import DataError
    from coclr.runfolder import LOCK_FILE

    out = _copy_folder(folder, tmp_path)
    (out / COMMIT_FILE).write_text("{}")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom coclr.filelock import exclusive_lock\n"
        f"with exclusive_lock({str(out / LOCK_FILE)!r}):\n    print('held', flush=True)\n    time.sleep(60)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(DataError, match=r"a coclr embed is writing it now \(.*\); run this again when it ends"):
            Embeddings(out)
    finally:
        holder.kill()
        holder.wait()
    with pytest.raises(DataError, match="a run was interrupted while writing"):  # its writer gone: as it is
        Embeddings(out)


def test_another_commands_locked_folder_is_refused_at_once_as_no_embedding(tmp_path):
    """A search of a running coclr learn's folder waited seconds, then said a coclr embed was writing it."""
    import subprocess
    import sys
    import time

    from coclr.errors import DataError
    from coclr.runfolder import LOCK_FILE

    (tmp_path / "run").mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import time\nfrom coclr.filelock import exclusive_lock\n"
        f"with exclusive_lock({str(tmp_path / 'run' / LOCK_FILE)!r}):\n    print('held', flush=True)\n"
        "    time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with pytest.raises(DataError, match="not a coclr embed output folder"):
            Embeddings(tmp_path / "run")
        assert time.monotonic() - started < 2
    finally:
        holder.kill()
        holder.wait()
