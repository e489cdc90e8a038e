"""Argo Workflows' capability matrix and limits table.

Kept apart from :mod:`couler.compilers.argo` (which this module does not
change): :data:`CAPABILITIES` says, per IR :class:`~couler.engines.base.Feature`,
how the Argo compiler expresses it, and :data:`LIMITS` lists Argo's documented
limits with their sources. Argo expresses nearly every feature; step priority
is the exception (the template-level ``priority`` field was removed from Argo,
argoproj/argo-workflows#14277). Features the compiler supports only in part
(a non-integral back-off factor, ``local`` artifact storage) are marked native
with a note: the compiler rejects those cases itself.
"""

from __future__ import annotations

from couler.engines.base import Capability, Feature, Limit, Support

__all__ = ["CAPABILITIES", "ENGINE", "LIMITS"]

ENGINE = "argo"

_N, _R, _U = Support.NATIVE, Support.REWRITTEN, Support.UNSUPPORTED
_DOCS = "https://argo-workflows.readthedocs.io/en/latest/"

CAPABILITIES: dict[Feature, Capability] = {
    Feature.CONTAINER: Capability(_N, "container template"),
    Feature.SCRIPT: Capability(_N, "script template"),
    Feature.JOB: Capability(_N, "resource template with successCondition / failureCondition"),
    Feature.SUBWORKFLOW_INLINE: Capability(_N, "a nested DAG template"),
    Feature.SUBWORKFLOW_REF: Capability(
        _N, "a resource template creating the child Workflow (pinned digest recorded in the "
            "couler.io/digest annotation)"),
    Feature.PARAMETERS: Capability(_N, "input / output parameters; stdout is outputs.result"),
    Feature.WORKFLOW_PARAMETERS: Capability(_N, "spec.arguments.parameters"),
    Feature.ARTIFACTS: Capability(
        _N, "input / output artifacts; local storage is rejected (no Argo driver) and output "
            "artifacts of a mapped step cannot be consumed"),
    Feature.EDGE_CONDITIONS: Capability(_N, "enhanced depends (.Failed, .Errored, .Skipped...)"),
    Feature.DEPENDS_EXPRESSION: Capability(_N, "enhanced depends expression (&&, ||, !)"),
    Feature.WHEN: Capability(_N, "task when expression"),
    Feature.ELSE: Capability(_N, "task when with the negated comparison"),
    Feature.MAP_STATIC: Capability(_N, "withItems"),
    Feature.MAP_DYNAMIC: Capability(_N, "withParam over an upstream output"),
    Feature.MAP_PARALLELISM: Capability(
        _R, "a <tmpl>-map wrapper DAG template with its own parallelism (Argo has no "
            "per-task parallelism)"),
    Feature.LOOP: Capability(_R, "a recursive <tmpl>-loop DAG template guarded by the condition"),
    Feature.EXIT_HOOKS: Capability(_N, "onExit handler DAG with tasks guarded by workflow.status"),
    Feature.RETRY: Capability(_N, "retryStrategy.limit"),
    Feature.RETRY_BACKOFF: Capability(
        _N, "retryStrategy.backoff; Argo's factor is an integer, so a non-integral factor is "
            "rejected"),
    Feature.RETRY_FAILURE_CLASSES: Capability(
        _N, "retryStrategy.retryPolicy / expression (OOM via exit code 137 / OOMKilled); a user "
            "error is a failed exit to Argo, which sees no log"),
    Feature.MEMORY_ESCALATION: Capability(
        _R, "podSpecPatch indexed by the retries counter: memory grows on every retry, not only "
            "after an out-of-memory kill"),
    Feature.TIMEOUT: Capability(_N, "template activeDeadlineSeconds / timeout"),
    Feature.RESOURCES: Capability(_N, "container resources"),
    Feature.GPU: Capability(_N, "container resource limit on the GPU resource name"),
    Feature.CACHE: Capability(_N, "memoize with a ConfigMap cache"),
    Feature.PRIORITY: Capability(
        _U, "Argo removed the template-level priority field (argoproj/argo-workflows#14277)"),
    Feature.NODE_SELECTOR: Capability(_N, "workflow / template nodeSelector"),
    Feature.TOLERATIONS: Capability(_N, "workflow / template tolerations"),
    Feature.VOLUMES: Capability(_N, "volumes, volumeClaimTemplates and volumeMounts"),
    Feature.SECRETS: Capability(_N, "env valueFrom.secretKeyRef"),
    Feature.DAEMON: Capability(_N, "daemon: true templates"),
    Feature.CRON: Capability(_N, "CronWorkflow"),
    Feature.EVENT_TRIGGERS: Capability(
        _R, "recorded in the couler.io/triggers annotation; Couler's submitter launches runs "
            "on events"),
    Feature.TUNE: Capability(
        _R, "rounds of an ask step (python -m couler_runtime.tune ask), a withParam map of the "
            "trial step and a tell step, then a best step producing the outputs "
            "(couler.optimize.tune.expand_tune); the study lives in the database the storage "
            "secret names; pruning: a trial reports its intermediate values to the study "
            "itself (couler_runtime.tune.report, couler-runtime in the trial's image)"),
}

LIMITS: tuple[Limit, ...] = (
    Limit("Kubernetes object size (etcd request, --max-request-bytes default)", 1572864,
          "bytes", "https://etcd.io/docs/v3.5/dev-guide/limit/"),
    Limit("Workflow object size (practical, before offloading node status)", 1048576, "bytes",
          _DOCS + "offloading-large-workflows/"),
    Limit("container args size before Argo offloads the template to a file", 131072, "bytes",
          "argoproj/argo-workflows workflow/controller (pod spec args over 128 KiB are "
          "offloaded); " + _DOCS + "environment-variables/"),
    Limit("template name length", 128, "characters",
          "argoproj/argo-workflows workflow/validate (maxCharsInObjectName); "
          "couler.compilers.argo _MAX_TEMPLATE_NAME"),
)
