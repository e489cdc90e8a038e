"""Tune steps: the API, the IR, validation, the codec, the static-engine rewrite."""

from __future__ import annotations

import json
from typing import Any

import pytest

import couler
from couler import ir
from couler.compilers.argo import compile_workflow
from couler.engines.base import Feature, features_used
from couler.errors import UserError, ValidationError
from couler.optimize.cache_key import item_cache_key, not_cacheable_reason
from couler.optimize.tune import budget, expand_tune, round_sizes, rounds, study_name
from couler_runtime.codec import workflow_from_proto, workflow_to_proto
from tests.argo_schema import assert_valid_argo


def _tuned(**kw: Any) -> ir.Workflow:
    """data -> train (tuned over lr and depth) -> use (reads best_params and lr)."""
    options = {"trials": 5, "parallel": 2, "objective": "auc", "seed": 7, **kw}
    with couler.workflow("tw") as b:
        data = couler.run_container(image="alpine", command=["sh", "-c", "echo 5 > /tmp/n"],
                                    output=couler.create_parameter_artifact("/tmp/n", name="n"),
                                    step_name="data")

        def train(lr: object, depth: object) -> object:
            return couler.run_container(
                image="trainer:1", command=["python", "train.py"],
                args=[f"--lr={lr}", f"--depth={depth}", data[0]],
                output=couler.create_parameter_artifact("/tmp/auc", name="auc"),
                step_name="train")

        best = couler.tune(train, space={"lr": couler.loguniform(1e-4, 1e-1),
                                         "depth": couler.int_range(2, 8)}, **options)
        couler.run_container(image="alpine", command=["echo"],
                             args=[best.best_params, best["lr"], best.best_value],
                             step_name="use")
    return b.to_ir()


def _issues(wf: ir.Workflow) -> list[str]:
    return [f"{i.step}|{i.field}|{i.message}" for i in ir.find_issues(wf)]


def _with_tune(wf: ir.Workflow, **changes: Any) -> ir.Workflow:
    import dataclasses

    step = wf.step("train")
    assert step is not None and step.tune is not None
    tune = dataclasses.replace(step.tune, **changes)
    steps = tuple(dataclasses.replace(s, tune=tune) if s.name == "train" else s
                  for s in wf.steps)
    return dataclasses.replace(wf, steps=steps)


# --------------------------------------------------------------------------- API and IR


def test_tune_builds_a_step_whose_trials_read_their_parameters_as_inputs() -> None:
    wf = _tuned(direction="MAXIMIZE", sampler="random", pruner="none")
    ir.validate(wf)
    train = wf.step("train")
    assert train is not None and train.tune is not None
    t = train.tune
    assert [p.name for p in t.space] == ["lr", "depth"]
    assert t.space[0] == ir.TuneParam("lr", ir.TuneKind.LOGUNIFORM, 1e-4, 1e-1)
    assert t.space[1] == ir.TuneParam("depth", ir.TuneKind.INT, 2, 8)
    assert (t.trials, t.parallel, t.objective, t.seed) == (5, 2, "auc", 7)
    assert (t.direction, t.sampler, t.pruner) == (
        ir.TuneDirection.MAXIMIZE, ir.TuneSampler.RANDOM, ir.TunePruner.NONE)
    items = {i.value.key: i.type for i in train.inputs if isinstance(i.value, ir.ItemRef)}
    assert items == {"lr": ir.ValueType.FLOAT, "depth": ir.ValueType.INT}
    # later steps read the tune outputs like any step output
    use = wf.step("use")
    assert use is not None and [d.step for d in use.dependencies] == ["train"]
    refs = [(i.value.output, i.type) for i in use.inputs if isinstance(i.value, ir.StepOutputRef)]
    assert refs == [("best_params", ir.ValueType.JSON), ("lr", ir.ValueType.FLOAT),
                    ("best_value", ir.ValueType.FLOAT)]
    assert train.output("best_params") is not None and train.output("auc") is None
    assert features_used(wf)[Feature.TUNE] == ["train"]


def test_space_helpers() -> None:
    assert couler.uniform(0, 1, step=0.25).to_ir("x") == ir.TuneParam(
        "x", ir.TuneKind.UNIFORM, 0.0, 1.0, 0.25)
    assert couler.int_range(1, 9, step=2).to_ir("n").step == 2
    assert couler.int_range(1, 1024, log=True).to_ir("n").log
    assert couler.choice("adam", "sgd").to_ir("o").choices == (
        ir.Literal.of("adam"), ir.Literal.of("sgd"))
    assert couler.choice(["a", 1]).to_ir("o").value_type is ir.ValueType.JSON
    assert couler.choice([1, 2.5]).to_ir("o").value_type is ir.ValueType.FLOAT
    with pytest.raises(UserError, match="must be an integer"):
        couler.int_range(1.5, 3)  # type: ignore[arg-type]
    with pytest.raises(UserError, match="must be a number"):
        couler.uniform("a", 3)  # type: ignore[arg-type]


