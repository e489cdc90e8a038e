"""The Couler-compatible Python API: build workflows as engine-neutral IR.

Scripts normally use it as ``import couler.argo as couler``; this package
holds the implementation, split by role:

* :mod:`~couler.api.builder`: the context-managed workflow builder;
* :mod:`~couler.api.steps`: ``run_container``, ``run_script``, ``run_job``;
* :mod:`~couler.api.control`: ``when``, predicates, ``map``, ``concurrent``,
  ``dag``, ``set_dependencies``, ``exec_while``, ``set_exit_handler``;
* :mod:`~couler.api.config`: workflow settings, volumes, parameters;
* :mod:`~couler.api.artifacts`, :mod:`~couler.api.secrets`, :mod:`~couler.api.options`;
* :mod:`~couler.api.tune`: ``tune`` and its space helpers (``uniform``, ``loguniform``,
  ``int_range``, ``choice``);
* :mod:`~couler.api.capture`: record workflows a program builds (for the CLI);
* :mod:`~couler.api.submission`: ``run()``.
"""

from couler.api.artifacts import (
    create_local_artifact,
    create_oss_artifact,
    create_parameter_artifact,
    create_s3_artifact,
)
from couler.api.builder import WorkflowBuilder
from couler.api.config import (
    DnsConfig,
    ImagePullSecret,
    Toleration,
    Volume,
    VolumeClaimTemplate,
    VolumeMount,
    WFStatus,
    add_image_pull_secret,
    add_toleration,
    add_volume,
    config_defaults,
    config_workflow,
    create_workflow_volume,
    set_dns,
    set_security_context,
    workflow,
    workflow_parameter,
)
from couler.api.control import (
    Predicate,
    bigger,
    bigger_equal,
    concurrent,
    dag,
    equal,
    exec_while,
    map,
    not_equal,
    set_dependencies,
    set_exit_handler,
    smaller,
    smaller_equal,
    when,
)
from couler.api.handles import ArtifactOutput, ParameterOutput, Secret, StepOutput, WorkflowParam
from couler.api.options import Cache, ImagePullPolicy
from couler.api.secrets import create_secret, get_secret, obtain_secret
from couler.api.steps import get_step_output, run_container, run_job, run_script
from couler.api.submission import run, set_default_submitter
from couler.api.tune import TuneResult, choice, int_range, loguniform, tune, uniform

__all__ = [
    "ArtifactOutput",
    "Cache",
    "DnsConfig",
    "ImagePullPolicy",
    "ImagePullSecret",
    "ParameterOutput",
    "Predicate",
    "Secret",
    "StepOutput",
    "Toleration",
    "TuneResult",
    "Volume",
    "VolumeClaimTemplate",
    "VolumeMount",
    "WFStatus",
    "WorkflowBuilder",
    "WorkflowParam",
    "add_image_pull_secret",
    "add_toleration",
    "add_volume",
    "bigger",
    "bigger_equal",
    "choice",
    "concurrent",
    "config_defaults",
    "config_workflow",
    "create_local_artifact",
    "create_oss_artifact",
    "create_parameter_artifact",
    "create_s3_artifact",
    "create_secret",
    "create_workflow_volume",
    "dag",
    "equal",
    "exec_while",
    "get_secret",
    "get_step_output",
    "int_range",
    "loguniform",
    "map",
    "not_equal",
    "obtain_secret",
    "run",
    "run_container",
    "run_job",
    "run_script",
    "set_default_submitter",
    "set_dependencies",
    "set_dns",
    "set_exit_handler",
    "set_security_context",
    "smaller",
    "smaller_equal",
    "tune",
    "uniform",
    "when",
    "workflow",
    "workflow_parameter",
]
