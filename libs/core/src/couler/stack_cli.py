"""``couler up | down | status | submit``: the embedded stack from the command line.

``up`` starts NATS and the five services (:mod:`couler_runtime.stack`) and prints
the gRPC address and the dashboard URL; ``submit PATH.py | --text "..."`` sends
work to the submitter (address and token from the stack's state file, or
``--address``/``--token``, or ``COULER_ADDRESS``/``COULER_AUTH_TOKEN``) and with
``--wait`` follows it with a live line per step change; ``status`` shows the
processes and recent runs; ``down`` stops everything. All of it needs the
``couler-runtime`` distribution and the service packages; they are imported only
when a command runs, so the core CLI loads without them.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, TextIO

from couler.cli_format import human_seconds
from couler.errors import UserError

__all__ = ["add_commands"]


def _home(args: argparse.Namespace) -> Path | None:
    return Path(args.home) if getattr(args, "home", None) else None


def cmd_up(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from couler.stack_admin import tls_requested
    from couler_runtime import stack
    from couler_runtime.settings import check_endpoint

    extra = {}
    if args.otel_endpoint:
        try:
            extra["COULER_OTEL_ENDPOINT"] = check_endpoint(args.otel_endpoint)
        except ValueError as exc:
            raise UserError(f"--otel-endpoint: {exc}") from None
    os.umask(0o077)  # what `up` writes in the home is its owner's only
    tls = tls_requested(args.tls)
    info = stack.up(_home(args), token=args.token, tls=tls, secrets_file=args.secrets_file,
                    extra_env=extra,
                    progress=lambda m: print(f"  {m}", file=err, flush=True))
    print(f"Couler is up in {info.home} (supervisor pid {info.supervisor})", file=out)
    print(f"  gRPC (submitter): {info.grpc_address}", file=out)
    for name, address in info.addresses.items():
        if name != "submitter":
            print(f"  gRPC ({name}): {address}", file=out)
    print(f"  dashboard:        {info.dashboard}"
          + ("  (token in stack.json; open it with ?token=...)" if info.token else ""), file=out)
    for name, url in info.metrics.items():
        print(f"  metrics ({name}):".ljust(20) + f"{url}"
              + ("  (Authorization: Bearer <token in stack.json>)" if info.token else ""),
              file=out)
    print(f"  NATS:             {info.nats_url}  (an nkey per identity; keys in "
          f"{info.home}/bus)", file=out)
    if info.passed:
        print(f"  settings passed:  {', '.join(info.passed)}", file=out)
    print("Submit work with `couler submit PATH.py --wait`; stop with `couler down`.", file=out)
    return 0


def cmd_down(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from couler_runtime import stack

    killed = stack.down(_home(args), grace=args.grace)
    if killed:
        print(f"couler down: had to kill {', '.join(killed)}", file=err)
    print("Couler is down; nothing left running.", file=out)
    return 0


def _client(args: argparse.Namespace) -> Any:
    from couler_runtime import stack
    from couler_runtime.client import CoulerClient

    address = args.address or os.environ.get("COULER_ADDRESS", "")
    token = args.token if args.token is not None else os.environ.get("COULER_AUTH_TOKEN")
    if not address:
        info, alive = stack.status(_home(args))
        if not alive.get("submitter"):
            raise UserError("the stack's submitter is not running; `couler up` first")
        address, token = info.addresses, token if token is not None else info.token
    return CoulerClient(address, token=token or None)


def cmd_status(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from couler_runtime import stack

    if args.run_id:
        return _run_status(args, out)
    if args.json:
        raise UserError("couler status --json needs a RUN (the run whose record to print)")
    from couler.stack_admin import print_processes

    report = stack.report(_home(args))
    info, alive = report.info, report.alive
    print(f"stack in {info.home} (dashboard {info.dashboard})", file=out)
    print_processes(report, out)
    if alive.get("submitter"):
        with _client(args) as client:
            page = client.submitter.list(page_size=args.limit)
        print("recent runs:", file=out)
        for run in page.runs:  # listed without their steps: counted
            print(f"  {run.run_id}  {run.workflow:<28} {run.state.value:<10} "
                  f"steps {run.step_count}, cached {run.cached_step_count}", file=out)
    return 0 if all(alive.values()) else 1


def _run_status(args: argparse.Namespace, out: TextIO) -> int:
    """One run: its state, then a line per step (with why a step failed), a page of steps
    at a time (a run may have 100,000)."""
    if args.json:
        return _run_status_json(args, out)
    reused = _Reused()
    with _client(args) as client:
        page = run = client.submitter.get_page(args.run_id)
        print(f"run {run.run_id} ({run.workflow}, engine {run.engine}): {run.state.value}"
              + (f": {run.message}" if run.message else "")
              + (f" ({run.step_count} steps)" if run.step_count > len(page.steps) else ""),
              file=out)
        while True:
            for s in page.steps:
                reused.add(s)
                label = s.name + (f"[{s.key}]" if s.key else "")
                extra = reused.said(s) if s.cached else (
                    f" after {s.attempts} attempts" if s.attempts > 1 else "")
                why = (f": {s.message}" if s.message and s.state.value in ("failed", "skipped")
                       else "")
                if s.state.value == "failed":
                    extra += _failure_said(s)
                print(f"  {label:<32} {s.state.value}{extra}{why}", file=out)
            if not page.next_step_page_token:
                if reused.steps:
                    print(reused.summary(), file=out)
                return 0
            page = client.submitter.get_page(args.run_id,
                                             page_token=page.next_step_page_token)


def cmd_logs(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    with _client(args) as client:
        text = client.submitter.logs(args.run_id, args.step, args.key or "",
                                     max_bytes=args.max_bytes)
    out.write(text if text.endswith("\n") or not text else text + "\n")
    return 0


class _Follow:
    """Prints one line per step change while a run is watched (given only the steps that
    changed, so following a run of 100,000 steps stays linear)."""

    def __init__(self, err: TextIO) -> None:
        self.err = err
        self.seen: dict[tuple[str, str], str] = {}
        self.state = ""

    def __call__(self, run: Any, changed: Any) -> None:
        if run.state.value != self.state:
            self.state = run.state.value
            print(f"[{time.strftime('%H:%M:%S')}] run {run.run_id}: {self.state}", file=self.err)
        for s in changed:
            key = (s.name, s.key)
            if self.seen.get(key) == s.state.value:
                continue
            self.seen[key] = s.state.value
            label = s.name + (f"[{s.key}]" if s.key else "")
            extra = " (reused from cache)" if s.cached else (
                f" attempt {s.attempts}" if s.attempts > 1 else "")
            if s.state.value in ("failed", "retrying"):
                extra += _failure_said(s)
            if s.state.value in ("failed", "retrying", "skipped") and s.message:
                extra += f": {s.message}"
            print(f"[{time.strftime('%H:%M:%S')}]   {label:<32} {s.state.value}{extra}",
                  file=self.err, flush=True)


# Passes whose changes to the workflow the user did not write: said, not hidden.
_SHOWN_PASSES = ("right_size", "default_retry", "split")


def _changes(run: Any) -> list[str]:
    """One line per change the optimizer made to the workflow (retries, resources, split)."""
    return [f"  optimizer {p.name}: {note}" for p in run.passes
            if p.changed and p.name in _SHOWN_PASSES for note in p.notes]


_SHOWN = 20  # steps named at most in a summary line (a run may have 100,000)


def _failure_said(s: Any) -> str:
    """`` (user error: Python ValueError in the traceback; not retried: ...)``: the failure's
    class and why (couler.failures), as the engine or the submitter classified it."""
    if s.failure_reason:
        return f" ({s.failure_reason})"
    return f" ({s.failure_class.value})" if s.failure_class else ""


def _failures(run: Any) -> list[str]:
    """One line per failed step (the first ones): why, and where its logs are."""
    failed = [s for s in run.steps if s.state.value == "failed"]
    lines = []
    for s in failed[:_SHOWN]:
        label = s.name + (f"[{s.key}]" if s.key else "")
        why = s.message or (f"exit code {s.exit_code}" if s.exit_code is not None else "")
        tries = f" after {s.attempts} attempts" if s.attempts > 1 else ""
        lines.append(f"  step {label} failed{tries}{_failure_said(s)}"
                     + (f": {why}" if why else ""))
    if len(failed) > _SHOWN:
        lines.append(f"  ... and {len(failed) - _SHOWN} more failed steps "
                     "(`couler status RUN_ID` lists them all)")
    return lines


def _record(run: Any) -> dict[str, Any]:
    return {
        "run_id": run.run_id, "workflow": run.workflow, "state": run.state.value,
        "engine": run.engine, "message": run.message,
        "cached_steps": sorted(s.name for s in run.steps if s.cached and not s.key),
        "steps": [{"name": s.name, "key": s.key, "state": s.state.value,
                   "attempts": s.attempts, "cached": s.cached, "outputs": dict(s.outputs),
                   "exit_code": s.exit_code, "message": s.message,
                   "failure_class": s.failure_class.value if s.failure_class else None,
                   "failure_reason": s.failure_reason,
                   "duration_seconds": (s.finished_at - s.started_at
                                        if s.finished_at and s.started_at else None),
                   "peak_memory_bytes": s.peak_memory_bytes,
                   "cache_saved_seconds": s.cache_saved_seconds} for s in run.steps],
        "cache_saved_seconds": sum(s.cache_saved_seconds for s in run.steps),
        "passes": [{"name": p.name, "changed": p.changed, "notes": list(p.notes)}
                   for p in run.passes],
    }


def cmd_submit(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from couler.cli import _capture, parse_parameters

    if (args.path is None) == (args.text is None):
        raise UserError("couler submit: give a program PATH.py or --text \"...\" (one of them)")
    if args.text is not None and not args.text.strip():
        raise UserError("couler submit: --text is empty; say what the workflow should do")
    sources: list[Any] = ([args.text] if args.text is not None
                          else list(_capture(args.path, args.program_args)))
    parameters = parse_parameters(args.param)
    status = 0
    with _client(args) as client:
        for source in sources:
            sub = client.submitter.submit(source, engine=args.engine, parameters=parameters,
                                          idempotency_key=args.key or "",
                                          no_cache=args.no_cache, dry_run=args.dry_run)
            what = source.name if not isinstance(source, str) else "text request"
            if sub.schedule:  # a cron / triggered workflow: registered, runs on its ticks
                if getattr(source, "schedule", None) is not None:
                    print(f"{what}: registered as schedule {sub.schedule!r}; the submitter "
                          f"launches a run on each tick (see `couler schedule ls`)", file=err)
                else:
                    print(f"{what}: registered as template {sub.schedule!r}; its event "
                          "triggers launch its runs", file=err)
                print(sub.schedule, file=out)
                continue
            verb = "submitted" if sub.created else "already submitted (same key)"
            print(f"{what}: {verb} as run {sub.run_id}", file=err)
            if not args.wait:
                print(sub.run_id, file=out)
                continue
            run = client.submitter.wait(sub.run_id, timeout=args.timeout,
                                        on_steps=None if args.json else _Follow(err))
            cached = sorted({s.name for s in run.steps if s.cached})
            if args.json:
                print(json.dumps(_record(run), indent=2), file=out)
            else:
                print(f"run {run.run_id} {run.state.value}"
                      + (f": {run.message}" if run.message else "")
                      + (f"; {len(cached)} step(s) reused from the cache: "
                         + ", ".join(cached[:_SHOWN]) + (", ..." if len(cached) > _SHOWN else "")
                         if cached else ""), file=out)
                for line in _changes(run):
                    print(line, file=out)
                for line in _failures(run):
                    print(line, file=out)
            if run.state.value != "succeeded":
                status = 1
    return status


def _connection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--home", help="the stack's directory (default $COULER_HOME or ~/.couler)")
    p.add_argument("--address", help="the submitter's host:port (default: the running stack)")
    p.add_argument("--token", default=None, help="the gRPC auth token (default: the stack's)")


def add_commands(sub: Any) -> None:
    """Register up / down / status / submit / logs, and restart / credentials / bus
    (:mod:`couler.stack_admin`), on the CLI's sub-parsers."""
    from couler.cache_cli import add_cache_commands
    from couler.recommend_cli import add_recommend_command
    from couler.schedule_cli import add_schedule_commands
    from couler.stack_admin import add_admin_commands

    p = sub.add_parser("up", help="start NATS and the five services on this machine, "
                                  "supervised")
    p.add_argument("--home", help="state directory (default $COULER_HOME or ~/.couler)")
    p.add_argument("--token", default=None,
                   help="gRPC auth token (default: a random one; '' for none)")
    p.add_argument("--tls", action="store_true",
                   help="run NATS with TLS (also COULER_NATS_TLS=true)")
    p.add_argument("--secrets-file", default=None, metavar="FILE",
                   help="give the services COULER_SECRETS_FILE=FILE (mode 0600 required)")
    p.add_argument("--otel-endpoint", default=None, metavar="URL",
                   help="export every service's traces over OTLP/gRPC to URL, e.g. "
                        "http://127.0.0.1:4317 (also COULER_OTEL_ENDPOINT)")
    p.set_defaults(takes_err=True, func=cmd_up)
    p = sub.add_parser("down", help="stop the stack started by `couler up`")
    p.add_argument("--home", help="state directory (default $COULER_HOME or ~/.couler)")
    p.add_argument("--grace", type=float, default=10.0, help="seconds before SIGKILL")
    p.set_defaults(takes_err=True, func=cmd_down)
    p = sub.add_parser("status", help="the stack's processes and recent runs, or one run")
    p.add_argument("run_id", nargs="?", help="a run: its state and every step's")
    _connection(p)
    p.add_argument("--limit", type=int, default=10, help="how many recent runs")
    p.add_argument("--json", action="store_true",
                   help="with RUN: print the run's record (every step) as JSON")
    p.set_defaults(takes_err=True, func=cmd_status)
    p = sub.add_parser("logs", help="what one step of a run wrote (stdout, then stderr)")
    p.add_argument("run_id", help="the run")
    p.add_argument("step", help="the step (inner steps of a sub-workflow: outer/inner)")
    p.add_argument("--key", help="one map item or loop iteration of the step")
    p.add_argument("--max-bytes", type=int, default=0,
                   help="at most this many bytes, from the end (default 1 MiB)")
    _connection(p)
    p.set_defaults(takes_err=True, func=cmd_logs)
    p = sub.add_parser("submit", help="send a workflow program or a request to the stack")
    p.add_argument("path", nargs="?", help="a workflow program (PATH.py)")
    p.add_argument("--text", help="a request in plain language instead of a program")
    p.add_argument("--engine", default="local", help="target engine (default: local)")
    p.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                   help="a workflow parameter value (repeatable)")
    p.add_argument("--key", help="idempotency key: a repeat submit starts nothing")
    p.add_argument("--wait", action="store_true", help="follow the run until it ends")
    p.add_argument("--json", action="store_true", help="with --wait: print the final record")
    p.add_argument("--timeout", type=float, default=None, help="with --wait: give up after S s")
    p.add_argument("--no-cache", action="store_true", help="reuse no cached step result")
    p.add_argument("--dry-run", action="store_true", help="plan only, run nothing")
    p.add_argument("program_args", nargs="*", help="arguments for the program (after --)")
    _connection(p)
    p.set_defaults(takes_err=True, func=cmd_submit)
    add_admin_commands(sub)
    add_cache_commands(sub)
    add_recommend_command(sub)
    add_schedule_commands(sub)



