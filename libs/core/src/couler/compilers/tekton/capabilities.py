"""What Tekton Pipelines can express: the capability matrix and limits of the Tekton compiler.

Each :data:`CAPABILITIES` entry says how a feature compiles (native, rewritten -- with the
rewrite -- or unsupported, with the reason); :data:`LIMITS` lists Tekton's documented
limits with their sources. ``scripts/gen_engine_docs.py`` renders both in docs/engines.md.
"""

from __future__ import annotations

from couler.engines.base import Capability, Feature, Limit, Support

__all__ = [
    "API_VERSION",
    "ARTIFACTS_SIZE",
    "ARTIFACTS_WORKSPACE",
    "ATTEMPTS_RESULT",
    "CAPABILITIES",
    "ENGINE",
    "EXIT_RESULT",
    "FAILURE_RESULT",
    "ITEM_PARAM",
    "LIMITS",
    "MAX_MATRIX_COMBINATIONS",
    "MAX_UNROLL",
    "TTL_ANNOTATION",
]

ENGINE = "tekton"
API_VERSION = "tekton.dev/v1"
MAX_UNROLL = 8  # longest loop unrolled into guarded iterations
MAX_MATRIX_COMBINATIONS = 256  # Tekton's default-max-matrix-combinations-count
TTL_ANNOTATION = "couler.io/ttl-seconds"
ITEM_PARAM = "couler-item"
ATTEMPTS_RESULT = "couler-attempts"  # written by the retry wrapper: attempts made
FAILURE_RESULT = "couler-failure"  # written by the retry wrapper: the last failure's class
EXIT_RESULT = "couler-exit"  # an attempt task's last exit code (memory escalation)
ARTIFACTS_WORKSPACE = "couler-artifacts"  # the workspace artifacts are passed through
ARTIFACTS_SIZE = "1Gi"  # its claim's size (a volumeClaimTemplate per PipelineRun)


_N, _R, _U = Support.NATIVE, Support.REWRITTEN, Support.UNSUPPORTED

