"""Programs using the open-source SDK's ``couler.steps`` (TensorFlow, PyTorch, MPI, Katib):
each call is one resource step creating the job's custom resource, compiled to valid Argo."""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import couler
import couler.argo
from couler import ir
from couler.api.builder import discard_implicit_builder
from couler.api.capture import capture_program
from couler.errors import UserError
from couler.steps import katib, mpi, pytorch
from couler.steps import tensorflow as tf
from tests.argo_schema import validate_argo


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    discard_implicit_builder()
    couler.config_workflow(name="sdk-steps")
    yield
    discard_implicit_builder()


def _compiled() -> dict[str, Any]:
    """The current workflow as Argo, checked against the Argo schema."""
    doc = couler.workflow_yaml()
    assert validate_argo(doc) == []
    return doc


def _jobs(doc: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each resource template of ``doc`` with its decoded manifest."""
    return [(t, yaml.safe_load(t["resource"]["manifest"]))
            for t in doc["spec"]["templates"] if "resource" in t]


def _job(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    (only,) = _jobs(doc)
    return only


def _container(replica: dict[str, Any]) -> dict[str, Any]:
    (container,) = replica["template"]["spec"]["containers"]
    return container


# ------------------------------------------------------------------------- TensorFlow


def test_tensorflow_train_creates_a_tfjob_with_every_replica_group() -> None:
    secret = couler.create_secret(secret_data={"access_key": "key1234"})
    outputs = tf.train(
        num_ps=2,
        num_workers=3,
        num_evaluators=1,
        image="tensorflow:1.13",
        command="python tf.py --epochs '2'",
        no_chief=False,
        worker_resources="cpu=0.5,memory=1024",
        ps_restart_policy="Never",
        worker_restart_policy="OnFailure",
        evaluator_resources="cpu=2,memory=4Gi,gpu=1",
        clean_pod_policy="Running",
        secret=secret,
    )
    assert [o.name for o in outputs] == ["job-name", "job-id", "job-obj"]
    (step,) = couler.argo.current_builder().to_ir().steps
    assert isinstance(step.body, ir.JobSpec) and step.body.action is ir.JobAction.CREATE

    doc = _compiled()
    template, job = _job(doc)
    # named after the calling function, as the SDK and run_container name steps
    assert template["name"] == "test-tensorflow-train-creates-a-tfjob-with-every-replica-group"
    resource = template["resource"]
    assert resource["action"] == "create" and resource["setOwnerReference"] is True
    assert resource["successCondition"] == "status.replicaStatuses.Worker.succeeded == 3"
    assert resource["failureCondition"] == (
        "status.replicaStatuses.Chief.failed > 0,status.replicaStatuses.PS.failed > 0,"
        "status.replicaStatuses.Worker.failed > 0,status.replicaStatuses.Evaluator.failed > 0")

    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "TFJob")
    assert job["metadata"] == {"generateName": "tf-train-"}
    assert job["spec"]["runPolicy"] == {"cleanPodPolicy": "Running"}
    specs = job["spec"]["tfReplicaSpecs"]
    assert {role: s["replicas"] for role, s in specs.items()} == {
        "Chief": 1, "PS": 2, "Worker": 3, "Evaluator": 1}
    assert specs["Worker"]["restartPolicy"] == "OnFailure"
    assert specs["PS"]["restartPolicy"] == "Never"
    env = [{"name": "access_key",
            "valueFrom": {"secretKeyRef": {"name": str(secret), "key": "access_key"}}}]
    for role, replica in specs.items():
        container = _container(replica)
        assert container["name"] == "tensorflow", role
        assert container["image"] == "tensorflow:1.13", role
        assert container["command"] == ["python", "tf.py", "--epochs", "2"], role
        assert container["env"] == env, role
    assert _container(specs["Worker"])["resources"]["limits"] == {"cpu": "0.5",
                                                                  "memory": "1024Mi"}
    assert _container(specs["Evaluator"])["resources"]["limits"] == {
        "cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}
    assert "resources" not in _container(specs["Chief"])
    assert "key1234" not in json.dumps(doc)


def test_tensorflow_groups_take_their_own_image_and_command_and_the_chief_is_optional() -> None:
    tf.train(image="tf:2", command=["python", "train.py"], num_workers=1,
             worker_image="tf:2-gpu", worker_command=["python", "worker.py"])
    specs = _job(_compiled())[1]["spec"]["tfReplicaSpecs"]
    assert set(specs) == {"Worker"}
    worker = _container(specs["Worker"])
    assert (worker["image"], worker["command"]) == ("tf:2-gpu", ["python", "worker.py"])
    assert "env" not in worker


# ------------------------------------------------------------------------- PyTorch


def test_pytorch_train_creates_a_pytorchjob_with_a_master_and_workers() -> None:
    pytorch.train(
        num_workers=3,
        image="pytorch:2.3",
        command="python pytorch.py",
        master_image="pytorch:2.3-master",
        master_resources="cpu=1",
        worker_resources={"cpu": "4", "memory": "16Gi", "gpu": 1},
        worker_restart_policy="OnFailure",
        clean_pod_policy="All",
        timeout="2h",
    )
    doc = _compiled()
    template, job = _job(doc)
    assert template["timeout"] == "7200s"
    assert template["resource"]["successCondition"] == (
        "status.replicaStatuses.Worker.succeeded == 3")
    assert template["resource"]["failureCondition"] == (
        "status.replicaStatuses.Master.failed > 0,status.replicaStatuses.Worker.failed > 0")
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert job["metadata"] == {"generateName": "pytorch-train-"}
    assert job["spec"]["runPolicy"] == {"cleanPodPolicy": "All"}
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert (specs["Master"]["replicas"], specs["Worker"]["replicas"]) == (1, 3)
    assert (specs["Master"]["restartPolicy"], specs["Worker"]["restartPolicy"]) == (
        "Never", "OnFailure")
    master, worker = _container(specs["Master"]), _container(specs["Worker"])
    assert (master["name"], master["image"]) == ("pytorch", "pytorch:2.3-master")
    assert (worker["name"], worker["image"]) == ("pytorch", "pytorch:2.3")
    assert master["command"] == worker["command"] == ["python", "pytorch.py"]
    assert master["resources"] == {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}
    assert worker["resources"]["limits"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}


# ------------------------------------------------------------------------- MPI


def test_mpi_train_creates_an_mpijob_decided_by_its_launcher() -> None:
    import couler.steps

    secret = couler.obtain_secret(["token"], name="hub-token")
    couler.steps.mpi.train(
        num_workers=3,
        image="horovod:0.28",
        command="mpirun -np 3 python mpi.py",
        worker_resources="cpu=0.5,memory=1024",
        clean_pod_policy="Running",
        secret="hub-token",
    )
    template, job = _job(_compiled())
    assert template["resource"]["successCondition"] == (
        "status.replicaStatuses.Launcher.succeeded > 0")
    assert template["resource"]["failureCondition"] == (
        "status.replicaStatuses.Launcher.failed > 0,status.replicaStatuses.Worker.failed > 0")
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "MPIJob")
    assert job["metadata"] == {"generateName": "mpi-train-"}
    spec = job["spec"]
    assert spec["slotsPerWorker"] == 1
    assert spec["cleanPodPolicy"] == spec["runPolicy"]["cleanPodPolicy"] == "Running"
    launcher = _container(spec["mpiReplicaSpecs"]["Launcher"])
    worker = _container(spec["mpiReplicaSpecs"]["Worker"])
    assert spec["mpiReplicaSpecs"]["Worker"]["replicas"] == 3
    assert "restartPolicy" not in spec["mpiReplicaSpecs"]["Worker"]
    assert launcher["command"] == ["mpirun", "-np", "3", "python", "mpi.py"]
    assert "command" not in worker  # the operator keeps workers idle for mpirun
    assert launcher["image"] == worker["image"] == "horovod:0.28"
    assert worker["resources"]["limits"] == {"cpu": "0.5", "memory": "1024Mi"}
    ref = {"name": "token", "valueFrom": {"secretKeyRef": {"name": "hub-token", "key": "token"}}}
    assert launcher["env"] == worker["env"] == [ref]
    assert str(secret) == "hub-token"


# ------------------------------------------------------------------------- Katib

_XGB_COMMAND = """ \\
python /opt/katib/train_xgboost.py \\
  --booster gbtree \\
"""

# The SDK's v1alpha3 trial: a Go template, written as its tests and examples write it.
_GO_TEMPLATE = f"""
        apiVersion: batch/v1
        kind: Job
        metadata:
          name: {{{{.Trial}}}}
          namespace: {{{{.NameSpace}}}}
        spec:
          template:
            spec:
              containers:
              - name: {{{{.Trial}}}}
                image: docker.io/katib/xgboost:v0.1
                command:
                - "{_XGB_COMMAND}"
                {{{{- with .HyperParameters}}}}
                {{{{- range .}}}}
                - "{{{{.Name}}}}={{{{.Value}}}}"
                {{{{- end}}}}
                {{{{- end}}}}
                env:
                - name: TRIAL
                  value: {{{{.Trial}}}}
              restartPolicy: Never
"""

_PARAMS = [
    {"name": "max_depth", "type": "int", "range": [2, 10]},
    {"name": "eta", "type": "double", "range": [0.01, 0.3]},
]
_OBJECTIVE = {"type": "maximize", "goal": 0.99, "metric_name": "accuracy"}


def test_katib_run_translates_the_sdk_go_template_into_a_v1beta1_experiment() -> None:
    katib.run(
        tuning_params=_PARAMS,
        objective=_OBJECTIVE,
        success_condition="status.trialsSucceeded > 4",
        failure_condition="status.trialsFailed > 3",
        algorithm="random",
        raw_template=_GO_TEMPLATE,
        parallel_trial_count=4,
        max_trial_count=16,
        max_failed_trial_count=3,
    )
    template, experiment = _job(_compiled())
    assert template["name"] == "test-katib-run-translates-the-sdk-go-template-into-a-v1beta1-ex"
    assert template["resource"]["successCondition"] == "status.trialsSucceeded > 4"
    assert template["resource"]["failureCondition"] == "status.trialsFailed > 3"
    assert "{{" not in template["resource"]["manifest"]
    assert (experiment["apiVersion"], experiment["kind"]) == ("kubeflow.org/v1beta1",
                                                              "Experiment")
    assert experiment["metadata"] == {"generateName": "katib-"}
    spec = experiment["spec"]
    assert (spec["parallelTrialCount"], spec["maxTrialCount"], spec["maxFailedTrialCount"]) == (
        4, 16, 3)
    assert spec["objective"] == {"type": "maximize", "goal": 0.99,
                                 "objectiveMetricName": "accuracy"}
    assert spec["algorithm"] == {"algorithmName": "random"}
    assert spec["parameters"] == [
        {"name": "max_depth", "parameterType": "int",
         "feasibleSpace": {"min": "2", "max": "10"}},
        {"name": "eta", "parameterType": "double",
         "feasibleSpace": {"min": "0.01", "max": "0.3"}},
    ]
    trial = spec["trialTemplate"]
    assert trial["primaryContainerName"] == "training"
    assert trial["trialParameters"] == [
        {"name": "max_depth", "reference": "max_depth"},
        {"name": "eta", "reference": "eta"},
        {"name": "trialName", "reference": "${trialSpec.Name}"},
    ]
    job = trial["trialSpec"]
    assert "metadata" not in job  # Katib names and places each trial's job
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "training"
    assert container["command"][1:] == ["--max_depth=${trialParameters.max_depth}",
                                        "--eta=${trialParameters.eta}"]
    assert "train_xgboost.py --booster gbtree" in container["command"][0]
    assert container["env"] == [{"name": "TRIAL", "value": "${trialParameters.trialName}"}]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_katib_run_takes_a_v1beta1_trial_spec_and_waits_for_the_experiment_by_default() -> None:
    trial = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "sidecar", "image": "busybox:1.36"},
            {"name": "train", "image": "trainer:1",
             "args": ["--lr=${trialParameters.lr}", "--layers=${trialParameters.layers}"]},
        ]}}},
    }
    katib.run(trial, [{"name": "lr", "type": "double", "range": [0.001, 0.1]},
                      {"name": "layers", "type": "int", "range": [1, 4]}],
              {"type": "minimize", "metric_name": "loss"},
              primary_container_name="train", step_name="tune")
    template, experiment = _job(_compiled())
    assert template["name"] == "tune"
    assert template["resource"]["successCondition"] == "status.completionTime"
    assert template["resource"]["failureCondition"] == (
        "status.trialsFailed > 2,status.trialMetricsUnavailable > 2")
    spec = experiment["spec"]
    assert (spec["parallelTrialCount"], spec["maxTrialCount"], spec["maxFailedTrialCount"]) == (
        3, 12, 3)
    assert spec["objective"] == {"type": "minimize", "objectiveMetricName": "loss"}
    assert spec["trialTemplate"]["primaryContainerName"] == "train"
    assert spec["trialTemplate"]["trialParameters"] == [
        {"name": "lr", "reference": "lr"}, {"name": "layers", "reference": "layers"}]
    assert spec["trialTemplate"]["trialSpec"] == trial


def test_katib_fails_the_step_at_the_first_failed_trial_when_none_may_fail() -> None:
    katib.run("apiVersion: batch/v1\nkind: Job\nspec:\n  template:\n    spec:\n"
              "      containers:\n      - name: t\n        image: t:1\n"
              "        args: ['${trialParameters.n}']\n",
              [{"name": "n", "type": "int", "range": [1, 2]}],
              {"type": "maximize", "metric_name": "acc"}, max_failed_trial_count=0)
    template, experiment = _job(_compiled())
    assert template["resource"]["failureCondition"] == (
        "status.trialsFailed > 0,status.trialMetricsUnavailable > 0")
    assert experiment["spec"]["trialTemplate"]["primaryContainerName"] == "t"


# ------------------------------------------------------------------------- steps in a workflow


def test_two_different_training_jobs_take_unique_names_inside_a_dag() -> None:
    def small() -> object:
        return tf.train(image="tf:2", num_workers=1)

    def large() -> object:
        return tf.train(image="tf:2", num_workers=4)

    couler.dag([[small], [small, large]])
    doc = _compiled()
    tasks = {t["name"]: t for t in doc["spec"]["templates"][0]["dag"]["tasks"]}
    assert set(tasks) == {"small", "large"}  # each named after the function calling train
    assert tasks["large"]["depends"] == "small"
    workers = {t["name"]: job["spec"]["tfReplicaSpecs"]["Worker"]["replicas"]
               for t, job in _jobs(doc)}
    assert workers == {"small": 1, "large": 4}


def test_steps_package_sits_beside_the_run_job_api_without_shadowing_it() -> None:
    import couler.api.steps
    import couler.steps

    assert couler.steps.tensorflow.train is tf.train and couler.steps.katib.run is katib.run
    assert couler.api.steps.run_job is couler.run_job is couler.argo.run_job
    assert "steps" not in couler.argo.__all__


def test_an_sdk_program_using_couler_steps_is_captured_unchanged(tmp_path: Path) -> None:
    program = tmp_path / "distributed_training.py"
    program.write_text(textwrap.dedent("""\
        import couler.argo as couler
        import couler.steps.pytorch as pytorch
        from couler.argo_submitter import ArgoSubmitter
        from couler.steps import tensorflow as tf

        secret = couler.create_secret(secret_data={"access_key": "s3cr3t-value"})
        tf.train(num_ps=1, num_workers=2, image="tensorflow:1.13", command="python tf.py",
                 worker_resources="cpu=0.5,memory=1024", secret=secret)
        pytorch.train(num_workers=2, image="pytorch:1.13", command="python pytorch.py",
                      secret=secret)
        couler.run(submitter=ArgoSubmitter(namespace="argo"))
        """))
    (wf,) = capture_program(str(program))
    kinds = [step.body.manifest_dict["kind"] for step in wf.steps
             if isinstance(step.body, ir.JobSpec)]
    assert kinds == ["TFJob", "PyTorchJob"]
    # at module level there is no calling function: the job's generateName names the step
    assert [s.name for s in wf.steps] == ["tf-train", "pytorch-train"]
    assert wf.steps[1].dependencies == (ir.Dependency("tf-train"),)
    doc = couler.argo.compile_ir(wf)
    assert validate_argo(doc) == []
    assert "s3cr3t-value" not in json.dumps(doc)
    assert f"{wf.name}-secret-1" in json.dumps(doc)


# ------------------------------------------------------------------------- bad input


_K = ("apiVersion: batch/v1\nkind: Job\n"
      "spec: {template: {spec: {containers: [{name: t, image: t}]}}}")


@pytest.mark.parametrize(("call", "message"), [
    (lambda: tf.train(image="tf:2"),
     "tensorflow.train: num_workers: must be at least 1, got 0"),
    (lambda: tf.train(image="tf:2", num_workers=True),
     "tensorflow.train: num_workers: must be an integer, not True"),
    (lambda: tf.train(image="tf:2", num_workers=1, num_ps=-1),
     "tensorflow.train: num_ps: must be at least 0, got -1"),
    (lambda: tf.train(num_workers=2),
     "tensorflow.train: image: the Worker replicas need an image: pass image= or "
     "worker_image="),
    (lambda: tf.train(ps_image="ps:1", num_ps=1, num_workers=1, worker_image="w:1",
                      no_chief=False),
     "tensorflow.train: image: the Chief replicas need an image: pass image= or chief_image="),
    (lambda: tf.train(image="tf:2", num_workers=1, worker_image=" "),
     "tensorflow.train: worker_image: the Worker replicas need an image"),
    (lambda: tf.train(image="tf:2", num_workers=1, worker_resources="cpu=1,disk=20"),
     "tensorflow.train: worker_resources: 'disk' is not supported; use cpu, memory and gpu"),
    (lambda: tf.train(image="tf:2", num_workers=1, worker_resources="cpu=lots"),
     "tensorflow.train: worker_resources: cpu: 'lots' is not a Kubernetes quantity"),
    (lambda: tf.train(image="tf:2", num_workers=1, ps_resources="cpu", num_ps=1),
     "tensorflow.train: ps_resources: 'cpu' is not key=value"),
    (lambda: tf.train(image="tf:2", num_workers=1, command="python 'unclosed"),
     "tensorflow.train: command: cannot split"),
    (lambda: tf.train(image="tf:2", num_workers=1, worker_command=["python", 3.5j]),
     "tensorflow.train: worker_command: every item must be a string or a number"),
    (lambda: pytorch.train(image="  ", num_workers=1),
     "pytorch.train: image: the Master replicas need an image: pass image= or master_image="),
    (lambda: pytorch.train(image="pt:2", num_workers=1, master_restart_policy="Sometimes"),
     "pytorch.train: master_restart_policy: 'Sometimes' is not one of Always, OnFailure, "
     "Never, ExitCode"),
    (lambda: pytorch.train(image="pt:2", num_workers=1, secret="nope"),
     "pytorch.train: secret: no secret called 'nope'"),
    (lambda: mpi.train(image="mpi:1", num_workers=1, clean_pod_policy="Sometimes"),
     "mpi.train: clean_pod_policy: 'Sometimes' is not one of All, Running, None"),
    (lambda: mpi.train(image="mpi:1", num_workers=0, step_name="allreduce"),
     "mpi.train (step 'allreduce'): num_workers: must be at least 1, got 0"),
    (lambda: katib.run(_K, [{"name": "lr", "type": "float", "range": [0, 1]}], _OBJECTIVE),
     "katib.run: tuning_params[0].type: 'float' is not one of int, double"),
    (lambda: katib.run(_K, [{"name": "n", "type": "int", "range": [10, 2]}], _OBJECTIVE),
     "katib.run: tuning_params[0].range: min 10 exceeds max 2"),
    (lambda: katib.run(_K, [{"name": "n", "type": "int", "range": [1.5, 2]}], _OBJECTIVE),
     "katib.run: tuning_params[0].range: the bounds must be integers, got 1.5"),
    (lambda: katib.run(_K, [{"name": "n", "type": "int"}], _OBJECTIVE),
     "katib.run: tuning_params[0]: needs range"),
    (lambda: katib.run(_K, [], _OBJECTIVE), "katib.run: tuning_params: must be a non-empty list"),
    (lambda: katib.run(_K, [{"name": "n", "type": "int", "range": [1, 2]}],
                       {"type": "maximise", "metric_name": "acc"}),
     "katib.run: objective.type: 'maximise' is not one of maximize, minimize"),
    (lambda: katib.run(_K, [{"name": "n", "type": "int", "range": [1, 2]}],
                       {"type": "maximize"}),
     "katib.run: objective: needs metric_name"),
    (lambda: katib.run(_K, _PARAMS, _OBJECTIVE, parallel_trial_count=5, max_trial_count=4),
     "katib.run: parallel_trial_count: 5 exceeds max_trial_count (4)"),
    (lambda: katib.run(_K, _PARAMS, _OBJECTIVE, algorithm=""),
     "katib.run: algorithm: must name a Katib algorithm"),
    (lambda: katib.run(_K, _PARAMS, _OBJECTIVE),
     "katib.run: raw_template: tuning parameter 'max_depth' is not used; write "
     "${trialParameters.max_depth} where the trial reads it"),
    (lambda: katib.run(_K.replace("image: t", "image: t, args: ['${trialParameters.lr}']"),
                       [{"name": "n", "type": "int", "range": [1, 2]}], _OBJECTIVE),
     "katib.run: raw_template: ${trialParameters.lr} names no tuning parameter"),
    (lambda: katib.run(_K.replace("kind: Job", "kind: Job\nmetadata: {name: x}"),
                       [{"name": "n", "type": "int", "range": [1, 2]}], _OBJECTIVE),
     "katib.run: raw_template: metadata.name must be left out"),
    (lambda: katib.run(_GO_TEMPLATE.replace("{{.NameSpace}}", "{{.Experiment}}"), _PARAMS,
                       _OBJECTIVE),
     "katib.run: raw_template: {{.Experiment}} cannot be translated to Katib v1beta1"),
    (lambda: katib.run(_GO_TEMPLATE.replace("{{- end}}\n", "", 1), _PARAMS, _OBJECTIVE),
     "katib.run: raw_template: a {{with}} or {{range}} has no {{end}}"),
    (lambda: katib.run(_K, [{"name": "n", "type": "int", "range": [1, 2]}], _OBJECTIVE,
                       primary_container_name="trainer"),
     "katib.run: primary_container_name: the trial has no container 'trainer'"),
])
def test_bad_input_is_refused_naming_the_workflow_call_and_argument(
        call: Callable[[], object], message: str) -> None:
    with pytest.raises(UserError, match="^" + re.escape(f"workflow 'sdk-steps': {message}")):
        call()
    assert not couler.argo.current_builder().has_steps


def test_a_secret_passed_by_value_is_refused_without_showing_the_value() -> None:
    with pytest.raises(UserError, match="secret: must be what create_secret or obtain_secret "
                                        "returned") as raised:
        pytorch.train(image="pt:2", num_workers=1,
                      secret={"token": "do-not-print"})  # type: ignore[arg-type]
    assert "do-not-print" not in str(raised.value)


def test_a_secret_of_another_workflow_is_refused() -> None:
    with couler.workflow("other"):
        foreign = couler.create_secret({"k": "v"})
    with pytest.raises(UserError, match=re.escape("tensorflow.train: secret: secret "
                                                  "'other-secret-1' belongs to another workflow")):
        tf.train(image="tf:2", num_workers=1, secret=foreign)
