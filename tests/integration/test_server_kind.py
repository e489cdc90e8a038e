"""The fixtures run the kind of server ``COULER_TEST_SERVERS`` chose (``tests/containers.py``).

Where no Docker daemon answers (the machine this suite was developed on), ``auto`` chooses
local processes: each fixture's server is then a process of this machine listening on
127.0.0.1; with a daemon, a container publishing its ports on 127.0.0.1.
"""

from __future__ import annotations

import os

import psutil  # type: ignore[import-untyped]

from tests.containers import CHOICE, backend, docker_reachable, kinds
from tests.servers import NatsServer, PostgresServer, SeaweedS3


def test_the_servers_are_of_the_chosen_kind(nats_server: NatsServer,
                                            postgres_server: PostgresServer,
                                            s3_server: SeaweedS3) -> None:
    chosen = kinds(backend())
    servers = {"nats": nats_server, "postgres": postgres_server, "s3": s3_server}
    for name, server in servers.items():
        assert type(server) is chosen[name], name
        assert server.running and server.listen_addresses() == {"127.0.0.1"}, name
    if backend() == "local":
        # local because no daemon answers, or because local was asked for
        assert not docker_reachable() or os.environ.get(CHOICE, "").strip().lower() == "local"
        names = {name: psutil.Process(server.pid).name() for name, server in servers.items()}
        assert names["nats"] == "nats-server"
        assert names["postgres"] in ("postgres", "postmaster")
        assert names["s3"] == "weed"