CAPABILITIES: dict[Feature, Capability] = {
    Feature.CONTAINER: Capability(_N, "a pipeline task with an embedded taskSpec of one step"),
    Feature.SCRIPT: Capability(
        _N, "step `script` with a shebang for the interpreter (a /bin/sh wrapper when the "
            "step has outputs or a multi-word interpreter command)"),
    Feature.JOB: Capability(
        _R, "Tekton has no resource step, so a job step is a kubectl step (bitnami/kubectl, "
            "under the run's service account, which needs rights on the resource) that "
            "writes the manifest (owned by the TaskRun), runs the action and polls the "
            "object every 5 s: Argo-style success / failure conditions (==, !=, >, <, in, "
            "notin, exists) read with kubectl get -o jsonpath; JSONPath outputs and jq `.` "
            "(the whole object) only; "
            "no retry wrapper, cache, artifacts or edge conditions on it"),
    Feature.SUBWORKFLOW_INLINE: Capability(
        _R, "flattened: inner steps become tasks GROUP-STEP, roots run after the group's "
            "dependencies, dependents run after every inner step; group-level when/map/loop/"
            "policies are rejected"),
    Feature.SUBWORKFLOW_REF: Capability(
        _R, "PipelineTask.pipelineRef exists in the v1 schema but pipelines-in-pipelines "
            "(TEP-0056) is not implemented by the Tekton controller, so the step is a job "
            "step (the kubectl step of job steps) creating a PipelineRun of the Pipeline "
            "deployed under the referenced name (generateName NAME-, the step's inputs as "
            "its params, the pinned digest in the couler.io/digest annotation, owned by the "
            "TaskRun) and waiting for its Succeeded condition (True: the step succeeds, "
            "False: it fails); the child's results cannot be read back, so a reference "
            "declaring outputs or artifacts is refused"),
    Feature.PARAMETERS: Capability(
        _R, "inputs are task params; outputs are task results, written to $(results.NAME.path) "
            "by a /bin/sh wrapper script that copies file outputs and captures stdout "
            "(trailing newlines trimmed); references are $(tasks.STEP.results.NAME)"),
    Feature.WORKFLOW_PARAMETERS: Capability(
        _N, "pipeline params with defaults (list → type array), passed by the PipelineRun"),
    Feature.ARTIFACTS: Capability(
        _R, "Tekton v1 has no artifact passing (task artifacts are provenance metadata), so "
            "artifacts go through a workspace couler-artifacts, a volumeClaimTemplate (1Gi, "
            "ReadWriteOnce; Tekton's affinity assistant keeps the run's pods on one node) "
            "bound by the PipelineRun: the producer's script copies each output artifact to "
            "STEP/ARTIFACT there after its command succeeds, the consumer's copies it to its "
            "path before its command; a mapped step's items store theirs under "
            "STEP/$(context.taskRun.name)/ARTIFACT (not read back by other steps); artifacts "
            "from or to object stores, of looped steps, and read from a mapped step are "
            "rejected"),
    Feature.EDGE_CONDITIONS: Capability(
        _R, "step-status rewrite (only finally tasks may read $(tasks.X.status)): every "
            "step runs as a /bin/sh script with onError: continue that writes results "
            "couler-status (Succeeded / Failed / Skipped / Omitted) and couler-branch, tests "
            "its edges on its upstreams' statuses (passed as params; a map's as arrays) and "
            "its when in the script, and a couler-run-status task fails the PipelineRun when "
            "a failure reaches a leaf (S7); an errored edge never holds (E5); not with inline "
            "sub-workflows or loops in the same workflow"),
    Feature.DEPENDS_EXPRESSION: Capability(
        _R, "the step-status rewrite (see edge conditions): the expression's and / or / not "
            "become an sh test over the upstreams' couler-status results"),
    Feature.WHEN: Capability(
        _N, "when expression `in` (==) / `notin` (!=); an ordering comparison (>, <, >=, <=) "
            "is tested as numbers by a guard task `STEP-when` (CEL when expressions are "
            "alpha-gated) whose `holds` result the when expression tests; in status mode the "
            "step's script tests it"),
    Feature.ELSE: Capability(_N, "when expression with the negated operator (`notin` / `in`), "
                                 "or the guard task of the negated comparison"),
    Feature.MAP_STATIC: Capability(
        _N, "matrix with one explicit `include` combination per item (zipped, not crossed); "
            "at most 256 items (default-max-matrix-combinations-count)"),
    Feature.MAP_DYNAMIC: Capability(
        _N, "matrix param fed by a whole array result $(tasks.STEP.results.OUT[*]); items "
            "must be strings, keyed items (item.KEY) are rejected"),
    Feature.MAP_PARALLELISM: Capability(
        _R, "a matrix has no concurrency bound, so a static map is split into batches of "
            "`parallelism` items (tasks STEP, STEP-batch2, ...), each running after the one "
            "before: at most that many at once, though a batch waits for the slowest item "
            "of the last; an upstream list's items cannot be split at compile time and are "
            "rejected"),
    Feature.LOOP: Capability(
        _R, "Tekton has no dynamic loops: unrolled into at most 8 iterations STEP-iterK, each "
            "guarded by the condition on the previous one's results; reading a loop's outputs "
            "downstream is rejected"),
    Feature.EXIT_HOOKS: Capability(
        _N, "finally tasks guarded by a when expression on $(tasks.status) (succeeded → "
            "Succeeded/Completed, failed and error → Failed); hook steps cannot depend on each "
            "other"),
    Feature.RETRY: Capability(
        _N, "pipeline task `retries` (a new pod per attempt); with back-off or failure "
            "classes the step's retry wrapper retries instead"),
    Feature.RETRY_BACKOFF: Capability(
        _R, "Tekton retries immediately, so the step runs through a /bin/sh retry wrapper "
            "(couler.compilers.entrypoint) that sleeps base*factor**n (capped) between "
            "attempts in the same container; the task has no `retries`, so a pod the "
            "platform loses is not retried; results couler-attempts / couler-failure"),
    Feature.RETRY_FAILURE_CLASSES: Capability(
        _R, "Tekton retries every failure, so the step's /bin/sh retry wrapper classifies "
            "each failed attempt with couler.failures' patterns (exit code, cgroup oom_kill "
            "count, the traceback's last exception, log lines, the same error twice) and "
            "retries only the policy's classes; engine-reported causes (eviction, "
            "OOMKilled of the whole pod, the task timeout) are not seen from inside"),
    Feature.MEMORY_ESCALATION: Capability(
        _R, "a Tekton retry reuses the task spec, so the step becomes attempt tasks STEP, "
            "STEP-mem2, ... (one per memory level up to the ceiling), each after the one "
            "before with memory x factor; the retry wrapper stops at an out-of-memory kill "
            "(the cgroup's oom_kill count) and the next task runs the command again, while "
            "one that finds the attempts before succeeded or failed otherwise passes their "
            "results on (a pod that exits at once); the last task's results are the step's; "
            "not for mapped or looped steps, nor with edge conditions in the workflow"),
    Feature.TIMEOUT: Capability(_N, "pipeline task `timeout` (Ns); workflow timeout → "
                                    "PipelineRun timeouts.pipeline"),
    Feature.RESOURCES: Capability(_N, "step computeResources requests / limits"),
    Feature.GPU: Capability(_N, "step computeResources limit on the GPU resource name"),
    Feature.CACHE: Capability(
        _R, "Tekton has no result cache, so the step's script memoizes its results on a "
            "PersistentVolumeClaim that must exist (named by the policy's name, default "
            "couler-cache), keyed by SHA-256 of the policy's key or of the step's definition "
            "and input values; a fresh entry (max_age) is copied to the results and the "
            "command is not run (result couler-cached); results only: output artifacts and "
            "memory escalation are rejected"),
    Feature.PRIORITY: Capability(
        _U, "an integer priority has no Tekton field; the pod template only takes a "
            "priorityClassName"),
    Feature.NODE_SELECTOR: Capability(
        _N, "PipelineRun taskRunTemplate.podTemplate (workflow) or taskRunSpecs (step)"),
    Feature.TOLERATIONS: Capability(
        _N, "PipelineRun taskRunTemplate.podTemplate (workflow) or taskRunSpecs (step)"),
    Feature.VOLUMES: Capability(
        _N, "pipeline workspaces bound by the PipelineRun (PVC, volumeClaimTemplate, emptyDir, "
            "configMap, secret); mounts are task workspaces with mountPath / subPath"),
    Feature.SECRETS: Capability(_N, "step env valueFrom.secretKeyRef"),
    Feature.DAEMON: Capability(
        _U, "Tekton sidecars live inside one task; nothing outlives a task to serve others"),
    Feature.CRON: Capability(
        _R, "Tekton Pipelines has no schedules: a Kubernetes batch/v1 CronJob WORKFLOW (schedule, "
            "timeZone, concurrencyPolicy, startingDeadlineSeconds, history limits, suspend) "
            "whose Job (backoffLimit 0, bitnami/kubectl, service account "
            "couler-tekton-launcher, which needs RBAC to get / create / patch pipelineruns) "
            "runs kubectl create -f on the PipelineRun (generateName, label "
            "couler.io/scheduled-by) mounted from the ConfigMap WORKFLOW-pipelinerun; the "
            "Job applies forbid (no run while one it started has no completionTime) and "
            "replace (cancel those runs first) to the PipelineRuns"),
    Feature.EVENT_TRIGGERS: Capability(
        _R, "Tekton Triggers (triggers.tekton.dev/v1beta1, a separate install): TriggerBinding, "
            "TriggerTemplate (the PipelineRun, string parameters bound from the event's "
            "fields, defaults otherwise; list parameters keep their defaults) and "
            "EventListener WORKFLOW (service el-WORKFLOW:8080, service account "
            "couler-tekton-launcher) with a CEL interceptor per trigger. Couler's events "
            "reach it as an HTTP POST of the event's fields (a JSON object) with headers "
            "Couler-Subject (the subject after couler.event.LAUNCHER., matched against the "
            "trigger's NATS pattern) and Couler-Launcher (checked against "
            "couler.io/launchers); nothing in Couler forwards bus events to it yet. The "
            "filter becomes CEL with the submitter's semantics (left-to-right reads, a "
            "missing field makes it false, numbers compared as numbers, string truth) using "
            "the cel-go strings extension (lowerAscii, trim); a parameter name that is not a "
            "CEL identifier is rejected. Checked structurally, not against a Triggers schema "
            "(none ships on PyPI or npm)"),
    Feature.TUNE: Capability(
        _R, "rounds of an ask task (python -m couler_runtime.tune ask --slots-out: each "
            "trial's parameters, number and the study's name as results tK-pJ, tK-trial, "
            "study), one task per trial of the round reading them (a matrix over the ask "
            "task's array result could not select a parameter of a trial's set), and a "
            "tell task reading each trial's objective result "
            "(couler.optimize.tune.expand_tune(slots=True)); a round's size is fixed when "
            "compiling (parallel, the rest of the budget last). The study is named after "
            "the run ($(context.pipelineRun.uid)), its URL is the storage secret's "
            "(COULER_TUNE_STORAGE); pruning: each trial gets its study and number from the "
            "ask task's results and reports to the study itself "
            "(couler_runtime.tune.report, couler-runtime in the trial's image)"),
}

