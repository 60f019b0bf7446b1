"""Dataset indexes: official split files of UCF101, HMDB51 and Kinetics-400 (made-up trees named like the
real ones), folders, CSV manifests, JSON round trip and missing-video reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coclr.errors import DataError
from coclr.video.indexes import (
    VideoEntry,
    VideoIndex,
    check_videos_exist,
    csv_index,
    folder_index,
    hmdb51_index,
    kinetics_index,
    missing_videos,
    ucf101_index,
)


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


# ---------------------------------------------------------------------------------------------- UCF101

def make_ucf101_lists(folder: Path) -> None:
    """A three-class UCF101 split 1 with the official files' form (Windows line endings included)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "classInd.txt").write_bytes(b"1 ApplyEyeMakeup\r\n2 BaseballPitch\r\n3 HandstandPushups\r\n")
    (folder / "trainlist01.txt").write_bytes(
        b"ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi 1\r\n"
        b"ApplyEyeMakeup/v_ApplyEyeMakeup_g09_c02.avi 1\r\n"
        b"BaseballPitch/v_BaseballPitch_g10_c03.avi 2\r\n"
        b"HandstandPushups/v_HandStandPushups_g08_c01.avi 3\r\n")
    (folder / "testlist01.txt").write_bytes(
        b"ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01.avi\r\n"
        b"BaseballPitch/v_BaseballPitch_g02_c04.avi\r\n"
        b"HandstandPushups/v_HandStandPushups_g07_c02.avi\r\n")


def test_ucf101_split_files(tmp_path):
    make_ucf101_lists(tmp_path / "ucfTrainTestlist")
    index = ucf101_index(tmp_path / "ucfTrainTestlist", split=1)
    assert index.name == "ucf101_split1"
    assert index.classes == ["ApplyEyeMakeup", "BaseballPitch", "HandstandPushups"]
    assert index.split_counts() == {"train": 4, "test": 3}
    # Groups are per class, as the authors' code identifies sources (v_<Class>_g<XX>): g08 of two classes differ.
    assert index.entries[0] == VideoEntry("ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi", 0, "train",
                                          "v_ApplyEyeMakeup_g08")
    assert index.entries[3] == VideoEntry("HandstandPushups/v_HandStandPushups_g08_c01.avi", 2, "train",
                                          "v_HandStandPushups_g08")
    test = index.split("test")
    assert [(e.label, e.group) for e in test.entries] == [(0, "v_ApplyEyeMakeup_g01"), (1, "v_BaseballPitch_g02"),
                                                          (2, "v_HandStandPushups_g07")]
    train_groups = {e.group for e in index.split("train").entries}
    assert train_groups.isdisjoint({e.group for e in test.entries})


def test_ucf101_label_that_contradicts_the_folder_is_reported(tmp_path):
    make_ucf101_lists(tmp_path)
    (tmp_path / "trainlist01.txt").write_text("BaseballPitch/v_BaseballPitch_g10_c03.avi 1\n")
    with pytest.raises(DataError, match="trainlist01.txt:1"):
        ucf101_index(tmp_path)


def test_ucf101_a_line_with_more_than_a_path_and_a_label_is_refused(tmp_path):
    """The rest of the line was dropped without a word (a name with a space, two lines run together)."""
    make_ucf101_lists(tmp_path)
    (tmp_path / "trainlist01.txt").write_text("ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi 1 extra\n")
    with pytest.raises(DataError, match=r"trainlist01.txt:1: expected 'Class/video.avi \[label\]', got"):
        ucf101_index(tmp_path)


def test_ucf101_missing_split_file_is_named(tmp_path):
    make_ucf101_lists(tmp_path)
    with pytest.raises(DataError, match="trainlist02.txt"):
        ucf101_index(tmp_path, split=2)


def test_ucf101_a_class_listed_twice_or_a_byte_order_mark(tmp_path):
    """A class listed twice made an empty extra class; a byte-order mark made '\\ufeff1 ApplyEyeMakeup' a bad line."""
    make_ucf101_lists(tmp_path)
    (tmp_path / "classInd.txt").write_bytes(b"\xef\xbb\xbf1 ApplyEyeMakeup\n2 BaseballPitch\n3 HandstandPushups\n")
    assert ucf101_index(tmp_path).classes == ["ApplyEyeMakeup", "BaseballPitch", "HandstandPushups"]
    for text, twice in ((b"1 ApplyEyeMakeup\n2 BaseballPitch\n3 HandstandPushups\n4 applyeyemakeup\n", "name"),
                        (b"1 ApplyEyeMakeup\n2 BaseballPitch\n2 HandstandPushups\n", "number")):
        (tmp_path / "classInd.txt").write_bytes(text)
        with pytest.raises(DataError, match=f"classInd.txt:[34]: the class {twice} of .* is listed twice"):
            ucf101_index(tmp_path)


# ---------------------------------------------------------------------------------------------- HMDB51

