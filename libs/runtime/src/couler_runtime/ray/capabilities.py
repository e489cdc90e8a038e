"""What the Ray executor supports, feature by feature.

Every step execution is one Ray task that runs the step exactly as the local engine
does (a host process, see :mod:`couler_runtime.local`), so the process-level
features (parameters, artifacts, volumes, timeouts, secrets) carry the local
engine's semantics; scheduling, resources and retries are Ray's.
"""

from __future__ import annotations

from couler.engines.base import Capability, Feature, Limit, Support

__all__ = ["CAPABILITIES", "ENGINE", "LIMITS"]

ENGINE = "ray"

_N, _R, _U = Support.NATIVE, Support.REWRITTEN, Support.UNSUPPORTED
_IGNORED = "ignored: Ray tasks are placed by resources only"
_SHARED = "needs a file system shared by every Ray node (the run dir)"

CAPABILITIES: dict[Feature, Capability] = {
    Feature.CONTAINER: Capability(_R, "command + args run as a host process inside the Ray "
                                      "task (as on the local engine); the image is ignored "
                                      "unless mapped to a command prefix"),
    Feature.SCRIPT: Capability(_R, "source run with the worker's interpreter inside the Ray "
                                   "task (as on the local engine); the image is ignored"),
    Feature.JOB: Capability(_U, "Kubernetes resources cannot run as Ray tasks"),
    Feature.SUBWORKFLOW_INLINE: Capability(_U, "not implemented by the Ray executor yet"),
    Feature.SUBWORKFLOW_REF: Capability(_U, "not implemented by the Ray executor yet"),
    Feature.PARAMETERS: Capability(_N, "outputs are returned from the task as a dict and "
                                       "passed downstream as object refs"),
    Feature.WORKFLOW_PARAMETERS: Capability(_N, "values given to run() or the defaults"),
    Feature.ARTIFACTS: Capability(_R, "the local engine's artifact store under the run dir; "
                                      + _SHARED),
    Feature.EDGE_CONDITIONS: Capability(_N, "evaluated inside the task on the upstream "
                                            "results"),
    Feature.DEPENDS_EXPRESSION: Capability(_N, "evaluated inside the task on the upstream "
                                               "results"),
    Feature.WHEN: Capability(_N, "evaluated inside the task on upstream outputs; numbers "
                                 "compared numerically, otherwise as strings"),
    Feature.ELSE: Capability(_N, "evaluated inside the task"),
    Feature.MAP_STATIC: Capability(_N, "one Ray task per item, aggregated by a zero-CPU task "
                                       "into JSON lists"),
    Feature.MAP_DYNAMIC: Capability(_R, "the driver resolves the upstream JSON list once the "
                                        "upstream task finishes, then submits one task per "
                                        "item"),
    Feature.MAP_PARALLELISM: Capability(_R, "N lanes: item i also waits for item i-N"),
    Feature.LOOP: Capability(_R, "all iterations run inside one Ray task (max_retries=0; the "
                                 "local engine's per-iteration retry applies)"),
    Feature.EXIT_HOOKS: Capability(_R, "run by the driver after the main graph, with its "
                                       "final status"),
    Feature.RETRY: Capability(_N, "max_retries=limit, retry_exceptions=[the executor's retry "
                                  "signal]; attempts counted in the execution directory"),
    Feature.RETRY_BACKOFF: Capability(_R, "the failed attempt sleeps base*factor**n (capped) "
                                          "before Ray re-executes the task"),
    Feature.RETRY_FAILURE_CLASSES: Capability(_R, "classified inside the task as on the local "
                                                  "engine (couler.failures: exit code and "
                                                  "stderr; the attempts before it are kept in "
                                                  "the attempt file); a class the "
                                                  "policy does not name fails the step "
                                                  "without a Ray retry"),
    Feature.MEMORY_ESCALATION: Capability(_R, "the sampled RSS limit is multiplied on OOM; "
                                              "the Ray memory reservation stays as requested"),
    Feature.TIMEOUT: Capability(_R, "the task kills the step's process tree (a transient "
                                    "failure)"),
    Feature.RESOURCES: Capability(_N, "cpu_request -> num_cpus (fractions allowed, default "
                                      "1), memory_request -> memory (bytes); memory_limit is "
                                      "enforced by sampling RSS; a request larger than the "
                                      "cluster fails the step instead of hanging"),
    Feature.GPU: Capability(_N, "gpu -> num_gpus"),
    Feature.CACHE: Capability(_R, "no result cache: every step runs"),
    Feature.PRIORITY: Capability(_R, _IGNORED),
    Feature.NODE_SELECTOR: Capability(_R, _IGNORED),
    Feature.TOLERATIONS: Capability(_R, _IGNORED),
    Feature.VOLUMES: Capability(_R, "each volume is a directory under the run dir; " + _SHARED),
    Feature.SECRETS: Capability(_N, "resolved from the secrets mapping given to the executor "
                                    "(shipped to the tasks in their arguments)"),
    Feature.DAEMON: Capability(_U, "daemon steps are not implemented by the Ray executor"),
    Feature.CRON: Capability(_U, "a single run cannot be scheduled; the submitter schedules it"),
    Feature.EVENT_TRIGGERS: Capability(_U, "a single run cannot wait for events; the submitter "
                                           "triggers it"),
    Feature.TUNE: Capability(_R, "one Ray task drives the optuna study (ask/tell, pruning) "
                                 "and runs up to `parallel` trial processes on its node"),
}

LIMITS: tuple[Limit, ...] = (
    Limit(
        "CPUs per step",
        0,
        "cores",
        "the Ray cluster's total (ray.cluster_resources()); a step asking for more is "
        "failed before submission; 0 = cluster dependent",
    ),
    Limit(
        "task argument / return size kept inline",
        100 * 1024,
        "bytes",
        "Ray docs, 'Objects': values under 100 KiB are inlined, larger ones go through the "
        "object store (step outputs are small text values)",
    ),
)
