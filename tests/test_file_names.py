"""File names as users have them: bytes that are not UTF-8 (an archive from another system), markup, quotes. Every
command takes such a video as any other: the store, the embedding, search and its page, the curation's tables and
page name the very file (its own bytes where a file is text for tools, U+FFFD where a page shows it), and nothing
fails on the name."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from coclr.cli import main
from test_embed import moving_square, write_video
from test_eval_helpers import save_tiny_encoder

NOT_UTF8 = b"caf\xe9 <b>clip.mp4"  # Latin-1: a name an old archive gives
MARKUP = "quote\"'&amp; <img src=x onerror=alert(1)>.mp4"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Ten small videos in two class folders: one named by bytes that are not UTF-8, one by markup."""
    root = tmp_path_factory.mktemp("names")
    videos = root / "videos"
    for number in range(10):
        kind = videos / ("left" if number % 2 else "right")
        write_video(kind / f"v{number}.mp4", moving_square(16, seed=number))
    try:
        os.rename(videos / "left" / "v1.mp4", os.path.join(os.fsencode(videos / "left"), NOT_UTF8))
    except OSError:  # (macOS's file systems refuse them)
        pytest.skip("this file system refuses names that are not UTF-8")
    os.rename(videos / "right" / "v2.mp4", videos / "right" / MARKUP)
    return root


def odd_paths(folder: Path) -> list[str]:
    """The two oddly named videos' paths, as ``os.listdir`` gives them (the bytes that are not UTF-8 as surrogates)."""
    return [os.fsdecode(os.path.join(os.fsencode(folder / "videos" / "left"), NOT_UTF8)),
            str(folder / "videos" / "right" / MARKUP)]


def test_text_becomes_the_very_bytes_of_a_name_whatever_the_locale():
    from coclr.text import from_bytes, to_bytes

    name = os.fsdecode(NOT_UTF8)  # as os.listdir gives it
    assert to_bytes(name) == NOT_UTF8 and from_bytes(NOT_UTF8) == name
    assert to_bytes("café 動画") == "café 動画".encode()  # a UTF-8 name hashes as it always did


def test_a_store_keeps_the_videos_of_any_name(folder, tmp_path):
    from coclr.store.clipstore import ClipStore

    index = tmp_path / "index.json"
    assert main(["data", "index", "--format", "folder", "--root", str(folder / "videos"), "--out", str(index)]) == 0
    assert main(["data", "store", "--index", str(index), "--root", str(folder / "videos"), "--out",
                 str(tmp_path / "store"), "--short-side", "32", "--workers", "1"]) == 0
    store = ClipStore(tmp_path / "store")
    keys = [entry.path for entry in store.index.entries]
    assert os.fsdecode(b"left/" + NOT_UTF8) in keys and f"right/{MARKUP}" in keys
    for key in keys:
        assert store.read(key, "rgb", [0]).shape[0] == 1 and store.check_entry(key, "rgb", decode=True) is None


@pytest.fixture(scope="module")
def embedded(folder, tmp_path_factory) -> Path:
    """The folder embedded by ``coclr embed`` with a tiny encoder."""
    root = tmp_path_factory.mktemp("embedded")
    checkpoint = save_tiny_encoder(root / "encoder.pth")
    assert main(["embed", str(folder / "videos"), "--out", str(root / "embedded"), "--checkpoint", str(checkpoint),
                 "--quiet"]) == 0
    return root / "embedded"


