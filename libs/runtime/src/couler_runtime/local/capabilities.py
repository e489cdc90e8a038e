"""What the local engine supports, feature by feature, and the check of a workflow against it."""

from __future__ import annotations

from couler import ir
from couler.engines.base import Capability, Feature, Limit, Support, check_capabilities
from couler.errors import UnsupportedFeatureError

__all__ = ["CAPABILITIES", "ENGINE", "LIMITS", "check_workflow"]

ENGINE = "local"

_N, _R, _U = Support.NATIVE, Support.REWRITTEN, Support.UNSUPPORTED
_IGNORED = "ignored on one machine"

CAPABILITIES: dict[Feature, Capability] = {
    Feature.CONTAINER: Capability(_R, "command + args run on the host as a subprocess; the image "
                                      "is ignored unless mapped to a local command prefix"),
    Feature.SCRIPT: Capability(_R, "source run with the local interpreter (python = the current "
                                   "interpreter, bash, sh); the image is ignored, except that "
                                   "LocalEngine(image_python=...) or the COULER_LOCAL_PYTHON "
                                   "setting ('IMAGE=PATH,...', wildcards allowed) maps an image "
                                   "to the Python that runs its scripts, e.g. the catalog's "
                                   "ghcr.io/couler-io/ml-tabular:* to .venv-ml/bin/python "
                                   "(scripts/setup-ml-venv.sh)"),
    Feature.JOB: Capability(_U, "Kubernetes resources cannot run on one machine"),
    Feature.SUBWORKFLOW_INLINE: Capability(_N, "inner steps run as a nested graph in the same "
                                               "run (records named outer/inner), under the "
                                               "same worker bound"),
    Feature.SUBWORKFLOW_REF: Capability(_R, "the referenced workflow must be given to "
                                            "LocalEngine(workflows=...); it runs nested, the "
                                            "step's inputs as its parameters"),
    Feature.PARAMETERS: Capability(_N, "output files are read from the step's mapped path"),
    Feature.WORKFLOW_PARAMETERS: Capability(_N, "values given to run() or the defaults"),
    Feature.ARTIFACTS: Capability(_R, "a local artifact store directory under the run; input "
                                      "sources: step artifacts and local paths only"),
    Feature.EDGE_CONDITIONS: Capability(_N),
    Feature.DEPENDS_EXPRESSION: Capability(_N),
    Feature.WHEN: Capability(_N, "numbers compared numerically, otherwise as strings"),
    Feature.ELSE: Capability(_N),
    Feature.MAP_STATIC: Capability(_N, "one execution per item; outputs aggregated as JSON lists"),
    Feature.MAP_DYNAMIC: Capability(_N, "the upstream output must be a JSON list"),
    Feature.MAP_PARALLELISM: Capability(_N, "also bounded by max_workers"),
    Feature.LOOP: Capability(_N),
    Feature.EXIT_HOOKS: Capability(_N, "run after the main graph with its final status"),
    Feature.RETRY: Capability(_N),
    Feature.RETRY_BACKOFF: Capability(_N),
    Feature.RETRY_FAILURE_CLASSES: Capability(_R, "couler.failures classifies exit code and "
                                                  "stderr: the sampled memory limit = oom; "
                                                  "failure to start, network errors = infra; a "
                                                  "Python exception or the same error twice = "
                                                  "user; a timeout or an exit seen once = "
                                                  "transient"),
    Feature.MEMORY_ESCALATION: Capability(_R, "the sampled RSS limit is multiplied on OOM"),
    Feature.TIMEOUT: Capability(_N, "the process tree is killed; a sub-workflow step's nested "
                                    "run is stopped"),
    Feature.RESOURCES: Capability(_R, "memory_limit enforced by sampling the tree's RSS; CPU "
                                      "and requests ignored"),
    Feature.GPU: Capability(_R, "the machine's GPUs (LocalEngine(gpus=...), COULER_LOCAL_GPUS, "
                                "CUDA_VISIBLE_DEVICES or nvidia-smi) are handed out whole: a "
                                "step waits for the devices it requests and sees only them "
                                "(CUDA_VISIBLE_DEVICES); a step requesting none sees none; a "
                                "request above the machine's count is refused before the run "
                                "starts (InsufficientResourcesError); the GPU type is not "
                                "checked"),
    Feature.CACHE: Capability(_R, "no result cache: every step runs (retry() reuses steps that "
                                  "succeeded)"),
    Feature.PRIORITY: Capability(_R, _IGNORED),
    Feature.NODE_SELECTOR: Capability(_R, _IGNORED),
    Feature.TOLERATIONS: Capability(_R, _IGNORED),
    Feature.VOLUMES: Capability(_R, "each volume is a directory under the run dir; mount paths "
                                    "are rewritten"),
    Feature.SECRETS: Capability(_N, "resolved from the secrets mapping given to the engine"),
    Feature.DAEMON: Capability(_R, "the step's process is started on this machine, outside "
                                   "the max_workers bound, and counts as succeeded for its "
                                   "dependents once started (they reach it on 127.0.0.1); it "
                                   "is stopped (SIGTERM to its process group, SIGKILL after "
                                   "5 s) when the other steps of its graph have finished; a "
                                   "failure after it started fails the run (rule S7); a daemon "
                                   "map, loop or sub-workflow is refused"),
    Feature.CRON: Capability(_R, "the embedded stack's submitter keeps the schedule and "
                                 "launches each run on time (`couler submit` registers it; "
                                 "`couler schedule ls|pause|resume`; timezone, concurrency "
                                 "policy, suspend, starting deadline, history limits; after "
                                 "downtime only the latest missed tick runs); a run of it "
                                 "here (`couler run`) is one run, now"),
    Feature.EVENT_TRIGGERS: Capability(_R, "the embedded stack's submitter subscribes the "
                                           "workflow to couler.event.<launcher>.<subject> and "
                                           "launches a run per event its filter takes, from "
                                           "the launchers its couler.io/launchers annotation "
                                           "allows; a run of it here is one run, now"),
    Feature.TUNE: Capability(_N, "the engine drives an optuna study (ask/tell) in RDB storage, "
                                 "trials as executions of the step, pruning from the values "
                                 "a trial reports"),
}

LIMITS: tuple[Limit, ...] = (
    Limit(
        "concurrent step processes",
        4,
        "processes",
        "LocalEngine(max_workers=4) default; raise it per engine (a map's own parallelism "
        "bound applies within it)",
    ),
)


def check_workflow(wf: ir.Workflow) -> None:
    """Refuse, before anything runs, a workflow that is invalid or needs what this engine lacks."""
    ir.validate(wf)
    check_capabilities(ENGINE, CAPABILITIES, wf)
    hooks = [s for hook in wf.exit_hooks for s in hook.steps]
    for step in ir.all_steps([*wf.steps, *hooks]):
        if not step.daemon:
            continue
        what = ("a map" if step.foreach is not None else "a loop" if step.loop is not None
                else "a sub-workflow" if isinstance(step.body, ir.SubWorkflowSpec) else "")
        if what:
            raise UnsupportedFeatureError(
                ENGINE, wf.name, step.name, Feature.DAEMON.value,
                f"a daemon step runs one process; {what} is refused")
