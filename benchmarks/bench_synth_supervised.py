"""How learnable the synthetic classes are for the demo's networks, with labels (an upper bound for the demo).

Generates a synthetic dataset (``key=value`` options of ``coclr data synth``), then trains an S3D of the
demo's size with cross-entropy on the train scenes and prints the train accuracy and the top-1 accuracy on
the unseen test scenes (centre crop, eval-mode BatchNorm) every few epochs. ``--baseline`` trains a plain
3-layer 3D CNN (3x3x3 convolutions at full resolution) instead, for comparison; ``--static`` repeats the
first frame of every clip, so only appearance is left. If the supervised S3D stays near chance, no
contrastive RGB method can beat chance on that data (docs/synth.md has the figures that shaped the demo's
dataset). ``--view flow`` trains on TV-L1 flow instead (extracted into the store first, resumably): the
upper bound for the flow rows, and for the positives that flow mines for CoCLR-RGB. A benchmark (minutes),
not a test.

    python benchmarks/bench_synth_supervised.py --out /tmp/sup [--view flow] [--epochs 64] [key=value ...]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

from coclr.config import load_config
from coclr.data.augment import ClipAugment, center_crop
from coclr.data.datasets import TrainClips
from coclr.models.encoder import build_encoder
from coclr.store.flow_extract import extract_flow
from coclr.synth import SynthConfig, generate_synthetic


class Plain3dCnn(nn.Module):
    """Three 3x3x3 conv-BN-ReLU layers (16, 32, 64 channels) with pooling: the baseline network."""

    def __init__(self) -> None:
        super().__init__()
        layers, channels = [], 3
        for out, pool in ((16, (1, 2, 2)), (32, 2), (64, None)):
            layers += [nn.Conv3d(channels, out, 3, padding=1), nn.BatchNorm3d(out), nn.ReLU()]
            layers += [nn.MaxPool3d(pool)] if pool else []
            channels = out
        self.net = nn.Sequential(*layers)
        self.out_channels = channels

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).mean(dim=(2, 3, 4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder of the generated dataset (reused if present)")
    parser.add_argument("--epochs", type=int, default=64)
    parser.add_argument("--every", type=int, default=8, help="evaluate every N epochs")
    parser.add_argument("--width", type=float, default=0.125, help="S3D width multiplier")
    parser.add_argument("--length", type=int, default=8)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--baseline", action="store_true", help="plain 3D CNN instead of S3D")
    parser.add_argument("--static", action="store_true", help="repeat the first frame (appearance only)")
    parser.add_argument("--view", choices=("rgb", "flow"), default="rgb",
                        help="train on RGB frames or on TV-L1 flow (extracted into the store if missing)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("overrides", nargs="*", help="synthetic dataset options, key=value")
    args = parser.parse_args()
    if args.static and args.view == "flow":
        parser.error("--static repeats RGB frames; it does not apply to --view flow")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    config = load_config(SynthConfig, overrides=args.overrides)
    print(generate_synthetic(args.out, config, workers=2), flush=True)
    view = args.view
    if view == "flow":
        print(extract_flow(args.out, backend="tvl1", view="flow", workers=2), flush=True)
    train = TrainClips(args.out, "train", [view], args.length, num_clips=1, seed=0)
    test = TrainClips(args.out, "test", [view], args.length, num_clips=1, seed=0)
    network = Plain3dCnn() if args.baseline else build_encoder(width=args.width, embed_dim=None)
    dim = network.out_channels if args.baseline else network.backbone.out_channels
    classifier = nn.Linear(dim, config.num_classes)
    optimiser = torch.optim.Adam([*network.parameters(), *classifier.parameters()], args.lr)
    augment = ClipAugment(size=args.size, crop_area=[0.6, 1.0], jitter_p=0.0, gray_p=0.0, blur_p=0.0)
    loader = torch.utils.data.DataLoader(train, batch_size=args.batch_size, shuffle=True, drop_last=True)
    generator = torch.Generator().manual_seed(0)

    def still(x: torch.Tensor) -> torch.Tensor:
        return x[:, :, :1].expand_as(x).contiguous() if args.static else x

    test_clips = torch.stack([test[i][view][0] for i in range(len(test))])
    test_labels = torch.stack([test[i]["label"] for i in range(len(test))])
    name = "3D CNN" if args.baseline else f"S3D width {args.width}"
    print(f"{name} on {view}: {len(train)} train clips, {len(test)} test clips, "
          f"chance {1 / config.num_classes:.3f}")
    started, step = time.time(), 0
    for epoch in range(args.epochs):
        train.set_epoch(epoch)
        correct = seen = 0
        for batch in loader:
            x = still(augment({view: batch[view][:, 0]}, generator)[view])
            logits = classifier(network.features(x))
            loss = F.cross_entropy(logits, batch["label"])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            correct += int((logits.argmax(1) == batch["label"]).sum())
            seen += len(x)
            step += 1
        if (epoch + 1) % args.every == 0 or epoch + 1 == args.epochs:
            network.eval()
            with torch.no_grad():
                clips = center_crop({view: test_clips}, args.size)[view]
                predicted = classifier(network.features(still(clips))).argmax(1)
            network.train()
            accuracy = float((predicted == test_labels).float().mean())
            print(f"epoch {epoch + 1} step {step}: train accuracy {correct / seen:.2f}, test accuracy "
                  f"{accuracy:.2f} ({time.time() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
