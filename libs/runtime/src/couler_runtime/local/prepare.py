"""The local engine's step preparation: what a step's process is given and what it leaves.

It owns turning a script or container step into an argv, an environment (secrets
resolved, the engine's own ``COULER_*`` settings left out) and a working directory,
substituting placeholders and mapping declared paths into the execution's directory,
fetching input artifacts, and reading the step's outputs and output artifacts after it
ran. ``_StepError`` says a step cannot run (fail it, do not retry).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from couler import ir

from . import interpreters
from .artifacts import PathMap, copy_path

if TYPE_CHECKING:
    from .engine import LocalRun

__all__ = ["prepare_step", "read_outputs"]

_PLACEHOLDER = re.compile(r"\{\{\s*(inputs\.[^}\s]+|item(?:\.[^}\s]+)?|workflow\.name)\s*\}\}")


class _StepError(Exception):
    """A step cannot run (bad input, missing secret...): fail it, do not retry."""


def prepare_step(run: LocalRun, step: ir.Step, exec_dir: Path, item: object
                 ) -> tuple[list[str], dict[str, str], Path, PathMap]:
    wf = run.workflow
    where = f"workflow {wf.name!r}, step {step.name!r}"
    inputs = {i.name: run._value(i.value, step, item, {}, f"inputs.{i.name}")
              for i in step.inputs}
    volumes = {v.name for v in wf.volumes}
    mounts: dict[str, Path] = {}
    for m in step.volume_mounts:
        if m.name not in volumes and wf.volumes:
            raise _StepError(f"{where}, field 'volume_mounts': unknown volume {m.name!r}")
        host = run.run_dir / "volumes" / m.name
        mounts[m.mount_path] = host / m.sub_path if m.sub_path else host
    declared = [o.selector for o in step.outputs if o.source is ir.OutputSource.PATH]
    declared += [a.path for a in step.output_artifacts]
    declared += [a.path for a in step.input_artifacts]
    paths = PathMap(exec_dir / "root", declared, mounts)
    for host in mounts.values():
        host.mkdir(parents=True, exist_ok=True)
    for path in declared:
        paths.host(path).parent.mkdir(parents=True, exist_ok=True)

    def sub(text: str, field: str) -> str:
        def repl(match: re.Match[str]) -> str:
            name = match.group(1)
            if name == "workflow.name":
                return wf.name
            if name.startswith("inputs."):
                key = name[len("inputs."):]
                if key not in inputs:
                    raise _StepError(f"{where}, field {field!r}: no input named {key!r}")
                return inputs[key]
            key = name[len("item."):] if name.startswith("item.") else ""
            return run._value(ir.ItemRef(key), step, item, {}, field)

        return paths.rewrite(_PLACEHOLDER.sub(repl, text))

    body = step.body
    if isinstance(body, ir.ScriptSpec):
        ext = {"python": ".py", "bash": ".sh", "sh": ".sh"}[body.language.value]
        script = exec_dir / f"script{ext}"
        script.write_text(paths.rewrite(body.source))
        default = {"python": [sys.executable], "bash": ["bash"], "sh": ["sh"]}
        interpreter = list(body.command) or default[body.language.value]
        if interpreter[0] in ("python", "python3"):
            interpreter[0] = sys.executable
        if interpreter[0] == sys.executable:  # the image's Python, when it is mapped
            interpreter[0] = (interpreters.interpreter_for(body.image, run.engine.image_python)
                              or sys.executable)
        argv = [*interpreter, str(script), *(sub(a, "args") for a in body.args)]
        working_dir = body.working_dir
    elif isinstance(body, ir.ContainerSpec):
        argv = [*(sub(c, "command") for c in body.command),
                *(sub(a, "args") for a in body.args)]
        mapped = run.engine.image_commands.get(body.image, ())
        if not body.command and not mapped:
            # args alone would run the first argument as the program
            raise _StepError(f"{where}, field 'command': a container step needs a command "
                             f"on the local engine (the entrypoint of image {body.image!r} "
                             "is unknown); give command=[...] or map the image to a "
                             "command (LocalEngine(image_commands=...))")
        argv = [*mapped, *argv]
        working_dir = body.working_dir
    else:
        raise _StepError(f"{where}: the local engine cannot run a {body.KIND} step")
    cwd = Path(sub(working_dir, "working_dir")) if working_dir else exec_dir
    if working_dir and not working_dir.startswith("/"):
        cwd = exec_dir / working_dir
    cwd.mkdir(parents=True, exist_ok=True)
    # The engine's own settings (a service's token, bus seed, S3 keys) are not the
    # step's: a step gets this process's environment without COULER_* variables.
    env = {k: v for k, v in os.environ.items() if not k.startswith("COULER_")}
    for var in step.env:
        if var.secret is None:
            env[var.name] = sub(var.value, f"env.{var.name}")
            continue
        value = run.engine.secrets.get((var.secret.name, var.secret.key))
        if value is None:
            name, key = var.secret.name, var.secret.key
            raise _StepError(
                f"{where}, field 'env.{var.name}': secret {name!r} key {key!r} is not in "
                "the local engine's secrets; give it with `couler run --secrets-file FILE` "
                f"(or $COULER_SECRETS_FILE), FILE being JSON {{{json.dumps(name)}: "
                f"{{{json.dumps(key)}: \"value\"}}}}, or LocalEngine(secrets="
                f"{{({name!r}, {key!r}): \"value\"}})")
        env[var.name] = value
    for art in step.input_artifacts:
        _fetch(run, step, art, paths.host(art.path), where)
    return argv, env, cwd, paths


def _fetch(run: LocalRun, step: ir.Step, art: ir.InputArtifact, dst: Path, where: str) -> None:
    src = art.source
    field_ = f"input_artifacts.{art.name}"
    try:
        if isinstance(src, ir.StepArtifactRef):
            run._store.get(run._name(src.step), src.artifact, dst)
            return
        if src.storage is ir.StorageKind.LOCAL:
            path = Path(src.key or src.url)
            if not path.exists():
                raise _StepError(f"{where}, field {field_!r}: local path {path} not found")
            copy_path(path, dst)
            return
    except FileNotFoundError as exc:
        raise _StepError(f"{where}, field {field_!r}: {exc}") from exc
    raise _StepError(f"{where}, field {field_!r}: the local engine cannot read "
                     f"{src.storage.value} storage")


def read_outputs(run: LocalRun, step: ir.Step, exec_dir: Path, paths: PathMap) -> dict[str, str]:
    where = f"workflow {run.workflow.name!r}, step {step.name!r}"
    outputs: dict[str, str] = {}
    for out in step.outputs:
        if out.source is ir.OutputSource.STDOUT:
            outputs[out.name] = (exec_dir / "stdout").read_text(errors="replace").strip()
        elif out.source is ir.OutputSource.PATH:
            host = paths.host(out.selector)
            if not host.is_file():
                raise _StepError(f"{where}, field 'outputs.{out.name}': the step did not "
                                 f"write {out.selector} (host path {host})")
            outputs[out.name] = host.read_text(errors="replace").strip()
        else:
            raise _StepError(f"{where}, field 'outputs.{out.name}': {out.source.value} "
                             "outputs need a job step")
    for art in step.output_artifacts:
        host = paths.host(art.path)
        if not host.exists():
            raise _StepError(f"{where}, field 'output_artifacts.{art.name}': the step did "
                             f"not write {art.path} (host path {host})")
        run._store.put(run._name(step.name), art.name, host)
    return outputs