_TEKTON_DOCS = "https://tekton.dev/docs/pipelines/"
LIMITS: tuple[Limit, ...] = (
    Limit("Kubernetes object size (etcd request, --max-request-bytes default)", 1572864,
          "bytes", "https://etcd.io/docs/v3.5/dev-guide/limit/ (Pipeline / PipelineRun are "
                   "stored in etcd like any object)"),
    Limit("Kubernetes object size (practical, leaving room for status)", 1048576, "bytes",
          "https://etcd.io/docs/v3.5/dev-guide/limit/; " + _TEKTON_DOCS + "pipelineruns/"),
    Limit("matrix combinations per pipeline task (default-max-matrix-combinations-count)",
          MAX_MATRIX_COMBINATIONS, "combinations",
          _TEKTON_DOCS + "matrix/ (Configuring a Matrix) and config/config-defaults.yaml"),
    Limit("task result size (results via termination message, max-result-size default)", 4096,
          "bytes", _TEKTON_DOCS + "tasks/#emitting-results (results-from: termination-message)"),
    Limit("all results of one task (container termination message)", 4096, "bytes",
          _TEKTON_DOCS + "tasks/#emitting-results"),
    Limit("loop iterations unrolled by Couler", MAX_UNROLL, "iterations",
          _TEKTON_DOCS + "pipelines/ (no dynamic loops; Couler unrolls, couler.compilers.tekton)"),
    Limit("pipeline task name length (DNS-1123 label)", 63, "characters",
          _TEKTON_DOCS + "pipelines/#adding-tasks-to-the-pipeline"),
)