def test_hmdb51_split_files(tmp_path):
    (tmp_path / "brush_hair_test_split1.txt").write_text(
        "April_09_brush_hair_u_nm_np1_ba_goo_0.avi 1 \nApril_09_brush_hair_u_nm_np1_ba_goo_1.avi 2 \n"
        "Aussie_Brush_Hair_brush_hair_h_cm_np1_le_goo_0.avi 0 \n")
    (tmp_path / "cartwheel_test_split1.txt").write_text("Acrobacias_cartwheel_f_cm_np1_le_med_0.avi 2 \n")
    (tmp_path / "cartwheel_test_split2.txt").write_text("Acrobacias_cartwheel_f_cm_np1_le_med_0.avi 1 \n")
    index = hmdb51_index(tmp_path, split=1)
    assert index.classes == ["brush_hair", "cartwheel"]
    assert [(e.path, e.label, e.split) for e in index.entries] == [
        ("brush_hair/April_09_brush_hair_u_nm_np1_ba_goo_0.avi", 0, "train"),
        ("brush_hair/April_09_brush_hair_u_nm_np1_ba_goo_1.avi", 0, "test"),
        ("cartwheel/Acrobacias_cartwheel_f_cm_np1_le_med_0.avi", 1, "test"),
    ]
    # split 2 without brush_hair's file: read as one class, cartwheel numbered 0 (1 in split 1), without a word
    with pytest.raises(DataError, match=r"no brush_hair_test_split2.txt, though the other splits have that class"):
        hmdb51_index(tmp_path, split=2)
    (tmp_path / "brush_hair_test_split2.txt").write_text("April_09_brush_hair_u_nm_np1_ba_goo_0.avi 2 \n")
    split2 = hmdb51_index(tmp_path, split=2)
    assert split2.classes == ["brush_hair", "cartwheel"] and split2.entries[-1].split == "train"


def test_hmdb51_and_kinetics_files_with_a_byte_order_mark(tmp_path):
    (tmp_path / "cartwheel_test_split1.txt").write_bytes(b"\xef\xbb\xbfb1.avi 1\nb2.avi 2\n")
    assert [e.path for e in hmdb51_index(tmp_path).entries] == ["cartwheel/b1.avi", "cartwheel/b2.avi"]
    csv_file = tmp_path / "k.csv"
    csv_file.write_bytes(b"\xef\xbb\xbflabel,youtube_id,time_start,time_end,split\nabseiling,x,0,10,train\n")
    assert kinetics_index(csv_file, tmp_path).classes == ["abseiling"]


def test_hmdb51_bad_flag_names_file_and_line(tmp_path):
    (tmp_path / "climb_test_split1.txt").write_text("a.avi 1\nb.avi 7\n")
    with pytest.raises(DataError, match="climb_test_split1.txt:2"):
        hmdb51_index(tmp_path)


def test_hmdb51_classes_sort_by_name_as_their_folders_do(tmp_path):
    """'climb' before 'climb_stairs' (the split files' names sort the other way: '_' after 'b'), the order of a
    folder index of the same videos and of the usual HMDB51 label maps."""
    for name in ("climb_stairs", "climb", "kick_ball", "kick"):
        (tmp_path / "splits" / f"{name}_test_split1.txt").parent.mkdir(exist_ok=True)
        (tmp_path / "splits" / f"{name}_test_split1.txt").write_text(f"{name}_0.avi 1\n")
        touch(tmp_path / "videos" / name / f"{name}_0.avi")
    index = hmdb51_index(tmp_path / "splits")
    assert index.classes == ["climb", "climb_stairs", "kick", "kick_ball"]
    assert index.classes == folder_index(tmp_path / "videos", extensions=[".avi"]).classes
    assert all(index.classes[e.label] == e.path.split("/")[0] for e in index.entries)


def test_a_video_listed_twice_is_refused_naming_both_lines(tmp_path):
    make_ucf101_lists(tmp_path / "ucf")
    with (tmp_path / "ucf" / "testlist01.txt").open("ab") as file:
        file.write(b"BaseballPitch/v_BaseballPitch_g10_c03.avi\r\n")
    with pytest.raises(DataError, match=r"testlist01.txt:4: BaseballPitch/v_BaseballPitch_g10_c03.avi is in the test "
                                        r"split here and in the train split at .*trainlist01.txt:3; .*remove one"):
        ucf101_index(tmp_path / "ucf")
    (tmp_path / "hmdb").mkdir()
    (tmp_path / "hmdb" / "kick_test_split1.txt").write_text("a.avi 1\nb.avi 2\na.avi 1\n")
    with pytest.raises(DataError, match=r"kick_test_split1.txt:3: kick/a.avi is listed again \(first at "
                                        r".*kick_test_split1.txt:1\)"):
        hmdb51_index(tmp_path / "hmdb")
    csv_file = tmp_path / "k.csv"
    csv_file.write_text("label,youtube_id,time_start,time_end,split\nabseiling,x,0,10,train\n")
    with pytest.raises(DataError, match=r"k.csv: given twice; give each annotation file once"):
        kinetics_index([csv_file, csv_file], tmp_path)


# ------------------------------------------------------------------------------------------ Kinetics-400

def test_kinetics_csv_and_the_usual_layouts(tmp_path):
    csv_file = tmp_path / "train.csv"
    csv_file.write_text(
        "label,youtube_id,time_start,time_end,split\n"
        "abseiling,--33Lscn6sk,4,14,train\n"
        "arm wrestling,0F7D3q5cHGw,20,30,train\n"
        "cleaning pool,-ohS3FB3Spc,50,60,validate\n"
        "abseiling,zzzmissing1,0,10,train\n")
    root = tmp_path / "k400"
    touch(root / "train" / "abseiling" / "--33Lscn6sk_000004_000014.mp4")
    touch(root / "arm_wrestling" / "0F7D3q5cHGw_000020_000030.mp4")
    touch(root / "-ohS3FB3Spc_000050_000060.mp4")
    index = kinetics_index(csv_file, root)
    assert index.classes == ["abseiling", "arm wrestling", "cleaning pool"]
    assert [(e.path, e.label, e.split, e.group) for e in index.entries] == [
        ("train/abseiling/--33Lscn6sk_000004_000014.mp4", 0, "train", "--33Lscn6sk"),
        ("arm_wrestling/0F7D3q5cHGw_000020_000030.mp4", 1, "train", "0F7D3q5cHGw"),
        ("-ohS3FB3Spc_000050_000060.mp4", 2, "val", "-ohS3FB3Spc"),
        ("train/abseiling/zzzmissing1_000000_000010.mp4", 0, "train", "zzzmissing1"),
    ]
    assert missing_videos(index, root) == ["train/abseiling/zzzmissing1_000000_000010.mp4"]


