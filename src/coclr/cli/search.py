"""``coclr search``: the nearest videos (or windows) of a query in a ``coclr embed`` output folder."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "search", help="nearest videos or windows of a query video in a coclr embed folder",
        description="Find the videos of DIR (or, with --windows, the windows: where in which video) most similar to "
        "the query by cosine similarity, exactly, reading the arrays in chunks. The query is a row of DIR or a video "
        "file; a file not in DIR is embedded with DIR's recorded settings and checkpoint.")
    parser.add_argument("dir", metavar="DIR", help="output folder of coclr embed")
    parser.add_argument("--query", required=True, metavar="VIDEO|ROW",
                        help="a video file, or a row number of DIR/videos.jsonl (of windows.jsonl with --windows)")
    parser.add_argument("-k", type=int, default=10, help="neighbours to list (default 10)")
    parser.add_argument("--windows", action="store_true", help="search the windows instead of whole videos")
    parser.add_argument("--center", action="store_true", help="subtract the folder's mean vector first (the paper's "
                        "retrieval protocol); default: plain cosine similarity of the stored vectors")
    parser.add_argument("--backend", choices=("exact", "faiss"), default="exact",
                        help="exact: chunked search in PyTorch (bounded memory); faiss: FAISS IndexFlatIP (exact too, "
                        "needs faiss-cpu and the whole array in memory)")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the result as JSON")
    output.add_argument("--html", metavar="OUT.html", help="write a page with the query and neighbours as animated "
                        "thumbnails (a new file, or a page coclr wrote; never inside DIR)")
    parser.add_argument("--device", help="torch device to embed a query video (default: cuda when available)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    import sys
    from pathlib import Path

    from coclr.embed.output import Embeddings, file_identity
    from coclr.embed.search import file_thumbnail, format_hits, search, write_search_html
    from coclr.errors import DataError
    from coclr.eval.gallery import is_page_file
    from coclr.runfolder import check_output_file

    if args.html:  # before any work: a page is written only where it overwrites nothing but a page of ours
        check_output_file(args.html, "search", is_page_file, "a coclr page")
    embeddings = Embeddings(args.dir)
    if embeddings.pending_chunks:
        print(f"coclr search: note: {args.dir} has results of an unfinished run not merged yet; run the same coclr "
              "embed command again to include them", file=sys.stderr)
    path, row = _parse_query(args.query)
    exclude = None
    if row is not None:
        records = embeddings.window_records if args.windows else embeddings.video_records
        if not 0 <= row < len(records):
            raise DataError(f"--query: row {row} is out of range ({len(records)} rows in {args.dir})")
        vector = (embeddings.windows if args.windows else embeddings.videos)[row]
        exclude = row
        video = embeddings.video_records[records[row]["video"]] if args.windows else records[row]
        label = video["path"]
    else:
        label = str(Path(path).absolute())
        stored = embeddings.row_of(path)
        if stored is not None and file_identity(path) == (embeddings.video_records[stored]["size"],
                                                          embeddings.video_records[stored]["mtime_ns"]):
            vector = embeddings.videos[stored]
            exclude = None if args.windows else stored
        else:
            from coclr.embed.run import embedder_for

            vector = embedder_for(args.dir, device=args.device, workers=0).embed(path).vector
    stale: list[str] = []
    hits = search(embeddings, vector, args.k, args.windows, exclude, args.backend, args.center, stale)
    if stale:
        print(f"coclr search: note: {len(stale)} embedded file(s) changed or were removed since they were embedded "
              f"(e.g. {stale[0]}): left out; run coclr embed again to update {args.dir}", file=sys.stderr)
    if args.json:
        print(json.dumps({"query": label, "windows": args.windows, "hits": [hit.to_json() for hit in hits]}, indent=1))
    else:
        print(f"query: {label}")
        print(format_hits(hits))
    if args.html:
        start = end = None
        if row is not None and args.windows:
            start, end = embeddings.window_records[row]["start"], embeddings.window_records[row]["end"]
        write_search_html(args.html, label, file_thumbnail(label, embeddings, start, end), hits, embeddings)
        print(f"wrote {args.html}")
    return 0


def _parse_query(query: str) -> tuple[str | None, int | None]:
    """A query is a row number unless a file of that name exists."""
    from pathlib import Path

    from coclr.errors import DataError

    if Path(query).is_file():
        return query, None
    if query.isdigit():
        return None, int(query)
    raise DataError(f"--query: {query} is neither a video file nor a row number")
