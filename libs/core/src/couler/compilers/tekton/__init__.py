"""Compile a Couler IR workflow into Tekton ``Pipeline`` + ``PipelineRun`` documents (plain data).

:func:`compile_workflow` turns an :class:`couler.ir.Workflow` into two
``tekton.dev/v1`` documents, a ``Pipeline`` and a ``PipelineRun`` that runs it
by reference; :func:`to_yaml` renders them as one multi-document YAML text.
The compiler is a pure function: no cluster, no network. :data:`CAPABILITIES`
and :data:`LIMITS` are Tekton's capability matrix and limits table; the
compiler checks the matrix (:func:`couler.engines.base.check_capabilities`)
before building anything.

Shape of the output:

* One pipeline task per step, each with an embedded ``taskSpec`` holding one
  Tekton step. Step inputs become task ``params`` (``{{inputs.NAME}}`` →
  ``$(params.NAME)``, also inside script sources, as the Argo compiler does);
  an input fed by another step's output is ``$(tasks.STEP.results.OUT)``,
  by a workflow parameter ``$(params.NAME)``.
* Outputs become task ``results``. Tekton reads a result from the file
  ``$(results.NAME.path)``, so a step with outputs runs through a ``/bin/sh``
  wrapper ``script`` (the image must have ``/bin/sh``): it runs the command
  (its words are passed as the script's ``args``) or the script source (written
  to a file by a quoted here-document and run with the interpreter), then copies
  each file output to its result file; a stdout output is captured to a file,
  echoed back to the log and stored with trailing newlines removed (like
  Argo's ``outputs.result``). The step fails if an output file is missing.
* A retry policy with back-off or failure classes runs the step through the
  retry wrapper of :mod:`couler.compilers.entrypoint` (inside the step's
  ``/bin/sh`` script; the task gets no ``retries``), which also writes the
  ``couler-attempts`` and ``couler-failure`` results; a plain retry limit is
  the task's ``retries``.
* Memory escalation on an out-of-memory kill becomes attempt tasks ``STEP``,
  ``STEP-mem2``, ... with more memory each, run one after another; a task runs
  the command again only when the attempts before ended out of memory, and
  otherwise passes their results on, so the last task's results are the
  step's.
* Dependencies become ``runAfter``. A workflow with an edge other than the
  default one (``failed``, ``any``, ...) or a depends expression is compiled by
  the step-status rewrite (:mod:`couler.compilers.tekton._status`): each step's
  script tests its edges and ``when`` on its upstreams' ``couler-status``
  results and records its own, with ``onError: continue``, and a
  ``couler-run-status`` task fails the PipelineRun when a failure reaches a
  leaf (docs/semantics.md S7). Tekton skips only the task whose ``when``
  is false; tasks ordered after it by ``runAfter`` still run, which is the IR's
  "succeeded (or skipped by its own when)" edge. A task that *reads a result*
  of a skipped task is skipped too (Tekton's resource dependency).
* ``when`` with ``==`` / ``!=`` becomes a when expression ``in`` / ``notin``;
  the else branch uses the negated operator. An ordering comparison (``>``,
  ``>=``, ``<``, ``<=``) is tested by a guard task ``STEP-when`` (``/bin/sh``
  and awk, the two values compared as numbers; a value that is not a number
  fails it) whose ``holds`` result the step's when expression tests ``in
  ["true"]``; loops' ordered conditions are still rejected.
* A map becomes a ``matrix``: static items as explicit ``include``
  combinations (one per item, so items are zipped, not crossed), an upstream
  list as a matrix param fed by a whole array result
  ``$(tasks.STEP.results.OUT[*])`` (the result is declared ``type: array``).
  A static map with a ``parallelism`` bound runs as batches of that many
  items (``STEP``, ``STEP-batch2``, ...), each after the one before.
* A loop is unrolled (at most :data:`MAX_UNROLL` iterations): iteration *k*
  is task ``STEP-iterK`` guarded by the loop condition on iteration *k-1*'s
  results, so once the condition fails every later iteration is skipped.
* An inline sub-workflow is flattened: its steps become tasks named
  ``GROUP-STEP``, its roots run after the group's dependencies and the group's
  dependents run after all of its steps.
* Artifacts pass through the workspace ``couler-artifacts`` (a
  ``volumeClaimTemplate`` bound by the PipelineRun): the producer's script
  copies each output artifact to ``STEP/ARTIFACT`` there after its command
  succeeds, the consumer's copies it to its path before its command.
* A cache policy memoizes the step's results on a PersistentVolumeClaim (the
  policy's name, default ``couler-cache``), keyed by the step's definition and
  input values (:mod:`couler.compilers.tekton._cache`).
* A job step is a kubectl step that acts on the manifest and polls the
  object's success / failure conditions (:mod:`couler.compilers.tekton._job`).
* Exit hooks become ``finally`` tasks guarded by ``$(tasks.status)``.
* Workflow parameters become pipeline ``params`` (list-typed ones ``type:
  array``) and are passed again by the ``PipelineRun`` when they have defaults.
* Volumes become pipeline ``workspaces`` bound by the ``PipelineRun``; pod
  settings (node selector, tolerations, service account, pull secrets, DNS,
  security context) go to the run's ``taskRunTemplate.podTemplate`` or, per
  step, to ``taskRunSpecs``.

* A cron schedule adds a ``ConfigMap`` holding the PipelineRun and a ``batch/v1``
  ``CronJob`` whose Job creates it with kubectl; event triggers add Tekton Triggers'
  ``TriggerBinding``, ``TriggerTemplate`` and ``EventListener`` (a CEL interceptor per
  trigger) (:mod:`couler.compilers.tekton._schedule`).

What Tekton cannot express raises :class:`~couler.errors.UnsupportedFeatureError`
(see :data:`CAPABILITIES` for the features and why), plus, found while
compiling: ordering comparisons in loop conditions, loops longer than
:data:`MAX_UNROLL`, maps larger than the matrix limit, reading the output of a
mapped or looped step, group-level policies on an inline sub-workflow,
dependencies between exit-hook steps, a workflow-wide parallelism bound, a
parallelism bound on a map over an upstream list, edge conditions in a
workflow with an inline sub-workflow or a loop, memory escalation of a mapped
or looped step or together with edge conditions, artifacts from or to
object stores, of looped steps or read from a mapped step, a cache on a step with output
artifacts or memory escalation, and a job step with a condition it cannot
read, a jq output other than ``.``, a non-create action on a manifest without
``metadata.name``, or retries by class, a cache, artifacts or edge conditions.
A ``ttl_seconds`` has no Tekton field; it is recorded in the
``couler.io/ttl-seconds`` annotation for an external pruner.
"""

from __future__ import annotations

from couler.compilers.tekton._cache import CACHED_RESULT
from couler.compilers.tekton._compiler import compile_workflow, to_yaml
from couler.compilers.tekton._status import BRANCH_RESULT, RUN_STATUS_TASK, STATUS_RESULT
from couler.compilers.tekton.capabilities import (
    API_VERSION,
    ATTEMPTS_RESULT,
    CAPABILITIES,
    ENGINE,
    FAILURE_RESULT,
    LIMITS,
    MAX_MATRIX_COMBINATIONS,
    MAX_UNROLL,
)

__all__ = [
    "API_VERSION",
    "ATTEMPTS_RESULT",
    "BRANCH_RESULT",
    "CACHED_RESULT",
    "CAPABILITIES",
    "ENGINE",
    "FAILURE_RESULT",
    "LIMITS",
    "MAX_MATRIX_COMBINATIONS",
    "MAX_UNROLL",
    "RUN_STATUS_TASK",
    "STATUS_RESULT",
    "compile_workflow",
    "to_yaml",
]
