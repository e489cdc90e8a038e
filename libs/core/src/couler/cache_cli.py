"""``couler cache ls | show | evict | pin | unpin | stats``: the step cache from the command line.

The commands talk to the cache service of the running ``couler up`` stack (its address and
token from the stack's state file), or to the one at ``--address`` (else
``$COULER_CACHE_ADDRESS``, else ``$COULER_ADDRESS``) with ``--token`` (else
``$COULER_AUTH_TOKEN``). A key may be given whole or by a prefix of at least 8 hex digits
that names one entry (what ``ls`` shows). ``ls`` and ``show`` count no cache hit or miss
and change no entry. Human output is a table; ``--json`` prints raw numbers (bytes,
seconds, times in seconds since the epoch) for machines.

Like :mod:`couler.stack_cli`, this needs ``couler-runtime``, imported when a command runs.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any, TextIO

from couler.cli_format import human_bytes, human_seconds, parse_bytes
from couler.errors import UserError
from couler.service_cli import add_connection_arguments, service_client

__all__ = ["add_cache_commands"]

_KEY_SHOWN = 12  # hex digits of a key in a table
_ORDERS = ("victim", "recent", "size", "cost")


def _entries(n: int) -> str:
    return f"{n} entry" if n == 1 else f"{n} entries"


def _when(seconds: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds)) if seconds else "-"


def _entry_json(listed: Any) -> dict[str, Any]:
    e = listed.entry
    return {
        "key": e.key, "workflow": e.workflow, "step": e.step, "size_bytes": e.size_bytes,
        "cost_seconds": e.cost_seconds, "hits": e.hits, "created_at": e.created_at,
        "last_used_at": e.last_used_at, "pinned": e.pinned, "lineage": list(e.lineage),
        "priority": listed.priority, "evicted_at": listed.evicted_at,
        "outputs": dict(e.outputs),
        "artifacts": {n: {"digest": a.digest, "size_bytes": a.size_bytes, "uri": a.uri}
                      for n, a in e.artifacts.items()},
    }


def _row(listed: Any) -> list[str]:
    e = listed.entry
    return [e.key[:_KEY_SHOWN], f"{e.workflow}/{e.step}", human_bytes(e.size_bytes),
            human_seconds(e.cost_seconds) if e.cost_seconds else "-", str(e.hits),
            _when(e.last_used_at), "pinned" if e.pinned else ""]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    for r in (header, *rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip(), file=out)


def cmd_ls(args: argparse.Namespace, out: TextIO) -> int:
    from couler_runtime.rpc.records import CacheOrder

    if args.limit < 1:
        raise UserError(f"--limit must be at least 1 (got {args.limit})")
    with service_client(args, "cache") as cache:
        listed = list(cache.list(order=CacheOrder(args.order), workflow=args.workflow or "",
                                 step=args.step or "", limit=args.limit + 1))
        stats = None if args.json else cache.stats()
    more = len(listed) > args.limit
    listed = listed[:args.limit]
    if args.json:
        print(json.dumps({"order": args.order, "entries": [_entry_json(e) for e in listed],
                          "more": more}, indent=2), file=out)
        return 0
    if not listed:
        print("no cache entries" + (" match" if args.workflow or args.step else ""), file=out)
        return 0
    _table(["KEY", "WORKFLOW/STEP", "SIZE", "COST", "HITS", "LAST USED", "PINNED"],
           [_row(e) for e in listed], out)
    what = {"victim": "next to be evicted first", "recent": "most recently used first",
            "size": "largest first", "cost": "most compute first"}[args.order]
    total = f" of {stats.entries} ({human_bytes(stats.bytes)})" if stats is not None else ""
    print(f"{_entries(len(listed))} shown{total}, {what}"
          + (f"; more with --limit {args.limit * 2}" if more else ""), file=out)
    return 0


def cmd_show(args: argparse.Namespace, out: TextIO) -> int:
    with service_client(args, "cache") as cache:
        listed = cache.show(args.key)
    if args.json:
        print(json.dumps(_entry_json(listed), indent=2), file=out)
        return 0
    e = listed.entry
    fields = [
        ("key", e.key), ("workflow", e.workflow), ("step", e.step),
        ("size", f"{human_bytes(e.size_bytes)} ({e.size_bytes} bytes)"),
        ("cost", f"{human_seconds(e.cost_seconds)} of compute" if e.cost_seconds
         else "unknown"),
        ("hits", str(e.hits)), ("created", _when(e.created_at)),
        ("last used", _when(e.last_used_at)),
        ("pinned", "yes (never evicted to keep the budget)" if e.pinned else "no"),
        ("priority", f"{listed.priority:.6g} (the lowest unpinned goes first)"),
    ]
    if listed.evicted_at:  # only its metadata is left
        fields[-2:] = [("evicted", f"{_when(listed.evicted_at)}: its bytes are gone, its "
                                   "metadata kept (a descendant is still found by lineage)")]
    for name, value in fields:
        print(f"{name + ':':<11}{value}", file=out)
    if e.outputs:
        print("outputs:", file=out)
        for name, value in sorted(e.outputs.items()):
            text = value if len(value) <= 80 else value[:77] + "..."
            print(f"  {name} = {text}", file=out)
    if e.artifacts:
        print("artifacts:", file=out)
        for name, a in sorted(e.artifacts.items()):
            print(f"  {name}  {a.digest}  {human_bytes(a.size_bytes)}", file=out)
    if e.lineage:
        print("lineage (the entries it read):", file=out)
        for parent in e.lineage:
            print(f"  {parent}", file=out)
    return 0


def _resolve(cache: Any, keys: Sequence[str]) -> list[str]:
    """The whole keys of ``keys`` (prefixes resolved); all of them or an error, before
    anything changes."""
    return list(dict.fromkeys(cache.show(k).entry.key for k in keys))


def cmd_evict(args: argparse.Namespace, out: TextIO) -> int:
    free = parse_bytes(args.free_bytes, "--free-bytes") if args.free_bytes else 0
    if not args.keys and not free:
        raise UserError("couler cache evict: give KEY... and/or --free-bytes N")
    with service_client(args, "cache") as cache:
        result = cache.evict(_resolve(cache, args.keys), free_bytes=free)
    if args.json:
        print(json.dumps({"evicted": list(result.evicted), "freed_bytes": result.freed_bytes},
                         indent=2), file=out)
        return 0
    print(f"evicted {_entries(len(result.evicted))}, freed {human_bytes(result.freed_bytes)}"
          + (": " + ", ".join(k[:_KEY_SHOWN] for k in result.evicted) if result.evicted
             else ""), file=out)
    return 0


def _pin(args: argparse.Namespace, out: TextIO, pinned: bool) -> int:
    with service_client(args, "cache") as cache:
        result = cache.pin(_resolve(cache, args.keys), pinned=pinned)
    verb = "pinned" if pinned else "unpinned"
    if args.json:
        print(json.dumps({verb: list(result.keys), "missing": list(result.missing)},
                         indent=2), file=out)
    else:
        print(f"{verb} {_entries(len(result.keys))}: "
              + ", ".join(k[:_KEY_SHOWN] for k in result.keys), file=out)
        if result.missing:  # evicted between the look-up and the pin
            print(f"gone meanwhile: {', '.join(k[:_KEY_SHOWN] for k in result.missing)}",
                  file=out)
    return 1 if result.missing else 0


def cmd_pin(args: argparse.Namespace, out: TextIO) -> int:
    return _pin(args, out, True)


def cmd_unpin(args: argparse.Namespace, out: TextIO) -> int:
    return _pin(args, out, False)


def cmd_stats(args: argparse.Namespace, out: TextIO) -> int:
    with service_client(args, "cache") as cache:
        s = cache.stats()
        policy = cache.list_page(page_size=1).policy
    lookups = s.hits + s.misses
    if args.json:
        print(json.dumps({"entries": s.entries, "bytes": s.bytes, "budget_bytes": s.budget_bytes,
                          "hits": s.hits, "misses": s.misses, "evictions": s.evictions,
                          "policy": policy,
                          "hit_ratio": s.hits / lookups if lookups else None}, indent=2),
              file=out)
        return 0
    budget = human_bytes(s.budget_bytes) if s.budget_bytes else "unlimited"
    print(f"entries:    {s.entries} ({human_bytes(s.bytes)} of a budget of {budget})", file=out)
    print(f"policy:     {policy}", file=out)
    print(f"lookups:    {s.hits} hits, {s.misses} misses"
          + (f" ({100 * s.hits / lookups:.1f}% hits)" if lookups else ""), file=out)
    print(f"evictions:  {s.evictions}", file=out)
    return 0


def _connection(p: argparse.ArgumentParser) -> None:
    add_connection_arguments(p, "cache", "the cache service")


def add_cache_commands(sub: Any) -> None:
    """Register ``couler cache ...`` on the CLI's sub-parsers."""
    p = sub.add_parser("cache", help="the step cache: list, show, evict, pin, unpin, stats")
    actions = p.add_subparsers(dest="cache_action", required=True, metavar="ACTION")
    q = actions.add_parser("ls", help="cache entries, the next to be evicted first")
    q.add_argument("--workflow", help="only this workflow's entries")
    q.add_argument("--step", help="only this step's entries")
    q.add_argument("--order", choices=_ORDERS, default="victim",
                   help="victim (next evicted first; default), recent, size or cost")
    q.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    _connection(q)
    q.set_defaults(func=cmd_ls)
    q = actions.add_parser("show", help="one entry: outputs, artifacts, lineage, priority")
    q.add_argument("key", help="a key, or a prefix of at least 8 hex digits")
    _connection(q)
    q.set_defaults(func=cmd_show)
    q = actions.add_parser("evict", help="remove entries (and their blobs, when unshared)")
    q.add_argument("keys", nargs="*", metavar="KEY", help="keys or prefixes to remove")
    q.add_argument("--free-bytes", default=None, metavar="N",
                   help="then evict by policy until N bytes are freed (e.g. 10G)")
    _connection(q)
    q.set_defaults(func=cmd_evict)
    q = actions.add_parser("pin", help="never evict these entries to keep the budget")
    q.add_argument("keys", nargs="+", metavar="KEY", help="keys or prefixes")
    _connection(q)
    q.set_defaults(func=cmd_pin)
    q = actions.add_parser("unpin", help="let the budget evict these entries again")
    q.add_argument("keys", nargs="+", metavar="KEY", help="keys or prefixes")
    _connection(q)
    q.set_defaults(func=cmd_unpin)
    q = actions.add_parser("stats", help="entries, bytes, budget, policy, hits and misses")
    _connection(q)
    q.set_defaults(func=cmd_stats)
