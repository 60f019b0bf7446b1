"""Real footage through embed, search, the store and data index (issue 45, decoding): any container a file holds
(MPEG-TS as .ts/.MTS), one bad argument failing alone, window times from the frames' timestamps, rotated phone
videos embedded upright, damaged real files failed or marked."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pytest

from coclr.cli import main as cli_main
from coclr.data.sampling import sliding_windows
from coclr.embed.embedder import Embedder
from coclr.embed.inputs import expand_inputs
from coclr.embed.output import Embeddings
from coclr.embed.search import file_thumbnail
from coclr.errors import DataError
from coclr.store.build import build_store
from coclr.store.clipstore import ClipStore
from coclr.video.decode import DAMAGE_TOLERANCE
from coclr.video.indexes import folder_index
from test_embed import SMALL, moving_square
from test_eval_helpers import save_tiny_encoder
from test_video import (
    damaged_copy,
    frame_numbers,
    numbered_frames,
    reference_damage,
    write_transport_stream,
    write_turned,
    write_video,
)

OPTIONS = ["--length", "8", "--size", "32", "--short-side", "32", "--workers", "0", "--quiet"]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> Path:
    return save_tiny_encoder(tmp_path_factory.mktemp("enc") / "encoder.pth")


def embed(encoder: Path, out: Path, *inputs) -> int:
    return cli_main(["embed", *map(str, inputs), "--checkpoint", str(encoder), "--out", str(out), *OPTIONS])


def rows(out: Path) -> dict[str, dict]:
    return {Path(r["path"]).name: r for r in Embeddings(out).video_records}


# ------------------------------------------------------------------------------------------------ inputs


def test_transport_streams_are_videos_and_a_bad_argument_fails_alone(tmp_path, encoder, capsys):
    """`coclr embed ok.mp4 clip.ts` read clip.ts as a list of paths (a line of binary garbage, exit 2, ok.mp4 not
    embedded). Now a file PyAV opens as a video is one whatever its extension, a binary file that is not is that
    input's failure (one line, exit 3), and the other inputs are embedded."""
    videos = tmp_path / "videos"
    videos.mkdir()
    write_video(videos / "ok.mp4", moving_square(12), fps=25, codec="libx264")
    stream = write_transport_stream(videos / "clip.ts", moving_square(12, seed=1))
    (videos / "CLIP.MTS").write_bytes(stream.read_bytes())
    noise = videos / "noise.bin"
    noise.write_bytes(np.random.default_rng(0).integers(0, 256, 20_000, np.uint8).tobytes())
    out = tmp_path / "out"
    unusable: dict[str, str] = {}
    assert expand_inputs([videos / "clip.ts", noise], unusable=unusable) == [videos / "clip.ts"]
    assert list(unusable) == [str(noise)] and "binary data" in unusable[str(noise)]
    with pytest.raises(DataError, match=f"{noise}: neither a video"):  # a library caller without the list
        expand_inputs([videos / "clip.ts", noise])

    assert embed(encoder, out, videos / "ok.mp4", videos / "clip.ts", videos / "CLIP.MTS", noise) == 3
    printed = capsys.readouterr()
    assert "3 videos embedded" in printed.out and "1 failed" in printed.out and not printed.err
    assert all(line.isprintable() for line in printed.out.splitlines())
    assert f"failed: {noise}: neither a video" in printed.out and "binary data" in printed.out
    assert sorted(rows(out)) == ["CLIP.MTS", "clip.ts", "ok.mp4"]
    assert [json.loads(line)["path"] for line in (out / "failed.jsonl").read_text().splitlines()] == [str(noise)]
    np.testing.assert_array_equal(Embeddings(out).videos[1], Embeddings(out).videos[2])  # .ts and .MTS: one file
    # Again: the bad input is skipped while unchanged, as a failed video is, and named again (exit 3 again).
    assert embed(encoder, out, videos / "ok.mp4", videos / "clip.ts", videos / "CLIP.MTS", noise) == 3
    printed = capsys.readouterr().out
    assert "0 videos embedded" in printed and f"failed before, unchanged: {noise}: neither a video" in printed
    # An input naming nothing is still an error before any work.
    assert embed(encoder, tmp_path / "other", videos / "ok.mp4", videos / "nope.mp4") == 2
    assert "nope.mp4: no such file" in capsys.readouterr().err and not (tmp_path / "other").exists()

    # A folder scan takes every container PyAV reads, and says which files it skipped and why.
    (videos / "notes.txt").write_text("not a video\n")
    assert embed(encoder, tmp_path / "scanned", videos) == 0
    printed = capsys.readouterr().out
    assert sorted(rows(tmp_path / "scanned")) == ["CLIP.MTS", "clip.ts", "ok.mp4"]
    assert "skipped 2 files that are not videos" in printed
    assert "noise.bin: cannot open as a video" in printed and "notes.txt: its name ends in .txt" in printed


