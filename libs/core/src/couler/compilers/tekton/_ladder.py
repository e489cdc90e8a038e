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
from decimal import ROUND_CEILING, Decimal
from typing import Any

from couler import ir
from couler.compilers import entrypoint
from couler.compilers.kube import resource_requirements
from couler.compilers.tekton.capabilities import ATTEMPTS_RESULT, EXIT_RESULT, FAILURE_RESULT
from couler.ir import parse_quantity

__all__ = ["memory_levels", "rung_names", "rungs"]

Doc = dict[str, Any]


def memory_levels(retry: ir.RetryPolicy | None, res: ir.Resources | None) -> list[Doc]:
    """The compute resources of each attempt task (the first as written), or [] when
    there is nothing to escalate (no factor, no memory quantity, or a ceiling reached at
    once)."""
    if retry is None or retry.memory_factor is None or res is None or not (
            res.memory_limit or res.memory_request):
        return []  # nothing to multiply: every attempt has the same memory
    factor = Decimal(str(retry.memory_factor))
    ceiling = parse_quantity(retry.memory_ceiling) if retry.memory_ceiling else None

    def series(quantity: str) -> list[int]:
        base = parse_quantity(quantity)
        top = None if ceiling is None else max(ceiling, base)
        value, out = base, []
        for _ in range(retry.limit + 1):
            capped = value if top is None else min(value, top)
            out.append(int(capped.to_integral_value(ROUND_CEILING)))
            value *= factor
        return out

    limits = series(res.memory_limit) if res.memory_limit else []
    requests = series(res.memory_request) if res.memory_request else []
    if limits and requests:
        requests = [min(a, b) for a, b in zip(requests, limits, strict=True)]
    levels: list[Doc] = [resource_requirements(res)]
    for k in range(1, retry.limit + 1):
        if (limits[k:k + 1], requests[k:k + 1]) == (limits[k - 1:k], requests[k - 1:k]):
            break  # the ceiling is reached: later attempts run in the last task
        compute = resource_requirements(res)
        if limits:
            compute.setdefault("limits", {})["memory"] = str(limits[k])
        if requests:
            compute.setdefault("requests", {})["memory"] = str(requests[k])
        levels.append(compute)
    return levels if len(levels) > 1 else []


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