def test_a_kinetics_index_points_evaluation_to_its_validation_videos(tmp_path, capsys):
    """Kinetics has train and val: the note said to lay a folder out by split or give --test-fraction (--format
    folder), none of which applies."""
    from coclr.cli import main

    (tmp_path / "k.csv").write_text("label,youtube_id,time_start,time_end,split\n"
                                    "abseiling,aaaaaaaaaaa,4,14,train\nabseiling,bbbbbbbbbbb,0,10,validate\n")
    touch(tmp_path / "k400" / "aaaaaaaaaaa_000004_000014.mp4")
    touch(tmp_path / "k400" / "bbbbbbbbbbb_000000_000010.mp4")
    assert main(["data", "index", "--format", "kinetics", "--annotations", str(tmp_path / "k.csv"), "--root",
                 str(tmp_path / "k400"), "--out", str(tmp_path / "k.json")]) == 0
    printed = capsys.readouterr().out
    assert "--test-split val (coclr eval)" in printed and "--test-fraction" not in printed


def test_an_index_of_no_video_is_refused_not_written(tmp_path, capsys):
    """Every video dropped by --drop-missing (a wrong --root), or Kinetics' test CSV (no labels: every row left out
    in silence), wrote an index of 0 videos at exit 0, which `data store` then refused."""
    from coclr.cli import main

    touch(tmp_path / "vids" / "a" / "x.avi")
    (tmp_path / "m.csv").write_text("path,label\na/x.avi,a\n")
    assert main(["data", "index", "--format", "csv", "--annotations", str(tmp_path / "m.csv"), "--root",
                 str(tmp_path), "--drop-missing", "--out", str(tmp_path / "i.json")]) == 2
    assert (f"error: all 1 videos of index 'm' are missing under {tmp_path} (the first: a/x.avi): check --root, "
            "which the paths are relative to") in capsys.readouterr().err
    assert not (tmp_path / "i.json").exists()
    (tmp_path / "k400_test.csv").write_text("label,youtube_id,time_start,time_end,split\n,abc,0,10,test\n"
                                            ",abd,0,10,test\n")
    assert main(["data", "index", "--format", "kinetics", "--annotations", str(tmp_path / "k400_test.csv"),
                 "--root", str(tmp_path / "vids"), "--out", str(tmp_path / "k.json")]) == 2
    said = capsys.readouterr()
    assert (f"note: left out 2 rows without a label (first {tmp_path / 'k400_test.csv'}:2): Kinetics' test CSV has "
            "none") in said.out
    assert "error: index 'kinetics400' lists no video: its annotations name none with a label; nothing written" in \
        said.err
    assert not (tmp_path / "k.json").exists()


def test_kinetics_csv_without_the_columns_is_rejected(tmp_path):
    (tmp_path / "bad.csv").write_text("label,youtube_id\nabseiling,x\n")
    with pytest.raises(DataError, match="bad.csv"):
        kinetics_index(tmp_path / "bad.csv", tmp_path)
    header = "label,youtube_id,time_start,time_end,split\n"
    for body, said in (("abseiling,aaaaaaaaaaa,10,20,train\nabseiling,ccc", r"cut.csv:3: expected the 5 cells of the "
                        r"header \(label,youtube_id,time_start,time_end,split\), got 2"),
                       ('"a\nb",x,1,2,train\nabseiling,y,1,2,train,extra\n',
                        r"cut.csv:4: expected the 5 cells .*got 6"),
                       ("abseiling,x,10,inf,train\n", "cut.csv:2: time_start and time_end must be seconds"),
                       ("abseiling,x,-1,9,train\n", "cut.csv:2: time_start and time_end must be seconds")):
        (tmp_path / "cut.csv").write_text(header + body)  # (an AttributeError and an OverflowError traceback)
        with pytest.raises(DataError, match=said):
            kinetics_index(tmp_path / "cut.csv", tmp_path)


# ---------------------------------------------------------------------------------------- folder and CSV

def test_folder_index(tmp_path):
    for path in ("walk/b.mp4", "walk/a.avi", "run/x.mkv", "run/notes.txt"):
        touch(tmp_path / "videos" / path)
    index = folder_index(tmp_path / "videos")
    assert index.classes == ["run", "walk"]
    assert [(e.path, e.label, e.split) for e in index.entries] == [
        ("run/x.mkv", 0, "train"), ("walk/a.avi", 1, "train"), ("walk/b.mp4", 1, "train")]


def test_a_name_with_a_backslash_is_named_as_such(tmp_path):
    """It was refused as "paths must be relative, with '/' and no '..'", of a relative path, with no remedy."""
    touch(tmp_path / "videos" / "walk" / "a\\b.mp4")
    with pytest.raises(DataError, match=r"'walk/a\\\\b\.mp4': a backslash in a name; rename the file"):
        folder_index(tmp_path / "videos")


def test_folder_index_with_split_folders(tmp_path):
    for path in ("train/walk/a.avi", "train/run/b.avi", "test/walk/c.avi", "val/jump/d.avi"):
        touch(tmp_path / path)
    index = folder_index(tmp_path)
    assert index.classes == ["jump", "run", "walk"]
    assert sorted((e.path, e.label, e.split) for e in index.entries) == [
        ("test/walk/c.avi", 2, "test"), ("train/run/b.avi", 1, "train"), ("train/walk/a.avi", 2, "train"),
        ("val/jump/d.avi", 0, "val")]


