"""The workflow-level and policy rules of ``couler.ir.validate``: names, labels, volumes,
schedules, triggers, counts, retries, resources, quantities, secrets and tune steps.

Each case pins the exact findings (step, field, message), so a rule that stops firing,
fires on the wrong field or says something else fails a test. Written against the
survivors of the mutation check (bench/mutation.py, target ``validate-rest``).
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any

import pytest

from couler import ir
from couler.ir.validate import (
    MAX_TUNE_STEP_NAME,
    MAX_TUNE_TRIALS,
    MAX_WORKFLOW_NAME,
    parse_quantity,
)

S = ir.Step
STEP = S("s", ir.ContainerSpec("alpine", command=("true",)))
DNS = ("is not a valid name: use at most {n} lowercase letters, digits and '-', starting "
       "and ending with a letter or digit (DNS-1123)")


def _found(steps: tuple[ir.Step, ...] = (STEP,), **wf: Any) -> list[tuple[str, str, str]]:
    w = ir.Workflow(name=wf.pop("name", "rules"), steps=steps, **wf)
    return [(i.step, i.field, i.message) for i in ir.find_issues(w)]


# --------------------------------------------------------------------------- quantities


@pytest.mark.parametrize(("text", "value"), [
    ("500m", Decimal("0.5")), ("2Gi", Decimal(2 * 1024 ** 3)), ("1e3", Decimal(1000)),
    (" 3 ", Decimal(3)), ("1Ei", Decimal(1024 ** 6)), ("2k", Decimal(2000)),
    ("1.5", Decimal("1.5")),
])
def test_quantities_parse_as_kubernetes_reads_them(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(("text", "message"), [
    ("2 GB", "'2 GB' is not a Kubernetes quantity (e.g. '500m', '2Gi')"),
    ("1e999999999", "'1e999999999' is out of range"),
])
def test_bad_quantities_say_why(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_quantity(text)
    assert str(info.value) == message


# --------------------------------------------------------------------------- the workflow


def test_the_workflow_needs_a_valid_name_and_steps() -> None:
    assert _found(name="") == [("", "name", "a workflow needs a name")]
    assert _found(name="Bad_Name") == [
        ("", "name", "'Bad_Name' " + DNS.format(n=MAX_WORKFLOW_NAME))]
    assert _found(name="a" * (MAX_WORKFLOW_NAME + 1))[0][1] == "name"
    assert _found(name="a" * MAX_WORKFLOW_NAME) == []
    assert _found(steps=()) == [("", "steps", "a workflow needs at least one step")]
    assert _found(tenant="Team A") == [("", "tenant", "'Team A' " + DNS.format(n=63))]
    assert _found(tenant="team-a") == []


def test_labels_annotations_and_node_selectors() -> None:
    long_value = "v" * 64
    assert _found(labels=(("app", "ok"), ("bad key!", "x"), ("team", long_value),
                          ("tier", "-x"))) == [
        ("", "labels", "'bad key!' is not a valid key"),
        ("", "labels", f"{long_value!r} is not a valid value for 'team'"),
        ("", "labels", "'-x' is not a valid value for 'tier'")]
    # annotation values are free text; their keys are checked like labels'
    assert _found(annotations=(("note", "any text: at all"), ("x/" + "k" * 64, "v"))) == [
        ("", "annotations", f"{'x/' + 'k' * 64!r} is not a valid key")]
    assert _found(node_selector=(("pool", "gpu pool"),)) == [
        ("", "node_selector", "'gpu pool' is not a valid value for 'pool'")]
    assert _found(labels=(("example.com/app", "a.b-c_d"),)) == []
    # the limits are inclusive: a 63-character name (after any prefix) and value are valid
    name63, value63 = "k" * 63, "v" * 63
    assert _found(labels=(("example.com/" + name63, value63), (name63, "ok"))) == []
    assert _found(labels=(("example.com/" + name63 + "k", "ok"),)) == [
        ("", "labels", f"{'example.com/' + name63 + 'k'!r} is not a valid key")]


def test_volumes() -> None:
    V, K = ir.Volume, ir.VolumeKind
    assert _found(volumes=(V("data", K.PVC, "claim"), V("scratch", K.EMPTY_DIR))) == []
    assert _found(volumes=(V("data", K.PVC, "c"), V("data", K.PVC, "c"))) == [
        ("", "volumes", "volume 'data' is declared twice")]
    assert _found(volumes=(V("Data", K.EMPTY_DIR),)) == [
        ("", "volumes", "volume name: 'Data' " + DNS.format(n=63))]
    for kind in (K.PVC, K.CONFIG_MAP, K.SECRET):
        assert _found(volumes=(V("v", kind),)) == [
            ("", "volumes", f"volume 'v' of kind {kind.value} needs claim_name")]
    assert _found(volumes=(V("t", K.CLAIM_TEMPLATE),)) == [
        ("", "volumes.t.size", "a quantity is required")]
    assert _found(volumes=(V("t", K.CLAIM_TEMPLATE, size="-1Gi"),)) == [
        ("", "volumes.t.size", "'-1Gi' is negative")]
    assert _found(volumes=(V("t", K.CLAIM_TEMPLATE, size="1Gi"),)) == []


def test_schedules_and_triggers() -> None:
    for ok in ("0 2 * * *", "0 0 2 * * *", "@daily"):
        assert _found(schedule=ir.CronSchedule(ok)) == []
    assert _found(schedule=ir.CronSchedule("every night")) == [
        ("", "schedule.schedule", "'every night' is not a cron expression of 5 fields")]
    # wildcards are whole tokens: * anywhere, > only last (as NATS reads them)
    for ok in ("data.ready", "data.*", "data.>", "*.ready", ">", "*", "a.*.c.>"):
        assert _found(triggers=(ir.EventTrigger(ok),)) == [], ok
    bad = ("data ready", "a..b", "a.>.c", "a.b*", "a.*b", ".a", "a.", "")
    assert _found(triggers=tuple(ir.EventTrigger(b) for b in bad)) == [
        ("", "triggers.subject", f"{b!r} is not a valid subject") for b in bad]


@pytest.mark.parametrize("name", ["timeout_seconds", "ttl_seconds", "parallelism"])
def test_workflow_counts_are_positive(name: str) -> None:
    assert _found(**{name: 1}) == []
    assert _found(**{name: 0}) == [("", name, "must be positive, got 0")]


def test_defaults_pull_secrets_and_exit_hooks() -> None:
    d = ir.StepDefaults(retry=ir.RetryPolicy(-1), timeout_seconds=0,
                        resources=ir.Resources(gpu=-1))
    assert _found(defaults=d) == [
        ("", "defaults.retry.limit", "must not be negative"),
        ("", "defaults.timeout_seconds", "must be positive, got 0"),
        ("", "defaults.resources.gpu", "must not be negative")]
    assert _found(image_pull_secrets=("regcred", "Bad_Secret")) == [
        ("", "image_pull_secrets", "'Bad_Secret' is not a valid secret name")]
    hook = ir.ExitHook(ir.RunStatus.FAILED, ())
    bad = ir.ExitHook(ir.RunStatus.ANY, (S("h", ir.ContainerSpec("")),))
    assert _found(exit_hooks=(hook, bad)) == [
        ("", "exit_hooks[0]", "an exit hook needs at least one step"),
        ("h", "image", "a container or script step needs an image")]


def test_workflow_parameters_declare_typed_defaults_and_enums() -> None:
    P, T, L = ir.Parameter, ir.ValueType, ir.Literal
    assert _found(parameters=(P("n", T.INT, L.of(1), enum=(L.of(1), L.of(2))),)) == []
    assert _found(parameters=(P("n", T.INT, L.of(1)), P("n", T.INT, L.of(1)))) == [
        ("", "parameters.n", "parameter is declared twice")]
    assert _found(parameters=(P("1n", default=L.of("x")),)) == [
        ("", "parameters.1n", "'1n' is not a valid parameter name")]
    # a bad default does not stop the enum from being checked, and each is typed
    assert _found(parameters=(P("n", T.INT, L("{x"), enum=(L.of("a"), L.of(2))),)) == [
        ("", "parameters.n", "'{x' is not valid JSON"),
        ("", "parameters.n", 'value "a" is not of type int')]


# --------------------------------------------------------------------------- policies


def _step(**kw: Any) -> tuple[ir.Step, ...]:
    return (dataclasses.replace(STEP, **kw),)


def test_retry_policies() -> None:
    R, B = ir.RetryPolicy, ir.Backoff
    assert _found(_step(retry=R(0))) == []
    assert _found(_step(retry=R(3, B(1.0, 1.0, 1.0), memory_factor=1.5,
                                memory_ceiling="16Gi"))) == []
    assert _found(_step(retry=R(2, on=()))) == [
        ("s", "retry.on", "name at least one failure class to retry")]
    assert _found(_step(retry=R(2, B(0.0, 0.9, None)))) == [
        ("s", "retry.backoff.base_seconds", "must be positive"),
        ("s", "retry.backoff.factor", "must be at least 1")]
    assert _found(_step(retry=R(2, B(10.0, 2.0, 9.0)))) == [
        ("s", "retry.backoff.cap_seconds", "must not be below base_seconds")]
    assert _found(_step(retry=R(2, memory_factor=1.0, memory_ceiling="lots"))) == [
        ("s", "retry.memory_factor", "must be greater than 1"),
        ("s", "retry.memory_ceiling", "'lots' is not a Kubernetes quantity (e.g. '500m', "
                                      "'2Gi')")]


def test_resources() -> None:
    Rs = ir.Resources
    assert _found(_step(resources=Rs("500m", "1", "1Gi", "1Gi", gpu=1))) == []
    assert _found(_step(resources=Rs(cpu_request="2", cpu_limit="1"))) == [
        ("s", "resources.cpu_request", "request 2 exceeds limit 1")]
    assert _found(_step(resources=Rs(memory_request="2Gi", memory_limit="1Gi"))) == [
        ("s", "resources.memory_request", "request 2Gi exceeds limit 1Gi")]
    # an unreadable side is reported once, and not compared
    assert _found(_step(resources=Rs(memory_request="x", memory_limit="1Gi"))) == [
        ("s", "resources.memory_request", "'x' is not a Kubernetes quantity (e.g. '500m', "
                                          "'2Gi')")]
    assert _found(_step(resources=Rs(cpu_limit="-1"))) == [
        ("s", "resources.cpu_limit", "'-1' is negative")]
    # zero is a quantity (not negative); a negative side is not compared with the other
    assert _found(_step(resources=Rs(cpu_request="0", memory_limit="0"))) == []
    assert _found(_step(resources=Rs(cpu_request="2", cpu_limit="-1"))) == [
        ("s", "resources.cpu_limit", "'-1' is negative")]


def test_secrets_and_artifact_locations() -> None:
    A, St = ir.ArtifactLocation, ir.StorageKind
    good = ir.SecretRef("creds", "key.id")
    assert _found(_step(output_artifacts=(ir.OutputArtifact("m", "/m", A(
        St.S3, bucket="b", access_key=good, secret_key=good)),))) == []
    bad = ir.SecretRef("Creds", "key id")
    assert _found(_step(output_artifacts=(ir.OutputArtifact("m", "/m", A(
        St.OSS, bucket="b", access_key=bad)),))) == [
        ("s", "output_artifacts.m.access_key", "'Creds' is not a valid secret name"),
        ("s", "output_artifacts.m.access_key", "'key id' is not a valid secret key")]
    assert _found(_step(output_artifacts=(ir.OutputArtifact("m", "/m", A(
        St.S3, bucket="b", secret_key=bad)),)))[0][1] == "output_artifacts.m.secret_key"
    for kind in (St.S3, St.OSS, St.GCS):  # object stores need a bucket
        assert _found(_step(output_artifacts=(ir.OutputArtifact("m", "/m", A(kind)),))) == [
            ("s", "output_artifacts.m", f"a {kind.value} artifact needs a bucket")]
    for kind in (St.GIT, St.HTTP):
        assert _found(_step(output_artifacts=(ir.OutputArtifact("m", "/m", A(kind)),))) == [
            ("s", "output_artifacts.m", f"a {kind.value} artifact needs a url")]
        assert _found(_step(output_artifacts=(ir.OutputArtifact("m", "/m", A(
            kind, url="https://x")),))) == []


# --------------------------------------------------------------------------- tune steps


def _tune(name: str = "t", **kw: Any) -> ir.Step:
    space = kw.pop("space", (ir.TuneParam("lr", low=0.1, high=0.2),))
    step_kw = {k: kw.pop(k) for k in ("body", "foreach", "loop", "daemon", "outputs")
               if k in kw}
    spec = ir.Tune(space=space, objective=kw.pop("objective", "v"), **kw)
    outputs = step_kw.pop("outputs", (ir.OutputParameter("v", ir.OutputSource.STDOUT, "",
                                                         ir.ValueType.FLOAT),))
    body = step_kw.pop("body", ir.ContainerSpec("alpine", command=("echo",)))
    return S(name, body, outputs=outputs, tune=spec, **step_kw)


def _tuned(**kw: Any) -> list[tuple[str, str, str]]:
    return _found((_tune(**kw),))


def test_a_valid_tune_step() -> None:
    assert _tuned() == []
    assert _found((_tune("t" * MAX_TUNE_STEP_NAME),)) == []


def test_tune_step_shape() -> None:
    long = "t" * (MAX_TUNE_STEP_NAME + 1)
    assert _found((_tune(long),)) == [
        (long, "name", f"a tune step's name has at most {MAX_TUNE_STEP_NAME} characters "
                       "(engines that run the study in steps add suffixes)")]
    job = ir.JobSpec('{"apiVersion": "v1", "kind": "Pod"}')
    assert (("t", "tune", "only container and script steps can be tuned, not a job step")
            in _tuned(body=job))
    assert _tuned(foreach=ir.ForEach(items=(ir.Literal.of(1),))) == [
        ("t", "tune", "a tune step cannot also map or loop; its trials are its executions")]
    assert _tuned(daemon=True) == [("t", "tune", "a daemon step cannot be tuned")]


def test_tune_space_names() -> None:
    assert _tuned(space=()) == [
        ("t", "tune.space", "the search space is empty; give at least one parameter "
                            "(uniform, loguniform, int_range or choice)")]
    p = ir.TuneParam("lr", low=0.1, high=0.2)
    assert _tuned(space=(p, p)) == [("t", "tune.space.lr", "parameter is declared twice")]
    assert _tuned(space=(dataclasses.replace(p, name="1lr"),)) == [
        ("t", "tune.space.1lr", "'1lr' is not a valid parameter name")]
    for reserved in (ir.TUNE_BEST_PARAMS, ir.TUNE_BEST_VALUE):
        assert _tuned(space=(dataclasses.replace(p, name=reserved),)) == [
            ("t", f"tune.space.{reserved}", f"{reserved!r} is the name of a tune output; "
                                            "rename the parameter")]


def test_tune_objective_counts_sampler_storage_and_seed() -> None:
    assert _tuned(objective="auc") == [
        ("t", "tune.objective", "the objective 'auc' is not an output of the step; its "
                                "outputs: ['v']")]
    listed = (ir.OutputParameter("v", ir.OutputSource.STDOUT, "", ir.ValueType.LIST),)
    assert _tuned(outputs=listed) == [
        ("t", "tune.objective", "the objective 'v' must be a number, not a list value")]
    for t in (ir.ValueType.INT, ir.ValueType.STRING, ir.ValueType.JSON):
        assert _tuned(outputs=(ir.OutputParameter("v", ir.OutputSource.STDOUT, "", t),)) == []
    assert _tuned(trials=0) == [("t", "tune.trials", "must be at least 1, got 0")]
    assert _tuned(trials=1) == _tuned(parallel=1) == []  # one trial, one at a time: valid
    assert _tuned(trials=MAX_TUNE_TRIALS) == []
    assert _tuned(trials=MAX_TUNE_TRIALS + 1) == [
        ("t", "tune.trials", f"at most {MAX_TUNE_TRIALS}, got {MAX_TUNE_TRIALS + 1}")]
    assert _tuned(parallel=0) == [("t", "tune.parallel", "must be at least 1, got 0")]
    assert _tuned(seed=-1) == [("t", "tune.seed", "must not be negative, got -1")]
    assert _tuned(seed=0) == []
    assert _tuned(storage=ir.SecretRef("Bad", "url")) == [
        ("t", "tune.storage", "'Bad' is not a valid secret name")]
    grid = ir.TuneSampler.GRID
    assert _tuned(sampler=grid) == [
        ("t", "tune.space.lr", "the grid sampler needs a discrete space: give this parameter "
                               "a step, or use choice()")]
    stepped = (ir.TuneParam("lr", low=0.1, high=0.2, step=0.05),
               ir.TuneParam("d", ir.TuneKind.INT, low=1, high=3))
    assert _tuned(sampler=grid, space=stepped) == []
    log = (ir.TuneParam("lr", ir.TuneKind.LOGUNIFORM, low=0.1, high=0.2),)
    assert [f for _, f, _ in _tuned(sampler=grid, space=log)] == ["tune.space.lr"]
    choices = (ir.TuneParam("c", ir.TuneKind.CHOICE, choices=(ir.Literal.of(1),)),)
    assert _tuned(sampler=ir.TuneSampler.CMAES, space=choices) == [
        ("t", "tune.sampler", "CMA-ES needs at least one numeric parameter")]
    assert _tuned(sampler=ir.TuneSampler.CMAES) == []


K = ir.TuneKind


@pytest.mark.parametrize(("param", "messages"), [
    (ir.TuneParam("p", K.CHOICE, choices=(ir.Literal.of(1), ir.Literal.of("a"))), []),
    (ir.TuneParam("p", K.CHOICE), ["choice() needs at least one value"]),
    (ir.TuneParam("p", K.CHOICE, choices=(ir.Literal("{x"),)), ["'{x' is not valid JSON"]),
    (ir.TuneParam("p", K.CHOICE, choices=(ir.Literal.of(1), ir.Literal.of(1))),
     ["choice() lists a value twice"]),
    (ir.TuneParam("p", K.UNIFORM, 0, 1, choices=(ir.Literal.of(1),)),
     ["a uniform parameter has no choices"]),
    (ir.TuneParam("p", K.UNIFORM, 0, float("inf")), ["bounds must be finite numbers"]),
    (ir.TuneParam("p", K.UNIFORM, float("nan"), 1), ["bounds must be finite numbers"]),
    (ir.TuneParam("p", K.UNIFORM, 2, 1), ["bad bounds: low 2 is above high 1"]),
    (ir.TuneParam("p", K.UNIFORM, 1, 1), []),
    (ir.TuneParam("p", K.LOGUNIFORM, 0, 1),
     ["bad bounds: a log-scale range needs low > 0, got 0"]),
    (ir.TuneParam("p", K.INT, 0, 8, log=True),
     ["bad bounds: a log-scale range needs low > 0, got 0"]),
    (ir.TuneParam("p", K.INT, 1, 8, log=True), []),
    (ir.TuneParam("p", K.INT, 0.5, 8), ["bad bounds: an int range needs integer bounds, "
                                        "got 0.5..8"]),
    (ir.TuneParam("p", K.INT, 0, 8.5), ["bad bounds: an int range needs integer bounds, "
                                        "got 0..8.5"]),
    (ir.TuneParam("p", K.INT, 0, 8, step=2), []),
    (ir.TuneParam("p", K.INT, 0, 8, step=1.5),
     ["an int range's step must be a positive integer, got 1.5"]),
    (ir.TuneParam("p", K.INT, 0, 8, step=0),
     ["an int range's step must be a positive integer, got 0"]),
    (ir.TuneParam("p", K.INT, 1, 8, step=2, log=True),
     ["a log-scale int range cannot have a step"]),
    (ir.TuneParam("p", K.INT, 1, 8, step=1, log=True), []),
    (ir.TuneParam("p", K.LOGUNIFORM, 1, 8, step=1),
     ["a loguniform parameter cannot have a step"]),
    (ir.TuneParam("p", K.UNIFORM, 0, 1, step=0), ["step must be positive, got 0"]),
    (ir.TuneParam("p", K.UNIFORM, 0, 1, step=0.25), []),
    (ir.TuneParam("p", K.UNIFORM, 1, 2, log=True),
     ["log applies to int ranges; use loguniform for floats"]),
])
def test_tune_parameters(param: ir.TuneParam, messages: list[str]) -> None:
    assert [m for _, _, m in _tuned(space=(param,))] == messages
