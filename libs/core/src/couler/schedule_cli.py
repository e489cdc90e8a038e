"""``couler schedule ls | pause | resume NAME``: the submitter's cron schedules.

A workflow with a cron schedule given to ``couler submit`` (or registered as a template) is
kept by the stack's submitter, which launches a run on each tick
(``couler_submitter.schedules`` states the policies). These commands talk to the submitter
of the running ``couler up`` stack, or to the one at ``--address`` (else
``$COULER_SUBMITTER_ADDRESS``, else ``$COULER_ADDRESS``) with ``--token`` (else
``$COULER_AUTH_TOKEN``), like every other RPC. Human output is a table; ``--json`` prints
raw values (times in seconds since the epoch) for machines.

Like :mod:`couler.stack_cli`, this needs ``couler-runtime``, imported when a command runs.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any, TextIO

from couler.service_cli import add_connection_arguments, service_client

__all__ = ["add_schedule_commands"]


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) if seconds else "-"


def _json(s: Any) -> dict[str, Any]:
    return {"name": s.name, "cron": s.cron, "timezone": s.timezone or "UTC",
            "concurrency_policy": s.concurrency_policy,
            "starting_deadline_seconds": s.starting_deadline_seconds or None,
            "suspended": s.suspended, "paused": s.paused, "engine": s.engine,
            "next_tick_at": s.next_tick_at or None, "last_tick_at": s.last_tick_at or None,
            "last_outcome": s.last_outcome, "last_run_id": s.last_run_id,
            "last_reason": s.last_reason}


def _status(s: Any) -> str:
    return "paused" if s.paused else "suspended" if s.suspended else "active"


def _last(s: Any) -> str:
    if s.last_outcome == "launched":
        return f"launched {s.last_run_id}"
    if s.last_outcome == "skipped":
        return f"skipped: {s.last_reason}"
    return "-"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header) - 1)]
    for r in (header, *rows):
        cells = [c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)] + [r[-1]]
        print("  ".join(cells).rstrip(), file=out)


def cmd_ls(args: argparse.Namespace, out: TextIO) -> int:
    with service_client(args, "submitter") as submitter:
        schedules = submitter.list_schedules()
    if args.json:
        print(json.dumps([_json(s) for s in schedules], indent=2), file=out)
        return 0
    if not schedules:
        print("no schedules (submit a workflow with a cron schedule to make one)", file=out)
        return 0
    _table(["NAME", "CRON", "TIMEZONE", "POLICY", "STATUS", "NEXT TICK", "LAST TICK"],
           [[s.name, s.cron, s.timezone or "UTC", s.concurrency_policy, _status(s),
             _when(s.next_tick_at), f"{_when(s.last_tick_at)} {_last(s)}"]
            for s in schedules], out)
    return 0


def _pause(args: argparse.Namespace, out: TextIO, pause: bool) -> int:
    with service_client(args, "submitter") as submitter:
        s = (submitter.pause_schedule if pause else submitter.resume_schedule)(args.name)
    if args.json:
        print(json.dumps(_json(s), indent=2), file=out)
        return 0
    if pause:
        print(f"schedule {s.name!r} paused: no tick launches a run until it is resumed",
              file=out)
    else:
        upcoming = (f"next tick {_when(s.next_tick_at)}" if s.next_tick_at
                    else "suspended by its workflow: no tick launches a run")
        print(f"schedule {s.name!r} resumed: {upcoming}", file=out)
    return 0


def cmd_pause(args: argparse.Namespace, out: TextIO) -> int:
    return _pause(args, out, True)


def cmd_resume(args: argparse.Namespace, out: TextIO) -> int:
    return _pause(args, out, False)


def _connection(p: argparse.ArgumentParser) -> None:
    add_connection_arguments(p, "submitter", "the submitter")


def add_schedule_commands(sub: Any) -> None:
    """Register ``couler schedule ...`` on the CLI's sub-parsers."""
    p = sub.add_parser("schedule", help="cron schedules the stack keeps: list, pause, resume")
    actions = p.add_subparsers(dest="schedule_action", required=True, metavar="ACTION")
    q = actions.add_parser("ls", help="the schedules: cron, policy, next and last tick")
    _connection(q)
    q.set_defaults(func=cmd_ls)
    q = actions.add_parser("pause", help="launch no run of the schedule until resumed")
    q.add_argument("name", help="the schedule (its workflow's name)")
    _connection(q)
    q.set_defaults(func=cmd_pause)
    q = actions.add_parser("resume", help="launch its runs again from its next tick")
    q.add_argument("name", help="the schedule (its workflow's name)")
    _connection(q)
    q.set_defaults(func=cmd_resume)
