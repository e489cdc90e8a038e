"""The local engine's sub-workflows: a sub-workflow step's inner graph run as one attempt.

It owns running an inline or referenced workflow's steps as a nested run sharing the
run's records, artifact store and process slots (records named ``outer/inner``), its exit
hooks, the step's timeout over the nested run, and what the step's outputs and artifacts
are (those of the one inner step declaring each).
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from couler import failures, ir
from couler.engines.base import Feature, RunState, StepState
from couler.errors import InvalidWorkflowError, UnsupportedFeatureError

from .artifacts import copy_path
from .capabilities import ENGINE, check_workflow
from .journal import _Record
from .prepare import _StepError
from .process import SAMPLE_SECONDS

if TYPE_CHECKING:
    from .engine import LocalRun

__all__ = ["attempt_nested", "resolve_references"]


def attempt_nested(run: LocalRun, step: ir.Step, rec: _Record, exec_dir: Path, item: object, *,
                   timeout: int | None) -> str | None:
    """Run a sub-workflow step's inner graph as one attempt of the step."""
    body = step.body
    assert isinstance(body, ir.SubWorkflowSpec)
    where = f"workflow {run.workflow.name!r}, step {step.name!r}"
    hooks_of: ir.Workflow | None = None
    if body.steps:
        wf, steps, parameters = run.workflow, body.steps, run._parameters
    else:
        ref = run._references.get(body.name)
        if ref is None:  # resolved when the run started; only a damaged record lacks it
            run._update(rec, message=f"{where}, field 'body.name': workflow "
                                     f"{body.name!r} is not available to the local engine")
            return "fatal"
        try:
            parameters = {i.name: run._value(i.value, step, item, {}, f"inputs.{i.name}")
                          for i in step.inputs}
        except _StepError as exc:
            run._update(rec, message=str(exc))
            return "fatal"
        wf, steps, hooks_of = ref, ref.steps, ref
        if ref.timeout_seconds is not None:
            timeout = min(timeout or ref.timeout_seconds, ref.timeout_seconds)
    scope = run._name(step.name) + (f"[{rec.key}]" if rec.key else "") + "/"
    child = _child(run, wf, scope, exec_dir, parameters)
    with _linked(run, child, timeout, f"{where}: timed out after {timeout} s"):
        child._graph(steps, reuse=True)
        inner = [r for r in (child._record(s.name) for s in steps) if r is not None]
        failed = [r for r in inner if r.state is StepState.FAILED]
        if failed and not child._unhandled(steps):
            failed = []  # every failure was handled inside (rule S7): the group succeeded
        bad: list[str] = []
        if hooks_of is not None and not child._cancel.is_set():
            final = RunState.FAILED if failed else RunState.SUCCEEDED
            hook_steps = child._hooks(final, failed)
            if hook_steps:
                child._graph(tuple(hook_steps), reuse=False)
                bad = [child._name(s.name) for s in hook_steps
                       if child._state_of(s.name) is StepState.FAILED]
    with run._lock:
        mine = [r for (name, _), r in run._records.items() if name.startswith(scope)]
    changes: dict[str, object] = {
        "peak_cpu": max((r.peak_cpu or 0.0 for r in mine), default=None),
        "peak_memory_bytes": max((r.peak_memory_bytes or 0 for r in mine), default=None),
    }
    if child._cancel.is_set():
        if run._cancel.is_set():
            run._update(rec, message=run._stop_message(), **changes)
            return "cancelled"
        run._update(rec, message=child._halt, failure_reason=str(
            failures.classify(None, timed_out=True)), **changes)
        return ir.FailureClass.TRANSIENT.value
    if failed or bad:
        names = [r.step for r in failed] + [f"{n} (exit hook)" for n in bad]
        run._update(rec, message=f"{where}: inner steps failed: {', '.join(names)}",
                    failure_reason=failed[0].failure_reason if failed else "",
                    errored=bool(failed) and failed[0].errored, **changes)
        return (failed[0].failure if failed else "") or "fatal"
    outputs: dict[str, str] = {}
    for out in step.outputs:
        producers = [s for s in steps if s.output(out.name) is not None]
        found = child._record(producers[0].name) if len(producers) == 1 else None
        if found is None or out.name not in found.outputs:
            run._update(rec, message=f"{where}, field 'outputs.{out.name}': no inner step "
                                     f"produced an output {out.name!r}", **changes)
            return "fatal"
        outputs[out.name] = found.outputs[out.name]
    for art in step.output_artifacts:
        makers = [s for s in steps if any(a.name == art.name for a in s.output_artifacts)]
        src = (run._store.location(child._name(makers[0].name), art.name)
               if len(makers) == 1 else None)
        if src is None or not src.exists():
            run._update(rec, message=f"{where}, field 'output_artifacts.{art.name}': no "
                                     f"inner step produced an artifact {art.name!r}",
                        **changes)
            return "fatal"
        copy_path(src, run._store.location(run._name(step.name), art.name))
    run._update(rec, message="", outputs=outputs, **changes)
    return None