def test_folder_without_videos_is_an_error(tmp_path):
    touch(tmp_path / "walk" / "readme.txt")
    with pytest.raises(DataError, match=str(tmp_path)):
        folder_index(tmp_path)


def test_csv_manifest_with_class_names_and_header(tmp_path):
    manifest = tmp_path / "list.csv"
    manifest.write_text("path,label,split\nclips/a.mp4,walk,train\nclips/b.mp4,run,test\nclips/c.mp4,walk,val\n")
    index = csv_index(manifest)
    assert index.name == "list"
    assert index.classes == ["run", "walk"]
    assert [(e.path, e.label, e.split) for e in index.entries] == [
        ("clips/a.mp4", 1, "train"), ("clips/b.mp4", 0, "test"), ("clips/c.mp4", 1, "val")]


def test_csv_manifest_with_integer_labels_and_no_header(tmp_path):
    manifest = tmp_path / "list.csv"
    manifest.write_text("a.mp4,2\nb.mp4,0\n")
    index = csv_index(manifest)
    assert index.classes == ["0", "1", "2"]
    assert [(e.label, e.split) for e in index.entries] == [(2, "train"), (0, "train")]


def test_integer_labels_far_apart_are_class_names(tmp_path):
    """Dates or identifiers as labels were class indices: 20240101 and 20240102 made 20,240,103 classes (65 s, 5 GB
    and a 272 MB index), 101 and 205 made 206 without a word."""
    manifest = tmp_path / "list.csv"
    manifest.write_text("a.mp4,20240102\nb.mp4,20240101\nc.mp4,0020240102\nd.mp4,9\n")
    index = csv_index(manifest)
    assert index.classes == ["9", "20240101", "20240102"]
    assert [e.label for e in index.entries] == [2, 1, 2, 0]


def test_csv_manifest_header_in_any_order_and_digits_int_refuses(tmp_path):
    """A header ``label,path`` was read as a row (a video named "label"); a label "²" passed ``isdigit`` and then
    ``int`` raised a traceback."""
    manifest = tmp_path / "list.csv"
    manifest.write_text("label,split,path\nwalk,test,a.mp4\nrun,train,b.mp4\n")
    index = csv_index(manifest)
    assert [(e.path, index.classes[e.label], e.split) for e in index.entries] == [("a.mp4", "walk", "test"),
                                                                               ("b.mp4", "run", "train")]
    manifest.write_text("a.mp4,²\nb.mp4,1\n")
    assert csv_index(manifest).classes == ["1", "²"]  # class names: not every label is a number


def test_csv_manifest_one_video_under_two_spellings_is_listed_twice(tmp_path):
    """./a.mp4 and a.mp4 made two entries of one file, in train and in test."""
    manifest = tmp_path / "list.csv"
    for twice in ("./pool/p1.mp4", "pool/./p1.mp4", "pool//p1.mp4"):
        manifest.write_text(f"path,label,split\npool/p1.mp4,a,train\n{twice},b,test\n")
        with pytest.raises(DataError, match=r"list\.csv:3: pool/p1\.mp4 is in the test split here and in the train "
                           r"split at .*list\.csv:2; a video belongs to one split"):
            csv_index(manifest)


def test_csv_manifest_bad_split_names_the_line(tmp_path):
    manifest = tmp_path / "list.csv"
    manifest.write_text("a.mp4,0,train\nb.mp4,0,holdout\n")
    with pytest.raises(DataError, match="list.csv:2"):
        csv_index(manifest)
    manifest.write_text('path,label\n"new\nline.mp4",a\n\nb.mp4,b,train,g,extra\n')  # a name with a line break
    with pytest.raises(DataError, match="list.csv:5: expected"):  # the file's line (it said 3)
        csv_index(manifest)


# ------------------------------------------------------------------------------------ index and checking

def test_json_round_trip_is_atomic_and_lossless(tmp_path):
    index = VideoIndex("demo", ["a", "b"], [VideoEntry("a/1.avi", 0, "train", "g01"), VideoEntry("b/2.avi", 1, "test")])
    index.save(tmp_path / "out" / "index.json")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["index.json"]
    assert VideoIndex.load(tmp_path / "out" / "index.json") == index
    assert json.loads((tmp_path / "out" / "index.json").read_text())["entries"][0]["group"] == "g01"


def test_loading_a_non_index_names_the_file(tmp_path):
    (tmp_path / "x.json").write_text('{"hello": 1}')
    with pytest.raises(DataError, match="x.json"):
        VideoIndex.load(tmp_path / "x.json")


def test_a_manifest_s_repeated_video_and_one_hmdb51_split_file_are_named(tmp_path):
    """A CSV listing a video twice (once as ./A/x.avi) was "index 'm' is invalid: A/x.avi: listed twice", naming
    no line; one HMDB51 split file given for the folder was "no split files found in" that file."""
    (tmp_path / "m.csv").write_text("A/x.avi,0\nB/y.avi,1\n./A/x.avi,1\n")
    with pytest.raises(DataError, match=rf"^{tmp_path / 'm.csv'}:3: A/x\.avi is listed again \(first at "
                       rf"{tmp_path / 'm.csv'}:1\); remove one of the two lines$"):
        csv_index(tmp_path / "m.csv")
    (tmp_path / "hmdb").mkdir()
    (tmp_path / "hmdb" / "climb_test_split1.txt").write_text("a.avi 1\n")
    with pytest.raises(DataError, match=r"climb_test_split1\.txt: a file; give the folder that holds the split "
                       r"files '\*_test_split1\.txt'"):
        hmdb51_index(tmp_path / "hmdb" / "climb_test_split1.txt")


