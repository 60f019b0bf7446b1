"""Each export format of an encoder run beside the PyTorch encoder on real clips: the differences of the features.

`coclr export` checks its output on noise clips of the encoder's shape (or the clips it is given); this runs the
three formats of ENCODER on every window of the real videos of a folder, as `coclr embed` cuts and normalises them
(the clip settings the encoder recorded), and prints, per format, the largest difference of the features, its ratio
to their largest magnitude and the smallest cosine, with the milliseconds per clip of its runtime and of PyTorch's
eager backbone on the same clips (A B B A after a warm-up, one thread, loading excluded).

    python benchmarks/export_check.py --encoder L/encoder_rgb.pth --videos ../shared/data/clips --work /tmp/export
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from coclr.models.export import compare, run_exported
from coclr.models.exported import export_encoder
from coclr.models.loading import load_encoder, read_clip_settings


def window_clips(videos: Path, settings: dict, most: int) -> torch.Tensor:
    """Every window of the videos (non-overlapping clips of the recorded length), centre-cropped and normalised as
    the encoder's training normalised them."""
    from coclr.video.decode import decode_video

    length, size = settings["length"], settings["size"]
    mean, std = torch.tensor(settings["mean"]), torch.tensor(settings["std"])
    clips = []
    for path in sorted(videos.iterdir()):
        frames = decode_video(path, short_side=settings.get("short_side") or size)
        top, left = (frames.shape[1] - size) // 2, (frames.shape[2] - size) // 2
        for start in range(0, len(frames) - length + 1, length):
            clip = torch.from_numpy(frames[start:start + length, top:top + size, left:left + size].astype(np.float32))
            clips.append(((clip / 255.0 - mean) / std).permute(3, 0, 1, 2))
    return torch.stack(clips[:most])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--encoder", required=True, help="an RGB encoder with recorded clip settings")
    parser.add_argument("--videos", required=True, help="a folder of videos")
    parser.add_argument("--work", required=True, help="folder for the exports (kept: reruns reuse them)")
    parser.add_argument("--clips", type=int, default=256, help="most windows compared")
    args = parser.parse_args()
    torch.set_num_threads(1)
    settings = read_clip_settings(args.encoder)
    if settings.get("view") != "rgb":
        raise SystemExit(f"{args.encoder}: an RGB encoder is needed (it recorded view {settings.get('view')!r})")
    clips = window_clips(Path(args.videos), settings, args.clips)
    backbone, _ = load_encoder(args.encoder)
    with torch.no_grad():
        reference = backbone(clips).mean(dim=(2, 3, 4)).numpy()
    print(f"{args.encoder}: {len(clips)} windows of {args.videos}, clips {tuple(clips.shape[1:])}, one thread")
    for fmt in ("safetensors", "torchscript", "onnx"):
        exported = export_encoder(args.encoder, fmt, Path(args.work) / fmt, clips=clips[:4])
        if fmt == "safetensors":
            read, _ = load_encoder(exported.model)
            with torch.no_grad():
                found = read(clips).mean(dim=(2, 3, 4)).numpy()
        else:
            found = run_exported(exported.model, fmt, clips)
        figures = compare(reference, found)

        def pytorch() -> None:
            with torch.no_grad():
                backbone(clips)

        if fmt == "onnx":
            import onnxruntime

            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = options.inter_op_num_threads = 1
            session = onnxruntime.InferenceSession(str(exported.model), options, providers=["CPUExecutionProvider"])

            def runtime(session=session) -> None:
                session.run(None, {"clips": clips.numpy()})
        else:
            network = torch.jit.load(str(exported.model)) if fmt == "torchscript" else read

            def runtime(network=network) -> None:
                with torch.no_grad():
                    network(clips)

        pytorch()
        runtime()  # once untimed: TorchScript optimises its graph on the first calls
        runtime()
        seconds = {"pytorch": 0.0, fmt: 0.0}
        for name, work in (("pytorch", pytorch), (fmt, runtime), (fmt, runtime), ("pytorch", pytorch)):
            begin = time.perf_counter()
            work()
            seconds[name] += (time.perf_counter() - begin) / 2
        speed = (f"; {1000 * seconds[fmt] / len(clips):.2f} ms a clip, PyTorch "
                 f"{1000 * seconds['pytorch'] / len(clips):.2f}")
        print(f"  {fmt}: largest difference {figures['max_difference']:.3g} ({figures['relative_difference']:.3g} "
              f"of the largest feature), smallest cosine {figures['min_cosine']:.8f}{speed}")


if __name__ == "__main__":
    main()