def test_embedding_search_and_curation_name_the_very_files(folder, embedded, tmp_path):
    from coclr.embed.output import Embeddings

    paths = [record["path"] for record in Embeddings(embedded).video_records]
    assert len(paths) == 10 and set(odd_paths(folder)) <= set(paths)
    assert all(os.path.isfile(path) for path in paths)

    page = tmp_path / "search.html"
    assert main(["search", str(embedded), "--query", odd_paths(folder)[0], "--html", str(page)]) == 0
    text = page.read_bytes()
    assert "caf\ufffd &lt;b&gt;clip.mp4".encode() in text  # the query's name, escaped, its byte as U+FFFD
    text.decode("utf-8")  # (the page is UTF-8 throughout)
    assert b"<b>clip" not in text
    strict = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}  # the standard output of en_US.UTF-8 (not C.UTF-8)
    found = subprocess.run([sys.executable, "-m", "coclr", "search", str(embedded), "--query", odd_paths(folder)[1],
                            "-k", "9"], capture_output=True, env=strict, timeout=120)
    assert found.returncode == 0, found.stderr
    assert MARKUP.encode() in found.stdout and NOT_UTF8 in found.stdout  # the names' own bytes, as ls prints them

    curated = tmp_path / "curated"
    assert main(["curate", str(embedded), "--out", str(curated), "--calibrate", "0", "--quiet"]) == 0
    raw = (curated / "outliers.csv").read_bytes()
    ranked = list(csv.DictReader(io.StringIO(raw.decode("utf-8", "surrogateescape"))))
    assert sorted(row["path"] for row in ranked) == sorted(paths)  # every file, named by its own bytes
    shown = (curated / "index.html").read_text(encoding="utf-8", errors="replace")
    assert "<img src=x" not in shown and "onerror=alert(1)&gt;" not in shown.split("<script")[0]
    assert json.loads((curated / "curate.json").read_text())["videos"] == 10


def test_the_page_shows_the_names_in_a_browser(folder, embedded, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed")
    from test_report import CHROMIUM_FLAGS

    page = tmp_path / "search.html"
    assert main(["search", str(embedded), "--query", odd_paths(folder)[0], "-k", "9", "--html", str(page)]) == 0
    dom = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
                          page.as_uri()], check=True, capture_output=True, text=True, timeout=60).stdout
    assert "caf\ufffd &lt;b&gt;clip.mp4" in dom  # the byte that is not UTF-8 as U+FFFD, the markup as text
    assert "<bdi>right/quote\"'&amp;amp; &lt;img src=x onerror=alert(1)&gt;.mp4</bdi>" in dom  # isolated, and
    assert "<img src=\"x\"" not in dom  # named from the folder of every video shown (not "alert(1)>.mp4")
    assert dom.count("border-color:#999999") == 9  # no label: no green for "same class"
    assert "<h1>Nearest videos</h1>" in dom
    windows = tmp_path / "windows.html"
    assert main(["search", str(embedded), "--query", "0", "--windows", "-k", "2", "--html", str(windows)]) == 0
    assert "<h1>Nearest windows</h1>" in windows.read_text()


def test_a_name_s_right_to_left_override_stays_inside_its_caption():
    from coclr.eval.gallery import short_names, video_cell

    cell = video_cell("data:,", "x/\u202egnp.mp4", "#000", "/v/x/\u202egnp.mp4", "#1", " (0.999)")
    assert "<bdi>x/\u202egnp.mp4</bdi> (0.999)</figcaption>" in cell  # the score after the name, not inside it
    assert short_names(["/v/x/clip.mp4", "/v/y/clip.mp4"]) == ["x/clip.mp4", "y/clip.mp4"]
    assert short_names(["/v/a.mp4"]) == ["a.mp4"] and short_names(["a.mp4", "/v/b.mp4"]) == ["a.mp4", "/v/b.mp4"]



@pytest.mark.slow
def test_learn_takes_videos_of_any_name(folder, tmp_path):
    from coclr.embed.output import Embeddings
    from test_learn import TINY_PLAN, run_learn

    out = tmp_path / "learnt"
    done = run_learn(folder / "videos", out, plan={**TINY_PLAN, "queue": 4})  # a small fixed plan (ten videos)
    output = done.stdout.read()
    assert done.returncode == 0, output
    record = json.loads((out / "learn.json").read_text())
    assert record["status"] == "done" and record["videos"] == 10 and record["failed"] == []
    for name in ("rgb", "two_stream"):
        assert set(odd_paths(folder)) <= {r["path"] for r in Embeddings(out / "embeddings" / name).video_records}
    page = (out / "report.html").read_bytes()
    assert b"<img src=x" not in page and b"<b>clip" not in page