def test_data_index_folder_uses_the_same_rule(tmp_path, capsys):
    root = tmp_path / "videos"
    (root / "walk").mkdir(parents=True)
    (root / "run").mkdir()
    stream = write_transport_stream(root / "walk" / "a.ts", numbered_frames(4, 32, 48))
    (root / "walk" / "b.MTS").write_bytes(stream.read_bytes())
    (root / "run" / "c.mp4").write_bytes(b"")  # a video by its name (decoding it would fail later)
    (root / "run" / "readme.txt").write_text("about the run clips\n")
    notes: list[str] = []
    index = folder_index(root, notes=notes)
    assert [(e.path, index.classes[e.label]) for e in index.entries] == [
        ("run/c.mp4", "run"), ("walk/a.ts", "walk"), ("walk/b.MTS", "walk")]
    assert len(notes) == 1 and "skipped 1 files that are not videos (run/readme.txt: its name ends in .txt)" in notes[0]
    assert cli_main(["data", "index", "--format", "folder", "--root", str(root), "--out",
                     str(tmp_path / "index.json")]) == 0
    assert "note: " in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------ time


def reference_times(path: Path) -> tuple[list[float], float]:
    """The frames' times (seconds from the first) and when the last one ends, from PyAV's timestamps directly."""
    with av.open(str(path)) as container:
        frames = [(frame.pts, frame.duration, frame.time_base) for frame in container.decode(video=0)]
    first = frames[0][0]
    times = [float((pts - first) * base) for pts, _, base in frames]
    pts, duration, base = frames[-1]
    return times, float((pts + duration - first) * base)


