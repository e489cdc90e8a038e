"""The Ray executor: each step execution of a workflow is one Ray task.

Mapping of the IR onto Ray:

* **Execution**: a task runs its step exactly as the local engine does -- it
  builds a :class:`~couler_runtime.local.engine.LocalRun` for the run
  directory and calls its single-attempt method (placeholders, path rewriting,
  secrets, the sampled process, output files and the artifact store are the
  local engine's). The run directory must therefore be on a file system every
  Ray node sees (one machine, or a shared mount).
* **Dependencies**: a task receives the object refs of its upstream steps'
  results as arguments, so Ray starts it only after they finished; a result
  is a dict ``{"record": <step record>, "executions": [<item / iteration
  records>]}`` whose record carries the state, outputs and failure class.
  Steps whose outputs a step reads (inputs, ``when``, map source) count as
  upstream too.
* **Edge conditions, depends, when / else**: evaluated inside the task on the
  upstream results (the local engine's rules); a step that must not run
  returns a SKIPPED record without starting a process.
* **map**: static items -> one task per item plus a zero-CPU task that
  aggregates the items' outputs into JSON lists (as the local engine does).
  Items from an upstream output are resolved by the driver once the upstream
  tasks finished (``ray.wait``), then the same tasks are submitted. A
  parallelism bound N is expressed as N lanes: item i also waits for item i-N.
* **Resources** (``@ray.remote`` options, from the step's resources or the
  workflow defaults): ``num_cpus`` = cpu_request (or cpu_limit; fractions
  allowed; default 1), ``memory`` = memory_request (or memory_limit) in bytes,
  ``num_gpus`` = gpu. memory_limit is also enforced by sampling the process
  tree's RSS, as on the local engine. A step requesting more CPUs, memory or
  GPUs than the whole cluster has is failed before submission with a message
  naming both numbers (Ray would keep an infeasible task pending forever).
* **Retries**: ``max_retries`` = the policy's limit and ``retry_exceptions`` =
  [:class:`RetryAttempt`]. The task classifies a failed attempt like the local
  engine (non-zero exit = transient, exit 137/-9 or the sampled memory limit =
  oom, failure to start = infra). When the policy retries that class and
  retries remain, the task sleeps the back-off, escalates the sampled memory
  limit on OOM, and raises :class:`RetryAttempt` so Ray re-executes it;
  otherwise it returns a FAILED record (so downstream edge conditions such as
  ``failed`` / ``any`` still see the result). Attempts are counted in a file in
  the execution directory, since a Ray task does not know its attempt number.
* **Loops**: all iterations run inside one task through the local engine's
  loop (its per-iteration retry policy applies; ``max_retries=0``).
* **Exit hooks**: run by the driver after the main graph, chosen by its final
  state as on the local engine.

Ray is imported when a run starts; without it :class:`RayExecutor` raises
:class:`~couler.errors.UserError`. The executor connects with ``ray.init`` when
Ray is not initialized yet, and never shuts Ray down.
"""

from __future__ import annotations

import importlib
import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from couler import ir
from couler.engines.base import RunState, RunStatus, StepState, StepStatus, check_capabilities
from couler.errors import InvalidWorkflowError, UserError
from couler_runtime.local.engine import (
    LocalEngine,
    LocalRun,
    _expr_steps,
    _MapState,
    _quantity,
    _Record,
    _StepError,
)

from .capabilities import CAPABILITIES, ENGINE

__all__ = ["RayExecutor", "RetryAttempt"]

_ATTEMPT_FILE = ".ray-attempt.json"
Result = dict[str, Any]  # {"record": _Record.to_dict(), "executions": [...]}


class RetryAttempt(Exception):  # noqa: N818 - a signal to Ray, not an error of the caller
    """Raised by a task whose attempt failed in a retryable way: Ray re-executes the task."""


@dataclass(frozen=True)
class _Context:
    """What every task of one run needs (shipped in the task arguments)."""

    run_dir: str
    workflow: ir.Workflow
    parameters: Mapping[str, str]
    secrets: Mapping[tuple[str, str], str]
    image_commands: Mapping[str, tuple[str, ...]]


