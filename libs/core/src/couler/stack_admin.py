"""``couler restart | credentials | bus``: running the embedded stack and its bus.

``restart NAME`` has the stack's supervisor restart one process (a service or ``nats``).
``credentials launch NAME`` makes a launch-only bus identity for a system outside Couler
(it may publish ``couler.launch.<template>`` and nothing else) and has the running
nats-server accept it; ``credentials revoke NAME`` and ``credentials list`` go with it.
``credentials init DIR`` writes the credential directory of a deployment that is not the
embedded stack (docker-compose, Kubernetes), and ``bus setup`` -- the one-shot job such a
deployment runs before its services -- creates the streams as the bus admin
(``COULER_NATS_URL``, the admin's ``COULER_NATS_SEED_FILE`` or ``COULER_NATS_SEED``,
``COULER_NATS_TLS_CA``).

Like :mod:`couler.stack_cli`, this needs ``couler-runtime``, imported when a command runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any, TextIO

from couler.errors import UserError

__all__ = ["add_admin_commands", "print_processes", "tls_requested"]


def _home(args: argparse.Namespace) -> Path | None:
    return Path(args.home) if getattr(args, "home", None) else None


def tls_requested(flag: bool) -> bool | None:
    """Whether ``couler up`` was asked for TLS: ``--tls`` or ``COULER_NATS_TLS=true``
    (None when not: a stack that is adopted keeps its mode).

    Raises:
        UserError: ``COULER_NATS_TLS`` is neither true nor false.
    """
    value = os.environ.get("COULER_NATS_TLS", "").strip().lower()
    if value not in ("", "0", "false", "no", "off", "1", "true", "yes", "on"):
        raise UserError(f"COULER_NATS_TLS={os.environ['COULER_NATS_TLS']!r}: expected true "
                        "or false")
    return True if flag or value in ("1", "true", "yes", "on") else None


def print_processes(report: Any, out: TextIO) -> None:
    """One line per process of the stack: state, pid, restarts, last exit, address."""
    info = report.info
    if report.supervised:
        print(f"  supervisor pid {info.supervisor} (logs/supervisor.log)", file=out)
    else:
        print("  supervisor NOT RUNNING: `couler up` starts one that adopts what still runs; "
              "`couler down` stops it", file=out)
    for name, alive in report.alive.items():
        state = report.state(name)
        rec = info.processes.get(name)
        where = info.addresses.get(name, info.nats_url if name == "nats" else "")
        pid = info.pids.get(name, 0) if alive else 0
        extra = []
        if rec is not None:
            extra.append(f"restarts {rec.restarts}")
            if rec.last_exit:
                extra.append(f"last exit: {rec.last_exit}")
            if state == "restarting" and rec.next_start > time.time():
                extra.append(f"next start in {rec.next_start - time.time():.1f} s "
                             f"(back-off {rec.backoff:g} s)")
            if state == "waiting" and rec.note:
                extra.append(f"waits for {rec.note}")
        print(f"  {name:<10} {state:<10} pid {pid or '-':<8} {where:<24} {', '.join(extra)}"
              .rstrip(), file=out)


def cmd_restart(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from couler_runtime import stack

    sig = signal.SIGKILL if args.kill else signal.SIGTERM
    info = stack.restart(_home(args), args.name, sig=sig, grace=args.grace)
    rec = info.processes[args.name]
    where = info.nats_url if args.name == "nats" else info.addresses.get(args.name, "")
    print(f"{args.name} restarted: pid {rec.pid} on {where} (restarts {rec.restarts})",
          file=out)
    return 0


# Five lines a launcher can start from (nats-py; couler.v1 is in the couler package).
_EXAMPLE = "\n".join((
    "import asyncio, nats{ssl_import}; from couler.v1 import events_pb2",
    "async def main():",
    '    nc = await nats.connect("{url}", nkeys_seed="{seed}", inbox_prefix="{inbox}"{tls})',
    '    await nc.jetstream().publish("couler.launch.TEMPLATE", events_pb2.LaunchRequest('
    'idempotency_key="2026-12-01").SerializeToString()); await nc.close()',
    "asyncio.run(main())",
))


def _credentials_launch(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from couler_runtime import stack

    launcher = stack.add_launcher(_home(args), args.name)
    url = launcher.nats_url or "nats://HOST:PORT"
    print(f"launcher {launcher.name!r} created (bus identity {launcher.identity}): it may "
          "publish couler.launch.> and nothing else", file=out)
    print(f"  NATS URL:     {launcher.nats_url or '(the stack is not running: see `couler up`)'}",
          file=out)
    print(f"  seed file:    {launcher.seed_file}  (its secret: keep it 0600)", file=out)
    print(f"  inbox prefix: {launcher.inbox_prefix}", file=out)
    print("  subject:      couler.launch.<template>  (a registered template; the body is a "
          "couler.v1.LaunchRequest)", file=out)
    if launcher.ca is not None:
        print(f"  TLS CA:       {launcher.ca}", file=out)
    if not launcher.applied:
        print("couler: the stack is not running; the launcher works once it is up", file=err)
    print("example (nats-py):", file=out)
    print(_EXAMPLE.format(
        url=url, seed=launcher.seed_file, inbox=launcher.inbox_prefix,
        ssl_import=", ssl" if launcher.ca else "",
        tls=f", tls=ssl.create_default_context(cafile=\"{launcher.ca}\")" if launcher.ca
        else ""), file=out)
    return 0


def _credentials_revoke(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from couler_runtime import stack

    applied = stack.revoke_launcher(_home(args), args.name)
    print(f"launcher {args.name!r} revoked"
          + ("; the running nats-server refuses it" if applied else
             " (the stack is not running; nats-server will refuse it)"), file=out)
    return 0


def _credentials_list(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from couler_runtime import stack

    for name in stack.launchers(_home(args)):
        print(name, file=out)
    return 0


def _credentials_init(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    import yaml

    from couler_runtime.bus_access import ADMIN, SERVICES
    from couler_runtime.bus_keys import BusFiles, write_private

    hosts = args.host or ["127.0.0.1", "localhost"]
    files = BusFiles.create(Path(args.dir), tls=args.tls, hosts=hosts)
    # With --env, standard output is only the .env lines (`... --env >> .env`).
    said = err if args.env else out
    print(f"bus credentials in {files.root} (keep the directory private):", file=said)
    print(f"  nats-server:  nats-server -c {files.config} -js", file=said)
    for identity in (*SERVICES, ADMIN):
        print(f"  {identity + ':':<13} COULER_NATS_SEED_FILE={files.seed_file(identity)}",
              file=said)
    print(f"  every service: COULER_NATS_TRUST_FILE={files.trust_file}", file=said)
    if files.tls is not None:
        print(f"  TLS ({', '.join(hosts)}): COULER_NATS_TLS_CA={files.tls.ca}, "
              "COULER_NATS_URL=tls://HOST:4222", file=said)
    if args.kubernetes:
        manifest = files.root / "kubernetes.yaml"
        write_private(manifest, yaml.safe_dump_all(files.kubernetes_objects(args.namespace),
                                                   sort_keys=False))
        print(f"  Kubernetes:   kubectl apply -f {manifest}  (Secrets couler-bus, "
              "couler-nats-config; ConfigMap couler-bus-trust)", file=said)
    print("then create the streams once, as the admin: `couler bus setup`", file=said)
    if args.env:
        for line in files.env_lines():
            print(line, file=out)
    return 0


def cmd_credentials(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    actions = {"launch": _credentials_launch, "revoke": _credentials_revoke,
               "list": _credentials_list, "init": _credentials_init}
    return actions[args.action](args, out, err)


def cmd_bus_setup(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from couler_runtime.bus_keys import BusIdentity
    from couler_runtime.stack import create_streams

    url = args.url or os.environ.get("COULER_NATS_URL", "")
    seed_file = args.seed_file or os.environ.get("COULER_NATS_SEED_FILE", "")
    seed = os.environ.get("COULER_NATS_SEED", "").strip()
    ca = args.ca or os.environ.get("COULER_NATS_TLS_CA", "")
    if not url:
        raise UserError("couler bus setup: COULER_NATS_URL (or --url) is required")
    if seed_file:
        identity = BusIdentity.from_file("admin", seed_file)
    elif seed:
        try:
            identity = BusIdentity("admin", seed.encode())
        except UserError as exc:
            raise UserError(f"couler bus setup: COULER_NATS_SEED: {exc}") from None
    else:
        raise UserError("couler bus setup: the admin identity's seed is required: "
                        "COULER_NATS_SEED_FILE (or --seed-file), or COULER_NATS_SEED")
    tls = None
    if ca:
        import ssl

        try:
            tls = ssl.create_default_context(cafile=ca)
        except (OSError, ssl.SSLError) as exc:
            raise UserError(f"couler bus setup: COULER_NATS_TLS_CA {ca}: {exc}") from None
    names = asyncio.run(create_streams(url, identity, tls=tls, timeout=args.timeout))
    print(f"streams ready: {', '.join(names)}", file=out)
    return 0


def add_admin_commands(sub: Any) -> None:
    """Register restart / credentials / bus on the CLI's sub-parsers."""
    p = sub.add_parser("restart", help="restart one process of the stack (a service or nats)")
    p.add_argument("name", help="cache, monitor, generator, optimizer, submitter or nats")
    p.add_argument("--home", help="state directory (default $COULER_HOME or ~/.couler)")
    p.add_argument("--grace", type=float, default=10.0, help="seconds before SIGKILL")
    p.add_argument("--kill", action="store_true", help="SIGKILL at once (as a crash would)")
    p.set_defaults(takes_err=True, func=cmd_restart)

    p = sub.add_parser("credentials", help="bus identities: launchers, deployment credentials")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = actions.add_parser("launch", help="create a launch-only identity NAME")
    q.add_argument("name", help="lowercase letters, digits and '-'")
    q.add_argument("--home", help="state directory (default $COULER_HOME or ~/.couler)")
    q = actions.add_parser("revoke", help="remove the launcher NAME")
    q.add_argument("name")
    q.add_argument("--home", help="state directory (default $COULER_HOME or ~/.couler)")
    q = actions.add_parser("list", help="the launchers")
    q.add_argument("--home", help="state directory (default $COULER_HOME or ~/.couler)")
    q = actions.add_parser("init", help="write a credential directory for a deployment")
    q.add_argument("dir", help="the directory (created 0700; existing keys are kept)")
    q.add_argument("--tls", action="store_true", help="also a CA and a server certificate")
    q.add_argument("--host", action="append", default=[],
                   help="a name or IP address of the NATS server, for its certificate "
                        "(repeatable; default 127.0.0.1 and localhost)")
    q.add_argument("--env", action="store_true",
                   help="print COULER_NATS_SEED_<IDENTITY>=... lines for a docker-compose .env")
    q.add_argument("--kubernetes", action="store_true",
                   help="also write DIR/kubernetes.yaml: the Secrets and ConfigMap of deploy/k8s")
    q.add_argument("--namespace", default="couler", help="with --kubernetes (default couler)")
    p.set_defaults(takes_err=True, func=cmd_credentials)

    p = sub.add_parser("bus", help="the bus of a deployment")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = actions.add_parser("setup", help="create the streams as the admin (COULER_NATS_URL, "
                                         "COULER_NATS_SEED_FILE or COULER_NATS_SEED, "
                                         "COULER_NATS_TLS_CA)")
    q.add_argument("--url", help="the NATS URL (default $COULER_NATS_URL)")
    q.add_argument("--seed-file", help="the admin's seed (default $COULER_NATS_SEED_FILE)")
    q.add_argument("--ca", help="the CA for TLS (default $COULER_NATS_TLS_CA)")
    q.add_argument("--timeout", type=float, default=60.0,
                   help="seconds to wait for NATS (default 60)")
    p.set_defaults(takes_err=True, func=cmd_bus_setup)
