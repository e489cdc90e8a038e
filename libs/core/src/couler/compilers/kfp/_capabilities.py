"""What the KFP compiler expresses (CAPABILITIES) and the limits it meets (LIMITS)."""

from __future__ import annotations

from couler.engines.base import (
    Capability,
    Feature,
    Limit,
    Support,
)

ENGINE = "kfp"

_N, _R, _U = Support.NATIVE, Support.REWRITTEN, Support.UNSUPPORTED
_NO_DEPENDS_NOTE = (
    "a depends expression needs the outcomes of several steps; a KFP task reads the final "
    "status of one upstream task only (ignore_upstream_failure + PipelineTaskFinalStatus), "
    "and dependentTasks is a plain conjunction")
_KK = "the kfp-kubernetes extension (kfp.kubernetes, platforms.kubernetes in the spec)"

CAPABILITIES: dict[Feature, Capability] = {
    Feature.CONTAINER: Capability(_N, "a container component (dsl.ContainerSpec) per step"),
    Feature.SCRIPT: Capability(
        _R, "a container component running the interpreter on the source (python -c SOURCE, "
            "bash -c / sh -c); in local mode a lightweight Python component running it in a "
            "subprocess"),
    Feature.JOB: Capability(
        _R, "KFP v2 has no resource step (v1 ResourceOp was dropped), so a job step is a "
            "container component running kubectl (bitnami/kubectl; the script Tekton's job "
            "step runs) that writes the manifest (owned by the step's pod, whose name and uid "
            "come from the downward API through " + _KK + "), runs the action and polls the "
            "object every 5 s: Argo-style success / failure conditions (==, !=, >, <, in, "
            "notin, exists) read with kubectl get -o jsonpath; JSONPath outputs and jq `.` "
            "(the whole object) only, as KFP output parameters. The pod runs under the run's "
            "service account (kfp-kubernetes 2.17 sets none per task; a workflow service "
            "account is rejected, so it is the API server's default, pipeline-runner, or "
            "default-editor in multi-user mode), which needs RBAC on the resource (the "
            "job's action, get). Artifacts and "
            "failed / completed edges or failed / error exit hooks on it (Couler's wrapper) "
            "are rejected; kfp.local cannot run it (no cluster)"),
    Feature.SUBWORKFLOW_INLINE: Capability(
        _N, "a nested @dsl.pipeline (a sub-DAG task) of the inner steps, built like the "
            "workflow's own; group-level settings (when, map, loop, retry, resources, edge "
            "conditions, outputs...) and claim templates mounted inside are rejected"),
    Feature.SUBWORKFLOW_REF: Capability(
        _U, "a KFP pipeline nests another only as a component compiled into the same "
            "PipelineSpec, and the referenced workflow's definition is not in the document "
            "(only its name); a run of a pipeline registered under that name is created "
            "through the KFP API server (RunService), not as a Kubernetes object, so the "
            "kubectl job-step rewrite that runs a reference on Tekton does not apply, and a "
            "task has no KFP endpoint or credentials to call the API with"),
    Feature.PARAMETERS: Capability(
        _R, "component input parameters ({{$.inputs.parameters['X']}}); outputs are "
            "dsl.OutputPath outputs written by a /bin/sh -c wrapper (stdout or the file's "
            "content, trailing newlines trimmed); parameter names become identifiers"),
    Feature.WORKFLOW_PARAMETERS: Capability(_N, "pipeline parameters with defaults and types"),
    Feature.ARTIFACTS: Capability(
        _R, "KFP artifacts (system.Artifact): an output artifact → dsl.Output[dsl.Artifact], "
            "copied from the step's path into {{$.outputs.artifacts['X'].path}} after the "
            "command (missing: the step fails); an input artifact from a step → "
            "dsl.Input[dsl.Artifact] fed by that step's output, copied to the step's path "
            "before the command; KFP stores them under the pipeline root, so output "
            "artifacts at a chosen location or as workflow outputs, and input artifacts "
            "from a storage location, are rejected"),
    Feature.EDGE_CONDITIONS: Capability(
        _R, "a step on one failed / completed / any edge → .after(upstream)."
            "ignore_upstream_failure(); failed / completed ones read the upstream's "
            "PipelineTaskFinalStatus and run the command only on FAILED (failed) or "
            "SUCCEEDED / FAILED (completed), else exit 0 at once (reported succeeded); the "
            "KFP backend runs such a task as an exit hook of its upstream, so it must be a "
            "leaf with that one edge, the upstream neither conditional nor mapped; the run "
            "still fails when the upstream fails (semantics E6); a succeeded-only edge from "
            "a conditional step → the step and its plain dependents run under that "
            "condition too (nested dsl.If in a sub-pipeline); errored (no platform-error "
            "status), skipped (a task inside a dsl.If reports no status out of it), omitted "
            "(no task runs after a task not run), any-succeeded / all-failed (no per-item "
            "outcomes) are rejected"),
    Feature.DEPENDS_EXPRESSION: Capability(_U, _NO_DEPENDS_NOTE),
    Feature.WHEN: Capability(
        _N, "dsl.If on the upstream output (==, !=, <, >, <=, >=; a string output compared "
            "with a number is declared float), in a sub-pipeline taking the output as an "
            "input when an output drives it or other steps depend on the step (KFP forbids "
            "dependencies into a dsl.If, not into a sub-pipeline task); reading a "
            "conditional step's output is rejected (dsl.OneOf is not mapped)"),
    Feature.ELSE: Capability(_R, "dsl.If with the negated operator (equivalent to dsl.Else)"),
    Feature.MAP_STATIC: Capability(
        _N, "dsl.ParallelFor over the static items (leaf values rendered as text)"),
    Feature.MAP_DYNAMIC: Capability(
        _N, "dsl.ParallelFor over an upstream output declared as a list (in a sub-pipeline "
            "taking the list as an input); a later step reads one output of a mapped step "
            "as a list in item order (dsl.Collected, returned by the sub-pipeline), a second "
            "output of the same mapped step is rejected"),
    Feature.MAP_PARALLELISM: Capability(_N, "dsl.ParallelFor(parallelism=N) (iteratorPolicy)"),
    Feature.LOOP: Capability(
        _R, "KFP v2 has no loops (kubeflow/pipelines#10748): unrolled into at most 16 "
            "iterations, iteration k in a nested pipeline couler-STEP-iterK that runs the "
            "step under dsl.If(the condition on iteration k-1's outputs), then iteration "
            "k+1; dependents run after the last; reading a looped step's outputs, and "
            "looped steps that are mapped, conditional, in a sub-workflow or carry "
            "artifacts, are rejected"),
    Feature.EXIT_HOOKS: Capability(
        _R, "one `any` / `failed` / `error` hook step → the dsl.ExitHandler exit task (failed "
            "/ error: it reads dsl.PipelineTaskFinalStatus and runs the step only when the "
            "state is not SUCCEEDED; error = any failure); `succeeded` hook steps → tasks "
            "after every step; a second any / failed / error hook step is rejected (one exit "
            "task per handler, handlers do not nest)"),
    Feature.RETRY: Capability(_N, "task.set_retry(num_retries)"),
    Feature.RETRY_BACKOFF: Capability(
        _N, "set_retry(backoff_duration, backoff_factor, backoff_max_duration)"),
    Feature.RETRY_FAILURE_CLASSES: Capability(
        _R, "KFP retries every failure, so a policy naming classes runs the step's command "
            "under the POSIX-sh retry wrapper of couler.compilers.entrypoint (as on Tekton): "
            "it classifies each failed attempt with couler.failures' classes (exit code, "
            "stderr patterns, the cgroup's oom_kill counter) and retries inside the container "
            "the classes the policy names, with its back-off; KFP's own set_retry is not "
            "set then (a pod the platform lost is not retried); kfp.local runs the same "
            "wrapper with the host's sh; refused on job steps"),
    Feature.MEMORY_ESCALATION: Capability(
        _R, "KFP fixes a task's memory for its retries, so the step becomes a ladder of "
            "tasks, one per memory level (the memory as written, then x factor up to the "
            "ceiling, at most limit + 1; set_memory_limit / set_memory_request per task): "
            "each runs the command under the retry wrapper (couler.compilers.entrypoint), "
            "stops at an out-of-memory failure and hands over -- exits 0 with outputs "
            "couler_class = oom and couler_attempts -- when attempts are left; the next "
            "rung runs under dsl.If(couler_class == 'oom') in a nested sub-pipeline "
            "couler-STEP-memK taking them as inputs, counting the attempts made against the "
            "limit and indexing the back-off; the last rung retries out-of-memory failures "
            "in place; a genuine failure fails its rung and the run; dependents run after "
            "the whole ladder; KFP's own set_retry is not set (a pod the platform lost is not "
            "retried). Only when the policy retries oom (or any); refused for a step that is "
            "mapped, looped, conditional, an exit hook, on or the upstream of a failed / "
            "completed / any edge, a job step, one mounting a claim template, or one whose "
            "outputs or artifacts other steps read (the rung that ran last is not known at "
            "compile time; dsl.OneOf is not mapped)"),
    Feature.TIMEOUT: Capability(
        _N, "kubernetes.set_timeout (pod activeDeadlineSeconds, per attempt) through " + _KK
            + "; a workflow timeout maps to PipelineConfig.active_deadline_seconds"),
    Feature.RESOURCES: Capability(
        _N, "set_cpu_request / set_cpu_limit / set_memory_request / set_memory_limit"),
    Feature.GPU: Capability(_N, "set_accelerator_type(resource name) + set_accelerator_limit"),
    Feature.CACHE: Capability(
        _R, "set_caching_options(True) (KFP's own content key; salt / max age / key are not "
            "expressible); steps without a policy get set_caching_options(False)"),
    Feature.PRIORITY: Capability(_U, "no task priority in KFP"),
    Feature.NODE_SELECTOR: Capability(
        _N, "kubernetes.add_node_selector through " + _KK + "; a step's node selector "
            "replaces the workflow's, as on Argo"),
    Feature.TOLERATIONS: Capability(
        _N, "kubernetes.add_toleration through " + _KK + "; a step's tolerations replace the "
            "workflow's, as on Argo"),
    Feature.VOLUMES: Capability(
        _R, "through " + _KK + ": an existing claim → mount_pvc; a claim template → a "
            "CreatePVC task before the steps mounting it (each mounts its name output and "
            "runs after it) and a DeletePVC task after them (a failed run leaves the claim: "
            "DeletePVC runs only after its upstream succeed); empty dir → empty_dir_mount; "
            "config map / secret volumes → use_config_map_as_volume / use_secret_as_volume; "
            "read-only PVC mounts, sub paths on non-PVC mounts and claim templates in exit "
            "tasks or sub-pipelines are rejected"),
    Feature.SECRETS: Capability(
        _N, "kubernetes.use_secret_as_env (secret key → env var) through " + _KK),
    Feature.DAEMON: Capability(_U, "no daemon / sidecar tasks in KFP v2"),
    Feature.CRON: Capability(
        _R, "a KFP recurring run, created by the KFP adapter (KfpAdapter.submit) through the "
            "API server's RecurringRunService with the compiled PipelineSpec (the spec itself "
            "carries no schedule): a cron trigger with a seconds field ('0 ' + the schedule), "
            "Forbid → max_concurrency 1, Allow → 10 (the API's maximum), suspend → mode "
            "DISABLE; Replace, a time zone other than UTC, a starting deadline and history "
            "limits are rejected (KFP has none of them)"),
    Feature.EVENT_TRIGGERS: Capability(_U, "KFP has no event triggers"),
    Feature.TUNE: Capability(
        _R, "rounds of an ask task (python -m couler_runtime.tune ask, parameter values as "
            "text: a ParallelFor item's integer field would read 2.0), a ParallelFor of trial "
            "tasks over its list (parallelism = parallel) in a sub-pipeline returning the "
            "objectives as dsl.Collected, and a tell task, then a best task producing the "
            "outputs (couler.optimize.tune.expand_tune); the study is named after the run "
            "({{$.pipeline_job_uuid}}) and its URL comes from the storage secret "
            "(kubernetes.use_secret_as_env). No pruning: KFP sets environment variables to "
            "literals only, so a trial cannot be told its trial number "
            "(couler_runtime.tune.report is a no-op, every trial runs to its end)"),
}