def test_window_times_follow_the_timestamps_in_embed_search_and_thumbnails(tmp_path, encoder, capsys):
    """A variable-frame-rate video whose clock starts at 2 s: 12 frames 40 ms apart, then 6 frames 1 s apart.
    Window times were frame index / frame rate (the last window, frames shown from 0.4 to 6.54 s, was recorded
    as 1.0-1.8 s); now each window starts when its first frame is shown and ends when its last one stops being
    shown."""
    times_ms = [2000 + 40 * i for i in range(12)] + [2440 + 1000 * (i + 1) for i in range(6)]
    path = write_video(tmp_path / "vfr.mkv", numbered_frames(len(times_ms), 32, 48), times_ms=times_ms)
    times, end = reference_times(path)
    assert times[:2] == [0.0, 0.04] and times[-1] == pytest.approx(6.44)
    out = tmp_path / "out"
    assert embed(encoder, out, path) == 0
    folder = Embeddings(out)
    windows = sliding_windows(len(times), 8, 1, 4)
    expected = [(times[w[0]], times[w[-1] + 1] if w[-1] + 1 < len(times) else end) for w in windows]
    recorded = [(r["start"], r["end"]) for r in folder.window_records]
    assert np.allclose(recorded, expected, rtol=0, atol=1e-9)
    assert recorded[0] == pytest.approx((0.0, 0.32))
    fps = folder.video_records[0]["fps"]
    assert (windows[-1][0] / fps, (windows[-1][-1] + 1) / fps) == pytest.approx((1.0, 1.8))  # what they were
    assert folder.video_records[0]["duration"] == pytest.approx(end)

    capsys.readouterr()
    assert cli_main(["search", str(out), "--query", "0", "--windows", "-k", "3"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 4 and printed[0].startswith("query: ")
    for line in printed[1:]:
        row = int(line.split("row")[1].split()[0])
        start, stop = expected[row]
        assert f"{start:8.2f}-{stop:.2f} s" in line, line

    # The thumbnail of a window hit shows that window's frames.
    for row, window in enumerate(windows):
        start, stop = expected[row]
        shown = frame_numbers(file_thumbnail(str(path), folder, start, stop, num_frames=16, height=32))
        assert shown == list(window), row


# ------------------------------------------------------------------------------------------------ orientation


def test_a_rotated_phone_video_is_embedded_and_stored_upright(tmp_path, encoder):
    """A file marked as turned 90 degrees (a phone's portrait recording) was embedded sideways: its vector equalled
    the unmarked file's byte for byte. Now its frames are turned as a player shows them: the vector is the one of
    the upright content, bit for bit (lossless files), no longer the unmarked file's; the turn is recorded."""
    frames = moving_square(12, 32, 48)
    videos = tmp_path / "videos" / "class"
    videos.mkdir(parents=True)
    plain = write_turned(videos / "plain.mkv", frames)
    phone = write_turned(videos / "phone.mkv", frames, -90)  # shown turned clockwise
    upright = write_turned(videos / "upright.mkv", np.rot90(frames, -1, axes=(1, 2)).copy())
    embedder = Embedder(encoder, workers=0, **SMALL)
    vectors = {path.stem: embedder.embed(path) for path in (plain, phone, upright)}
    np.testing.assert_array_equal(vectors["phone"].vector, vectors["upright"].vector)
    assert not np.array_equal(vectors["phone"].vector, vectors["plain"].vector)
    assert (vectors["phone"].rotation, vectors["plain"].rotation) == (90, 0)
    out = tmp_path / "out"
    assert embed(encoder, out, videos) == 0
    recorded = rows(out)
    assert (recorded["phone.mkv"]["rotation"], recorded["phone.mkv"]["mirrored"]) == (90, False)
    assert recorded["plain.mkv"]["rotation"] == 0

    index = folder_index(tmp_path / "videos")
    build_store(index, tmp_path / "videos", tmp_path / "store", short_side=None, workers=0)
    store = ClipStore(tmp_path / "store")
    assert store.read_encoded("class/phone.mkv", "rgb", range(12)) == \
        store.read_encoded("class/upright.mkv", "rgb", range(12))  # the same frames, the same JPEG bytes
    assert store.frame_size("class/phone.mkv", "rgb") == (48, 32)
    turned = {key: {k: v for k, v in note.items() if k not in ("source", "sha256")}
              for key, note in store.notes("rgb").items()}
    assert turned == {"class/phone.mkv": {"rotation": 90, "mirrored": False}, "class/plain.mkv": {},
                      "class/upright.mkv": {}}
    from coclr.atomic import file_identity

    for key, note in store.notes("rgb").items():  # the file each entry was decoded from
        assert note["source"] == list(file_identity(tmp_path / "videos" / key))


# ------------------------------------------------------------------------------------------------ damage


def test_damaged_real_files_fail_or_are_marked_in_embed_and_store(shared_clips, tmp_path, encoder, capsys):
    """4 KB of random bytes in the middle of real files: embed returned 0 and said nothing while 96 of 300 frames
    of the MP4 were visibly corrupt. Now a video with more than 10% damaged frames fails (exit 3, listed), one
    with fewer is embedded (and stored) with its count in videos.jsonl (notes_rgb.json) and a line saying so."""
    videos = tmp_path / "videos" / "clips"
    videos.mkdir(parents=True)
    broken = damaged_copy(shared_clips / "cleaning_pool.mp4", videos / "cleaning_pool.mp4")
    scratched = damaged_copy(shared_clips / "v_Basketball_g01_c01.avi", videos / "v_Basketball_g01_c01.avi")
    (videos / "archery_ucf_format.avi").write_bytes((shared_clips / "archery_ucf_format.avi").read_bytes())
    damaged, total = reference_damage(scratched)
    assert 0 < len(damaged) <= DAMAGE_TOLERANCE * total
    out = tmp_path / "out"

    assert embed(encoder, out, videos) == 3
    printed = capsys.readouterr().out
    assert "2 videos embedded" in printed and "1 failed" in printed
    assert f"failed: {broken}: damaged: " in printed
    assert f"damaged: {scratched}: {len(damaged)} damaged frames" in printed
    recorded = rows(out)
    assert recorded["v_Basketball_g01_c01.avi"]["damaged_frames"] == len(damaged)
    assert recorded["archery_ucf_format.avi"]["damaged_frames"] == 0
    failed = [json.loads(line) for line in (out / "failed.jsonl").read_text().splitlines()]
    assert [f["path"] for f in failed] == [str(broken)] and "damaged" in failed[0]["error"]

    index = tmp_path / "index.json"
    assert cli_main(["data", "index", "--format", "folder", "--root", str(tmp_path / "videos"), "--out",
                     str(index)]) == 0
    assert cli_main(["data", "store", "--index", str(index), "--root", str(tmp_path / "videos"), "--out",
                     str(tmp_path / "store"), "--short-side", "32", "--workers", "0"]) == 3
    printed = capsys.readouterr().out
    assert "failed: clips/cleaning_pool.mp4: VideoDecodeError: " in printed and "damaged: " in printed
    store = ClipStore(tmp_path / "store")
    assert list(store.failed("rgb")) == ["clips/cleaning_pool.mp4"]
    notes = store.notes("rgb")
    damaged_noted = {key: note["damaged_frames"] for key, note in notes.items() if "damaged_frames" in note}
    assert damaged_noted == {"clips/v_Basketball_g01_c01.avi": len(damaged)}
