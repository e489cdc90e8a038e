"""A typed, blocking Python client for Couler's five gRPC services.

::

    with CoulerClient("127.0.0.1:50051", token=token) as couler:
        run_id = couler.submitter.submit(workflow, engine="local").run_id
        for run in couler.submitter.watch(run_id):
            print(run.state, [(s.name, s.state) for s in run.steps])

One address serves all five services (the embedded stack puts them behind one
server) or a mapping names one per service (``{"submitter": "...", "cache": ...}``);
services at the same address share a channel.

No message depends on the size of a workflow, and the client hides how: a workflow
larger than :data:`UPLOAD_THRESHOLD` encoded is uploaded in chunks
(``SubmitterService.UploadWorkflow``) and sent by reference (``submit``,
``register_template``, ``optimize``); :meth:`SubmitterClient.get` fetches a record's steps
page by page; :meth:`SubmitterClient.watch` merges the changes the server streams into
whole records; a plan or template answered by reference is downloaded
(``DownloadBlob``), checked against its digest and size, and decoded.

Workflows go in and come out as IR (:mod:`couler.ir`, through
:mod:`couler_runtime.codec`), everything else as the frozen dataclasses of
:mod:`couler_runtime.rpc.records`; protobuf never reaches the caller.
A failed call raises the :mod:`couler.errors` exception the server raised (a
``ValidationError`` with its issues, ``NotFoundError``, ...), chained to the RpcError.

Services use the asyncio channels of :mod:`couler_runtime.rpc.client` instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from couler import ir
from couler.errors import InvalidWorkflowError, UserError
from couler.v1 import (
    cache_service_pb2,
    common_pb2,
    generator_service_pb2,
    monitor_service_pb2,
    optimizer_service_pb2,
    submitter_service_pb2,
    workflow_pb2,
)
from couler_runtime import codec
from couler_runtime.rpc import SERVICES
from couler_runtime.rpc.client import connect, translated_errors
from couler_runtime.rpc.records import (
    BlobRef,
    CacheEntry,
    CacheOrder,
    CachePage,
    CacheStats,
    CommitResult,
    EvictResult,
    GenerationReport,
    ListedEntry,
    LookupResult,
    Objective,
    PinResult,
    Plan,
    Recommendation,
    RecommendationReport,
    Run,
    RunState,
    StepRecord,
    Template,
    Utilization,
    blob_ref_from_proto,
    blob_ref_to_proto,
    cache_entry_from_proto,
    cache_entry_to_proto,
    cache_order_to_proto,
    cache_stats_from_proto,
    generation_report_from_proto,
    listed_entry_from_proto,
    objectives_to_proto,
    plan_from_proto,
    recommendation_from_proto,
    recommendation_report_from_proto,
    run_from_proto,
    run_states_to_proto,
    template_from_proto,
    utilization_from_proto,
)

__all__ = [
    "UPLOAD_THRESHOLD",
    "CacheClient",
    "CoulerClient",
    "Generated",
    "GeneratorClient",
    "MonitorClient",
    "OptimizerClient",
    "RunPage",
    "Submission",
    "SubmitterClient",
]

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)

DEFAULT_TIMEOUT = 60.0
#: A workflow larger than this, encoded, is uploaded and sent by reference.
UPLOAD_THRESHOLD = 1 << 20
#: Bytes per upload message.
UPLOAD_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Generated:
    """A workflow the generator made, and how."""

    workflow: ir.Workflow
    report: GenerationReport


@dataclass(frozen=True, slots=True)
class Submission:
    """An accepted run; ``created`` is False when the idempotency key was used before.

    ``schedule`` is set (and ``run_id`` empty) when the workflow has a cron schedule: it
    was registered as the schedule of that name, and runs on its ticks.
    """

    run_id: str
    created: bool
    schedule: str = ""


@dataclass(frozen=True, slots=True)
class RunPage:
    """A page of runs, newest first; ``next_page_token`` is "" on the last page."""

    runs: tuple[Run, ...]
    next_page_token: str = ""


class _Unary(Generic[Req, Resp]):
    """One unary RPC: serializes, applies the timeout, translates errors."""

    def __init__(self, channel: grpc.Channel, service: str, method: str,
                 response: type[Resp], timeout: float | None) -> None:
        self._call: grpc.UnaryUnaryMultiCallable[Req, Resp] = channel.unary_unary(
            f"/{service}/{method}",
            request_serializer=_serialize,
            response_deserializer=response.FromString,
        )
        self._timeout = timeout

    def __call__(self, request: Req) -> Resp:
        with translated_errors():
            return self._call(request, timeout=self._timeout)


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


class _ServiceClient:
    """Base of the per-service clients: one channel, one service name, a timeout."""

    _SERVICE = ""

    def __init__(self, channel: grpc.Channel, timeout: float | None = DEFAULT_TIMEOUT) -> None:
        self._channel = channel
        self._timeout = timeout

    def _unary(self, method: str, response: type[Resp]) -> _Unary[Any, Resp]:
        return _Unary(self._channel, self._SERVICE, method, response, self._timeout)


class GeneratorClient(_ServiceClient):
    """``couler.v1.GeneratorService``."""

    _SERVICE = SERVICES["generator"]

    def __init__(self, channel: grpc.Channel, timeout: float | None = DEFAULT_TIMEOUT) -> None:
        super().__init__(channel, timeout)
        self._generate = self._unary("Generate", generator_service_pb2.GenerateResponse)

    def generate(self, text: str, *, constraints: Sequence[str] = (), engine: str = "",
                 name: str = "") -> Generated:
        """A valid workflow for ``text``; ``UserError`` when it cannot be planned."""
        resp = self._generate(generator_service_pb2.GenerateRequest(
            text=text, constraints=list(constraints), engine=engine, name=name))
        return Generated(codec.workflow_from_proto(resp.workflow),
                         generation_report_from_proto(resp.report))


class OptimizerClient(_ServiceClient):
    """``couler.v1.OptimizerService``.

    ``blobs`` (the submitter's client, which :class:`CoulerClient` gives it when it knows
    the submitter's address) uploads large workflows and downloads plans answered by
    reference.
    """

    _SERVICE = SERVICES["optimizer"]

    def __init__(self, channel: grpc.Channel, timeout: float | None = DEFAULT_TIMEOUT,
                 blobs: SubmitterClient | None = None) -> None:
        super().__init__(channel, timeout)
        self._optimize = self._unary("Optimize", common_pb2.Plan)
        self.blobs = blobs

    def optimize(self, workflow: ir.Workflow, engine: str = "local", *,
                 objectives: Iterable[Objective] = (), no_cache: bool = False,
                 parameters: Mapping[str, str] | None = None, run_id: str = "") -> Plan:
        """The plan for running ``workflow`` on ``engine``."""
        request = optimizer_service_pb2.OptimizeRequest(
            engine=engine, objectives=objectives_to_proto(objectives), no_cache=no_cache,
            parameters=dict(parameters or {}), run_id=run_id)
        message = codec.workflow_to_proto(workflow)
        if message.ByteSize() > UPLOAD_THRESHOLD and self.blobs is not None:
            ref = self.blobs.upload_workflow(message.SerializeToString())
            request.workflow_ref.CopyFrom(blob_ref_to_proto(ref))
        else:
            request.workflow.CopyFrom(message)
        answer = self._optimize(request)
        if answer.HasField("stored"):
            if self.blobs is None:
                raise UserError("optimize: the plan came by reference and no submitter "
                                "address was given to download it")
            data = self.blobs.download_blob(blob_ref_from_proto(answer.stored))
            answer = _parse(common_pb2.Plan, data, "the stored plan")
        return plan_from_proto(answer)


def _parse(message_type: type[Resp], data: bytes, what: str) -> Resp:
    try:
        return message_type.FromString(data)
    except DecodeError as exc:
        raise InvalidWorkflowError(f"{what} ({len(data)} bytes) is not a "
                                   f"{message_type.DESCRIPTOR.full_name}: {exc}") from None


class CacheClient(_ServiceClient):
    """``couler.v1.CacheService``."""

    _SERVICE = SERVICES["cache"]

    def __init__(self, channel: grpc.Channel, timeout: float | None = DEFAULT_TIMEOUT) -> None:
        super().__init__(channel, timeout)
        self._lookup = self._unary("Lookup", cache_service_pb2.LookupResponse)
        self._commit = self._unary("Commit", cache_service_pb2.CommitResponse)
        self._stats = self._unary("Stats", cache_service_pb2.StatsResponse)
        self._evict = self._unary("Evict", cache_service_pb2.EvictResponse)
        self._pin = self._unary("Pin", cache_service_pb2.PinResponse)
        self._list = self._unary("List", cache_service_pb2.ListEntriesResponse)
        self._show = self._unary("Show", cache_service_pb2.ShowEntryResponse)

    def lookup(self, keys: Iterable[str], *, max_age_seconds: int = 0,
               peek: bool = False) -> LookupResult:
        """The entries for ``keys`` (by key) and the keys with none; ``peek``: count no
        hit or miss and change no entry."""
        resp = self._lookup(cache_service_pb2.LookupRequest(
            keys=list(keys), max_age_seconds=max_age_seconds, peek=peek))
        return LookupResult({e.key: cache_entry_from_proto(e) for e in resp.entries},
                            tuple(resp.missing))

    def commit(self, entry: CacheEntry) -> CommitResult:
        """Store ``entry`` (its artifacts are already in the artifact store)."""
        resp = self._commit(cache_service_pb2.CommitRequest(entry=cache_entry_to_proto(entry)))
        return CommitResult(resp.created, tuple(resp.evicted))

    def stats(self) -> CacheStats:
        """Size and counters."""
        return cache_stats_from_proto(self._stats(cache_service_pb2.StatsRequest()))

    def evict(self, keys: Iterable[str] = (), *, free_bytes: int = 0) -> EvictResult:
        """Remove ``keys``, then more by policy until ``free_bytes`` are freed."""
        resp = self._evict(cache_service_pb2.EvictRequest(keys=list(keys), free_bytes=free_bytes))
        return EvictResult(tuple(resp.evicted), resp.freed_bytes)

    def pin(self, keys: Iterable[str], *, pinned: bool = True) -> PinResult:
        """Pin ``keys`` (never evicted to keep the budget), or unpin them."""
        resp = self._pin(cache_service_pb2.PinRequest(keys=list(keys), pinned=pinned))
        return PinResult(tuple(resp.keys), tuple(resp.missing))

    def list_page(self, *, order: CacheOrder = CacheOrder.VICTIM, workflow: str = "",
                  step: str = "", page_size: int = 0, page_token: str = "") -> CachePage:
        """One page of entries in ``order`` (of ``workflow`` / ``step`` when given), each
        with its eviction priority; counts no hit or miss."""
        resp = self._list(cache_service_pb2.ListEntriesRequest(
            order=cache_order_to_proto(order), workflow=workflow, step=step,
            page_size=page_size, page_token=page_token))
        return CachePage(tuple(listed_entry_from_proto(e) for e in resp.entries),
                         resp.next_page_token, resp.policy)

    def list(self, *, order: CacheOrder = CacheOrder.VICTIM, workflow: str = "",
             step: str = "", limit: int | None = None, page_size: int = 0
             ) -> Iterator[ListedEntry]:
        """Entries in ``order``, fetched a page at a time, ``limit`` at most (None: all)."""
        token = ""
        count = 0
        while limit is None or count < limit:
            size = page_size if limit is None else min(page_size or 1000, limit - count)
            page = self.list_page(order=order, workflow=workflow, step=step, page_size=size,
                                  page_token=token)
            for listed in page.entries:
                yield listed
                count += 1
            token = page.next_page_token
            if not token:
                return

    def show(self, key: str) -> ListedEntry:
        """The entry of ``key`` or of a unique key prefix (>= 8 hex digits), with its
        eviction priority; counts no hit or miss. ``NotFoundError`` when there is none."""
        return listed_entry_from_proto(self._show(
            cache_service_pb2.ShowEntryRequest(key=key)).entry)


class SubmitterClient(_ServiceClient):
    """``couler.v1.SubmitterService``."""

    _SERVICE = SERVICES["submitter"]

    def __init__(self, channel: grpc.Channel, timeout: float | None = DEFAULT_TIMEOUT) -> None:
        super().__init__(channel, timeout)
        self._submit = self._unary("Submit", submitter_service_pb2.SubmitResponse)
        self._get = self._unary("Get", common_pb2.Run)
        self._cancel = self._unary("Cancel", common_pb2.Run)
        self._retry = self._unary("Retry", common_pb2.Run)
        self._list = self._unary("List", submitter_service_pb2.ListRunsResponse)
        self._register = self._unary("RegisterTemplate", common_pb2.Template)
        self._templates = self._unary("ListTemplates",
                                      submitter_service_pb2.ListTemplatesResponse)
        self._logs = self._unary("Logs", submitter_service_pb2.StepLogsResponse)
        self._schedules = self._unary("ListSchedules",
                                      submitter_service_pb2.ListSchedulesResponse)
        self._pause = self._unary("PauseSchedule", submitter_service_pb2.Schedule)
        self._resume = self._unary("ResumeSchedule", submitter_service_pb2.Schedule)
        self._watch: grpc.UnaryStreamMultiCallable[Any, submitter_service_pb2.WatchRunResponse] \
            = channel.unary_stream(
                f"/{self._SERVICE}/Watch", request_serializer=_serialize,
                response_deserializer=submitter_service_pb2.WatchRunResponse.FromString)
        self._upload: grpc.StreamUnaryMultiCallable[Any, common_pb2.BlobRef] = \
            channel.stream_unary(f"/{self._SERVICE}/UploadWorkflow",
                                 request_serializer=_serialize,
                                 response_deserializer=common_pb2.BlobRef.FromString)
        self._download: grpc.UnaryStreamMultiCallable[Any, submitter_service_pb2.BlobChunk] = \
            channel.unary_stream(f"/{self._SERVICE}/DownloadBlob",
                                 request_serializer=_serialize,
                                 response_deserializer=submitter_service_pb2.BlobChunk.FromString)

    def submit(
        self,
        source: ir.Workflow | str | None = None,
        *,
        template: str = "",
        engine: str = "",
        parameters: Mapping[str, str] | None = None,
        idempotency_key: str = "",
        dry_run: bool = False,
        no_cache: bool = False,
        constraints: Sequence[str] = (),
        objectives: Iterable[Objective] = (),
        tenant: str = "",
    ) -> Submission:
        """Start a run of a workflow, of a request in plain language, or of a template.

        Give exactly one of ``source`` (an IR workflow, or text) and ``template``. A
        workflow larger than :data:`UPLOAD_THRESHOLD` encoded is uploaded first and sent
        by reference. Returns at once; follow the run with :meth:`watch` or :meth:`wait`.
        """
        if (source is None) == (not template):
            raise UserError("submit: give exactly one of a workflow, a text or a template")
        request = submitter_service_pb2.SubmitRequest(
            engine=engine, parameters=dict(parameters or {}), idempotency_key=idempotency_key,
            dry_run=dry_run, no_cache=no_cache, constraints=list(constraints),
            objectives=objectives_to_proto(objectives), tenant=tenant)
        if isinstance(source, ir.Workflow):
            self._attach(source, request.workflow, request.workflow_ref)
        elif isinstance(source, str):
            request.text = source
        else:
            request.template = template
        resp = self._submit(request)
        return Submission(resp.run_id, resp.created, resp.schedule)

    def _attach(self, workflow: ir.Workflow, inline: workflow_pb2.Workflow,
                ref: common_pb2.BlobRef) -> None:
        """Put ``workflow`` in a request: inline, or uploaded and by reference when large."""
        message = codec.workflow_to_proto(workflow)
        if message.ByteSize() > UPLOAD_THRESHOLD:
            ref.CopyFrom(blob_ref_to_proto(self.upload_workflow(message.SerializeToString())))
        else:
            inline.CopyFrom(message)

    def upload_workflow(self, data: bytes | ir.Workflow) -> BlobRef:
        """Upload an encoded ``couler.v1.Workflow`` (or a workflow, encoded here) in chunks;
        its reference in the blob store."""
        if isinstance(data, ir.Workflow):
            data = codec.workflow_to_proto(data).SerializeToString()
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        size = len(data)

        def chunks() -> Iterator[submitter_service_pb2.UploadWorkflowRequest]:
            view = memoryview(data)
            yield submitter_service_pb2.UploadWorkflowRequest(
                data=bytes(view[:UPLOAD_CHUNK]), size_bytes=size, digest=digest)
            for at in range(UPLOAD_CHUNK, size, UPLOAD_CHUNK):
                yield submitter_service_pb2.UploadWorkflowRequest(
                    data=bytes(view[at:at + UPLOAD_CHUNK]))

        with translated_errors():
            ref = self._upload(chunks(), timeout=self._timeout)
        return blob_ref_from_proto(ref)

    def download_blob(self, ref: BlobRef) -> bytes:
        """The bytes of a blob, checked against the reference's digest and size."""
        parts: list[bytes] = []
        received = 0
        call = self._download(submitter_service_pb2.DownloadBlobRequest(
            ref=blob_ref_to_proto(ref)), timeout=self._timeout)
        try:
            with translated_errors():
                for chunk in call:
                    received += len(chunk.data)
                    if received > ref.size_bytes:
                        raise InvalidWorkflowError(f"blob {ref.digest}: more than the "
                                                   f"{ref.size_bytes} bytes announced")
                    parts.append(chunk.data)
        finally:
            call.cancel()
        data = b"".join(parts)
        if len(data) != ref.size_bytes or \
                "sha256:" + hashlib.sha256(data).hexdigest() != ref.digest:
            raise InvalidWorkflowError(f"blob {ref.digest}: received {len(data)} bytes that do "
                                       "not match the reference")
        return data

    def get_page(self, run_id: str, *, page_size: int = 0, page_token: str = "") -> Run:
        """The run's record with one page of its steps; ``next_step_page_token`` names the
        next page ("" on the last). ``NotFoundError`` for an unknown run."""
        return run_from_proto(self._get(submitter_service_pb2.GetRunRequest(
            run_id=run_id, step_page_size=page_size, step_page_token=page_token)))

    def get(self, run_id: str) -> Run:
        """The run's record with all its steps (fetched a page at a time);
        ``NotFoundError`` for an unknown run."""
        return self._complete(self.get_page(run_id))

    def _complete(self, first: Run) -> Run:
        """``first`` (a record with the first page of steps) with the remaining pages."""
        if not first.next_step_page_token:
            return first
        steps = list(first.steps)
        token = first.next_step_page_token
        while token:
            page = self.get_page(first.run_id, page_token=token)
            steps.extend(page.steps)
            token = page.next_step_page_token
        return dataclasses.replace(first, steps=tuple(steps), next_step_page_token="")

    def watch_changes(self, run_id: str, *, timeout: float | None = None
                      ) -> Iterator[tuple[Run, tuple[StepRecord, ...]]]:
        """Like :meth:`watch`, with the step records that changed since the previous item
        (all of them in the first)."""
        call = self._watch(submitter_service_pb2.WatchRunRequest(run_id=run_id),
                           timeout=timeout)
        steps: dict[tuple[str, str], StepRecord] = {}
        changed: dict[tuple[str, str], StepRecord] = {}
        try:
            with translated_errors():
                for message in call:
                    run = run_from_proto(message.run)
                    for rec in run.steps:
                        steps[(rec.name, rec.key)] = rec
                        changed[(rec.name, rec.key)] = rec
                    if message.more:
                        continue
                    yield dataclasses.replace(run, steps=tuple(steps.values())), \
                        tuple(changed.values())
                    changed = {}
        finally:
            call.cancel()

    def watch(self, run_id: str, *, timeout: float | None = None) -> Iterator[Run]:
        """The current record, then one per change, ending after a terminal state; each
        with all the run's steps (the server sends only what changed; they are merged here).

        ``timeout`` bounds the whole stream (``OperationTimeoutError`` past it).
        Closing the iterator early cancels the stream.
        """
        for run, _ in self.watch_changes(run_id, timeout=timeout):
            yield run

    def wait(self, run_id: str, *, timeout: float | None = None,
             on_change: Callable[[Run], None] | None = None,
             on_steps: Callable[[Run, tuple[StepRecord, ...]], None] | None = None) -> Run:
        """Follow the run until it is terminal and return the final record.

        ``on_change`` gets every record; ``on_steps`` every record with the steps that
        changed since the previous one (cheaper to follow for runs of many steps).
        """
        last: Run | None = None
        for run, changed in self.watch_changes(run_id, timeout=timeout):
            if on_change is not None:
                on_change(run)
            if on_steps is not None:
                on_steps(run, changed)
            last = run
        if last is None or not last.state.terminal:
            raise UserError(f"run {run_id!r}: the watch ended before the run finished")
        return last

    def cancel(self, run_id: str, reason: str = "") -> Run:
        """Stop the run (no-op if finished); returns its record."""
        return self._complete(run_from_proto(self._cancel(
            submitter_service_pb2.CancelRunRequest(run_id=run_id, reason=reason))))

    def retry(self, run_id: str) -> Run:
        """Re-run a failed or cancelled run from its failure point."""
        return self._complete(run_from_proto(self._retry(
            submitter_service_pb2.RetryRunRequest(run_id=run_id))))

    def list(self, *, workflow: str = "", states: Iterable[RunState] = (), page_size: int = 0,
             page_token: str = "") -> RunPage:
        """Runs, newest first, filtered by workflow name and state; without their steps
        (``step_count`` and ``cached_step_count`` say how many)."""
        resp = self._list(submitter_service_pb2.ListRunsRequest(
            workflow=workflow, states=run_states_to_proto(states), page_size=page_size,
            page_token=page_token))
        return RunPage(tuple(run_from_proto(r) for r in resp.runs), resp.next_page_token)

    def register_template(self, name: str, workflow: ir.Workflow, *,
                          engine: str = "") -> Template:
        """Register (or replace) a template launched as ``couler.launch.<name>``."""
        request = submitter_service_pb2.RegisterTemplateRequest(name=name, engine=engine)
        self._attach(workflow, request.workflow, request.workflow_ref)
        return self._template(self._register(request))

    def list_templates(self) -> tuple[Template, ...]:
        """The registered templates, by name."""
        resp = self._templates(submitter_service_pb2.ListTemplatesRequest())
        return tuple(self._template(t) for t in resp.templates)

    def _template(self, message: common_pb2.Template) -> Template:
        if message.HasField("workflow_ref"):
            data = self.download_blob(blob_ref_from_proto(message.workflow_ref))
            message.workflow.CopyFrom(_parse(workflow_pb2.Workflow, data,
                                             f"template {message.name!r}'s workflow"))
        return template_from_proto(message)

    def list_schedules(self) -> tuple[submitter_service_pb2.Schedule, ...]:
        """The cron schedules the submitter keeps, by name."""
        resp = self._schedules(submitter_service_pb2.ListSchedulesRequest())
        return tuple(resp.schedules)

    def pause_schedule(self, name: str) -> submitter_service_pb2.Schedule:
        """Stop launching schedule ``name``'s runs (NotFoundError for an unknown one)."""
        return self._pause(submitter_service_pb2.ScheduleRequest(name=name))

    def resume_schedule(self, name: str) -> submitter_service_pb2.Schedule:
        """Launch schedule ``name``'s runs again from its next tick."""
        return self._resume(submitter_service_pb2.ScheduleRequest(name=name))

    def logs(self, run_id: str, step: str, key: str = "", *, max_bytes: int = 0) -> str:
        """What one step execution wrote (the last ``max_bytes``; 0: the server's 1 MiB)."""
        resp = self._logs(submitter_service_pb2.StepLogsRequest(
            run_id=run_id, step=step, key=key, max_bytes=max_bytes))
        return str(resp.text)


class MonitorClient(_ServiceClient):
    """``couler.v1.MonitorService``."""

    _SERVICE = SERVICES["monitor"]

    def __init__(self, channel: grpc.Channel, timeout: float | None = DEFAULT_TIMEOUT) -> None:
        super().__init__(channel, timeout)
        self._utilization = self._unary("Utilization", monitor_service_pb2.UtilizationResponse)
        self._recommendations = self._unary("Recommendations",
                                            monitor_service_pb2.RecommendationsResponse)

    def utilization(self, *, run_id: str = "", workflow: str = "", step: str = "",
                    limit: int = 0) -> Utilization:
        """Samples and peaks of a run, or of a workflow (and step)."""
        return utilization_from_proto(self._utilization(monitor_service_pb2.UtilizationRequest(
            run_id=run_id, workflow=workflow, step=step, limit=limit)))

    def recommendations(self, workflow: str, step: str = "") -> tuple[Recommendation, ...]:
        """The current recommendations for ``workflow`` (one ``step``'s, if given)."""
        resp = self._recommendations(
            monitor_service_pb2.RecommendationsRequest(workflow=workflow, step=step))
        return tuple(recommendation_from_proto(r) for r in resp.recommendations)

    def recommendation_report(self, workflow: str, step: str = "") -> RecommendationReport:
        """The recommendations for ``workflow`` with their evidence, and the requests its
        steps were last planned with (what ``couler recommend`` shows)."""
        return recommendation_report_from_proto(self._recommendations(
            monitor_service_pb2.RecommendationsRequest(workflow=workflow, step=step)))


class CoulerClient:
    """All five services, at one address or one each.

    Args:
        address: "host:port" for all services, or a mapping from service
            ("generator", "optimizer", "cache", "submitter", "monitor") to address;
            a service left out raises ``UserError`` when used.
        token: the bearer token the servers require, if any.
        timeout: seconds each unary call may take (``None``: no limit); ``watch``
            takes its own.
        credentials: TLS channel credentials; ``None`` is plain text.
    """

    def __init__(self, address: str | Mapping[str, str], *, token: str | None = None,
                 timeout: float | None = DEFAULT_TIMEOUT,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        addresses = ({name: address for name in SERVICES} if isinstance(address, str)
                     else dict(address))
        unknown = set(addresses) - set(SERVICES)
        if unknown:
            raise UserError(f"CoulerClient: unknown service(s) {sorted(unknown)}; "
                            f"expected some of {sorted(SERVICES)}")
        self._addresses = addresses
        self._channels: dict[str, grpc.Channel] = {}
        self._token, self._timeout, self._credentials = token, timeout, credentials
        self._clients: dict[str, _ServiceClient] = {}

    def _client(self, name: str, cls: type[_ServiceClient]) -> Any:
        if name not in self._clients:
            address = self._addresses.get(name)
            if not address:
                raise UserError(f"CoulerClient: no address given for the {name} service")
            if address not in self._channels:
                self._channels[address] = connect(address, token=self._token,
                                                  credentials=self._credentials)
            self._clients[name] = cls(self._channels[address], self._timeout)
        return self._clients[name]

    @property
    def generator(self) -> GeneratorClient:
        """The generator service."""
        client: GeneratorClient = self._client("generator", GeneratorClient)
        return client

    @property
    def optimizer(self) -> OptimizerClient:
        """The optimizer service (large workflows and plans go through the submitter's
        blob store when its address is known)."""
        client: OptimizerClient = self._client("optimizer", OptimizerClient)
        if client.blobs is None and self._addresses.get("submitter"):
            client.blobs = self.submitter
        return client

    @property
    def cache(self) -> CacheClient:
        """The cache service."""
        client: CacheClient = self._client("cache", CacheClient)
        return client

    @property
    def submitter(self) -> SubmitterClient:
        """The submitter service."""
        client: SubmitterClient = self._client("submitter", SubmitterClient)
        return client

    @property
    def monitor(self) -> MonitorClient:
        """The monitor service."""
        client: MonitorClient = self._client("monitor", MonitorClient)
        return client

    def close(self) -> None:
        """Close every channel."""
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        self._clients.clear()

    def __enter__(self) -> CoulerClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