def test_tune_api_errors() -> None:
    with couler.workflow("bad"):
        with pytest.raises(UserError, match="search space is empty"):
            couler.tune(lambda: None, space={}, objective="x")
        with pytest.raises(UserError, match="unknown sampler 'bayes'"):
            couler.tune(lambda x: couler.run_container(image="a", command=["echo", x]),
                        space={"x": couler.uniform(0, 1)}, objective="result",
                        sampler="bayes")
        with pytest.raises(UserError, match="trials must be a positive integer"):
            couler.tune(lambda x: None, space={"x": couler.uniform(0, 1)}, objective="r",
                        trials=0)
        with pytest.raises(UserError, match="created 0 steps"):
            couler.tune(lambda x: None, space={"x": couler.uniform(0, 1)}, objective="r")


def test_the_objective_may_be_the_standard_output() -> None:
    with couler.workflow("so") as b:
        couler.tune(lambda x: couler.run_script(image="python", source="print(1)", args=[x],
                                                step_name="t"),
                    space={"x": couler.uniform(0, 1)}, objective="result")
    wf = b.to_ir()
    ir.validate(wf)
    step = wf.steps[0]
    assert [(o.name, o.source, o.type) for o in step.outputs] == [
        ("result", ir.OutputSource.STDOUT, ir.ValueType.FLOAT)]


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(("changes", "field", "message"), [
    ({"objective": "loss"}, "tune.objective", "the objective 'loss' is not an output"),
    ({"space": ()}, "tune.space", "the search space is empty"),
    ({"trials": 0}, "tune.trials", "must be at least 1"),
    ({"parallel": 0}, "tune.parallel", "must be at least 1"),
    ({"space": (ir.TuneParam("lr", ir.TuneKind.LOGUNIFORM, 0.0, 1.0),
                ir.TuneParam("depth", ir.TuneKind.INT, 2, 8))},
     "tune.space.lr", "a log-scale range needs low > 0"),
    ({"space": (ir.TuneParam("lr", ir.TuneKind.UNIFORM, 2.0, 1.0),
                ir.TuneParam("depth", ir.TuneKind.INT, 2, 8))},
     "tune.space.lr", "bad bounds: low 2 is above high 1"),
    ({"space": (ir.TuneParam("lr", ir.TuneKind.UNIFORM, 0.0, 1.0),
                ir.TuneParam("depth", ir.TuneKind.INT, 2, 8.5))},
     "tune.space.depth", "an int range needs integer bounds"),
    ({"space": (ir.TuneParam("lr", ir.TuneKind.CHOICE),
                ir.TuneParam("depth", ir.TuneKind.INT, 2, 8))},
     "tune.space.lr", "choice() needs at least one value"),
    ({"sampler": ir.TuneSampler.GRID}, "tune.space.lr", "the grid sampler needs a discrete"),
    ({"storage": ir.SecretRef("Bad Name", "url")}, "tune.storage", "not a valid secret name"),
])
def test_validation_names_workflow_step_and_field(changes: dict[str, Any], field: str,
                                                  message: str) -> None:
    wf = _with_tune(_tuned(), **changes)
    issues = _issues(wf)
    assert any(i.startswith(f"train|{field}|") and message in i for i in issues), issues
    with pytest.raises(ValidationError, match="tw"):
        ir.validate(wf)


def test_unknown_sampler_in_ir_json_is_rejected() -> None:
    text = ir.to_json(_tuned()).replace('"trials":5', '"sampler":"bayes","trials":5')
    with pytest.raises((ValueError, TypeError)):
        ir.from_json(ir.Workflow, text)


def test_a_trial_reads_only_parameters_of_the_space() -> None:
    wf = _tuned()
    train = wf.step("train")
    assert train is not None
    import dataclasses

    bad = dataclasses.replace(train, inputs=(
        *train.inputs, ir.InputParameter("x", ir.ItemRef("momentum"))))
    wf = dataclasses.replace(wf, steps=tuple(bad if s.name == "train" else s
                                             for s in wf.steps))
    assert any("reads trial parameter 'momentum'" in i for i in _issues(wf))


