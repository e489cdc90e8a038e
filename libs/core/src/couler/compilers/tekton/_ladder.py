"""Memory escalation on Tekton: attempt tasks with more memory, one after another.

A Tekton retry reuses the task's spec, so a step whose retry policy multiplies its memory
on an out-of-memory kill becomes tasks ``STEP``, ``STEP-mem2``, ... -- one per distinct
memory, up to the policy's ceiling and at most ``limit + 1`` -- each running after the
one before. The first runs the command under the retry wrapper, which stops at an
out-of-memory kill (``stop_on``); every later task reads the results of the one before
(``couler-exit``, ``couler-failure``, ``couler-attempts`` and the outputs, written even
after a failure) and runs the command again, with the attempts made so far counted
against the limit and indexing the back-off delays, only when that task ended out of
memory with attempts left; otherwise it passes the results on (a pod that exits at
once). The last task's results are the step's, and its exit code too: every task but
the last has ``onError: continue``.

Pure: builds documents.
"""

from __future__ import annotations

import copy
import shlex
from typing import Any

from couler import ir
from couler.compilers import entrypoint
from couler.compilers.tekton.capabilities import ATTEMPTS_RESULT, EXIT_RESULT, FAILURE_RESULT

__all__ = ["rung_names", "rungs"]

Doc = dict[str, Any]


def rung_names(step: str, n: int) -> list[str]:
    """``STEP``, ``STEP-mem2``, ... ``STEP-memN`` (just ``STEP`` for n < 2)."""
    return [step] + [f"{step}-mem{k}" for k in range(2, n + 1)]


def rungs(task: Doc, levels: list[Doc], names: list[str], retry: ir.RetryPolicy
          ) -> list[Doc]:
    """The attempt tasks made from the step's ``task`` (compiled with the wrapper's
    ``stop_on`` OOM and ``attempts_before`` COULER_ATTEMPTS_BEFORE, every result written)."""
    delays = " ".join(f"{d:g}" for d in entrypoint.delays(retry))
    base = task["taskSpec"]
    results = [r["name"] for r in base["results"]]
    out = []
    for k, (name, compute) in enumerate(zip(names, levels, strict=True)):
        spec = copy.deepcopy(base)
        tstep = spec["steps"][0]
        tstep["computeResources"] = compute
        if k == len(names) - 1:
            tstep.pop("onError", None)  # the last attempt's failure is the step's
        rung = dict(task)
        rung["name"] = name
        if k:
            prev = names[k - 1]
            rung.pop("when", None)  # skipped with the first task (its results are missing)
            rung["runAfter"] = [prev]
            prev_params = [(f"couler-prev-{i}", r) for i, r in enumerate(results)]
            rung["params"] = [*task.get("params", []), *(
                {"name": p, "value": f"$(tasks.{prev}.results.{r})"} for p, r in prev_params)]
            spec["params"] = [*spec.get("params", []), *(
                {"name": p, "type": "string"} for p, _ in prev_params)]
            env = {r: f"COULER_PREV_{i}" for i, r in enumerate(results)}
            tstep["env"] = [*tstep.get("env", []), *(
                {"name": env[r], "value": f"$(params.{p})"} for p, r in prev_params)]
            tstep["script"] = "\n".join(_head(env, results, compute, retry, delays)) + "\n" \
                + tstep["script"].split("\n", 1)[1]
        rung["taskSpec"] = spec
        out.append(rung)
    return out


def _head(env: dict[str, str], results: list[str], compute: Doc, retry: ir.RetryPolicy,
          delays: str) -> list[str]:
    """A later attempt task's first lines: pass the results on, or go on with more memory."""
    ex, fail = f'"${env[EXIT_RESULT]}"', f'"${env[FAILURE_RESULT]}"'
    att_var = env[ATTEMPTS_RESULT]
    att = f'"${att_var}"'
    memory = (compute.get("limits") or compute.get("requests") or {}).get("memory")
    head = [
        "#!/bin/sh",
        f"if [ {ex} = 0 ] || [ {fail} != oom ] || [ {att} -gt {retry.limit} ]; then",
        *(f"  printf '%s' \"${env[r]}\" > \"$(results.{r}.path)\"" for r in results),
        f"  exit {ex}",
        "fi",
        f'echo "couler: out of memory: attempt $(({att_var} + 1)) with memory {memory}" >&2',
        f"COULER_ATTEMPTS_BEFORE={att}",
    ]
    if retry.backoff is not None:
        head.append(f"sleep \"$(echo {shlex.quote(delays)} | cut -d ' ' -f {att})\"")
    return head
