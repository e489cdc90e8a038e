"""Job steps on Tekton: a kubectl step that creates the resource and waits on its conditions.

The script is :mod:`couler.compilers.kube_job`'s (shared with KFP); Tekton gives it the
owner (the TaskRun, through ``$(context.taskRun.name)`` / ``uid``) and the result files
(``$(results.NAME.path)``). Pure: builds text.
"""

from __future__ import annotations

from couler import ir
from couler.compilers.kube_job import JOB_IMAGE, POLL_SECONDS, WHOLE_OBJECT, condition_test
from couler.compilers.kube_job import script as _script

__all__ = ["JOB_IMAGE", "POLL_SECONDS", "WHOLE_OBJECT", "condition_test", "script"]

_OWNER = {"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "name": "$(context.taskRun.name)",
          "uid": "$(context.taskRun.uid)", "blockOwnerDeletion": True}


def script(job: ir.JobSpec, outputs: list[tuple[str, str]]) -> str:
    """The kubectl step's script; ``outputs`` are (result name, JSONPath or
    :data:`WHOLE_OBJECT`) pairs.

    Raises:
        ValueError: a condition or JSONPath this translation does not know.
    """
    return _script(job, outputs, owner=_OWNER,
                   result_file=lambda name: f'"$(results.{name}.path)"')
