"""What the CLI commands that talk to one service of the stack share: where it is, and a
client whose unreachable service is a one-line error.

The address is ``--address``, else ``$COULER_<SERVICE>_ADDRESS``, else ``$COULER_ADDRESS``,
else the running ``couler up`` stack's (from its state file); the token ``--token``, else
``$COULER_AUTH_TOKEN``, else the stack's. Needs ``couler-runtime``, imported when called.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from couler.errors import RetryableError, UserError

__all__ = ["add_connection_arguments", "service_address", "service_client"]


def add_connection_arguments(p: argparse.ArgumentParser, service: str, what: str) -> None:
    """``--home --address --token --timeout --json`` of a command that talks to ``service``
    (``what`` names it in the help: "the submitter")."""
    p.add_argument("--home", help="the stack's directory (default $COULER_HOME or ~/.couler)")
    p.add_argument("--address", help=f"{what}'s host:port (default "
                                     f"$COULER_{service.upper()}_ADDRESS, $COULER_ADDRESS, "
                                     "or the stack's)")
    p.add_argument("--token", default=None, help="the gRPC auth token (default "
                                                 "$COULER_AUTH_TOKEN or the stack's)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per call (default 30)")
    p.add_argument("--json", action="store_true", help="print JSON for machines")


def service_address(args: argparse.Namespace, service: str) -> tuple[str, str | None]:
    """``service``'s address and the token to use (see the module docstring)."""
    from couler_runtime import stack

    address = (args.address or os.environ.get(f"COULER_{service.upper()}_ADDRESS", "")
               or os.environ.get("COULER_ADDRESS", ""))
    token = args.token if args.token is not None else os.environ.get("COULER_AUTH_TOKEN")
    if address:
        return address, token
    home = Path(args.home) if args.home else None
    info, alive = stack.status(home)
    if not alive.get(service) or not info.addresses.get(service):
        raise UserError(f"the stack's {service} is not running (in {info.home}); `couler up` "
                        "first, or give --address HOST:PORT")
    return info.addresses[service], token if token is not None else info.token


@contextmanager
def service_client(args: argparse.Namespace, service: str) -> Iterator[Any]:
    """The client of ``service`` (e.g. ``client.cache``); an unreachable service is a
    one-line error naming its address."""
    from couler_runtime.client import CoulerClient

    address, token = service_address(args, service)
    with CoulerClient({service: address}, token=token or None,
                      timeout=args.timeout) as client:
        try:
            yield getattr(client, service)
        except RetryableError as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UserError(f"the {service} at {address} is not reachable: {first}") from exc