# --------------------------------------------------------------------------- task side


class _TaskRun(LocalRun):
    """A local run used to execute single steps inside a Ray task.

    It keeps no ``run.json``: concurrent tasks would race on it; the driver
    writes the run record instead.
    """

    def _persist(self) -> None:
        return


def _local_run(ctx: _Context, upstream: Sequence[Result] = ()) -> _TaskRun:
    run_dir = Path(ctx.run_dir)
    engine = LocalEngine(run_dir.parent, max_workers=1, secrets=ctx.secrets,
                         image_commands=ctx.image_commands)
    run = _TaskRun(engine, ctx.workflow, run_dir, parameters=ctx.parameters, on_event=None)
    for result in upstream:
        rec = _Record.from_dict(result["record"])
        run._records[(rec.step, "")] = rec
    return run


def _find_step(wf: ir.Workflow, name: str) -> ir.Step:
    for step in (*wf.steps, *(s for hook in wf.exit_hooks for s in hook.steps)):
        if step.name == name:
            return step
    raise InvalidWorkflowError(f"workflow {wf.name!r}: no step named {name!r}")


def _result(rec: _Record, executions: Sequence[_Record] = ()) -> Result:
    return {"record": rec.to_dict(), "executions": [r.to_dict() for r in executions]}


def _ended(name: str, state: StepState, message: str, key: str = "") -> Result:
    return _result(_Record(name, key=key, state=state, message=message, finished_at=time.time()))


def _decision(run: _TaskRun, step: ir.Step) -> str | None:
    """None = run the step; otherwise why it does not run (a SKIPPED record)."""
    decision = run._decide(step)
    if decision is None:  # cannot happen: every upstream result is terminal
        return "upstream results are missing"
    return decision or None


