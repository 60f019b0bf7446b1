"""``coclr search``: the nearest videos (or windows) of a query in a ``coclr embed`` output folder."""

from __future__ import annotations

import argparse

from coclr.cli._options import add_option_flags, options_from_flags
from coclr.embed.options import SearchOptions
from coclr.text import shown


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "search", help="nearest videos or windows of a query video in a coclr embed folder",
        description="Find the videos of DIR (or, with --windows, the windows: where in which video) most similar to "
        "the query by cosine similarity, exactly, reading the arrays in chunks. The query is a row of DIR or a video "
        "file; a file not in DIR is embedded with DIR's recorded settings and checkpoint.")
    parser.add_argument("dir", metavar="DIR", help="output folder of coclr embed")
    parser.add_argument("--query", required=True, metavar="VIDEO|ROW",
                        help="a video file, or a row number of DIR/videos.jsonl (of windows.jsonl with --windows)")
    add_option_flags(parser, SearchOptions)
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the result as JSON")
    output.add_argument("--html", metavar="OUT.html", help="write a page with the query and neighbours as animated "
                        "thumbnails (a new file, or a page coclr wrote; never inside DIR)")
    parser.add_argument("--device", help="torch device to embed a query video (default: cuda when available)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    import os
    import sys

    from coclr.embed.output import Embeddings
    from coclr.embed.search import (
        check_search,
        file_thumbnail,
        format_hits,
        resolve_query,
        search,
        seconds_span,
        write_search_html,
    )
    from coclr.errors import DataError
    from coclr.eval.gallery import is_page_file
    from coclr.filelock import lock_holder
    from coclr.runfolder import LOCK_FILE, check_output_file

    if args.html:  # before any work: a page is written only where it overwrites nothing but a page of ours
        check_output_file(args.html, "search", lambda path: is_page_file(path, "search"), "a coclr search page")
    if args.device is not None:  # (checked where given: a row's query embeds nothing, and took any text silently)
        from coclr.distributed import pick_device  # noqa: PLC0415 (heavy: torch)

        pick_device(args.device, "device")
    embeddings = Embeddings(args.dir)
    writer = lock_holder(os.path.join(args.dir, LOCK_FILE))
    if writer is not None:
        print(f"coclr search: note: a coclr embed is writing {args.dir} now ({writer}): what it embeds in this run is "
              "searched once it ends", file=sys.stderr)
    elif embeddings.pending_chunks:
        print(f"coclr search: note: {args.dir} has results of an unfinished run not merged yet; run the same coclr "
              "embed command again to include them", file=sys.stderr)
    asked = options_from_flags(SearchOptions, args)
    check_search(embeddings, asked)  # before a query video is embedded
    query = resolve_query(embeddings, args.query, asked.windows, args.device)
    if query.stale:
        changed = f"row {query.row}'s file {query.label} changed or was removed since it was embedded"
        if args.html:
            raise DataError(f"--query: {changed}, so a page cannot show it; run coclr embed again to update "
                            f"{args.dir}")
        print(f"coclr search: note: {shown(changed)}: the query is the file as it was", file=sys.stderr)
    stale: list[str] = []
    hits = search(embeddings, query.vector, asked.k, asked.windows, query.exclude, asked.backend, asked.center, stale)
    if not hits:
        what = "other window" if asked.windows else "other video"
        print(f"coclr search: note: no hit: {args.dir} holds no {what} as it was embedded", file=sys.stderr)
    if stale:
        print(f"coclr search: note: {len(stale)} embedded file(s) changed or were removed since they were embedded "
              f"(e.g. {shown(stale[0])}): left out; run coclr embed again to update {args.dir}", file=sys.stderr)
    start = end = None  # a stored window as the query: which stretch of its video
    if query.row is not None and asked.windows:
        start, end = embeddings.window_records[query.row]["start"], embeddings.window_records[query.row]["end"]
    span = f" (window row {query.row}, {seconds_span(start, end)})" if start is not None else ""
    if args.json:
        where = {"row": query.row, "start": start, "end": end} if start is not None else {}
        print(json.dumps({"query": query.label, **where, "windows": asked.windows,
                          "hits": [hit.to_json() for hit in hits]}, indent=1))
    else:
        print(f"query: {shown(query.label)}{span}")
        print(format_hits(hits))
    if args.html:
        write_search_html(args.html, query.label, file_thumbnail(query.label, embeddings, start, end), hits,
                          embeddings, span=span.strip(" ()"), windows=asked.windows)
        print(f"wrote {args.html}")
    return 0