def test_reading_an_unknown_tune_output_is_an_error() -> None:
    wf = _tuned()
    import dataclasses

    use = wf.step("use")
    assert use is not None
    bad = dataclasses.replace(use, inputs=(ir.InputParameter("a", ir.StepOutputRef("train",
                                                                                  "auc")),))
    wf = dataclasses.replace(wf, steps=tuple(bad if s.name == "use" else s for s in wf.steps))
    assert any("step 'train' has no output 'auc'" in i for i in _issues(wf))


# --------------------------------------------------------------------------- codec, keys


def test_json_and_proto_round_trips() -> None:
    wf = _with_tune(_tuned(), storage=ir.SecretRef("tune-db", "url"), image="me/rt:1",
                    sampler=ir.TuneSampler.CMAES, direction=ir.TuneDirection.MINIMIZE,
                    pruner=ir.TunePruner.NONE, seed=None,
                    space=(ir.TuneParam("lr", ir.TuneKind.UNIFORM, 0, 1, step=0.1),
                           ir.TuneParam("depth", ir.TuneKind.INT, 1, 64, log=True),
                           ir.TuneParam("opt", ir.TuneKind.CHOICE,
                                        choices=(ir.Literal.of("a"), ir.Literal.of(2)))))
    assert ir.from_json(ir.Workflow, ir.to_json(wf)) == wf
    assert workflow_from_proto(workflow_to_proto(wf)) == wf
    default = _tuned()
    assert workflow_from_proto(workflow_to_proto(default)) == default


def test_a_trial_is_keyed_by_its_parameters() -> None:
    wf = _tuned()
    train = wf.step("train")
    assert train is not None
    assert not_cacheable_reason(wf, train) is not None
    key = {"params": {}, "producer_keys": {"data": "k1"}}
    a = item_cache_key(wf, train, {"lr": 0.01, "depth": 3}, **key)  # type: ignore[arg-type]
    b = item_cache_key(wf, train, {"depth": 3, "lr": 0.01}, **key)  # type: ignore[arg-type]
    c = item_cache_key(wf, train, {"lr": 0.02, "depth": 3}, **key)  # type: ignore[arg-type]
    assert a is not None and a == b and a != c


def test_study_name_follows_the_spec_and_context() -> None:
    wf = _tuned()
    train = wf.step("train")
    assert train is not None
    name = study_name("tw", train)
    assert name.startswith("tw.train.") and name == study_name("tw", train)
    assert study_name("tw", train, ["x"]) != name
    other = _with_tune(wf, trials=6).step("train")
    assert other is not None and study_name("tw", other) != name
    stored = _with_tune(wf, storage=ir.SecretRef("db", "url")).step("train")
    assert stored is not None and study_name("tw", stored) == name  # where is not what


# --------------------------------------------------------------------------- static engines


def test_expand_tune_makes_rounds_of_ask_trials_tell_and_a_best_step() -> None:
    wf = _tuned()
    out = expand_tune(wf)
    ir.validate(out)
    names = [s.name for s in out.steps]
    assert rounds(ir.Tune(space=(), objective="x", trials=5, parallel=2)) == 3
    assert names == ["data",
                     "train-ask-0", "train-0", "train-tell-0",
                     "train-ask-1", "train-1", "train-tell-1",
                     "train-ask-2", "train-2", "train-tell-2",
                     "train", "use"]
    by = {s.name: s for s in out.steps}
    ask = by["train-ask-0"]
    assert isinstance(ask.body, ir.ContainerSpec)
    assert ask.body.args[:3] == ("-m", "couler_runtime.tune", "ask")
    assert ask.env == (ir.EnvVar("COULER_TUNE_STORAGE", secret=ir.SecretRef("couler-tune",
                                                                             "url")),)
    trials = by["train-1"]
    assert trials.tune is None and trials.foreach == ir.ForEach(
        source=ir.StepOutputRef("train-ask-1", "params"), parallelism=2)
    assert {d.step for d in trials.dependencies} == {"data", "train-ask-1"}
    tell = by["train-tell-1"]
    assert ir.InputParameter("values", ir.StepOutputRef("train-1", "auc"),
                             ir.ValueType.JSON) in tell.inputs
    best = by["train"]
    assert {o.name for o in best.outputs} == {"best_params", "best_value", "lr", "depth"}
    assert {d.step for d in best.dependencies} == {"data", "train-tell-2"}
    # nothing in the document holds a URL or password: only the secret reference
    text = json.dumps(ir.to_dict(out))
    assert "sqlite" not in text and "postgres" not in text
    assert expand_tune(out) is out


