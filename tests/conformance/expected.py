"""The expected result of every conformance program, written by hand from docs/semantics.md.

Each answer was derived by reading the program and the rules of docs/semantics.md -- never
copied from an engine's output -- and every run and step carries a ``why`` naming the
rule(s) that decide it (S1..S11, the exceptions E1..E7, or a paragraph of the page: *words*,
*attempts*, *daemon*). ``tests/unit/test_conformance_expected.py`` checks that every rule
named exists in docs/semantics.md and that the steps listed are exactly the program's steps.
The local engine, Ray (tests/ray_engine/check_conformance.py), Apache Airflow
(tests/integration/test_conformance_airflow.py) and ``kfp.local``
(tests/integration/test_conformance_engines.py) are each compared with these answers
(:func:`tests.conformance.harness.matches`); an engine's known differences are listed in its
test, each naming the exception (E1..E7) or the environment limit it comes from.

How a result reads (the harness's summary, not a rule): a run is ``succeeded`` or
``failed``; a step ``succeeded``, ``failed`` or ``skipped`` -- skipped by its own ``when``
and *not run* (its edges did not hold, Argo's Omitted) are both recorded ``skipped``
(docs/semantics.md, *words*), and the ``why`` says which. An output parameter is its file's
text, or a script's standard output, without the trailing newline; a map step's output is
the JSON list of its items' values in item order (*attempts*: "its outputs enter the map's
lists at its position"). Outputs not listed are not compared; ``attempts`` is compared
where the program is about retries. A program an engine cannot express is refused at
compile time naming the feature (docs/semantics.md, "What each engine cannot do the same
way"); the answer below is what an engine that runs it must produce.

This module is plain Python (no imports beyond the standard library) so every engine's
virtualenv can read it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EXPECTED", "PARAGRAPHS"]

# Paragraphs of docs/semantics.md a ``why`` may name besides the S / E rule ids.
PARAGRAPHS = ("words", "attempts", "daemon")


def _step(state: str, why: str, *, outputs: dict[str, str] | None = None,
          attempts: int | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"state": state, "why": why}
    if outputs is not None:
        entry["outputs"] = outputs
    if attempts is not None:
        entry["attempts"] = attempts
    return entry


def _run(state: str, why: str, **steps: dict[str, Any]) -> dict[str, Any]:
    return {"state": state, "why": why,
            "steps": {name.replace("__", "/").replace("_", "-"): s for name, s in steps.items()}}


OK = "words: its command exits 0"
NO_FAILURE = "S7: no step failed, so no failure reaches a leaf"

EXPECTED: dict[str, dict[str, Any]] = {
    "artifacts": _run(
        "succeeded", NO_FAILURE,
        producer=_step("succeeded", OK),
        consumer=_step("succeeded", "S1: after producer, which succeeded; its input artifact "
                       "is producer's report, so it copies 'artifact-payload'",
                       outputs={"seen": "artifact-payload"})),
    "basic_steps": _run(
        "succeeded", NO_FAILURE,
        produce=_step("succeeded", "words: the script prints 'hello' (its result)",
                      outputs={"result": "hello"}),
        shout=_step("succeeded", "S1: after produce; S11: produce's result is filled into its "
                    "argument $0, so it writes 'hello world'",
                    outputs={"said": "hello world"})),
    "cron": _run(
        "succeeded", NO_FAILURE + " (the schedule only says when a run starts)",
        tick=_step("succeeded", OK)),
    "daemon": _run(
        "succeeded", "S7 and daemon: a stopped daemon is no failure",
        server=_step("succeeded", "daemon: the graph has no other step, so it is stopped at "
                     "once (or exits 0 by itself after 1 s); being stopped is no failure")),
    "depends_expr": _run(
        "succeeded", NO_FAILURE,
        ok=_step("succeeded", OK, outputs={"out": "ok"}),
        also_ok=_step("succeeded", OK, outputs={"out": "also-ok"}),
        either=_step("succeeded", "S5: 'ok.Succeeded || !also-ok.Failed' is read once both "
                     "finished; both hold", outputs={"out": "either"})),
    "edge_conditions": _run(
        "succeeded", "S7: broken's failure is handled by steps that succeed (on-failure, "
        "always); the leaves ok, on-failure and always all succeeded; S9: no continue-on",
        ok=_step("succeeded", OK + "; S7: independent of broken",
                 outputs={"out": "ok"}),
        broken=_step("failed", "words: its command exits 1"),
        on_failure=_step("succeeded", "S4: broken.Failed holds",
                         outputs={"out": "recovering"}),
        always=_step("succeeded", "S4: an any edge holds for every outcome",
                     outputs={"out": "always"})),
    "event_trigger": _run(
        "succeeded", NO_FAILURE + " (the trigger only says when a run starts)",
        react=_step("succeeded", OK)),
    "exit_hooks": _run(
        "succeeded", NO_FAILURE + "; S8: the hooks run after it and do not change it",
        work=_step("succeeded", OK),
        celebrate=_step("succeeded", "S8: the run succeeded, which its 'on' matches"),
        mourn=_step("skipped", "S8: on failed, the run succeeded: the hook does not fire and "
                    "is recorded skipped")),
    # Engines run it only where a GPU is given (the local conformance run gives the engine
    # a device; tests/integration/test_local_gpus.py refuses a request above the machine).
    "gpu": _run(
        "succeeded", NO_FAILURE,
        train=_step("succeeded", OK + " on the GPU it requested")),
    "interpolation": _run(
        "succeeded", NO_FAILURE,
        square=_step("succeeded", "S11: each item is filled into 'n=%s twice=%s%s'; "
                     "attempts: the map's list holds its items' values in item order",
                     outputs={"out": '["n=2 twice=22", "n=3 twice=33"]'}),
        lr=_step("succeeded", "S1: after square; words: the script prints '0.5'",
                 outputs={"result": "0.5"}),
        train=_step("succeeded", "S1: after lr; S11: lr's result fills the f-string and the "
                    "workflow parameter epochs (default 3) the formatted argument",
                    outputs={"out": "lr=0.5 --epochs=3"})),
    # Only a Kubernetes cluster runs a job step: the local engine, Ray, kfp.local and
    # Airflow's dag.test() refuse it here (their CAPABILITIES / needs a cluster).
    "job_step": _run(
        "succeeded", NO_FAILURE,
        k8s_job=_step("succeeded", "words: the Job's pod exits 0, so its success condition "
                      "'status.succeeded > 0' holds")),
    "map_outcomes": _run(
        "failed", "S7: give-up did not run, so it carries its parent's outcome -- mixed "
        "failed -- to a leaf; salvage's success does not handle it",
        mixed=_step("failed", "words and attempts: item 1 exits 1, so the map step failed "
                    "(item 0 succeeded)"),
        salvage=_step("succeeded", "S4: mixed.AnySucceeded holds (item 0)"),
        give_up=_step("skipped", "S4 and S2: mixed.AllFailed does not hold (item 0 "
                      "succeeded): not run")),
    "map_static": _run(
        "succeeded", NO_FAILURE + "; S10: parallelism 2 changes neither",
        square=_step("succeeded", "S10: every item runs (two at once); attempts: the list in "
                     "item order, 1, 2, 3 squared", outputs={"square": '["1", "4", "9"]'})),
    "map_upstream": _run(
        "succeeded", NO_FAILURE,
        list_shards=_step("succeeded", "words: the script prints the JSON list",
                          outputs={"result": '["a", "b", "c"]'}),
        process=_step("succeeded", "S1: after list-shards; one item per element of its "
                      "result (S11 fills each into $0); attempts: values in item order",
                      outputs={"done": '["shard-a", "shard-b", "shard-c"]'})),
    "omitted_upstream": _run(
        "failed", "S7: on-eval-failure and after-eval did not run and carry evaluate's "
        "outcome, which carries train's failure, to a leaf",
        train=_step("failed", "words: its command exits 1"),
        evaluate=_step("skipped", "S2: its default edge from train does not hold: not run"),
        on_eval_failure=_step("skipped", "S2 and S4: evaluate was not run, which is not "
                              "failed: not run"),
        after_eval=_step("skipped", "S2 and S4: evaluate was not run, which is not "
                         "completed: not run"),
        always=_step("succeeded", "S2 and S4: an any edge holds even for a step not run")),
    "oom_policies": _run(
        "succeeded", NO_FAILURE,
        train=_step("succeeded", OK + " at the first attempt: nothing to retry, no memory "
                    "escalation", attempts=1)),
    "placement": _run(
        "succeeded", NO_FAILURE + " (placement says where, not what)",
        write=_step("succeeded", "words: it writes 'shared' to the mounted volume and copies "
                    "it back", outputs={"written": "shared"})),
    "priority": _run(
        "succeeded", NO_FAILURE + " (a priority orders, it does not change what runs)",
        urgent=_step("succeeded", OK, outputs={"said": "urgent"})),
    "resources_cache": _run(
        "succeeded", NO_FAILURE,
        compute=_step("succeeded", OK + "; attempts: a first run reuses nothing, so it is "
                      "not cached", outputs={"computed": "computed"})),
    "retry_backoff": _run(
        "succeeded", NO_FAILURE + " (words: failed means failed after its retries)",
        flaky=_step("succeeded", "words and attempts: attempt 1 exits 3, the retry (limit 2) "
                    "prints 'recovered'", outputs={"result": "recovered"}, attempts=2)),
    "retry_timeout": _run(
        "succeeded", NO_FAILURE + " (words: failed means failed after its retries)",
        flaky=_step("succeeded", "words and attempts: attempt 1 exits 3, the retry prints "
                    "'recovered', well inside its 60 s timeout",
                    outputs={"result": "recovered"}, attempts=2),
        after=_step("succeeded", "S1: after flaky, which succeeded; attempts: it exits 0 at "
                    "once, so its retry is not used", attempts=1)),
    "secrets": _run(
        "succeeded", NO_FAILURE,
        use_secret=_step("succeeded", "words: TOKEN is the secret's value (s3cr3t, "
                         "harness.LOCAL_SECRETS), so the test passes",
                         outputs={"check": "token-ok"})),
    "sibling_whens": _run(
        "failed", "S7: first failed and is a leaf",
        flip=_step("succeeded", "words: the script prints 'heads'",
                   outputs={"result": "heads"}),
        first=_step("failed", "S6: its when holds; words: its command exits 1"),
        second=_step("succeeded", "S6: a sibling when depends on flip only, never on first; "
                     "its when holds")),
    "skip_propagation": _run(
        "failed", "S7: deploy did not run and carries evaluate's outcome, hence train's "
        "failure, to a leaf",
        train=_step("failed", "words: its command exits 1"),
        evaluate=_step("skipped", "S2: its default edge from the failed train does not hold: "
                       "not run"),
        deploy=_step("skipped", "S2: evaluate was not run, which a default edge does not "
                     "accept (S1 accepts only a skip by the step's own when): not run"),
        unrelated=_step("succeeded", "S7: independent branches run to completion")),
    "strict_succeeded": _run(
        "succeeded", "S7: the leaves are notify (succeeded) and archive, which did not run "
        "and carries audit's, hence ship's, hence check's success",
        check=_step("succeeded", OK, outputs={"out": "no"}),
        ship=_step("skipped", "S6: its when (out == 'yes') is false: skipped by its when"),
        notify=_step("succeeded", "S1: a default edge accepts ship skipped by its when",
                     outputs={"out": "notified"}),
        audit=_step("skipped", "S3: ship.Succeeded needs ship to have run: not run"),
        archive=_step("skipped", "S2: audit was not run: not run")),
    "subworkflow_ref": _run(
        "succeeded", NO_FAILURE + " (S7 decides the sub-workflow's outcome the same way)",
        prepare=_step("succeeded", OK),
        child=_step("succeeded", "S1: after prepare; S7: its graph (conf-basic-steps) has no "
                    "failure"),
        child__produce=_step("succeeded", "words: as in basic_steps, the script prints 'hello'",
                             outputs={"result": "hello"}),
        child__shout=_step("succeeded", "S1 and S11: as in basic_steps",
                           outputs={"said": "hello world"})),
    "subworkflows": _run(
        "succeeded", NO_FAILURE,
        first=_step("succeeded", OK),
        concurrent_task=_step("succeeded", "S1: after first; S7: its graph has no failure"),
        concurrent_task__one_a=_step("succeeded", OK),
        concurrent_task__one_b=_step("succeeded", "S1: after one-a; " + OK),
        concurrent_task_2=_step("succeeded", "S1: after first; S7: its graph has no failure"),
        concurrent_task_2__two_a=_step("succeeded", OK),
        concurrent_task_2__two_b=_step("succeeded", "S1: after two-a; " + OK),
        last=_step("succeeded", "S1: after both sub-workflows")),
    # docs/tuning.md: the study maximizes the objective by default; the grid runs x in 1, 2, 3
    # and the trial prints -(x - 2)^2 (-1, 0, -1), so the best is x = 2 with value 0.
    "tune": _run(
        "succeeded", NO_FAILURE,
        trial=_step("succeeded", "words: every trial exits 0; its outputs are the best "
                    "trial's (docs/tuning.md, direction 'maximize')",
                    outputs={"best_params": '{"x": 2}', "best_value": "0.0", "x": "2"}),
        use=_step("succeeded", "S1: after trial; S11 fills in the best x")),
    "unusual_edges": _run(
        "failed", "S7: on-error did not run and carries broken's failure to a leaf (after-fan "
        "carries gate's skip, no failure)",
        gate=_step("skipped", "S6: its when ('a' == 'b') is false: skipped by its when"),
        fan=_step("skipped", "S3: gate.Succeeded needs gate to have run: not run, none of "
                  "its items"),
        after_fan=_step("skipped", "S2: fan was not run: not run"),
        broken=_step("failed", "words: its command exits 1 (a failure of its own, not a "
                     "platform error)"),
        on_error=_step("skipped", "S4: broken.Errored needs a platform error; broken's "
                       "command failed: not run")),
    "when_else": _run(
        "succeeded", NO_FAILURE,
        evaluate=_step("succeeded", "words: the script prints 7", outputs={"result": "7"}),
        deploy=_step("succeeded", "S6: its when (result == '7') holds"),
        retrain=_step("skipped", "S6: the else branch is the condition negated, false: "
                      "skipped by its when")),
    "while_loop": _run(
        "succeeded", NO_FAILURE,
        poll=_step("succeeded", "words: the first iteration prints 'done', which is not "
                   "'again', so the loop stops after it (max 3)", outputs={"result": "done"})),
    "workflow_params": _run(
        "succeeded", NO_FAILURE,
        show=_step("succeeded", "S11: the parameters' defaults (greeting 'hi', count 3) fill "
                   "$0 and $1", outputs={"shown": "hi x3"})),
}