def test_invalid_entries_are_rejected():
    with pytest.raises(DataError, match="a/1.avi: listed in the train split and in the test split"):
        VideoIndex("d", ["a"], [VideoEntry("a/1.avi", 0, "train"), VideoEntry("a/1.avi", 0, "test")])
    with pytest.raises(DataError, match="a/1.avi: listed twice in the test split"):
        VideoIndex("d", ["a"], [VideoEntry("a/1.avi", 0, "test"), VideoEntry("a/1.avi", 0, "test")])
    with pytest.raises(DataError, match="label 3"):
        VideoIndex("d", ["a"], [VideoEntry("a/1.avi", 3, "train")])
    with pytest.raises(DataError, match="relative"):
        VideoIndex("d", ["a"], [VideoEntry("../1.avi", 0, "train")])


@pytest.mark.parametrize("edit, problem", [
    (lambda d: d.update(entries={}), r'"entries" must be a list of videos, got \'dict\''),
    (lambda d: d["entries"][1].update(path=None), r'entry 1: "path" must be the video\'s path \(text\), got None'),
    (lambda d: d["entries"][0].update(label=1.5), r'entry 0 \(a/1\.avi\): "label" must be a class number or null, '
                                                  r"got 1\.5"),
    (lambda d: d["entries"][0].update(label=True), r'"label" must be a class number or null, got True'),
    (lambda d: d["entries"][0].pop("label"), r'"label" must be a class number or null, got None'),
    (lambda d: d["entries"][0].update(split=1), r'"split" must be one of train, val, test, got 1'),
    (lambda d: d.update(classes="ab"), r'"classes" must be a list of class names'),
])
def test_a_malformed_index_file_is_named_with_its_entry(tmp_path, edit, problem):
    """An index edited by hand: "entries": {} built an empty store with exit status 0, a null path was looked for
    as a video named "None", a label of 1.5 was taken as 1."""
    index = VideoIndex("demo", ["a", "b"], [VideoEntry("a/1.avi", 0, "train"), VideoEntry("b/2.avi", 1, "test")])
    data = index.to_dict()
    edit(data)
    (tmp_path / "index.json").write_text(json.dumps(data))
    with pytest.raises(DataError, match=rf"index\.json: malformed index: (entry 0 \(a/1\.avi\): )?{problem}"):
        VideoIndex.load(tmp_path / "index.json")


def test_a_store_of_an_index_without_videos_is_refused(tmp_path):
    from coclr.store.build import build_store

    (tmp_path / "videos").mkdir()
    with pytest.raises(DataError, match="index 'empty' lists no videos: nothing to decode"):
        build_store(VideoIndex("empty", ["a"], []), tmp_path / "videos", tmp_path / "store")
    assert not (tmp_path / "store").exists()


def test_missing_videos_are_reported_together(tmp_path):
    entries = [VideoEntry(f"c/v{i:02d}.avi", 0, "train") for i in range(45)]
    index = VideoIndex("demo", ["c"], entries)
    for i in range(0, 45, 3):
        touch(tmp_path / f"c/v{i:02d}.avi")
    expected_missing = [f"c/v{i:02d}.avi" for i in range(45) if i % 3]
    assert missing_videos(index, tmp_path) == expected_missing
    with pytest.raises(DataError) as error:
        check_videos_exist(index, tmp_path)
    message = str(error.value)
    assert "30 of the 45 videos" in message and str(tmp_path) in message
    assert all(path in message for path in expected_missing[:20])  # the first 20 are named
    assert expected_missing[20] not in message and "and 10 more" in message
    check_videos_exist(index.without(expected_missing), tmp_path)


def test_counts(tmp_path):
    index = VideoIndex("d", ["a", "b", "c"], [VideoEntry("1", 0, "train"), VideoEntry("2", 2, "train"),
                                             VideoEntry("3", 2, "test")])
    assert index.split_counts() == {"train": 2, "test": 1}
    assert index.class_counts() == [1, 0, 2]
    assert index.class_counts("train") == [1, 0, 1]
    assert len(index.split("test")) == 1 and index.split("test").classes == ["a", "b", "c"]


def test_a_symlink_loop_and_videos_reached_twice_are_reported(tmp_path):
    """`train/zz_loop -> ../train` used to add a class holding copies of every training video."""
    root = tmp_path / "data"
    for path in ("train/walk/a.avi", "train/run/b.avi", "test/walk/c.avi"):
        touch(root / path)
    (root / "train" / "zz_loop").symlink_to("../train")
    with pytest.raises(DataError, match=r"loop\): train/zz_loop -> \.\./train"):
        folder_index(root)
    (root / "train" / "zz_loop").unlink()
    (root / "train" / "walk" / "again.avi").symlink_to("a.avi")
    with pytest.raises(DataError, match=r"reached by two paths: train/walk/again\.avi \(also train/walk/a\.avi\)"):
        folder_index(root)
    (root / "train" / "walk" / "again.avi").unlink()
    touch(tmp_path / "elsewhere" / "jump" / "d.avi")
    (root / "train" / "jump").symlink_to(tmp_path / "elsewhere" / "jump")  # a linked class folder is fine
    index = folder_index(root)
    assert sorted(e.path for e in index.entries) == ["test/walk/c.avi", "train/jump/d.avi", "train/run/b.avi",
                                                      "train/walk/a.avi"]