def test_the_argo_document_of_a_tuned_workflow_is_valid() -> None:
    wf = _with_tune(_tuned(), storage=ir.SecretRef("tune-db", "url"))
    doc = compile_workflow(wf)
    assert_valid_argo(doc)
    templates = {t["name"]: t for t in doc["spec"]["templates"]}
    tasks = {t["name"]: t for t in templates["tw"]["dag"]["tasks"]}
    assert tasks["train-0"]["arguments"]["parameters"][-1]["value"] == \
        "{{tasks.train-ask-0.outputs.parameters.params}}"
    assert tasks["use"]["arguments"]["parameters"][0]["value"] == \
        "{{tasks.train.outputs.parameters.best_params}}"
    mapped = templates[tasks["train-0"]["template"]]
    assert mapped["parallelism"] == 2
    assert mapped["dag"]["tasks"][0]["withParam"] == "{{inputs.parameters.items}}"
    ask = templates[tasks["train-ask-0"]["template"]]
    assert ask["container"]["env"] == [{"name": "COULER_TUNE_STORAGE", "valueFrom": {
        "secretKeyRef": {"name": "tune-db", "key": "url"}}}]


def test_with_a_pruner_the_trials_get_what_they_need_to_report_to_the_study() -> None:
    by = {s.name: s for s in expand_tune(_tuned()).steps}  # pruner "median", the default
    assert by["train-ask-0"].body.args[-1] == "--tag-trials"  # type: ignore[union-attr]
    env = {e.name: e for e in by["train-1"].env}
    assert env["COULER_TUNE_STUDY"].value == "{{item.couler_study}}"
    assert env["COULER_TUNE_TRIAL"].value == "{{item.couler_trial}}"
    assert env["COULER_TUNE_STORAGE"].secret == ir.SecretRef("couler-tune", "url")
    assert env["COULER_TUNE_OBJECTIVE"].value == "/tmp/auc"  # the objective's file
    # on Argo the item's keys reach the trial's container through hoisted parameters
    doc = compile_workflow(_tuned())
    assert_valid_argo(doc)
    templates = {t["name"]: t for t in doc["spec"]["templates"]}
    trial = next(t for t in templates.values() if t.get("container", {}).get("image")
                 == "trainer:1")
    values = {e["name"]: e.get("value") for e in trial["container"]["env"]}
    assert values["COULER_TUNE_TRIAL"].startswith("{{inputs.parameters.item-couler")
    # without a pruner nothing is added: the trials stay keyed by their parameters only
    plain = {s.name: s for s in expand_tune(_with_tune(_tuned(),
                                                       pruner=ir.TunePruner.NONE)).steps}
    assert "--tag-trials" not in plain["train-ask-0"].body.args  # type: ignore[union-attr]
    assert plain["train-1"].env == ()


def test_expand_tune_for_kfp_compiles_no_pruning_and_text_parameters() -> None:
    by = {s.name: s for s in expand_tune(_tuned(), prune=False, text=True).steps}
    args = by["train-ask-0"].body.args  # type: ignore[union-attr]
    assert "--text-params" in args and "--tag-trials" not in args
    assert by["train-1"].env == ()  # no study / trial number for report()
    assert "--text-params" not in _ask_args(expand_tune(_tuned()))


def _ask_args(wf: ir.Workflow) -> tuple[str, ...]:
    step = wf.step("train-ask-0")
    assert step is not None and isinstance(step.body, ir.ContainerSpec)
    return step.body.args


def test_the_slots_rewrite_unrolls_each_round_into_one_step_per_trial() -> None:
    wf = expand_tune(_tuned(), slots=True)
    tune = _tuned().step("train").tune  # type: ignore[union-attr]
    assert tune is not None
    sizes = round_sizes(tune)
    assert sum(sizes) == budget(tune) and all(0 < n <= tune.parallel for n in sizes)
    for r, size in enumerate(sizes):
        ask = _slot_args(wf, f"train-ask-{r}")
        assert ask[ask.index("--n") + 1] == str(size) and "--slots-out" in ask
        trials = [s for s in wf.steps if s.name.startswith(f"train-{r}-")]
        assert [s.name for s in trials] == [f"train-{r}-{k}" for k in range(size)]
        for k, s in enumerate(trials):
            assert s.foreach is None and s.tune is None
            refs = {i.value for i in s.inputs if isinstance(i.value, ir.StepOutputRef)}
            mine = {ref for ref in refs if ref.step == f"train-ask-{r}"}
            assert {ref.output for ref in mine} == {f"t{k}-p0", f"t{k}-p1", f"t{k}-trial",
                                                    "study"}  # pruning: it reports itself
            assert refs - mine == {ir.StepOutputRef("data", "n")}  # what it read before
        tell = _slot_args(wf, f"train-tell-{r}")
        assert tell.count("--trial") == size and tell.count("--value") == size
    assert wf.step("train") is not None  # the best step keeps the name later steps read


