"""Run Couler workflows on Apache Airflow 3 through its stable REST API (``/api/v2``).

:class:`AirflowAdapter` compiles the IR with :func:`couler.compilers.airflow.compile_workflow`
into the source of one DAG file and reports runs in the engine-neutral vocabulary of
:mod:`couler.engines.base`. It speaks plain HTTP (the standard library's ``urllib``, behind
the small :class:`Transport` seam) and imports nothing from Airflow.

**Deploying the DAG.** Airflow has no API to upload DAG code: DAGs are files that the
``dag-processor`` finds in a DAG bundle. The adapter therefore needs the deployment's DAGs
folder as a path it can write to (a local folder, or a shared volume / synced folder
mounted on this machine). :meth:`AirflowAdapter.submit` writes ``couler_<dag id>_<hash>.py``
there atomically (only when its content changed), then polls ``GET /dagSources/{dag_id}``
until Airflow serves exactly that source; an entry of ``GET /importErrors`` for the file
fails the submit with the traceback (:class:`~couler.errors.UserError`), and no parse
within ``parse_timeout`` seconds raises :class:`~couler.errors.OperationTimeoutError`.
Then it unpauses the DAG (``PATCH /dags/{dag_id}``) and triggers a run
(``POST /dags/{dag_id}/dagRuns``).

**Run ids** are ``"DAG_ID/DAG_RUN_ID"``: the DAG id is the workflow name, the DAG run id
is ``couler-k-KEY`` for an idempotency key made of ``[A-Za-z0-9_.-]`` (at most 100
characters), ``couler-h-<sha256 of the key>`` for any other key and ``couler-r-<uuid>``
without one. A submit whose run already exists returns it and writes, unpauses and
triggers nothing (idempotency is per workflow name, as DAG run ids are per DAG). A
workflow with a cron schedule is registered (and unpaused unless ``suspend``), and
``submit`` returns its DAG id alone: Airflow's scheduler starts its runs.

State mapping (Airflow -> Couler):

==============================  ================================================
Airflow                         Couler
==============================  ================================================
dag run queued                  ``RunState.PENDING``
dag run running                 ``RunState.RUNNING``
dag run success                 ``RunState.SUCCEEDED``
dag run failed                  ``RunState.FAILED`` (``CANCELLED`` when its note is
                                :data:`CANCEL_NOTE`, see :meth:`AirflowAdapter.cancel`)
task none / scheduled / queued  ``StepState.PENDING``
task running / deferred /       ``StepState.RUNNING``
up_for_reschedule
task up_for_retry / restarting  ``StepState.RETRYING``
task success                    ``StepState.SUCCEEDED``
task failed                     ``StepState.FAILED``
task skipped                    ``StepState.SKIPPED`` (a false ``when``, a trigger rule)
task upstream_failed            ``StepState.SKIPPED`` (its dependency condition was not met)
task removed                    ``StepState.SKIPPED`` (no longer in the DAG)
==============================  ================================================

In a cancelled run, failed tasks, unfinished tasks and tasks skipped before their first
attempt (``try_number`` 0) are ``StepState.CANCELLED``.

Which task instances are steps: every task except the compiler's helpers (the map item
lists ``STEP--items`` and ``couler-exit-status``); when an item-list helper failed, its
mapped step is reported ``FAILED``. A task id is the IR step name (``GROUP.STEP`` inside
an inline sub-workflow); a mapped task instance's ``map_index`` is the ``key``
(``""`` before the map is expanded). ``attempts`` is the ``try_number``. Outputs are the
task's ``return_value`` XCom (the compiler returns one dict of outputs per task), read
once per finished attempt and cached; non-string values are compact JSON. Airflow does
not report a step's exit code: ``exit_code`` stays ``None``.

Utilization: Airflow's REST API reports no resource use of a task instance, so a run on
Airflow has no utilization samples (:class:`AirflowAdapter` is no
:class:`~couler.engines.base.SamplingAdapter`).

Every HTTP error is translated once, at this boundary, into :mod:`couler.errors`, and the
message names the workflow: 404 -> ``NotFoundError``, 409 -> ``ConflictError``, 401/403
and other 4xx -> ``UserError``, 5xx, 429 and connection failures -> ``RetryableError``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, Protocol

from couler import ir
from couler.api.handles import SecretMaterial
from couler.compilers.airflow import EXIT_STATUS_TASK, ITEMS_SUFFIX, compile_workflow
from couler.engines.base import RunState, RunStatus, StepState, StepStatus
from couler.errors import (
    ConflictError,
    DocumentTooLargeError,
    NotFoundError,
    OperationTimeoutError,
    RetryableError,
    UserError,
)
from couler_runtime.polling import parse_time, poll_status

# Airflow's import error for a DAG file that took longer than dagbag_import_timeout.
_IMPORT_TIMEOUT = "DagBag import timeout"

__all__ = ["CANCEL_NOTE", "AirflowAdapter", "Transport", "run_status", "urllib_transport"]

CANCEL_NOTE = "couler: cancelled"  # the DAG run note that tells a cancel from a failure
_IDEMPOTENT = frozenset({"GET", "PATCH", "PUT", "DELETE"})
_SERVER_ERROR_DELAYS = (0.5, 1.0, 2.0)  # seconds before each repeat of a request answered 5xx
_PAGE = 100  # [api] maximum_page_limit default
_KEY = re.compile(r"[A-Za-z0-9_.-]{1,100}")
_RUN_STATE = {
    "queued": RunState.PENDING,
    "running": RunState.RUNNING,
    "success": RunState.SUCCEEDED,
    "failed": RunState.FAILED,
}
_TASK_STATE = {
    "": StepState.PENDING,
    "scheduled": StepState.PENDING,
    "queued": StepState.PENDING,
    "running": StepState.RUNNING,
    "deferred": StepState.RUNNING,
    "up_for_reschedule": StepState.RUNNING,
    "up_for_retry": StepState.RETRYING,
    "restarting": StepState.RETRYING,
    "success": StepState.SUCCEEDED,
    "failed": StepState.FAILED,
    "skipped": StepState.SKIPPED,
    "upstream_failed": StepState.SKIPPED,
    "removed": StepState.SKIPPED,
}
_TASK_MESSAGE = {
    "upstream_failed": "not run: an upstream step failed",
    "removed": "the task is no longer in the DAG",
}


class Transport(Protocol):
    """Sends one HTTP request; returns the status code and the body for every status.

    Raises ``OSError`` (``urllib.error.URLError`` included) when the server cannot be
    reached or does not answer in ``timeout`` seconds.
    """

    def __call__(self, method: str, url: str, headers: Mapping[str, str],
                 body: bytes | None, timeout: float) -> tuple[int, bytes]: ...


def urllib_transport(method: str, url: str, headers: Mapping[str, str], body: bytes | None,
                     timeout: float) -> tuple[int, bytes]:
    """The default :class:`Transport`, on the standard library's ``urllib``."""
    request = urllib.request.Request(url, data=body, headers=dict(headers), method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as e:
        with e:
            return int(e.code), bytes(e.read())


class AirflowAdapter:
    """Submits, observes and cancels Couler runs on one Airflow 3 deployment.

    Args:
        base_url: The API server, e.g. ``http://127.0.0.1:8080`` (``/api/v2`` is added).
        dags_folder: The deployment's DAGs folder (its ``dags-folder`` bundle), writable
            from here: Airflow cannot receive DAG code through its API.
        username, password: Credentials exchanged for a JWT at ``POST /auth/token``
            (again when the token expires).
        token: A bearer token to use instead of the username and password.
        parse_timeout: Seconds :meth:`submit` waits for the DAG processor to parse the file.
        poll_interval: Seconds between polls while waiting for a parse or watching a run.
        request_timeout: Seconds one HTTP request may take.
        transport: Sends the requests (default :func:`urllib_transport`).
    """

    def __init__(self, base_url: str, dags_folder: str | os.PathLike[str], *,
                 username: str | None = None, password: str | None = None,
                 token: str | None = None, parse_timeout: float = 120.0,
                 poll_interval: float = 2.0, request_timeout: float = 30.0,
                 transport: Transport | None = None) -> None:
        if token is None and (username is None or password is None):
            raise UserError("AirflowAdapter needs a bearer token or a username and password")
        self.base_url = base_url.rstrip("/")
        self.dags_folder = Path(dags_folder)
        self.parse_timeout = parse_timeout
        self.poll_interval = poll_interval
        self.request_timeout = request_timeout
        self._username = username
        self._password = password
        self._token = token
        self._can_login = username is not None and password is not None
        self._transport: Transport = transport or urllib_transport
        # Outputs of finished attempts: (dag id, run id, task id, map index, try) -> outputs.
        self._outputs: dict[tuple[str, str, str, int, int], dict[str, str]] = {}

    def __repr__(self) -> str:
        return f"AirflowAdapter({self.base_url!r}, dags_folder={str(self.dags_folder)!r})"

    # ------------------------------------------------------------------ submit

    def submit(self, wf: ir.Workflow, secrets: Sequence[SecretMaterial] = (), *,
               idempotency_key: str | None = None) -> str:
        """Compile ``wf``, deploy its DAG file, trigger a run and return the run id.

        The run id is ``"DAG_ID/DAG_RUN_ID"`` (see the module docstring); with the same
        ``idempotency_key`` a second submit returns the first run and does nothing else.
        Secrets to create become Airflow Variables ``NAME/KEY`` (created or overwritten),
        which the generated DAG reads at run time.

        Raises:
            ValidationError, UnsupportedFeatureError: the workflow cannot be compiled.
            UserError: Airflow could not import the DAG file (the message holds its
                traceback), or it rejected a request.
            OperationTimeoutError: the file was not parsed within ``parse_timeout``.
            RetryableError: server-side or connection trouble.
        """
        source = compile_workflow(wf)
        dag_id = wf.name
        if wf.schedule is not None:
            self._put_secrets(secrets, dag_id)
            self._deploy(dag_id, source)
            if not wf.schedule.suspend:
                self._set_paused(dag_id, False)
            return dag_id
        dag_run_id = _dag_run_id(idempotency_key)
        run_id = f"{dag_id}/{dag_run_id}"
        if idempotency_key is not None and self._find_run(dag_id, dag_run_id):
            return run_id
        self._put_secrets(secrets, dag_id)
        self._deploy(dag_id, source)
        self._set_paused(dag_id, False)
        try:
            self._api("POST", f"/dags/{_q(dag_id)}/dagRuns",
                      {"dag_run_id": dag_run_id, "logical_date": None, "conf": {}},
                      action=f"triggering a run of workflow {dag_id!r}")
        except ConflictError:
            if idempotency_key is None or not self._find_run(dag_id, dag_run_id):
                raise
        return run_id

    def dag_file(self, dag_id: str) -> Path:
        """Where :meth:`submit` writes the DAG file of workflow ``dag_id``."""
        safe = re.sub(r"[^A-Za-z0-9_]", "_", dag_id)
        digest = hashlib.sha256(dag_id.encode()).hexdigest()[:8]
        return self.dags_folder / f"couler_{safe}_{digest}.py"

    def _deploy(self, dag_id: str, source: str) -> None:
        """Write the DAG file (atomically, if changed) and wait until Airflow serves it."""
        path = self.dag_file(dag_id)
        before = self._import_errors(dag_id, path.name)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")  # not a .py file
        try:
            current = path.read_text(encoding="utf-8") if path.exists() else None
            wrote = current != source
            if wrote:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(source, encoding="utf-8")
                os.replace(tmp, path)  # the DAG processor never sees half a file
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise UserError(f"workflow {dag_id!r}: cannot write the DAG file {str(path)!r} "
                            f"into the DAGs folder ({type(e).__name__}: {e})") from e
        deadline = time.monotonic() + self.parse_timeout
        while True:
            if self._dag_source(dag_id) == source:
                return
            errors = self._import_errors(dag_id, path.name)
            fresh = [trace for key, trace in errors.items() if not wrote or key not in before]
            if fresh:
                trace = fresh[-1].strip()
                if _IMPORT_TIMEOUT in trace:  # the file is too large to import in time
                    said = next(ln for ln in trace.splitlines() if _IMPORT_TIMEOUT in ln)
                    raise DocumentTooLargeError(  # the file's bytes: the budget's unit
                        "airflow", dag_id, len(source.encode()),
                        f"Airflow could not import the DAG file {path.name!r} in time: "
                        f"{said.strip()[-300:]}")
                raise UserError(f"workflow {dag_id!r}: Airflow could not import the DAG file "
                                f"{path.name!r}:\n{trace[-2000:]}")
            if time.monotonic() >= deadline:
                raise OperationTimeoutError(
                    f"workflow {dag_id!r}: Airflow did not parse the DAG file {str(path)!r} "
                    f"within {self.parse_timeout} s; is a dag-processor running with this "
                    "folder as its DAGs folder?")
            time.sleep(self.poll_interval)

    def _dag_source(self, dag_id: str) -> str | None:
        try:
            doc = self._api("GET", f"/dags/{_q(dag_id)}", action=f"reading DAG {dag_id!r}")
            if doc.get("is_stale"):
                return None
            src = self._api("GET", f"/dagSources/{_q(dag_id)}",
                            action=f"reading the source of DAG {dag_id!r}")
        except NotFoundError:
            return None
        content = src.get("content")
        return content if isinstance(content, str) else None

    def _import_errors(self, dag_id: str, filename: str) -> dict[tuple[int, str], str]:
        """Import errors of ``filename``: (id, timestamp) -> stack trace."""
        out: dict[tuple[int, str], str] = {}
        for e in self._pages("/importErrors", "import_errors",
                             {"filename_pattern": filename},
                             action=f"reading the import errors of workflow {dag_id!r}"):
            name = str(e.get("filename") or "")
            if name == filename or name.endswith("/" + filename):
                key = (_int(e.get("import_error_id"), 0), str(e.get("timestamp") or ""))
                out[key] = str(e.get("stack_trace") or "")
        return out

    def _set_paused(self, dag_id: str, paused: bool) -> None:
        self._api("PATCH", f"/dags/{_q(dag_id)}", {"is_paused": paused},
                  params={"update_mask": "is_paused"},
                  action=f"{'pausing' if paused else 'unpausing'} DAG {dag_id!r}")

    def _find_run(self, dag_id: str, dag_run_id: str) -> bool:
        try:
            self._api("GET", f"/dags/{_q(dag_id)}/dagRuns/{_q(dag_run_id)}",
                      action=f"looking up run {dag_run_id!r} of workflow {dag_id!r}")
        except NotFoundError:
            return False
        return True

    def _put_secrets(self, secrets: Sequence[SecretMaterial], dag_id: str) -> None:
        entities = [{"key": f"{s.name}/{k}", "value": v}
                    for s in secrets if s.should_create for k, v in s.reveal().items()]
        if not entities:
            return
        body = {"actions": [{"action": "create", "entities": entities,
                             "action_on_existence": "overwrite"}]}
        names = ", ".join(sorted({repr(s.name) for s in secrets if s.should_create}))
        what = f"storing secrets {names} of workflow {dag_id!r} as Airflow Variables"
        result = self._api("PATCH", "/variables", body, action=what, echo=False)
        errors = (result.get("create") or {}).get("errors") or []
        if errors:
            raise UserError(f"{what}: {len(errors)} variable(s) were refused")

    # ------------------------------------------------------------------ observe

    def get(self, run_id: str) -> dict[str, Any]:
        """The DAG run ``run_id`` as Airflow reports it (plain data)."""
        dag_id, dag_run_id = _split(run_id)
        return self._api("GET", f"/dags/{_q(dag_id)}/dagRuns/{_q(dag_run_id)}",
                         action=f"reading run {run_id!r} of workflow {dag_id!r}")

    def status(self, run_id: str) -> RunStatus:
        """The state of the run and of its steps (see the module's mapping)."""
        dag_id, dag_run_id = _split(run_id)
        run = self.get(run_id)
        tis = self._task_instances(dag_id, dag_run_id)
        return run_status(run, tis, self._read_outputs(dag_id, dag_run_id, tis))

    def watch(self, run_id: str, timeout: float | None = None) -> Iterator[RunStatus]:
        """Yield the run's status now and whenever it changes, until it is terminal.

        Airflow has no change stream: the run and its task instances are polled every
        ``poll_interval`` seconds.

        Raises:
            OperationTimeoutError: ``timeout`` seconds passed before the run ended.
            NotFoundError: the run does not exist.
        """
        return poll_status(self.status, run_id, interval=self.poll_interval, timeout=timeout)

    def logs(self, run_id: str, step: str, key: str = "") -> str:
        """The log of the last attempt of step ``step`` (map item ``key``) as text.

        Each structured log event becomes one line ``TIMESTAMP LEVEL EVENT``; what the
        step printed appears as events of the ``task.stdout`` logger.

        Raises:
            NotFoundError: no such step in the run, or it has not started yet.
        """
        dag_id, dag_run_id = _split(run_id)
        if key and not key.isdigit():
            raise NotFoundError(f"run {run_id!r}: map item key {key!r} is not an index")
        map_index = int(key) if key else -1
        base = f"/dags/{_q(dag_id)}/dagRuns/{_q(dag_run_id)}/taskInstances/{_q(step)}"
        label = step + (f"[{key}]" if key else "")
        what = f"reading step {label!r} of run {run_id!r} of workflow {dag_id!r}"
        ti = self._api("GET", base + (f"/{map_index}" if key else ""), action=what)
        tries = _int(ti.get("try_number"), 0)
        if tries < 1:
            raise NotFoundError(f"run {run_id!r}: step {label!r} has not started "
                                f"(state {ti.get('state')!r}), so it has no log")
        doc = self._api("GET", f"{base}/logs/{tries}",
                        params={"full_content": "true", "map_index": str(map_index)},
                        action=f"reading the log of step {label!r} of run {run_id!r}")
        return _log_text(doc.get("content"))

    # ------------------------------------------------------------------ control

    def cancel(self, run_id: str) -> None:
        """Stop the run: mark the DAG run failed, with the note :data:`CANCEL_NOTE`.

        This is Airflow's "mark failed": running tasks are killed and marked failed, tasks
        not started are marked skipped. Airflow has no cancelled state, so the note tells
        a cancel from a failure and the run is reported ``RunState.CANCELLED`` (its note
        is replaced). A no-op on a finished run. For a scheduled workflow (a run id
        without ``/``) the DAG is paused instead: no new runs start.
        """
        if "/" not in run_id:
            self._set_paused(run_id, True)
            return
        dag_id, dag_run_id = _split(run_id)
        run = self.get(run_id)
        if run.get("state") in ("success", "failed"):
            return
        self._api("PATCH", f"/dags/{_q(dag_id)}/dagRuns/{_q(dag_run_id)}",
                  {"state": "failed", "note": CANCEL_NOTE},
                  action=f"cancelling run {run_id!r} of workflow {dag_id!r}")

    # ------------------------------------------------------------------ internals

    def _task_instances(self, dag_id: str, dag_run_id: str) -> list[dict[str, Any]]:
        return self._pages(f"/dags/{_q(dag_id)}/dagRuns/{_q(dag_run_id)}/taskInstances",
                           "task_instances", {},
                           action=f"reading the steps of run {dag_run_id!r} of workflow "
                                  f"{dag_id!r}")

    def _read_outputs(self, dag_id: str, dag_run_id: str, tis: Sequence[Mapping[str, Any]],
                      ) -> dict[tuple[str, int], dict[str, str]]:
        """Outputs of the succeeded task instances: (task id, map index) -> outputs."""
        done = {(str(t.get("task_id")), _int(t.get("map_index"), -1),
                 _int(t.get("try_number"), 0))
                for t in tis if t.get("state") == "success"}
        todo = {d for d in done if (dag_id, dag_run_id, *d) not in self._outputs}
        if todo:
            run_path = f"/dags/{_q(dag_id)}/dagRuns/{_q(dag_run_id)}"
            what = f"reading the outputs of run {dag_run_id!r} of workflow {dag_id!r}"
            have = {(str(x.get("task_id")), _int(x.get("map_index"), -1))
                    for x in self._pages(run_path + "/taskInstances/~/xcomEntries",
                                         "xcom_entries", {"xcom_key": "return_value"},
                                         action=what)}
            for task_id, map_index, tries in todo:
                outputs: dict[str, str] = {}
                if (task_id, map_index) in have:
                    try:
                        entry = self._api(
                            "GET", f"{run_path}/taskInstances/{_q(task_id)}/xcomEntries/"
                                   "return_value", params={"map_index": str(map_index)},
                            action=what)
                    except NotFoundError:
                        entry = {}
                    outputs = _outputs(entry.get("value"))
                self._outputs[(dag_id, dag_run_id, task_id, map_index, tries)] = outputs
        return {(t, m): self._outputs[(dag_id, dag_run_id, t, m, n)] for t, m, n in done}

    def _pages(self, path: str, field: str, params: Mapping[str, str], *,
               action: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        while True:
            page = self._api("GET", path, params={**params, "limit": str(_PAGE),
                                                  "offset": str(len(items))}, action=action)
            batch = [dict(i) for i in page.get(field) or () if isinstance(i, Mapping)]
            items += batch
            if not batch or len(items) >= _int(page.get("total_entries"), 0):
                return items

    def _login(self) -> str:
        body = json.dumps({"username": self._username, "password": self._password}).encode()
        status, data = self._send("POST", self.base_url + "/auth/token",
                                  {"Content-Type": "application/json",
                                   "Accept": "application/json"}, body, "logging in")
        if status in (200, 201):
            token = _json(data, "logging in").get("access_token")
            if isinstance(token, str) and token:
                self._token = token
                return token
        _raise(status, data, f"logging in to Airflow at {self.base_url} as "
                             f"{self._username!r}", echo=False)

    def _api(self, method: str, path: str, body: object = None, *,
             params: Mapping[str, str] | None = None, action: str,
             echo: bool = True) -> dict[str, Any]:
        url = f"{self.base_url}/api/v2{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        data = None if body is None else json.dumps(body).encode()
        status, raw = self._authorized(method, url, data, action)
        if status == 401 and self._can_login:  # the JWT expired: log in again, once
            self._token = None
            status, raw = self._authorized(method, url, data, action)
        for delay in _SERVER_ERROR_DELAYS:
            # Airflow answers 500 when its metadata database is busy ("database is locked"
            # on SQLite): a request that can be repeated safely is sent again, briefly
            if status not in (500, 502, 503, 504) or method not in _IDEMPOTENT:
                break
            time.sleep(delay)
            status, raw = self._authorized(method, url, data, action)
        if 200 <= status < 300:
            return _json(raw, action) if raw.strip() else {}
        _raise(status, raw, action, echo=echo)

    def _authorized(self, method: str, url: str, data: bytes | None,
                    action: str) -> tuple[int, bytes]:
        token = self._token if self._token is not None else self._login()
        headers = {"Accept": "application/json", "Authorization": f"Bearer {token}"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        return self._send(method, url, headers, data, action)

    def _send(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None,
              action: str) -> tuple[int, bytes]:
        try:
            return self._transport(method, url, headers, body, self.request_timeout)
        except OSError as e:  # URLError, connection refused, timeouts
            raise RetryableError(f"{action}: cannot reach the Airflow API at {self.base_url} "
                                 f"({type(e).__name__}: {e})") from e


# --------------------------------------------------------------------------- helpers


def _q(part: str) -> str:
    return urllib.parse.quote(part, safe="")


def _dag_run_id(key: str | None) -> str:
    if key is None:
        return f"couler-r-{uuid.uuid4().hex}"
    if _KEY.fullmatch(key):
        return f"couler-k-{key}"
    return f"couler-h-{hashlib.sha256(key.encode()).hexdigest()}"


def _split(run_id: str) -> tuple[str, str]:
    dag_id, sep, dag_run_id = run_id.partition("/")
    if not sep:
        raise UserError(f"{run_id!r} is not a run id but a scheduled workflow (DAG id); "
                        "run ids are 'DAG_ID/DAG_RUN_ID'")
    if not dag_id or not dag_run_id:
        raise NotFoundError(f"no run {run_id!r}: run ids are 'DAG_ID/DAG_RUN_ID'")
    return dag_id, dag_run_id


def _json(raw: bytes, action: str) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise RetryableError(f"{action}: the Airflow API answered with invalid JSON") from e
    if not isinstance(doc, dict):
        raise RetryableError(f"{action}: the Airflow API returned {type(doc).__name__}, "
                             "not an object")
    return doc


def _raise(status: int, raw: bytes, action: str, *, echo: bool = True) -> NoReturn:
    """Raise the Couler error for an HTTP error answer during ``action``."""
    detail = ""
    if echo:
        try:
            doc = json.loads(raw)
            found = doc.get("detail", doc) if isinstance(doc, dict) else doc
            detail = found if isinstance(found, str) else json.dumps(found)
        except ValueError:
            detail = raw.decode("utf-8", "replace")
    message = f"{action}: the Airflow API answered {status}"
    if detail:
        message += f": {detail[:300]}"
    if status == 404:
        raise NotFoundError(message)
    if status == 409:
        raise ConflictError(message)
    if status in (401, 403):
        raise UserError(message + " (check the credentials or token and the user's role)")
    if status >= 500 or status == 429:
        raise RetryableError(message)
    raise UserError(message)


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _text(value: object) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _outputs(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {str(k): _text(v) for k, v in value.items()}
    return {"return_value": _text(value)}


def _log_text(content: object) -> str:
    if isinstance(content, str):
        return content
    lines = []
    for event in content if isinstance(content, list) else ():
        if not isinstance(event, Mapping):
            lines.append(str(event))
            continue
        text = str(event.get("event", ""))
        head = " ".join(str(event[k]) for k in ("timestamp", "level") if event.get(k))
        lines.append(f"{head} {text}" if head else text)
    return "\n".join(lines) + ("\n" if lines else "")


def _step_status(ti: Mapping[str, Any], outputs: Mapping[tuple[str, int], Mapping[str, str]],
                 cancelled: bool, failed_helpers: set[str]) -> StepStatus:
    task_id = str(ti.get("task_id", ""))
    map_index = _int(ti.get("map_index"), -1)
    raw = str(ti.get("state") or "")
    tries = _int(ti.get("try_number"), 0)
    state = _TASK_STATE.get(raw, StepState.PENDING)
    message = _TASK_MESSAGE.get(raw, "")
    if raw == "upstream_failed" and task_id in failed_helpers:
        state = StepState.FAILED
        message = f"its item list (task {task_id + ITEMS_SUFFIX!r}) failed"
    if cancelled and (state is StepState.FAILED or not state.terminal
                      or (raw in ("skipped", "upstream_failed") and tries == 0)):
        state, message = StepState.CANCELLED, "run cancelled"
    return StepStatus(step=task_id, state=state, key=str(map_index) if map_index >= 0 else "",
                      attempts=tries, started_at=parse_time(ti.get("start_date")),
                      finished_at=parse_time(ti.get("end_date")),
                      outputs=dict(outputs.get((task_id, map_index), {})), message=message)


def run_status(run: Mapping[str, Any], task_instances: Sequence[Mapping[str, Any]],
               outputs: Mapping[tuple[str, int], Mapping[str, str]] | None = None,
               ) -> RunStatus:
    """Map an Airflow DAG run and its task instances (plain data) to a :class:`RunStatus`.

    ``outputs`` maps (task id, map index) to the outputs of succeeded task instances.
    """
    dag_id = str(run.get("dag_id", ""))
    raw = str(run.get("state") or "")
    state = _RUN_STATE.get(raw, RunState.RUNNING)
    cancelled = state is RunState.FAILED and run.get("note") == CANCEL_NOTE
    failed_helpers = {str(t.get("task_id", "")).removesuffix(ITEMS_SUFFIX)
                      for t in task_instances
                      if str(t.get("task_id", "")).endswith(ITEMS_SUFFIX)
                      and t.get("state") == "failed"}
    tis = [t for t in task_instances
           if not str(t.get("task_id", "")).endswith(ITEMS_SUFFIX)
           and t.get("task_id") != EXIT_STATUS_TASK]
    tis.sort(key=lambda t: (str(t.get("start_date") or "~"), str(t.get("task_id", "")),
                            _int(t.get("map_index"), -1)))
    steps = tuple(_step_status(t, outputs or {}, cancelled, failed_helpers) for t in tis)
    message = ""
    if cancelled:
        state = RunState.CANCELLED
        message = "cancelled: the DAG run was marked failed through the Airflow API"
    elif state is RunState.FAILED:
        failed = [s.step + (f"[{s.key}]" if s.key else "") for s in steps
                  if s.state is StepState.FAILED]
        message = "failed steps: " + ", ".join(failed) if failed else "the DAG run failed"
    return RunStatus(run_id=f"{dag_id}/{run.get('dag_run_id', '')}", workflow=dag_id,
                     state=state, steps=steps, started_at=parse_time(run.get("start_date")),
                     finished_at=parse_time(run.get("end_date")), message=message)
