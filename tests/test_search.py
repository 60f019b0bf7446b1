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
    hits = json.loads(capsys.readouterr().out)["hits"]
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


def test_bad_queries_are_one_line_errors(folder, capsys):
    out, _, _ = folder
    assert cli_main(["search", str(out), "--query", "99"]) == 2
    assert "row 99 is out of range (6 rows" in capsys.readouterr().err
    assert cli_main(["search", str(out), "--query", "nothing.mp4"]) == 2
    assert "neither a video file nor a row number" in capsys.readouterr().err
    assert cli_main(["search", str(out.parent), "--query", "1"]) == 2
    assert "not a coclr embed output folder" in capsys.readouterr().err