def _slot_args(wf: ir.Workflow, name: str) -> tuple[str, ...]:
    step = wf.step(name)
    assert step is not None and isinstance(step.body, ir.ContainerSpec)
    return step.body.args


# --------------------------------------------------------------------------- generator


def test_the_planner_maps_bayesian_optimization_to_a_tune_step() -> None:
    from couler.generate.planner import plan

    wf, report = plan("Fine-tune a ResNet-18 on the images in s3://pets/train with 30 trials "
                      "of Bayesian optimization")
    [step] = [s for s in wf.steps if s.tune is not None]
    assert step.tune is not None and step.foreach is None
    assert dict(step.labels)["couler.io/catalog"] == "train-vision-finetune"
    assert (step.tune.trials, step.tune.parallel, step.tune.sampler, step.tune.objective) == (
        30, 4, ir.TuneSampler.TPE, "accuracy")
    assert {p.name for p in step.tune.space} == {"learning_rate", "batch_size", "epochs"}
    assert any("30 trials of Bayesian optimization" in t for t in report.subtasks)
    assert_valid_argo(compile_workflow(wf))


def test_the_planner_maps_random_search_and_says_when_it_cannot_tune() -> None:
    from couler.generate.planner import plan

    wf, _ = plan("Fine-tune a ResNet-18 on the images in s3://pets/train with 8 trials of "
                 "random search")
    [step] = [s for s in wf.steps if s.tune is not None]
    assert step.tune is not None
    assert (step.tune.trials, step.tune.sampler) == (8, ir.TuneSampler.RANDOM)
    # the tabular learners report no metric to optimize: one run, and the report says so
    wf, report = plan("tune a logistic regression on s3://b/churn.csv with 30 trials of "
                      "Bayesian optimization")
    assert all(s.tune is None for s in wf.steps)
    assert any("no metric or hyperparameters to tune" in n for n in report.notes)


def test_a_spec_may_tune_a_step_whose_template_reports_a_metric() -> None:
    from couler.generate.library import TEMPLATES
    from couler.generate.spec import assemble, parse_spec

    text = json.dumps({"name": "t", "steps": [
        {"name": "load", "template": "ingest-image-folder", "params": {"source": "s3://p/"}},
        {"name": "tune", "template": "train-vision-finetune", "after": ["load"],
         "tune": {"trials": 6, "sampler": "random", "parallel": 3,
                  "space": {"learning-rate": ["0.0001", "0.01"],
                            "batch-size": ["16", "32", "64"]}}}]})
    wf = assemble(parse_spec(text), TEMPLATES)
    step = wf.step("tune")
    assert step is not None and step.tune is not None
    assert (step.tune.trials, step.tune.parallel, step.tune.sampler, step.tune.objective) == (
        6, 3, ir.TuneSampler.RANDOM, "accuracy")
    kinds = {p.name: p.kind for p in step.tune.space}
    assert kinds == {"learning_rate": ir.TuneKind.LOGUNIFORM, "batch_size": ir.TuneKind.CHOICE}
    bad = text.replace('"sampler": "random"', '"sampler": "annealing"')
    with pytest.raises(ValidationError,
                       match=r"step 'tune', field 'tune': .*sampler \(tpe, random"):
        parse_spec(bad)
    # a template that reports no metric has nothing to tune towards
    wrong = text.replace('"template": "train-vision-finetune"',
                         '"template": "train-recommender"')
    wrong = wrong.replace('"batch-size"', '"factors"').replace('"learning-rate"',
                                                               '"regularization"')
    with pytest.raises(ValidationError, match=r"step 'tune', field 'tune\.objective'"):
        assemble(parse_spec(wrong), TEMPLATES)


def test_airflow_compiles_the_rounds_too() -> None:
    from couler.compilers import airflow

    source = airflow.compile_workflow(_tuned())
    compile(source, "dag.py", "exec")  # a Python DAG file
    assert "couler_runtime.tune" in source and "train-tell-2" in source
    assert "{{workflow.uid}}" in source  # the run is part of the study's name
