"""The bus's permission table, its derived server configuration, keys and signatures."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from couler.errors import UserError
from couler_runtime.bus_access import (
    ADMIN,
    GRANTS,
    SERVICES,
    STREAMS,
    deadletter_subject,
    grant_for,
    launcher_identity,
    nats_permissions,
    owners,
    stream_of,
    subject_matches,
)
from couler_runtime.bus_keys import (
    HEADER_SIGNER,
    BusFiles,
    BusIdentity,
    Trust,
    new_seed,
    public_key_of,
    signing_input,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("pattern", "subject", "matches"), [
    ("couler.step.*", "couler.step.succeeded", True),
    ("couler.step.*", "couler.step.a.b", False),
    ("couler.feedback.>", "couler.feedback.wf", True),
    ("couler.feedback.>", "couler.feedback", False),
    ("couler.workflow.requested", "couler.workflow.requested", True),
    ("couler.workflow.requested", "couler.workflow.requested.x", False),
    (">", "anything.at.all", True),
])
def test_subject_matching(pattern: str, subject: str, matches: bool) -> None:
    assert subject_matches(pattern, subject) is matches


def test_every_event_subject_has_exactly_the_owners_the_design_names() -> None:
    assert owners("couler.workflow.optimized") == {"optimizer"}
    assert owners("couler.workflow.rejected") == {"generator", "optimizer"}
    assert owners("couler.workflow.requested") == {"submitter"}
    assert owners("couler.step.succeeded") == {"submitter"}
    assert owners("couler.feedback.my-wf") == {"monitor"}
    assert owners("couler.cache.evicted") == {"cache"}
    assert owners("couler.launch.nightly") == frozenset()  # outside launchers only
    for service in SERVICES:
        assert owners(deadletter_subject(service)) == {service}


def test_every_consumer_reads_a_stream_that_captures_its_filter() -> None:
    names = {s.name for s in STREAMS}
    for grant in GRANTS.values():
        for c in grant.consumers:
            assert c.stream in names
            assert stream_of(c.filter.replace(">", "x").replace("*", "x")) == c.stream, c
    durables = [c.durable for g in GRANTS.values() for c in g.consumers]
    assert len(durables) == len(set(durables))


def test_server_permissions_are_least_privilege() -> None:
    for service in SERVICES:
        perms = nats_permissions(GRANTS[service])
        publish = perms["publish"]["allow"]
        assert perms["subscribe"]["allow"] == [f"_INBOX.{service}.>"]
        assert not any("DELETE" in p or "PURGE" in p or "STREAM.CREATE" in p
                       or "STREAM.UPDATE" in p or p in ("$JS.API.>", ">", "couler.>")
                       for p in publish), (service, publish)
        for p in publish:
            if p.startswith(("$JS.API.CONSUMER.", "$JS.ACK.")):  # only its own consumers
                assert any(f".{c.stream}.{c.durable}" in p
                           for c in GRANTS[service].consumers), p
    assert nats_permissions(GRANTS[ADMIN])["publish"]["allow"] == ["$JS.API.>"]
    launcher = nats_permissions(grant_for(launcher_identity("ci-bot")))
    # launches, and events under its own name only (the submitter's triggers rely on it)
    assert launcher == {"publish": {"allow": ["couler.launch.>", "couler.event.ci-bot.>"]},
                        "subscribe": {"allow": ["_INBOX.launch-ci-bot.>"]}}


@pytest.mark.parametrize("name", ["", "CI", "-x", "a" * 41, "a.b", "x y"])
def test_bad_launcher_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="launcher name"):
        launcher_identity(name)


def test_the_architecture_document_shows_the_table_in_code() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] in GRANTS:
            rows[cells[0]] = cells
    assert set(rows) == set(GRANTS)
    for name, grant in GRANTS.items():
        _, owns, consumes = rows[name]
        assert set(re.findall(r"`([^`]+)`", owns)) == set(grant.publishes), name
        documented = set(re.findall(r"`([^`]+)`: `([^`]+)`", consumes))
        assert documented == {(c.durable, c.filter) for c in grant.consumers}, name


# ----------------------------------------------------------------------------- keys


def test_bus_files_are_private_and_stable(tmp_path: Path) -> None:
    files = BusFiles.create(tmp_path / "bus")
    assert (files.root.stat().st_mode & 0o777) == 0o700
    for path in [*files.root.rglob("*")]:
        if path.is_file():
            assert (path.stat().st_mode & 0o777) == 0o600, path
    keys = files.public_keys()
    assert set(keys) == {*SERVICES, ADMIN}
    again = BusFiles.create(tmp_path / "bus")  # a restart keeps every key
    assert again.public_keys() == keys
    conf = json.loads(files.config.read_text())  # NATS reads JSON
    users = conf["authorization"]["users"]
    assert {u["nkey"] for u in users} == set(keys.values())
    assert "tls" not in conf
    assert files.trust().public_keys == keys


def test_launchers_are_added_and_revoked(tmp_path: Path) -> None:
    files = BusFiles.create(tmp_path / "bus")
    seed_path = files.add_launcher("ci-bot")
    assert files.launchers() == ["ci-bot"]
    public = public_key_of(seed_path.read_bytes().strip())
    conf = json.loads(files.config.read_text())
    (user,) = [u for u in conf["authorization"]["users"] if u["nkey"] == public]
    assert user["permissions"]["publish"]["allow"] == ["couler.launch.>",
                                                       "couler.event.ci-bot.>"]
    assert "launch-ci-bot" not in files.trust().public_keys  # launchers do not sign
    with pytest.raises(UserError, match="exists already"):
        files.add_launcher("ci-bot")
    files.revoke_launcher("ci-bot")
    assert files.launchers() == []
    conf = json.loads(files.config.read_text())
    assert public not in {u["nkey"] for u in conf["authorization"]["users"]}


def test_tls_material(tmp_path: Path) -> None:
    files = BusFiles.create(tmp_path / "bus", tls=True)
    assert files.tls is not None
    conf = json.loads(files.config.read_text())
    assert conf["tls"]["cert_file"] == str(files.tls.cert)
    context = files.client_tls()
    assert context is not None and context.check_hostname


def test_signatures_bind_subject_headers_and_body() -> None:
    optimizer = BusIdentity("optimizer", new_seed())
    other = BusIdentity("optimizer", new_seed())
    trust = Trust({"optimizer": optimizer.public_key})
    headers = {"Nats-Msg-Id": "r1.optimized.x", "couler-run-id": "r1",
               HEADER_SIGNER: "optimizer", "traceparent": "not signed"}
    data = signing_input("couler.workflow.optimized", headers, "ab" * 32)
    signature = optimizer.sign(data)
    assert trust.verify("optimizer", data, signature)
    assert not trust.verify("optimizer", data, other.sign(data))  # another key
    assert not trust.verify("monitor", data, signature)  # unknown identity
    for changed in (
        signing_input("couler.workflow.generated", headers, "ab" * 32),
        signing_input("couler.workflow.optimized", {**headers, "couler-run-id": "r2"},
                      "ab" * 32),
        signing_input("couler.workflow.optimized", headers, "cd" * 32),
    ):
        assert not trust.verify("optimizer", changed, signature)
    # an advisory header is not covered
    assert trust.verify("optimizer", signing_input(
        "couler.workflow.optimized", {**headers, "traceparent": "other"}, "ab" * 32),
        signature)
    assert not trust.verify("optimizer", data, "not base64 !!")


def test_msg_ids_are_per_identity_secrets() -> None:
    a, b = BusIdentity("submitter", new_seed()), BusIdentity("submitter", new_seed())
    assert a.msg_id("couler.workflow.requested", "r1.requested") == a.msg_id(
        "couler.workflow.requested", "r1.requested")
    assert a.msg_id("couler.workflow.requested", "r1.requested") != b.msg_id(
        "couler.workflow.requested", "r1.requested")
    assert a.msg_id("couler.workflow.requested", "k") != a.msg_id("couler.workflow.finished",
                                                                  "k")


def test_identities_are_checked(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="unknown bus identity"):
        BusIdentity("intruder", new_seed())
    with pytest.raises(UserError, match="not an nkey seed"):
        BusIdentity("submitter", b"SUnotaseed")
    seed_file = tmp_path / "seed"
    seed_file.write_bytes(new_seed())
    seed_file.chmod(0o640)
    with pytest.raises(UserError, match="readable by others"):
        BusIdentity.from_file("submitter", seed_file)
    assert "SU" not in repr(BusIdentity("submitter", new_seed()))