CONTROL = "two\nlines \x1b[2J\x1b]0;title\x07.mp4"  # a newline, and escape sequences that clear the screen, retitle


def test_a_terminal_shows_control_characters_of_names_as_escapes():
    from coclr.text import shown

    assert shown(CONTROL) == "two\\nlines \\x1b[2J\\x1b]0;title\\x07.mp4"
    assert shown("a\tb\r\x7f\x85 café \udce9") == "a\\tb\\r\\x7f\\x85 café \udce9"  # C0, DEL, C1; the rest kept
    assert shown(f"one {CONTROL}\ntwo", newlines=True) == "one two\nlines \\x1b[2J\\x1b]0;title\\x07.mp4\ntwo"
    # a right-to-left override showed the rest of the line reversed ("rtl<U+202E>gpm.exe.mp4" read as rtl...exe.mp4)
    assert shown("rtl\u202egpm.exe.mp4 \u2067x\u2069 \u200f") == "rtl\\u202egpm.exe.mp4 \\u2067x\\u2069 \\u200f"
    letters = "\u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627"  # right-to-left letters are kept
    assert shown(letters) == letters


def test_the_listings_keep_a_name_with_control_characters_on_its_line(tmp_path, capsys):
    videos = tmp_path / "videos"
    for number in range(3):
        write_video(videos / f"v{number}.mp4", moving_square(16, seed=number))
    os.rename(videos / "v0.mp4", videos / CONTROL)
    (videos / ("broken " + CONTROL)).write_bytes(b"not a video at all" * 100)
    checkpoint = save_tiny_encoder(tmp_path / "encoder.pth")
    out = tmp_path / "embedded"
    assert main(["embed", str(videos), "--out", str(out), "--checkpoint", str(checkpoint), "--quiet"]) == 3
    assert main(["search", str(out), "--query", str(videos / CONTROL), "-k", "2"]) == 0
    assert main(["search", str(out), "--query", str(videos / "v1.mp4"), "-k", "2"]) == 0
    assert main(["search", str(out), "--query", str(videos / ("gone " + CONTROL))]) == 2
    printed = capsys.readouterr()
    terminal = printed.out + printed.err
    assert "\x1b" not in terminal and "\x07" not in terminal  # nothing reaches the terminal as a command
    lines = terminal.splitlines()
    failed = [line for line in lines if "broken two" in line]
    assert len(failed) == 1 and "broken two\\nlines \\x1b[2J" in failed[0]  # the failed file, on one line
    assert "cannot open as a video" in failed[0]  # with its reason (the name's line break is not the message's)
    hits = [line for line in lines if line.endswith(".mp4") and " row " in line]
    assert len(hits) == 4 and any(line.endswith("/two\\nlines \\x1b[2J\\x1b]0;title\\x07.mp4") for line in hits)
    assert any(line.startswith("query: ") and line.endswith("\\x07.mp4") for line in lines)
    refused = printed.err[printed.err.index("coclr search: error:"):]  # one line (it kept the name's line break:
    # only a message of several lines, a job's log tails, keeps its own)
    assert "gone two\\nlines \\x1b[2J\\x1b]0;title\\x07.mp4" in refused.splitlines()[0]


def test_an_error_of_several_lines_keeps_them_and_a_one_line_error_escapes_a_name_s_newline(tmp_path, capsys,
                                                                                           monkeypatch):
    import coclr.cli as cli
    from coclr.errors import CoclrError, DataError

    tails = CoclrError("failed: a\n--- a, killed\nlast line of its log")
    tails.lines = True  # (as the scheduler raises it)
    for error, said in ((tails, "error: failed: a\n--- a, killed\nlast line of its log\n"),
                        (DataError("no\nfile.csv: manifest not found"), "error: no\\nfile.csv: manifest not found\n")):
        def failing(args, error=error):
            raise error

        monkeypatch.setattr(cli, "run_command", failing)
        assert cli.main(["data", "verify", str(tmp_path)]) == 2
        assert capsys.readouterr().err.endswith(said)