def _child(run: LocalRun, wf: ir.Workflow, prefix: str, directory: Path,
           parameters: Mapping[str, str]) -> LocalRun:
    """A nested run of a sub-workflow's steps, sharing this run's records and slots."""
    child = copy.copy(run)
    child.workflow = wf
    child._parameters = dict(parameters)
    child._prefix = prefix
    child._steps_dir = directory
    child._parent = run
    child._cancel = threading.Event()
    child._halt = ""
    return child


@contextmanager
def _linked(run: LocalRun, child: LocalRun, timeout: int | None, message: str) -> Iterator[None]:
    """Stop ``child`` when this run stops or after ``timeout`` seconds (then ``message``)."""
    done = threading.Event()

    def watch() -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done.is_set():
            if run._cancel.is_set():
                child._cancel.set()
                return
            if deadline is not None and time.monotonic() >= deadline:
                with run._lock:
                    child._halt = message
                    child._cancel.set()
                return
            run._cancel.wait(SAMPLE_SECONDS)

    watcher = threading.Thread(target=watch, name=f"couler-local-{child._prefix}",
                               daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def resolve_references(wf: ir.Workflow, available: Mapping[str, ir.Workflow]
                       ) -> dict[str, ir.Workflow]:
    """Every workflow ``wf`` refers to (transitively), checked before anything runs."""
    found: dict[str, ir.Workflow] = {}

    def visit(current: ir.Workflow, chain: tuple[str, ...]) -> None:
        hooks = (s for hook in current.exit_hooks for s in hook.steps)
        for step in ir.all_steps((*current.steps, *hooks)):
            body = step.body
            if not isinstance(body, ir.SubWorkflowSpec) or body.steps:
                continue
            where = f"workflow {current.name!r}, step {step.name!r}"
            ref = available.get(body.name)
            if ref is None:
                known = ", ".join(repr(n) for n in sorted(available)) or "none"
                raise UnsupportedFeatureError(
                    ENGINE, current.name, step.name, Feature.SUBWORKFLOW_REF.value,
                    f"field 'body.name': workflow {body.name!r} is not available locally; "
                    f"give it to LocalEngine(workflows=...) (available: {known})")
            if body.digest and ir.digest(ref) != body.digest:
                raise UnsupportedFeatureError(
                    ENGINE, current.name, step.name, Feature.SUBWORKFLOW_REF.value,
                    f"field 'body.digest': the step pins {body.digest} but the local workflow "
                    f"{body.name!r} is {ir.digest(ref)}")
            if body.name in chain:
                raise InvalidWorkflowError(f"{where}, field 'body.name': workflow references "
                                           "form a cycle: " + " -> ".join((*chain, body.name)))
            missing = [p.name for p in ref.parameters
                       if p.default is None and step.input(p.name) is None]
            if missing:
                raise InvalidWorkflowError(
                    f"{where}, field 'inputs': workflow {body.name!r} needs parameters "
                    f"{', '.join(map(repr, missing))}, which the step does not give as inputs")
            if body.name not in found:
                check_workflow(ref)
                found[body.name] = ref
                visit(ref, (*chain, body.name))

    visit(wf, (wf.name,))
    return found
