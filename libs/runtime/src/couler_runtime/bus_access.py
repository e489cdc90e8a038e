"""Who may do what on the bus: streams, identities, and each identity's NATS permissions.

This module is the one place that says which identity owns (publishes) each subject and
which durable consumers it reads through; everything else is derived from it:

* the NATS server's ``authorization`` block (:func:`nats_permissions`): an identity may
  publish only the subjects it owns and call only the JetStream API of its own durable
  consumers (create, info, next message, ack) and the info of the streams it uses --
  no identity but ``admin`` may create, change or delete a stream or a consumer;
* the consumers' check of every message they receive (:func:`owners`): a message is
  accepted only when it is signed by an owner of its subject (``couler_runtime.bus_keys``);
* the documentation (the table in ``docs/architecture.md`` is checked against
  :data:`GRANTS` by a test).

Each identity reads replies (JetStream acknowledgements, fetched messages) on its own
inbox prefix (:func:`inbox_prefix`), so no identity can read another's deliveries. Event
launchers from other platforms get the ``launch`` grant: publish ``couler.launch.>`` and
events under their own name, ``couler.event.<name>.>``, and nothing else; their messages
are not signed (the server's permissions are the check: the token after
``couler.event`` names the launcher that published, which is what the submitter's event
triggers check a workflow's allowed launchers against).

Pure data and functions: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "ADMIN",
    "DEADLETTER_PREFIX",
    "EVENT_PREFIX",
    "EVENT_SUBJECTS",
    "GRANTS",
    "LAUNCHER_PREFIX",
    "LAUNCH_SUBJECTS",
    "SERVICES",
    "STREAMS",
    "Consumer",
    "Grant",
    "StreamSpec",
    "deadletter_subject",
    "event_publisher",
    "grant_for",
    "inbox_prefix",
    "launcher_grant",
    "launcher_identity",
    "nats_permissions",
    "owners",
    "stream_of",
    "streams_used",
    "subject_matches",
]

ADMIN = "admin"
LAUNCHER_PREFIX = "launch-"
DEADLETTER_PREFIX = "couler.deadletter"
LAUNCH_SUBJECTS = "couler.launch.>"
EVENT_PREFIX = "couler.event"
EVENT_SUBJECTS = f"{EVENT_PREFIX}.>"
SERVICES = ("generator", "optimizer", "cache", "submitter", "monitor")
_LAUNCHER_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?")


@dataclass(frozen=True)
class StreamSpec:
    """One JetStream stream: its name and the subjects it captures."""

    name: str
    subjects: tuple[str, ...]


STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec("COULER_WORKFLOW", ("couler.workflow.>",)),
    StreamSpec("COULER_STEP", ("couler.step.>",)),
    StreamSpec("COULER_METRICS", ("couler.metrics.>",)),
    StreamSpec("COULER_FEEDBACK", ("couler.feedback.>",)),
    StreamSpec("COULER_LAUNCH", ("couler.launch.>",)),
    # Events outside launchers publish (couler.event.<launcher>.<subject>): triggers.
    StreamSpec("COULER_EVENT", (EVENT_SUBJECTS,)),
    StreamSpec("COULER_CACHE", ("couler.cache.>",)),
    # Messages a consumer gave up on (terminated), with why; the submitter fails their runs.
    StreamSpec("COULER_DEADLETTER", (f"{DEADLETTER_PREFIX}.>",)),
)


@dataclass(frozen=True)
class Consumer:
    """A durable pull consumer: its stream, its name and the subjects it reads."""

    stream: str
    durable: str
    filter: str


@dataclass(frozen=True)
class Grant:
    """What one identity may do.

    Attributes:
        identity: Its name (a service's name, ``admin``, or ``launch-<name>``).
        publishes: The subjects it owns (patterns with ``*``/``>``).
        consumers: The durable consumers it reads through.
        admin: May call every JetStream API (create streams, inspect consumers).
        signs: Its messages carry a signature consumers verify (services do; outside
            launchers do not, the server's permissions are the check).
        stream_info: May read the configuration of the streams it uses (services wait for
            them at start; launchers need nothing but their subject).
    """

    identity: str
    publishes: tuple[str, ...] = ()
    consumers: tuple[Consumer, ...] = ()
    admin: bool = False
    signs: bool = True
    stream_info: bool = True


def deadletter_subject(identity: str) -> str:
    """Where ``identity`` records the messages its consumers gave up on."""
    return f"{DEADLETTER_PREFIX}.{identity}"


def _wf(durable: str, event: str) -> Consumer:
    return Consumer("COULER_WORKFLOW", durable, f"couler.workflow.{event}")


_MONITOR_WORKFLOW_EVENTS = ("requested", "generated", "optimized", "submitted", "finished",
                            "rejected")

GRANTS: dict[str, Grant] = {
    "generator": Grant(
        "generator",
        publishes=("couler.workflow.generated", "couler.workflow.rejected",
                   deadletter_subject("generator")),
        consumers=(_wf("generator", "requested"),),
    ),
    "optimizer": Grant(
        "optimizer",
        publishes=("couler.workflow.optimized", "couler.workflow.rejected",
                   deadletter_subject("optimizer")),
        consumers=(_wf("optimizer-requested", "requested"),
                   _wf("optimizer-generated", "generated"),
                   _wf("optimizer-refused", "refused"),
                   Consumer("COULER_FEEDBACK", "optimizer-feedback", "couler.feedback.>")),
    ),
    "cache": Grant(
        "cache",
        publishes=("couler.cache.committed", "couler.cache.evicted",
                   deadletter_subject("cache")),
        consumers=(Consumer("COULER_STEP", "cache", "couler.step.succeeded"),),
    ),
    "submitter": Grant(
        "submitter",
        publishes=("couler.workflow.requested", "couler.workflow.submitted",
                   "couler.workflow.finished", "couler.workflow.refused", "couler.step.*",
                   "couler.metrics.utilization", "couler.metrics.batch",
                   deadletter_subject("submitter")),
        consumers=(_wf("submitter-optimized", "optimized"),
                   _wf("submitter-rejected", "rejected"),
                   Consumer("COULER_LAUNCH", "submitter-launch", LAUNCH_SUBJECTS),
                   Consumer("COULER_EVENT", "submitter-events", EVENT_SUBJECTS),
                   Consumer("COULER_DEADLETTER", "submitter-deadletter",
                            f"{DEADLETTER_PREFIX}.>")),
    ),
    "monitor": Grant(
        "monitor",
        publishes=("couler.feedback.>", deadletter_subject("monitor")),
        consumers=(Consumer("COULER_STEP", "monitor-steps", "couler.step.>"),
                   Consumer("COULER_METRICS", "monitor-metrics", "couler.metrics.utilization"),
                   Consumer("COULER_METRICS", "monitor-metrics-batch", "couler.metrics.batch"),
                   *(_wf(f"monitor-workflows-{e}", e) for e in _MONITOR_WORKFLOW_EVENTS)),
    ),
    ADMIN: Grant(ADMIN, admin=True),
}


def launcher_identity(name: str) -> str:
    """The identity of the outside launcher ``name`` (``launch-<name>``).

    Raises:
        ValueError: ``name`` is not a lowercase DNS-1123 label of at most 40 characters.
    """
    if not _LAUNCHER_NAME.fullmatch(name):
        raise ValueError(f"launcher name {name!r} must be lowercase letters, digits and '-' "
                         "(at most 40, starting and ending with a letter or digit)")
    return LAUNCHER_PREFIX + name


def launcher_grant(identity: str) -> Grant:
    """An outside launcher: publishes ``couler.launch.>`` and its own events,
    ``couler.event.<name>.>``, nothing else, unsigned."""
    name = identity.removeprefix(LAUNCHER_PREFIX)
    return Grant(identity, publishes=(LAUNCH_SUBJECTS, f"{EVENT_PREFIX}.{name}.>"),
                 signs=False, stream_info=False)


def event_publisher(subject: str) -> tuple[str, str]:
    """``(launcher name, event subject)`` of a bus subject ``couler.event.<name>.<subject>``
    (the server admits only launcher ``name`` on it).

    Raises:
        ValueError: Not an event subject.
    """
    parts = subject.split(".")
    if len(parts) < 4 or ".".join(parts[:2]) != EVENT_PREFIX:
        raise ValueError(f"{subject!r} is not {EVENT_PREFIX}.<launcher>.<subject>")
    return parts[2], ".".join(parts[3:])


def grant_for(identity: str) -> Grant:
    """The grant of ``identity`` (a service, ``admin`` or ``launch-<name>``).

    Raises:
        KeyError: An unknown identity.
    """
    if identity in GRANTS:
        return GRANTS[identity]
    if identity.startswith(LAUNCHER_PREFIX):
        launcher_identity(identity.removeprefix(LAUNCHER_PREFIX))  # checks the name
        return launcher_grant(identity)
    raise KeyError(f"unknown bus identity {identity!r} (known: {', '.join(GRANTS)}, "
                   f"{LAUNCHER_PREFIX}<name>)")


def inbox_prefix(identity: str) -> str:
    """The reply subjects of ``identity``: ``_INBOX.<identity>``."""
    return f"_INBOX.{identity}"


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether NATS ``subject`` matches ``pattern`` (``*`` one token, ``>`` the rest)."""
    pat, sub = pattern.split("."), subject.split(".")
    for i, token in enumerate(pat):
        if token == ">":
            return len(sub) > i
        if i >= len(sub) or (token != "*" and token != sub[i]):
            return False
    return len(pat) == len(sub)


def owners(subject: str, grants: Iterable[Grant] | None = None) -> frozenset[str]:
    """The identities allowed to publish ``subject`` (services and admin's table only;
    launchers are not listed: any launcher may publish a launch)."""
    found = {g.identity for g in (grants if grants is not None else GRANTS.values())
             if any(subject_matches(p, subject) for p in g.publishes)}
    return frozenset(found)


def stream_of(subject: str) -> str | None:
    """The stream that captures ``subject``, if any."""
    for spec in STREAMS:
        if any(subject_matches(p, subject) for p in spec.subjects):
            return spec.name
    return None


def streams_used(grant: Grant) -> list[str]:
    """The streams ``grant`` publishes to or consumes from."""
    names = {c.stream for c in grant.consumers}
    names.update(s for p in grant.publishes if (s := stream_of(p.replace(">", "x")
                                                              .replace("*", "x"))))
    return sorted(names)


def nats_permissions(grant: Grant) -> dict[str, dict[str, list[str]]]:
    """The ``permissions`` block of ``grant`` in the NATS server's configuration.

    Publish: the owned subjects; per consumer its JetStream API calls (create with its
    own filter, info, next message) and acknowledgements; the info of the streams it
    uses. Subscribe: its own inbox only. ``admin`` may call the whole JetStream API.
    """
    inbox = f"{inbox_prefix(grant.identity)}.>"
    if grant.admin:
        return {"publish": {"allow": ["$JS.API.>"]}, "subscribe": {"allow": [inbox]}}
    publish = list(grant.publishes)
    for c in grant.consumers:
        publish += [
            f"$JS.API.CONSUMER.CREATE.{c.stream}.{c.durable}.{c.filter}",
            f"$JS.API.CONSUMER.INFO.{c.stream}.{c.durable}",
            f"$JS.API.CONSUMER.MSG.NEXT.{c.stream}.{c.durable}",
            f"$JS.ACK.{c.stream}.{c.durable}.>",
        ]
    if grant.stream_info:
        publish += [f"$JS.API.STREAM.INFO.{s}" for s in streams_used(grant)]
    return {"publish": {"allow": publish}, "subscribe": {"allow": [inbox]}}