def test_a_plain_class_folder_is_split_by_source_group(tmp_path):
    """UCF101-named clips group by source (v_<Class>_g<XX>), nested clips by their subfolder; the split is
    deterministic, keeps each group on one side and moves no group when videos are added."""
    for group in range(1, 7):
        for clip in range(1, 4):
            touch(tmp_path / "videos" / "Archery" / f"v_Archery_g{group:02d}_c{clip:02d}.avi")
    for source in ("s1", "s2", "s3", "s4"):
        for clip in ("x", "y"):
            touch(tmp_path / "videos" / "walk" / source / f"{clip}.mp4")
    index = folder_index(tmp_path / "videos", test_fraction=0.34, seed=1)
    by_group: dict[str, set[str]] = {}
    for entry in index.entries:
        by_group.setdefault(entry.group, set()).add(entry.split)
    assert all(len(splits) == 1 for splits in by_group.values())
    assert {g for g in by_group if g.startswith("walk/")} == {"walk/s1", "walk/s2", "walk/s3", "walk/s4"}
    counts = index.split_counts()  # about a third of each class's groups: 1 to 3 of 6 Archery's, 1 to 2 of 4 walk's
    assert counts["train"] + counts["test"] == 26 and 3 * 1 + 2 * 1 <= counts["test"] <= 3 * 3 + 2 * 2
    assert folder_index(tmp_path / "videos", test_fraction=0.34, seed=1) == index
    assert folder_index(tmp_path / "videos", test_fraction=0.34, seed=2) != index
    touch(tmp_path / "videos" / "walk" / "s5" / "z.mp4")
    grown = {e.path: e.split for e in folder_index(tmp_path / "videos", test_fraction=0.34, seed=1).entries}
    assert all(grown[e.path] == e.split for e in index.entries if e.path.startswith("Archery"))
    with pytest.raises(DataError, match="already laid out by split"):
        touch(tmp_path / "bysplit" / "train" / "walk" / "a.avi")
        folder_index(tmp_path / "bysplit", test_fraction=0.2)


def test_cli_folder_index_says_when_there_is_no_test_split_and_splits_on_request(tmp_path, capsys):
    from coclr.cli import main

    for clip in range(4):
        touch(tmp_path / "videos" / "walk" / f"{clip}.mp4")
        touch(tmp_path / "videos" / "run" / f"{clip}.mp4")
    assert main(["data", "index", "--format", "folder", "--root", str(tmp_path / "videos"),
                 "--out", str(tmp_path / "a.json")]) == 0
    assert "no video is in a test split" in capsys.readouterr().out
    assert main(["data", "index", "--format", "folder", "--root", str(tmp_path / "videos"), "--test-fraction", "0.25",
                 "--out", str(tmp_path / "b.json")]) == 0
    assert "(train 6, test 2)" in capsys.readouterr().out
    assert main(["data", "index", "--format", "csv", "--annotations", str(tmp_path / "a.json"), "--test-fraction",
                 "0.25", "--out", str(tmp_path / "c.json")]) == 2
    assert "--test-fraction applies to --format folder" in capsys.readouterr().err
    videos = ["--root", str(tmp_path / "videos")]
    for given, said in (([*videos, "--annotations", "x"], "--annotations applies to --format ucf101, hmdb51"),
                        ([*videos, "--split", "2"], "--split applies to --format ucf101 and hmdb51"),
                        ([*videos, "--seed", "5"], "--seed applies with --test-fraction")):  # each ignored, exit 0
        assert main(["data", "index", "--format", "folder", *given, "--out", str(tmp_path / "d.json")]) == 2
        assert said in capsys.readouterr().err and not (tmp_path / "d.json").exists()
    assert main(["data", "index", "--format", "csv", "--annotations", str(tmp_path / "a.json"), "--drop-missing",
                 "--out", str(tmp_path / "d.json")]) == 2
    assert "--drop-missing needs --root" in capsys.readouterr().err


def test_a_store_kept_inside_the_video_folder_is_not_read_as_a_class_or_as_videos(tmp_path):
    from coclr.atomic import atomic_write_json
    from coclr.video.decode import why_not_video
    from coclr.video.indexes import folder_index, tree_index
    from test_embed import moving_square, write_video

    for kind in ("left", "right"):
        write_video(tmp_path / "videos" / kind / f"{kind}.mp4", moving_square(4))
    store = tmp_path / "videos" / "store"
    write_video(store / "rgb" / "left" / "left.mp4.frames", moving_square(4))  # what PyAV would read as a video
    atomic_write_json(store / "store.json", {"format": "coclr-clip-store"})
    assert why_not_video(store / "rgb" / "left" / "left.mp4.frames") == "its name ends in .frames"
    for index in (folder_index(tmp_path / "videos", notes=(notes := [])),
                  tree_index(tmp_path / "videos", notes=(tree_notes := []))):
        assert sorted(entry.path for entry in index.entries) == ["left/left.mp4", "right/right.mp4"]
    assert folder_index(tmp_path / "videos").classes == ["left", "right"]
    for said in (notes, tree_notes):
        assert any("left out 1 folder(s) of coclr's own outputs: store (coclr data store)" in line for line in said)


def test_split_folders_in_any_case_and_beside_other_folders(tmp_path):
    from coclr.video.indexes import folder_index
    from test_embed import moving_square, write_video

    for split, kind in (("Train", "left"), ("Train", "right"), ("Test", "left")):
        write_video(tmp_path / "videos" / split / kind / f"{kind}.mp4", moving_square(4))
    index = folder_index(tmp_path / "videos")
    assert index.classes == ["left", "right"]  # not "Train" and "Test"
    assert sorted((entry.path, entry.split) for entry in index.entries) == [
        ("Test/left/left.mp4", "test"), ("Train/left/left.mp4", "train"), ("Train/right/right.mp4", "train")]
    (tmp_path / "videos" / "__MACOSX").mkdir()  # an archive's folder beside the splits
    with pytest.raises(DataError, match=r"holds split folders \(Test, Train\) beside other folders \(__MACOSX\)"):
        folder_index(tmp_path / "videos")


