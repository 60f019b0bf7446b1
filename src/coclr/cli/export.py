"""``coclr export``: an encoder as safetensors, ONNX or TorchScript, with its config and model card, checked."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export", help="write an encoder as safetensors, ONNX or TorchScript, with its config and a model card",
        description="Write ENCODER (any checkpoint coclr reads: ours, the CoCLR authors', torchvision's s3d) into "
        "the folder OUT as model.safetensors (tensors and a JSON config; coclr.load_encoder reads it), model.onnx "
        "or model.pt (TorchScript): the network from normalised clips [B, C, T, H, W] to pooled features [B, D]. "
        "OUT also gets config.json (network, view, clip shape, normalisation, feature dimension) and README.md (how "
        "it was trained, how to load it). A network is run beside the PyTorch encoder and kept only when its "
        "features agree (cosine >= 0.9999 on every clip); safetensors is read back and compared. The same command "
        "on the same OUT returns at once; another encoder or format is refused.")
    parser.add_argument("encoder", metavar="ENCODER", help="the encoder checkpoint (e.g. coclr learn's "
                        "encoder_rgb.pth)")
    parser.add_argument("--format", required=True, help="safetensors, onnx (needs coclr[export]) or torchscript")
    parser.add_argument("--out", required=True, help="output folder: new or empty (created), or one the same "
                        "export wrote")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from coclr.atomic import read_json_record
    from coclr.errors import DataError
    from coclr.learn.stages import card_notes
    from coclr.models.exported import export_encoder
    from coclr.models.loading import open_checkpoint

    encoder = Path(args.encoder)
    notes: list[str] = []
    collapsed = False
    try:
        learnt = read_json_record(encoder.parent / "learn.json") if encoder.is_file() else None
    except DataError:  # (not a learn run's record: the card goes without its notes)
        learnt = None
    if learnt:  # an encoder a coclr learn folder exported: the card says how it was chosen and measured
        payload = open_checkpoint(encoder).payload
        meta = payload.get("meta") if isinstance(payload, dict) else None
        stage = meta.get("stage") if isinstance(meta, dict) else None
        listed = learnt.get("exported")
        exported = {f"encoder_{view}{suffix}": entry for view, entry in
                    (listed.items() if isinstance(listed, dict) else ()) if isinstance(entry, dict)
                    for suffix in (".pth", ".safetensors")}
        entry = exported.get(encoder.name) or {}
        if stage is not None and entry.get("stage") == stage:  # (not any file put beside a learn.json)
            notes = card_notes(learnt, stage)
            collapsed = bool(entry.get("collapsed"))
    print(export_encoder(encoder, args.format, args.out, notes=notes), flush=True)
    if collapsed:  # (exported as asked, as an evaluation measures it: said, and on its card)
        print(f"coclr export: note: {encoder} is a collapsed encoder (its learn.json: every stage of its view "
              "collapsed); its features carry nothing, and its model card says so", file=sys.stderr, flush=True)
    return 0