_KFP_DOCS = "https://www.kubeflow.org/docs/components/pipelines/"
MAX_UNROLL = 16  # longest bounded loop unrolled into nested guarded pipelines
LIMITS: tuple[Limit, ...] = (
    Limit("Argo Workflow object size the compiled pipeline runs as (Kubernetes/etcd request, "
          "--max-request-bytes default)", 1572864, "bytes",
          "https://etcd.io/docs/v3.5/dev-guide/limit/ (the KFP backend turns a run into an "
          "Argo Workflow object)"),
    Limit("KFP API server gRPC message size (pipeline upload / run creation)", 4194304, "bytes",
          "gRPC default max receive message size, used by the KFP API server "
          "(backend/src/apiserver/main.go)"),
    Limit("pipeline / task name length (DNS-1123 label, Kubernetes object names)", 63,
          "characters", _KFP_DOCS + "user-guides/core-functions/ and Kubernetes names"),
    Limit("ParallelFor parallelism (iteratorPolicy.parallelismLimit, int32)", 2147483647,
          "tasks", _KFP_DOCS + "user-guides/core-functions/control-flow/#parallel-looping-"
                   "dslparallelfor (0 = unbounded)"),
    Limit("loop iterations unrolled by Couler", MAX_UNROLL, "iterations",
          "couler.compilers.kfp (KFP v2 has no loops: kubeflow/pipelines#10748)"),
    Limit("output parameter size (read back by the launcher; stored in MLMD)", 524288, "bytes",
          "https://github.com/kubeflow/pipelines/issues/4545 (large parameters; use "
          "artifacts)"),
)