def test_a_link_to_nothing_named_as_a_video_is_a_missing_video(tmp_path, capsys):
    """Which files are videos is one rule (coclr.video.decode.why_not_video): a link to nothing named as a video is
    one, as coclr embed takes it (that input's failure). The index skipped it as "not a video", and `data store`
    then reported every video done with it left out; it is a missing video, refused as one (--drop-missing leaves
    it out). A link to nothing named otherwise is skipped, said."""
    from coclr.cli import main
    from coclr.video.indexes import tree_index
    from test_embed import moving_square, write_video

    write_video(tmp_path / "videos" / "a.mp4", moving_square(4))
    (tmp_path / "videos" / "gone.mp4").symlink_to(tmp_path / "nowhere.mp4")
    (tmp_path / "videos" / "notes.txt").symlink_to(tmp_path / "nowhere.txt")
    notes: list[str] = []
    assert [entry.path for entry in tree_index(tmp_path / "videos", notes=notes).entries] == ["a.mp4", "gone.mp4"]
    assert any("skipped 1 files that are not videos (notes.txt: a link to "
               f"{tmp_path / 'nowhere.txt'}, which does not exist)" in note for note in notes), notes
    args = ["data", "index", "--format", "folder", "--unlabelled", "--root", str(tmp_path / "videos"), "--out",
            str(tmp_path / "index.json")]
    assert main(args) == 2 and not (tmp_path / "index.json").exists()
    assert ("1 of the 2 videos of index 'videos' are missing under " f"{tmp_path / 'videos'}: gone.mp4 (a link to "
            f"{tmp_path / 'nowhere.mp4'}, which does not exist); restore them, or give --drop-missing to leave them "
            "out") in capsys.readouterr().err
    # a folder named as a video and a link in a loop were "missing" and "a link to nothing" too
    from coclr.errors import DataError
    from coclr.video.indexes import VideoEntry, VideoIndex, check_videos_exist

    (tmp_path / "videos" / "dir.mp4").mkdir()
    (tmp_path / "videos" / "loop.mp4").symlink_to("loop.mp4")
    index = VideoIndex("v", ["x"], [VideoEntry(name, 0, "train") for name in ("a.mp4", "dir.mp4", "loop.mp4")])
    with pytest.raises(DataError, match=r"dir\.mp4 \(a folder, not a video file\), loop\.mp4 \(a symbolic link in "
                       r"a loop \(it leads back to itself\), not a video file\)$"):
        check_videos_exist(index, tmp_path / "videos")
    assert main([*args, "--drop-missing"]) == 0
    assert [entry["path"] for entry in json.loads((tmp_path / "index.json").read_text())["entries"]] == ["a.mp4"]


def test_classes_a_split_lacks_and_names_alike_are_said(tmp_path, capsys):
    """train/café (NFC) beside test/café (NFD), or train/c beside test/C: two classes, each in one split, without a
    word; every test video of them a miss."""
    import unicodedata

    from coclr.cli import main

    for split, name in (("train", unicodedata.normalize("NFC", "café")), ("test", unicodedata.normalize("NFD", "café")),
                        ("train", "tea"), ("test", "tea")):
        folder = tmp_path / "videos" / split / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{split}.mp4").write_bytes(b"")
    assert main(["data", "index", "--format", "folder", "--root", str(tmp_path / "videos"), "--out",
                 str(tmp_path / "index.json")]) == 0
    out = capsys.readouterr().out
    assert "1 class(es) have test videos and no training video" in out
    assert "differ only in case or Unicode form" in out


def test_a_named_pipe_among_the_videos_is_said_not_opened(tmp_path, capsys):
    """A FIFO named pipe.mp4 was dropped from the index without a word, and embed called it "not found"."""
    import os

    from coclr.cli import main
    from coclr.errors import VideoDecodeError
    from coclr.video.decode import probe_video

    (tmp_path / "videos" / "a").mkdir(parents=True)
    (tmp_path / "videos" / "a" / "v.mp4").write_bytes(b"x")
    os.mkfifo(tmp_path / "videos" / "a" / "pipe.mp4")
    assert main(["data", "index", "--format", "folder", "--unlabelled", "--root", str(tmp_path / "videos"), "--out",
                 str(tmp_path / "index.json")]) == 0
    assert "pipe.mp4" in capsys.readouterr().out
    with pytest.raises(VideoDecodeError, match="not a regular file"):
        probe_video(tmp_path / "videos" / "a" / "pipe.mp4")


def test_one_video_under_two_spellings_is_listed_twice_in_every_format(tmp_path):
    """``Class/./v.avi`` in the test list beside ``Class/v.avi`` in the train list: one video in both splits (an
    evaluation on videos trained on), indexed and stored twice without a word; a hand-written index too."""
    make_ucf101_lists(tmp_path / "ucf")
    with (tmp_path / "ucf" / "testlist01.txt").open("ab") as file:
        file.write(b"BaseballPitch/./v_BaseballPitch_g10_c03.avi\r\n")
    with pytest.raises(DataError, match=r"testlist01.txt:4: BaseballPitch/v_BaseballPitch_g10_c03.avi is in the test "
                                        r"split here and in the train split"):
        ucf101_index(tmp_path / "ucf")
    (tmp_path / "hmdb").mkdir()
    (tmp_path / "hmdb" / "climb_test_split1.txt").write_text("a.avi 1\n./a.avi 2\n")
    with pytest.raises(DataError, match=r"climb_test_split1.txt:2: climb/a.avi is in the test split here"):
        hmdb51_index(tmp_path / "hmdb")
    with pytest.raises(DataError, match=r"'a//b.mp4': write the path in its plain form, 'a/b.mp4'"):
        VideoIndex("x", ["a"], [VideoEntry("a//b.mp4", 0, "train")])
    with pytest.raises(DataError, match=r"ucf/classInd.txt: a file; give the folder that holds classInd.txt"):
        ucf101_index(tmp_path / "ucf" / "classInd.txt")