def _save(path: Path, state: Mapping[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def _attempt_once(run: _TaskRun, step: ir.Step, key: str, label: str, item: object) -> _Record:
    """One attempt of one execution; raises :class:`RetryAttempt` when Ray should retry."""
    wf = run.workflow
    policy = step.retry or wf.defaults.retry
    timeout = step.timeout_seconds or wf.defaults.timeout_seconds
    resources = step.resources or wf.defaults.resources
    exec_dir = run.run_dir / "steps" / step.name / label
    exec_dir.mkdir(parents=True, exist_ok=True)
    state_path = exec_dir / _ATTEMPT_FILE
    state: dict[str, Any] = (
        json.loads(state_path.read_text()) if state_path.is_file() else
        {"attempts": 0, "started_at": time.time(),
         "memory_limit": _quantity(resources.memory_limit) if resources else None})
    state["attempts"] += 1
    _save(state_path, state)
    attempts = int(state["attempts"])
    rec = _Record(step.name, key=key, state=StepState.RUNNING, attempts=attempts,
                  started_at=float(state["started_at"]))
    run._records[(step.name, key)] = rec
    failure = run._attempt(step, rec, label, item, timeout=timeout,
                           memory_limit=state["memory_limit"])
    if failure is None:
        rec.state, rec.finished_at, rec.failure = StepState.SUCCEEDED, time.time(), ""
        return rec
    retries = attempts - 1
    retryable = (failure not in ("fatal", "cancelled") and policy is not None
                 and retries < policy.limit
                 and (ir.FailureClass.ANY in policy.on or ir.FailureClass(failure) in policy.on))
    if not retryable or policy is None:
        rec.state, rec.finished_at = StepState.FAILED, time.time()
        rec.failure = "" if failure in ("fatal", "cancelled") else failure
        return rec
    delay = 0.0
    if policy.backoff is not None:
        b = policy.backoff
        delay = b.base_seconds * b.factor ** retries
        if b.cap_seconds is not None:
            delay = min(delay, b.cap_seconds)
    limit = state["memory_limit"]
    if failure == ir.FailureClass.OOM.value and policy.memory_factor and limit is not None:
        limit = int(limit * policy.memory_factor)
        ceiling = _quantity(policy.memory_ceiling)
        state["memory_limit"] = min(limit, ceiling) if ceiling is not None else limit
        _save(state_path, state)
    time.sleep(delay)
    raise RetryAttempt(f"{rec.message} (attempt {attempts} of {policy.limit + 1}, {failure})")


def _step_task(ctx: _Context, name: str, index: int | None, item: object, n_upstream: int,
               *upstream: Result) -> Result:
    """The body of a step's (or a map item's) Ray task.

    ``upstream[:n_upstream]`` are the upstream results; the rest only order the
    task (a map lane's previous item).
    """
    step = _find_step(ctx.workflow, name)
    run = _local_run(ctx, upstream[:n_upstream])
    key = "" if index is None else str(index)
    skip = _decision(run, step)
    if skip is not None:
        return _ended(name, StepState.SKIPPED, skip, key)
    if step.loop is not None:
        rec = _Record(name)
        run._records[(name, "")] = rec
        run._run_step(step)
        iterations = [r for (s, k), r in run._records.items() if s == name and k]
        return _result(run._records[(name, "")], iterations)
    label = "main" if index is None else f"item-{index}"
    return _result(_attempt_once(run, step, key, label, item))


def _map_task(ctx: _Context, name: str, n_upstream: int, *results: Result) -> Result:
    """Aggregate a map's item results into the step's result (local engine rules)."""
    step = _find_step(ctx.workflow, name)
    run = _local_run(ctx, results[:n_upstream])
    skip = _decision(run, step)
    if skip is not None:
        return _ended(name, StepState.SKIPPED, skip)
    items = [_Record.from_dict(r["record"]) for r in results[n_upstream:]]
    for rec in items:
        run._records[(name, rec.key)] = rec
    starts = [r.started_at for r in items if r.started_at is not None]
    run._records[(name, "")] = _Record(name, state=StepState.RUNNING,
                                       started_at=min(starts) if starts else time.time())
    run._finish_map(_MapState(step, [None] * len(items)))
    return _result(run._records[(name, "")], items)


# --------------------------------------------------------------------------- driver side


def _import_ray() -> Any:
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise UserError(
            "the Ray executor needs the 'ray' package, which is not installed in this "
            "environment: create the Ray environment with `scripts/setup-engine-venv.sh ray` "
            "(requirements-ray.txt) and run from .venv-ray") from exc


def _needs(step: ir.Step, available: set[str]) -> list[str]:
    """Upstream steps of ``step``: its dependencies and the steps whose outputs it reads."""
    names = [d.step for d in step.dependencies]
    if step.depends is not None:
        names += _expr_steps(step.depends)
    sources: list[ir.ValueSource] = [i.value for i in step.inputs]
    if step.when is not None:
        sources += [step.when.condition.left, step.when.condition.right]
    if step.foreach is not None and step.foreach.source is not None:
        sources.append(step.foreach.source)
    names += [s.step for s in sources if isinstance(s, ir.StepOutputRef)]
    return [n for n in dict.fromkeys(names) if n != step.name and n in available]


def task_options(step: ir.Step, wf: ir.Workflow) -> dict[str, Any]:
    """The ``ray.remote`` options of a step's tasks (see the module docs for the mapping)."""
    resources = step.resources or wf.defaults.resources
    policy = step.retry or wf.defaults.retry
    opts: dict[str, Any] = {"name": f"{wf.name}.{step.name}", "num_cpus": 1.0,
                            "max_retries": 0, "retry_exceptions": False}
    if resources is not None:
        cpu = resources.cpu_request or resources.cpu_limit
        if cpu:
            opts["num_cpus"] = float(ir.parse_quantity(cpu))
        memory = _quantity(resources.memory_request or resources.memory_limit)
        if memory:
            opts["memory"] = memory
        if resources.gpu:
            opts["num_gpus"] = resources.gpu
    if policy is not None and step.loop is None and policy.limit > 0:
        opts["max_retries"] = policy.limit
        opts["retry_exceptions"] = [RetryAttempt]
    return opts


class RayExecutor:
    """Runs workflows on a Ray cluster, one Ray task per step execution.

    Args:
        work_dir: Directory holding one sub-directory per run (on a file system
            every Ray node sees).
        address: The Ray cluster to connect to when Ray is not initialized yet
            (None = ``ray.init()``'s default: a local cluster or ``RAY_ADDRESS``).
        secrets: Secret values by ``(secret name, key)``.
        image_commands: Optional command prefix per container image (as on the
            local engine).
        init_options: Extra keyword arguments for ``ray.init``.
    """

    name = ENGINE
    capabilities = CAPABILITIES

    def __init__(self, work_dir: str | Path, address: str | None = None, *,
                 secrets: Mapping[tuple[str, str], str] | None = None,
                 image_commands: Mapping[str, Sequence[str]] | None = None,
                 init_options: Mapping[str, Any] | None = None) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.address = address
        self.secrets: dict[tuple[str, str], str] = dict(secrets or {})
        self.image_commands: dict[str, tuple[str, ...]] = {
            k: tuple(v) for k, v in (image_commands or {}).items()}
        self.init_options: dict[str, Any] = dict(init_options or {})
        self._remotes: dict[str, Any] = {}

    # ------------------------------------------------------------------ public API

    def run(self, wf: ir.Workflow, *, parameters: Mapping[str, str] | None = None) -> RunStatus:
        """Run ``wf`` on Ray to completion and return its final status.

        Raises:
            UnsupportedFeatureError: ``wf`` uses a feature the Ray executor lacks.
            InvalidWorkflowError: A dependency names a step that does not exist.
            UserError: Ray is not installed.
        """
        check_capabilities(ENGINE, CAPABILITIES, wf)
        ir.validate(wf)
        ray = _import_ray()
        if not ray.is_initialized():
            ray.init(address=self.address, **self.init_options)
        run_id = f"{wf.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        run_dir = self.work_dir / run_id
        run_dir.mkdir(parents=True)
        ctx = _Context(str(run_dir), wf, dict(parameters or {}), self.secrets,
                       self.image_commands)
        started = time.time()
        refs = self._graph(ray, ctx, wf.steps, {})
        results = {s.name: self._get(ray, refs[s.name], s.name) for s in wf.steps}
        main = [_Record.from_dict(results[s.name]["record"]) for s in wf.steps]
        failed = [r for r in main if r.state is StepState.FAILED]
        final = RunState.FAILED if failed else RunState.SUCCEEDED
        message = ("steps failed: " + ", ".join(r.step for r in failed)) if failed else ""
        hooks = _local_run(ctx)._hooks(final, failed)
        if hooks:
            hook_refs = self._graph(ray, ctx, tuple(hooks), refs)
            for step in hooks:
                results[step.name] = self._get(ray, hook_refs[step.name], step.name)
            bad = [s.name for s in hooks
                   if results[s.name]["record"]["state"] == StepState.FAILED.value]
            if bad:
                final = RunState.FAILED
                message = "; ".join(filter(None, [message, "exit hooks failed: " + ", ".join(bad)]))
        steps: list[StepStatus] = []
        for result in results.values():
            steps.append(_Record.from_dict(result["record"]).status())
            steps += [_Record.from_dict(r).status() for r in result.get("executions", ())]
        status = RunStatus(run_id=run_id, workflow=wf.name, state=final, steps=tuple(steps),
                           started_at=started, finished_at=time.time(), message=message)
        _write_record(run_dir, wf, ctx.parameters, status, results)
        return status

    # ------------------------------------------------------------------ graph

    def _remote(self, ray: Any, fn: Any) -> Any:
        remote = self._remotes.get(fn.__name__)
        if remote is None:
            remote = self._remotes[fn.__name__] = ray.remote(fn)
        return remote

    def _get(self, ray: Any, ref: Any, name: str) -> Result:
        try:
            result: Result = ray.get(ref)
        except Exception as exc:  # the task raised: retries exhausted by crashes, upstream lost
            text = str(exc).strip().splitlines()
            return _ended(name, StepState.FAILED,
                          f"step {name!r}: the Ray task failed: {text[-1] if text else exc!r}")
        return result

    def _graph(self, ray: Any, ctx: _Context, steps: Sequence[ir.Step],
               known: Mapping[str, Any]) -> dict[str, Any]:
        """Submit ``steps``; return the result ref of each step (and of ``known`` ones)."""
        refs: dict[str, Any] = dict(known)
        available = {s.name for s in steps} | set(known)
        pending = {s.name: s for s in steps}
        while pending:
            progressed = False
            blocking: list[Any] = []
            for name, step in list(pending.items()):
                needs = _needs(step, available)
                if any(n not in refs for n in needs):
                    continue
                upstream = [refs[n] for n in needs]
                dynamic = step.foreach is not None and step.foreach.source is not None
                if dynamic and upstream:
                    _, not_ready = ray.wait(upstream, num_returns=len(upstream), timeout=0)
                    if not_ready:
                        blocking += not_ready
                        continue
                refs[name] = self._submit(ray, ctx, step, needs, upstream)
                del pending[name]
                progressed = True
            if pending and not progressed:
                if not blocking:  # a cycle: cannot happen for a validated workflow
                    for name in pending:
                        refs[name] = ray.put(_ended(name, StepState.FAILED,
                                                    "dependencies can never be satisfied"))
                    break
                ray.wait(list(dict.fromkeys(blocking)), num_returns=1)
        return refs

    def _infeasible(self, ray: Any, opts: Mapping[str, Any]) -> str:
        total = ray.cluster_resources()
        wanted = (("num_cpus", "CPU", "CPUs"), ("memory", "memory", "bytes of memory"),
                  ("num_gpus", "GPU", "GPUs"))
        for option, resource, unit in wanted:
            need = float(opts.get(option) or 0)
            have = float(total.get(resource, 0))
            if need > have:
                return (f"requests {need:g} {unit} but the Ray cluster has {have:g} in total; "
                        "Ray would never schedule it")
        return ""

    def _submit(self, ray: Any, ctx: _Context, step: ir.Step, needs: Sequence[str],
                upstream: Sequence[Any]) -> Any:
        wf = ctx.workflow
        where = f"workflow {wf.name!r}, step {step.name!r}"
        opts = task_options(step, wf)
        problem = self._infeasible(ray, opts)
        if problem:
            return ray.put(_ended(step.name, StepState.FAILED, f"{where}: {problem}"))
        task = self._remote(ray, _step_task)
        if step.foreach is None:
            return task.options(**opts).remote(ctx, step.name, None, None, len(upstream),
                                               *upstream)
        if step.foreach.source is not None:  # resolved here, now that upstream finished
            run = _local_run(ctx, [self._get(ray, ref, n) for n, ref in zip(needs, upstream,
                                                                            strict=True)])
            skip = _decision(run, step)
            if skip is not None:
                return ray.put(_ended(step.name, StepState.SKIPPED, skip))
            try:
                items = run._items(step)
            except _StepError as exc:
                return ray.put(_ended(step.name, StepState.FAILED, str(exc)))
        else:
            items = [lit.value for lit in step.foreach.items]
        lanes = step.foreach.parallelism
        item_refs: list[Any] = []
        for i, item in enumerate(items):
            after = [item_refs[i - lanes]] if lanes and i >= lanes else []
            item_refs.append(task.options(**{**opts, "name": f"{opts['name']}[{i}]"}).remote(
                ctx, step.name, i, item, len(upstream), *upstream, *after))
        aggregate = self._remote(ray, _map_task).options(
            name=opts["name"], num_cpus=0, max_retries=0)
        return aggregate.remote(ctx, step.name, len(upstream), *upstream, *item_refs)





def _write_record(run_dir: Path, wf: ir.Workflow, parameters: Mapping[str, str],
                  status: RunStatus, results: Mapping[str, Result]) -> None:
    data = {
        "run_id": status.run_id, "engine": ENGINE, "workflow": ir.to_dict(wf),
        "parameters": dict(parameters), "state": status.state.value,
        "started_at": status.started_at, "finished_at": status.finished_at,
        "message": status.message,
        "steps": [r for res in results.values()
                  for r in (res["record"], *res.get("executions", ()))],
    }
    (run_dir / "run.json").write_text(json.dumps(data, indent=1, sort_keys=True))
