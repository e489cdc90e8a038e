"""The script of a Tekton step: run the command, write the results (and what rewrites add).

Every rewrite that needs the step's own shell -- outputs as results, the retry wrapper,
the step-status rewrite, artifacts, memory escalation's attempt tasks, the cache -- is
one part of the ``/bin/sh`` script :func:`step_script` builds, in this order: the
status prologue (edges and when), the artifact fetches, the script source, the cache
lookup, the command (under the retry wrapper), the result copies and artifact stores,
the cache store, the status epilogue. Pure: builds text.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection, Sequence
from typing import Any

from couler import ir
from couler.compilers import entrypoint
from couler.compilers.tekton import _cache, _status
from couler.compilers.tekton.capabilities import ATTEMPTS_RESULT, EXIT_RESULT, FAILURE_RESULT

__all__ = ["step_script"]


def step_script(step: ir.Step, run: str, files: Sequence[ir.OutputParameter],
                stdout: Sequence[ir.OutputParameter], prologue: str = "", *,
                arrays: Collection[str] = (), policy: ir.RetryPolicy | None = None,
                status: tuple[Sequence[_status.Upstream], str, str] | None = None,
                moves: tuple[list[str], list[str]] = ([], []), ladder: bool = False,
                cache: _cache.CachePlan | None = None) -> str:
    """A /bin/sh script that runs ``run`` and writes the step's result files.

    Args:
        step: the step (its outputs are the results).
        run: the shell command line of one attempt.
        files: outputs read from files; stdout: outputs read from stdout.
        prologue: lines run first (the script source written to a file).
        arrays: names of outputs that are array results.
        policy: retry under the :mod:`~couler.compilers.entrypoint` wrapper.
        status: the step-status rewrite's (upstreams, edge test, when test): test the
            step's edges and when first and record its outcome (:mod:`._status`).
        moves: artifact lines run before the command and after its success.
        ladder: an attempt task of memory escalation (stop at OOM, write couler-exit).
        cache: memoize the results (:mod:`._cache`).
    """
    lines = ["#!/bin/sh"]
    if status is not None:
        declared = [(o.name, o.name in arrays) for o in step.outputs]
        if policy is not None:
            declared += [(ATTEMPTS_RESULT, False), (FAILURE_RESULT, False)]
        lines += _status.prologue(*status, declared)
    elif ladder:  # the next attempt task reads every result, even after a failure
        for o in step.outputs:
            empty = "[]" if o.name in arrays else ""
            lines.append(f"printf '{empty}' > \"$(results.{o.name}.path)\"")
    fetch, store = moves
    if fetch:
        finish = "couler_finish Failed failed; " if status is not None else ""
        lines.append(f"couler_missing() {{ echo \"couler: input artifact $1 is missing\" "
                     f">&2; {finish}exit 1; }}")
    lines += fetch
    if prologue:
        lines.append(prologue.rstrip("\n"))
    out = "/tmp/couler-stdout"
    run_lines_at = len(lines)
    if policy is not None:
        status_file = "/tmp/couler-retry-status"
        extra: dict[str, Any] = {}
        if ladder:  # out of memory: the next attempt task, with more memory, goes on
            extra = {"stop_on": (ir.FailureClass.OOM,),
                     "attempts_before": "COULER_ATTEMPTS_BEFORE"}
        lines += [entrypoint.fragment(policy, run, status_path=status_file,
                                      stdout_path=out if stdout else "",
                                      **extra).rstrip("\n"),
                  "rc=$couler_rc"]
        if ladder:
            lines.append(f"printf '%s' \"$rc\" > \"$(results.{EXIT_RESULT}.path)\"")
        if stdout:
            lines.append(f"cat {out}")
        for key, result in (("attempts", ATTEMPTS_RESULT), ("class", FAILURE_RESULT)):
            lines.append(f"sed -n 's/^{key}=//p' {status_file} | tr -d '\\n' > "
                         f'"$(results.{result}.path)"')
    elif stdout:
        lines += [f"{run} > {out}", "rc=$?", f"cat {out}"]
    else:
        lines += [run, "rc=$?"]
    copies = [f"printf '%s' \"$(cat {out})\" > \"$(results.{o.name}.path)\""
              for o in stdout]
    copies += [f"cp {shlex.quote(o.selector)} \"$(results.{o.name}.path)\""
               for o in files]
    copies += store
    if cache is not None:  # a hit restores the results instead of running
        cached = [o.name for o in step.outputs]
        hit = cache.restore(cached)
        if policy is not None:
            hit += [f"printf 0 > \"$(results.{ATTEMPTS_RESULT}.path)\"",
                    f"printf '' > \"$(results.{FAILURE_RESULT}.path)\""]
        run_part = lines[run_lines_at:]
        lines[run_lines_at:] = [*cache.lookup(), 'if [ -n "$couler_hit" ]; then',
                                *(f"  {h}" for h in hit), "  rc=0", "else",
                                *(f"  {r}" for r in "\n".join(run_part).split("\n")),
                                "fi"]
        copies = [f'[ -n "$couler_hit" ] || {c}' for c in copies]
        copies.append(f'[ -n "$couler_hit" ] || {{ {" ; ".join(cache.store(cached))} ; }}')
    if status is None:
        lines.append('[ "$rc" -eq 0 ] || exit "$rc"')
        lines += [c + " || exit 1" for c in copies]
    else:  # a missing output file fails the step, as outside status mode
        if copies:
            lines.append('if [ "$rc" -eq 0 ]; then')
            lines += [f"  {c} || rc=1" for c in copies]
            lines.append("fi")
        lines += _status.epilogue()
    return "\n".join(lines) + "\n"