def test_lists_that_are_not_utf8_are_one_line(tmp_path):
    """A latin-1 split list was read with the byte replaced (the index then held a path no file has, or said the
    video was missing); a latin-1 or UTF-16 Kinetics CSV was a UnicodeDecodeError's traceback."""
    make_ucf101_lists(tmp_path / "ucf")
    with (tmp_path / "ucf" / "testlist01.txt").open("ab") as file:
        file.write(b"BaseballPitch/v_caf\xe9.avi\r\n")
    with pytest.raises(DataError, match=r"testlist01.txt: not UTF-8 text \(byte 0xe9 .*save it as UTF-8"):
        ucf101_index(tmp_path / "ucf")
    for name, data in (("latin.csv", b"label,youtube_id,time_start,time_end,split\ncaf\xe9,a,0,10,train\n"),
                       ("wide.csv", "label,youtube_id,time_start,time_end,split\n".encode("utf-16"))):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(DataError, match=rf"{name}: (not UTF-8|UTF-16) text"):
            kinetics_index(tmp_path / name, tmp_path)
    with pytest.raises(DataError, match=r"ucf: a folder, not an annotation CSV"):
        kinetics_index(tmp_path / "ucf", tmp_path)


def test_a_train_val_index_says_which_classes_have_no_training_video(tmp_path, capsys):
    """Kinetics' layout (train and val, no test): the notes of classes were never printed."""
    from coclr.cli import main

    (tmp_path / "k.csv").write_text("label,youtube_id,time_start,time_end,split\nAbseiling,aaaaaaaaaaa,4,14,train\n"
                                    "abseiling,bbbbbbbbbbb,0,10,validate\nkissing,ccccccccccc,0,10,validate\n")
    for name in ("aaaaaaaaaaa_000004_000014", "bbbbbbbbbbb_000000_000010", "ccccccccccc_000000_000010"):
        touch(tmp_path / "k400" / f"{name}.mp4")
    assert main(["data", "index", "--format", "kinetics", "--annotations", str(tmp_path / "k.csv"), "--root",
                 str(tmp_path / "k400"), "--out", str(tmp_path / "k.json")]) == 0
    out = capsys.readouterr().out
    assert "2 class(es) have val videos and no training video ('abseiling', 'kissing')" in out, out
    assert "the classes 'Abseiling' and 'abseiling' differ only in case" in out


def test_unlabelled_footage_laid_out_by_split_keeps_its_splits(tmp_path, capsys):
    """train/ and test/ folders of unlabelled footage: every video went to train (an evaluation's test videos
    among those trained on), without a word."""
    from coclr.video.indexes import tree_index

    for path in ("train/cam1/a.mp4", "train/cam2/b.mp4", "Test/cam3/c.mp4", "val/d.mp4", "train/e.mp4",
                 "train/f.mp4"):
        touch(tmp_path / "split" / path)
    index = tree_index(tmp_path / "split")
    # a group is the source folder below the split folder: train/e.mp4 and train/f.mp4 were both of group "train"
    # (each other's positive under group_positives), where a video at the top of a flat folder has none
    assert sorted((e.path, e.split, e.group) for e in index.entries) == [
        ("Test/cam3/c.mp4", "test", "cam3"), ("train/cam1/a.mp4", "train", "cam1"),
        ("train/cam2/b.mp4", "train", "cam2"), ("train/e.mp4", "train", None), ("train/f.mp4", "train", None),
        ("val/d.mp4", "val", None)]
    with pytest.raises(DataError, match="laid out by split already"):
        tree_index(tmp_path / "split", test_fraction=0.2)
    for path in ("footage/a.mp4", "test/b.mp4"):
        touch(tmp_path / "mixed" / path)
    notes: list[str] = []
    assert {e.split for e in tree_index(tmp_path / "mixed", notes=notes).entries} == {"train"}
    assert any("1 videos under test/ or val/ folders are indexed as training videos" in note for note in notes)


def test_an_empty_name_and_store_options_out_of_range_are_refused_by_their_flags(tmp_path, capsys):
    """``--name ''`` was ignored (the dataset's name kept, without a word); a store's --short-side, --fps or
    --quality out of range was refused naming the Python key (``short_side:``), not the flag."""
    from coclr.cli import main

    touch(tmp_path / "videos" / "a" / "v.mp4")
    assert main(["data", "index", "--format", "folder", "--root", str(tmp_path / "videos"), "--name", " ", "--out",
                 str(tmp_path / "index.json")]) == 2
    assert "--name: empty" in capsys.readouterr().err and not (tmp_path / "index.json").exists()
    assert main(["data", "index", "--format", "folder", "--root", str(tmp_path / "videos"), "--out",
                 str(tmp_path / "index.json")]) == 0
    for flag, value in (("--short-side", "-5"), ("--fps", "0"), ("--quality", "101"), ("--workers", "-2")):
        capsys.readouterr()
        assert main(["data", "store", "--index", str(tmp_path / "index.json"), "--root", str(tmp_path / "videos"),
                     "--out", str(tmp_path / "store"), flag, value]) == 2
        assert f"error: {flag}: " in capsys.readouterr().err, flag
        assert not (tmp_path / "store").exists()


def test_an_index_given_as_a_folder_is_named_a_folder(tmp_path):
    """`data store --index UCF` with UCF a folder said "index file not found: UCF" of a folder that is there."""
    with pytest.raises(DataError, match="a folder, not an index file: give the index file `coclr data index` wrote"):
        VideoIndex.load(tmp_path)