class _Reused:
    """What the cache saved a run: counted over its step records as they are printed."""

    def __init__(self) -> None:
        self.steps = 0
        self.cached = 0
        self.saved = 0.0

    def add(self, step: Any) -> None:
        self.steps += 1
        if step.cached:
            self.cached += 1
            self.saved += step.cache_saved_seconds

    @staticmethod
    def said(step: Any) -> str:
        """How a reused step's line says it."""
        if step.cache_saved_seconds > 0:
            return (f" (reused from cache, saved {human_seconds(step.cache_saved_seconds)} "
                    "of compute)")
        return " (reused from cache)"

    def summary(self) -> str:
        """``reused 7 of 10 steps, saved 1h 12m of compute``."""
        if not self.cached:
            return f"reused 0 of {self.steps} steps from the cache"
        return (f"reused {self.cached} of {self.steps} steps from the cache"
                + (f", saved {human_seconds(self.saved)} of compute" if self.saved else ""))


def _run_status_json(args: argparse.Namespace, out: TextIO) -> int:
    """``couler status RUN --json``: the run's record with every step, and what the cache
    saved it."""
    with _client(args) as client:
        run = client.submitter.get(args.run_id)
    record = _record(run)
    record["reused_steps"] = sum(1 for s in run.steps if s.cached)
    print(json.dumps(record, indent=2), file=out)
    return 0
