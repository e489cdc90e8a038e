"""Step constructors: ``run_container``, ``run_script``, ``run_job``.

Each call adds one step to the current workflow and returns the SDK-compatible
list of output handles (first: the primary output, e.g. a script's stdout
``result``). Every step carries its own body; compilers de-duplicate identical
bodies, so two calls of one function with different images never share a
template by accident.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
import itertools
import json
import textwrap
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import PurePosixPath
from types import FrameType

import yaml

from couler import ir
from couler.api import naming
from couler.api.artifacts import FileArtifact, ParameterArtifact
from couler.api.builder import (
    EnvDraft,
    InputArtifactDraft,
    OutputArtifactDraft,
    StepDraft,
    WorkflowBuilder,
    current_builder,
)
from couler.api.config import Toleration
from couler.api.handles import (
    ArtifactOutput,
    ItemHandle,
    Outputs,
    ParameterOutput,
    Secret,
    StepOutput,
    WorkflowParam,
)
from couler.api.interpolate import has_mark, refuse_in_name, split_marks
from couler.api.options import (
    Cache,
    ImagePullPolicy,
    to_cache,
    to_image_pull_policy,
    to_resources,
    to_retry,
    to_seconds,
)
from couler.errors import UserError

__all__ = ["get_step_output", "run_container", "run_job", "run_script", "script_source"]

_JOB_OUTPUTS = (
    ir.OutputParameter("job-name", ir.OutputSource.JSON_PATH, "{.metadata.name}"),
    ir.OutputParameter("job-id", ir.OutputSource.JSON_PATH, "{.metadata.uid}"),
    ir.OutputParameter("job-obj", ir.OutputSource.JQ, "."),
)


def run_container(  # noqa: PLR0917 - the SDK's positional signature
    image: str,
    command: str | Sequence[str] | None = None,
    args: object = None,
    output: object = None,
    input: object = None,
    env: Mapping[str, object] | Sequence[Mapping[str, object]] | None = None,
    env_from: object = None,
    secret: Secret | str | None = None,
    resources: Mapping[str, object] | ir.Resources | None = None,
    timeout: int | str | None = None,
    retry: int | ir.RetryPolicy | None = None,
    step_name: str | None = None,
    image_pull_policy: ImagePullPolicy | str | None = None,
    pool: str | None = None,
    enable_ulogfs: bool = True,
    daemon: bool = False,
    volume_mounts: Sequence[ir.VolumeMount | Mapping[str, object]] | None = None,
    working_dir: str | None = None,
    node_selector: Mapping[str, object] | None = None,
    cache: Cache | ir.CachePolicy | None = None,
    parallelism: int | None = None,
    *,
    tolerations: Sequence[Toleration | ir.Toleration] | None = None,
    priority: int | None = None,
    labels: Mapping[str, object] | None = None,
) -> list[StepOutput]:
    """Run a command in a container image as one step.

    Args:
        image: The container image.
        command: The entrypoint (a list, or one string).
        args: Arguments: literals (str/int/float/bool, passed as typed inputs
            ``para-<template>-<i>``), outputs of earlier steps (which also
            add a dependency), workflow parameters or map items. One string
            or one output may be given without a list. Output artifacts of
            earlier steps become input artifacts at their path, not arguments.
        output: What the step produces: artifacts from
            ``create_parameter_artifact`` / ``create_*_artifact`` (a list or one).
        input: Artifacts the step reads: outputs of earlier steps (a list a
            ``run_*`` call returned gives its artifacts; its parameters are
            skipped), or S3/OSS artifacts.
        env: Environment variables (values converted with ``str``).
        env_from: Not supported yet; a non-empty value raises UserError.
        secret: A secret from ``create_secret``/``obtain_secret`` (or its name):
            each key becomes an environment variable read from the secret.
        resources: ``{"cpu": "1", "memory": "1Gi", "gpu": 1}`` (requests =
            limits) or ``{"requests": {...}, "limits": {...}}``.
        timeout: Deadline of the step, in seconds or as ``"30m"``.
        retry: Number of retries, or an ``ir.RetryPolicy``.
        step_name: Names the step and its template; default: the calling
            function's name.
        image_pull_policy: ``ImagePullPolicy`` or its name.
        pool: Accepted for compatibility; has no effect.
        enable_ulogfs: Accepted for compatibility; has no effect.
        daemon: Run as a daemon the following steps can talk to.
        volume_mounts: ``VolumeMount(name, mount_path)`` list.
        working_dir: The working directory.
        node_selector: Node labels the step's pod must match.
        cache: ``Cache(name, key, max_age)``.
        parallelism: At most this many pods of the step at once.
        tolerations: Step-level tolerations.
        priority: Scheduling priority of the step.
        labels: Labels of the step's pod.

    Returns:
        The step's outputs: the declared ones, or ``[result]`` (its stdout)
        when it declares none.

    Raises:
        UserError: for invalid options.
    """
    b = current_builder()
    _check_env_from(b, env_from)
    template, explicit = _template(step_name, naming.caller_frame(1), naming.image_base_name(image))
    spec = ir.ContainerSpec(image=_image(image), command=_command(command),
                            working_dir=working_dir or "",
                            image_pull_policy=to_image_pull_policy(image_pull_policy))
    draft = StepDraft(builder=b, base_name=template, template=template, body=spec,
                      explicit_name=explicit)
    _add_args(b, draft, args)
    _add_command(b, draft)
    _add_outputs(draft, output)
    _add_inputs(b, draft, input)
    _add_env(b, draft, env)
    _add_secret(b, draft, secret)
    _add_options(draft, resources=resources, timeout=timeout, retry=retry, cache=cache,
                 daemon=daemon, volume_mounts=volume_mounts, node_selector=node_selector,
                 parallelism=parallelism, tolerations=tolerations, priority=priority,
                 labels=labels)
    return _finish(b, draft)


def run_script(  # noqa: PLR0917 - the SDK's positional signature
    image: str,
    command: str | Sequence[str] | None = None,
    source: Callable[..., object] | str | None = None,
    args: object = None,
    output: object = None,
    input: object = None,
    env: Mapping[str, object] | Sequence[Mapping[str, object]] | None = None,
    secret: Secret | str | None = None,
    resources: Mapping[str, object] | ir.Resources | None = None,
    timeout: int | str | None = None,
    retry: int | ir.RetryPolicy | None = None,
    step_name: str | None = None,
    image_pull_policy: ImagePullPolicy | str | None = None,
    pool: str | None = None,
    enable_ulogfs: bool = True,
    daemon: bool = False,
    volume_mounts: Sequence[ir.VolumeMount | Mapping[str, object]] | None = None,
    working_dir: str | None = None,
    node_selector: Mapping[str, object] | None = None,
    cache: Cache | ir.CachePolicy | None = None,
    *,
    tolerations: Sequence[Toleration | ir.Toleration] | None = None,
    priority: int | None = None,
    labels: Mapping[str, object] | None = None,
    parallelism: int | None = None,
) -> list[StepOutput]:
    """Run source code with an interpreter in a container image as one step.

    Args:
        image: The container image.
        command: The interpreter: default Python; ``["bash"]`` or ``["sh"]``
            select a shell script.
        source: A Python function, whose *body* becomes the script (taken with
            ``inspect`` and ``ast``, so annotated signatures and decorators
            are fine), or the script text as a string.
        args: Arguments, as for :func:`run_container`.
        output: Declared outputs, as for :func:`run_container`.
        input: Input artifacts, as for :func:`run_container`.
        env: Environment variables.
        secret: A secret whose keys become environment variables.
        resources: Resources, as for :func:`run_container`.
        timeout: Deadline of the step.
        retry: Number of retries, or an ``ir.RetryPolicy``.
        step_name: Names the step and its template; default: the calling
            function's name, else the source function's name.
        image_pull_policy: ``ImagePullPolicy`` or its name.
        pool: Accepted for compatibility; has no effect.
        enable_ulogfs: Accepted for compatibility; has no effect.
        daemon: Run as a daemon.
        volume_mounts: ``VolumeMount(name, mount_path)`` list.
        working_dir: The working directory.
        node_selector: Node labels the step's pod must match.
        cache: ``Cache(name, key, max_age)``.
        tolerations: Step-level tolerations.
        priority: Scheduling priority of the step.
        labels: Labels of the step's pod.
        parallelism: At most this many pods of the step at once.

    Returns:
        ``[result]`` (the script's stdout) followed by the declared outputs.

    Raises:
        UserError: without a source, or for a source that cannot be extracted.
    """
    b = current_builder()
    if source is None:
        raise UserError("run_script needs source= (a function or the script text)")
    text = source if isinstance(source, str) else script_source(source)
    language, interpreter = _language(command)
    fallback = naming.image_base_name(image)
    if not isinstance(source, str):
        source_name = getattr(source, "__name__", "")
        if source_name and not source_name.startswith("<"):
            fallback = naming.sanitize(source_name)
    template, explicit = _template(step_name, naming.caller_frame(1), fallback)
    spec = ir.ScriptSpec(image=_image(image), source=text, language=language, command=interpreter,
                         working_dir=working_dir or "",
                         image_pull_policy=to_image_pull_policy(image_pull_policy))
    draft = StepDraft(builder=b, base_name=template, template=template, body=spec,
                      explicit_name=explicit, has_stdout=True)
    _add_args(b, draft, args)
    _add_command(b, draft)
    _add_outputs(draft, output)
    _add_inputs(b, draft, input)
    _add_env(b, draft, env)
    _add_secret(b, draft, secret)
    _add_options(draft, resources=resources, timeout=timeout, retry=retry, cache=cache,
                 daemon=daemon, volume_mounts=volume_mounts, node_selector=node_selector,
                 parallelism=parallelism, tolerations=tolerations, priority=priority,
                 labels=labels)
    return _finish(b, draft)


def run_job(  # noqa: PLR0917 - the SDK's positional signature
    manifest: str | Mapping[str, object],
    success_condition: str,
    failure_condition: str,
    timeout: int | str | None = None,
    retry: int | ir.RetryPolicy | None = None,
    step_name: str | None = None,
    pool: str | None = None,
    env: Mapping[str, object] | None = None,
    action: str | ir.JobAction = "create",
    set_owner_reference: bool = True,
    cache: Cache | ir.CachePolicy | None = None,
    *,
    priority: int | None = None,
    labels: Mapping[str, object] | None = None,
    caller_depth: int = 0,
) -> list[StepOutput]:
    """Create a Kubernetes resource (a Job, PyTorchJob, TFJob, ...) and wait for it.

    Args:
        manifest: The resource, as YAML/JSON text or a dict.
        success_condition: When the step succeeds, e.g. ``"status.succeeded > 0"``.
        failure_condition: When it fails, e.g. ``"status.failed > 3"``.
        timeout: Deadline of the step.
        retry: Number of retries, or an ``ir.RetryPolicy``.
        step_name: Names the step; default: the calling function's name, else
            the manifest's name or kind.
        pool: Accepted for compatibility; has no effect.
        env: Written into the manifest's ``spec.env`` as name/value pairs.
        action: ``create`` (default), ``apply``, ``replace``, ``patch`` or ``delete``.
        set_owner_reference: Make the workflow own the resource.
        cache: ``Cache(name, key, max_age)``.
        priority: Scheduling priority of the step.
        labels: Step labels.
        caller_depth: For wrappers (``couler.steps.tensorflow.train``, ...): how many
            frames above ``run_job``'s caller the function naming the step is.

    Returns:
        ``[job-name, job-id, job-obj]`` output handles.

    Raises:
        UserError: for a manifest that is not an object, or an unknown action.
    """
    b = current_builder()
    body = _manifest(manifest)
    if env:
        spec = body.setdefault("spec", {})
        if not isinstance(spec, dict):
            raise UserError("run_job: the manifest's spec is not a mapping, cannot add env")
        spec["env"] = [{"name": str(k), "value": str(v)} for k, v in env.items()]
    try:
        job_action = ir.JobAction(action.value if isinstance(action, ir.JobAction)
                                  else str(action).lower())
    except ValueError as e:
        raise UserError(f"run_job: action {action!r} is not one of "
                        f"{[a.value for a in ir.JobAction]}") from e
    template, explicit = _template(step_name, naming.caller_frame(1 + caller_depth),
                                   _manifest_name(body))
    try:
        spec_ir = ir.JobSpec.of(body, action=job_action, success_condition=success_condition or "",
                                failure_condition=failure_condition or "",
                                set_owner_reference=set_owner_reference)
    except (TypeError, ValueError) as e:
        raise UserError(f"run_job: the manifest is not JSON-compatible ({e})") from e
    draft = StepDraft(builder=b, base_name=template, template=template, body=spec_ir,
                      explicit_name=explicit)
    draft.outputs.extend(_JOB_OUTPUTS)
    _add_options(draft, resources=None, timeout=timeout, retry=retry, cache=cache, daemon=False,
                 volume_mounts=None, node_selector=None, parallelism=None, tolerations=None,
                 priority=priority, labels=labels)
    return _finish(b, draft)


def get_step_output(step_name: str) -> list[StepOutput]:
    """The outputs of a step defined earlier in the current workflow, looked up by name.

    Args:
        step_name: The step's name (its ``step_name``, or the name Couler gave it).

    Returns:
        The list its ``run_container``/``run_script``/``run_job`` call returned.

    Raises:
        UserError: if no step of the current workflow has that name.
    """
    return current_builder().step_outputs(str(step_name))


# --------------------------------------------------------------------------- script source


def script_source(fn: Callable[..., object]) -> str:
    """The body of a Python function as script text (dedented).

    Uses :func:`inspect.getsource` and :mod:`ast`, so annotated signatures,
    default values with colons and decorators are handled.

    Raises:
        UserError: if the source is unavailable or ``fn`` is not a ``def`` function.
    """
    name = getattr(fn, "__qualname__", repr(fn))
    try:
        text = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        raise UserError(f"run_script: cannot read the source of {name}: {e}; pass the script "
                        "text as a string instead") from e
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        raise UserError(f"run_script: the source of {name} is not a plain function "
                        "definition (a lambda?); use a def function or a string") from e
    func = tree.body[0] if tree.body else None
    if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise UserError(f"run_script: the source of {name} is not a function definition; use a "
                        "def function or a string")
    lines = text.splitlines()
    first, last = func.body[0], func.body[-1]
    end = last.end_lineno or last.lineno
    segment = lines[first.lineno - 1:end]
    segment[0] = " " * first.col_offset + segment[0][first.col_offset:]
    return textwrap.dedent("\n".join(segment)) + "\n"


def _language(command: str | Sequence[str] | None) -> tuple[ir.ScriptLanguage, tuple[str, ...]]:
    if command is None:
        return ir.ScriptLanguage.PYTHON, ()
    cmd = _command(command)
    if not cmd:
        return ir.ScriptLanguage.PYTHON, ()
    exe = PurePosixPath(cmd[0]).name
    if exe.startswith("python"):
        return ir.ScriptLanguage.PYTHON, cmd
    if exe == "bash":
        return ir.ScriptLanguage.BASH, cmd
    if exe in ("sh", "ash", "dash"):
        return ir.ScriptLanguage.SH, cmd
    raise UserError(f"run_script: interpreter {cmd[0]!r} is not supported; use python, bash or "
                    "sh (or run_container)")


# --------------------------------------------------------------------------- helpers


def _template(step_name: str | None, frame: FrameType | None, fallback: str) -> tuple[str, bool]:
    """The template name and whether the user chose it."""
    if step_name:
        refuse_in_name(str(step_name), f"workflow {current_builder().workflow_name()!r}: step_name")
        name = naming.user_name(str(step_name))
        if name is None:
            b = current_builder()
            raise UserError(
                f"workflow {b.workflow_name()!r}: step_name {step_name!r} is not a valid name: "
                "use at most 63 lowercase letters, digits and '-', starting and ending with a "
                "letter or digit (DNS-1123); upper case and '_'/'.' are mapped for you")
        return name, True
    caller = naming.caller_function_name(frame)
    return naming.sanitize(caller or fallback), False


def _image(image: str) -> str:
    if not isinstance(image, str) or not image.strip():
        raise UserError(f"a step needs an image, got {image!r}")
    return image


def _command(command: str | Sequence[str] | None) -> tuple[str, ...]:
    if command is None:
        return ()
    if isinstance(command, str):
        return (command,)
    return tuple(str(c) for c in command)


def _check_env_from(b: WorkflowBuilder, env_from: object) -> None:
    if env_from:
        raise UserError(f"workflow {b.workflow_name()!r}: env_from is not supported yet; set the "
                        "variables with env= or read a secret with secret=")


def _as_list(value: object) -> list[object]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _add_args(b: WorkflowBuilder, draft: StepDraft, args: object) -> None:
    items = _as_list(args)
    for i, raw in enumerate(items):
        value = b.unwrap(raw)
        if isinstance(value, ArtifactOutput):
            _consume_artifact(b, draft, value)
            continue
        name = f"para-{draft.template}-{i}"
        if isinstance(value, str) and has_mark(value):
            extra = itertools.count(1)
            draft.args.append(_fill_marks(
                b, draft, value, what=f"argument {i}",
                names=itertools.chain([name], (f"{name}-{k}" for k in extra))))
            continue
        _add_input(b, draft, name, value, what=f"argument {i}")
        draft.args.append(f"{{{{inputs.{name}}}}}")
    draft.next_index = len(items)


def _add_command(b: WorkflowBuilder, draft: StepDraft) -> None:
    """Fill formatted handles in the command (``command=["python", f"{script}"]``)."""
    body = draft.body
    if not isinstance(body, (ir.ContainerSpec, ir.ScriptSpec)):
        return
    if not any(has_mark(c) for c in body.command):
        return
    names = iter(draft.new_input_name, None)
    command = tuple(_fill_marks(b, draft, c, what=f"command {i}", names=names)
                    if has_mark(c) else c for i, c in enumerate(body.command))
    draft.body = dataclasses.replace(body, command=command)


def _fill_marks(b: WorkflowBuilder, draft: StepDraft, text: str, *, what: str,
              names: Iterator[str]) -> str:
    """``text`` with each formatted handle the placeholder of a new input the handle feeds.

    A handle the step already takes is one input. Literal text that itself looks like a
    placeholder (``{{...}}``) is passed as a literal input, so no engine
    templates it.
    """
    where = f"workflow {b.workflow_name()!r}, step {draft.template!r}, {what}"
    fed: dict[int, str] = {}
    out: list[str] = []
    for literal, mark in split_marks(text):
        if "{{" in literal:
            name = next(names)
            _add_input(b, draft, name, literal, what=what)
            out.append(f"{{{{inputs.{name}}}}}")
        else:
            out.append(literal)
        if not mark:
            continue
        handle = b.marks.resolve(mark, where=where)
        if isinstance(handle, ArtifactOutput):
            raise UserError(f"{where}: artifact {handle.name!r} of step {handle.step_name!r} is "
                            "a file, not a value; pass it in input= and read it at its path")
        if id(handle) not in fed:
            source, _, _ = b.operand(handle, what=f"step {draft.template!r}, {what}")
            known = next((i.name for i in draft.inputs if i.value == source), None)
            fed[id(handle)] = known or next(names)
            if known is None:
                _add_input(b, draft, fed[id(handle)], handle, what=what)
        out.append(f"{{{{inputs.{fed[id(handle)]}}}}}")
    return "".join(out)


def _add_input(b: WorkflowBuilder, draft: StepDraft, name: str, value: object, *,
               what: str) -> None:
    source, vtype, upstream = b.operand(value, what=f"step {draft.template!r}, {what}")
    draft.inputs.append(ir.InputParameter(name, source, vtype))
    if upstream is not None:
        draft.add_dep(upstream.name)
        if isinstance(source, ir.StepOutputRef) and upstream.is_stdout(source.output):
            draft.stdout_of.append(upstream)


def _consume_artifact(b: WorkflowBuilder, draft: StepDraft, handle: ArtifactOutput) -> None:
    upstream = b.check_output(handle, what=f"step {draft.template!r}")
    names = {a.name for a in draft.input_artifacts}
    name = handle.name if handle.name not in names else f"{upstream.name}-{handle.name}"
    draft.input_artifacts.append(InputArtifactDraft(
        name, handle.path, ir.StepArtifactRef(upstream.name, handle.name)))
    draft.add_dep(upstream.name)


def _add_outputs(draft: StepDraft, output: object) -> None:
    for i, art in enumerate(_as_list(output)):
        if isinstance(art, ParameterArtifact):
            name = art.name or f"output-{i}"
            draft.outputs.append(ir.OutputParameter(name, ir.OutputSource.PATH, art.path))
            if art.is_global:
                draft.global_outputs.add(name)
        elif isinstance(art, FileArtifact):
            name = art.name or f"output-{i}"
            draft.output_artifacts.append(
                OutputArtifactDraft(name, art.path, art.location(), is_global=art.is_global))
        else:
            raise UserError(f"step {draft.template!r}: output {i} is {art!r}; use "
                            "create_parameter_artifact or create_*_artifact")


def _input_items(inputs: object) -> list[object]:
    """The items of ``input=``, with each list a ``run_*`` call returned reduced to its artifacts.

    A script step's list starts with its stdout ``result`` (a parameter) and a
    step may declare parameter outputs too; SDK users pass such lists as
    ``input=`` directly, meaning the files. A returned list without any
    artifact is kept whole, so it fails as a parameter does.
    """
    items = [inputs] if _returned_outputs(inputs) is not None else _as_list(inputs)
    flat: list[object] = []
    for item in items:
        outputs = _returned_outputs(item)
        artifacts = [o for o in outputs or () if isinstance(o, ArtifactOutput)]
        flat.extend(artifacts if artifacts else [item])
    return flat


def _returned_outputs(value: object) -> list[StepOutput] | None:
    """``value`` as step outputs if it is the very list of handles a ``run_*`` call returned."""
    if not isinstance(value, (list, tuple)) or not value or not isinstance(value[0], StepOutput):
        return None
    handles = value[0].draft.handles
    if len(handles) != len(value) or not all(a is b for a, b in zip(handles, value, strict=True)):
        return None
    return list(handles)


def _add_inputs(b: WorkflowBuilder, draft: StepDraft, inputs: object) -> None:
    for i, raw in enumerate(_input_items(inputs)):
        value = b.unwrap(raw)
        if isinstance(value, ArtifactOutput):
            _consume_artifact(b, draft, value)
        elif isinstance(value, FileArtifact) and (location := value.location()) is not None:
            draft.input_artifacts.append(
                InputArtifactDraft(value.name or f"input-{i}", value.path, location))
        else:
            raise UserError(f"step {draft.template!r}: input {i} is {value!r}; pass an output "
                            "artifact of an earlier step or an S3/OSS artifact")


def _add_env(b: WorkflowBuilder, draft: StepDraft,
             env: Mapping[str, object] | Sequence[Mapping[str, object]] | None) -> None:
    if not env:
        return
    if isinstance(env, Mapping):
        items = [(str(k), v) for k, v in env.items()]
    else:
        items = []
        for entry in env:
            if not isinstance(entry, Mapping) or "name" not in entry:
                raise UserError(f"step {draft.template!r}: env entries must be "
                                "{'name': ..., 'value': ...}")
            items.append((str(entry["name"]), entry.get("value", "")))
    for key, value in items:
        resolved = b.unwrap(value) if isinstance(value, (list, tuple)) else value
        if isinstance(resolved, (StepOutput, WorkflowParam, ItemHandle)):
            name = draft.new_input_name()
            _add_input(b, draft, name, resolved, what=f"env {key}")
            draft.env.append(EnvDraft(key, f"{{{{inputs.{name}}}}}"))
        elif isinstance(value, str) and has_mark(value):
            draft.env.append(EnvDraft(key, _fill_marks(b, draft, value, what=f"env {key}",
                                                     names=iter(draft.new_input_name, None))))
        else:
            draft.env.append(EnvDraft(key, str(value)))


def _add_secret(b: WorkflowBuilder, draft: StepDraft, secret: Secret | str | None) -> None:
    if secret is None:
        return
    handle = secret if isinstance(secret, Secret) else b.find_secret(str(secret))
    if handle is None:
        raise UserError(f"workflow {b.workflow_name()!r}, step {draft.template!r}: no secret "
                        f"called {secret!r}; create it with create_secret or obtain_secret")
    if handle.builder is not b:
        raise UserError(f"workflow {b.workflow_name()!r}, step {draft.template!r}: secret "
                        f"{handle.name!r} belongs to another workflow")
    for key in handle.keys:
        draft.env.append(EnvDraft(key, secret=handle, key=key))


def _add_options(
    draft: StepDraft, *, resources: Mapping[str, object] | ir.Resources | None,
    timeout: int | str | None, retry: int | ir.RetryPolicy | None,
    cache: Cache | ir.CachePolicy | None, daemon: bool,
    volume_mounts: Sequence[ir.VolumeMount | Mapping[str, object]] | None,
    node_selector: Mapping[str, object] | None, parallelism: int | None,
    tolerations: Sequence[Toleration | ir.Toleration] | None, priority: int | None,
    labels: Mapping[str, object] | None,
) -> None:
    draft.resources = to_resources(resources)
    draft.timeout_seconds = to_seconds(timeout, what=f"step {draft.template!r}: timeout")
    draft.retry = to_retry(retry)
    draft.cache = to_cache(cache)
    draft.daemon = bool(daemon)
    draft.parallelism = parallelism
    draft.priority = priority
    draft.node_selector = {str(k): str(v) for k, v in (node_selector or {}).items()}
    draft.labels = {str(k): str(v) for k, v in (labels or {}).items()}
    for mount in volume_mounts or ():
        if isinstance(mount, ir.VolumeMount):
            draft.volume_mounts.append(mount)
        elif isinstance(mount, Mapping):
            path = mount.get("mount_path", mount.get("mountPath"))
            if "name" not in mount or not path:
                raise UserError(f"step {draft.template!r}: a volume mount needs name and "
                                "mount_path")
            draft.volume_mounts.append(ir.VolumeMount(
                str(mount["name"]), str(path), read_only=bool(mount.get("read_only", False)),
                sub_path=str(mount.get("sub_path", ""))))
        else:
            raise UserError(f"step {draft.template!r}: volume_mounts entries must be "
                            "couler.VolumeMount(name, mount_path)")
    for tol in tolerations or ():
        draft.tolerations.append(tol.to_ir() if isinstance(tol, Toleration) else tol)


def _finish(b: WorkflowBuilder, draft: StepDraft) -> list[StepOutput]:
    """Add the draft (or find the step it repeats) and return its output handles."""
    step = b.add_step(draft)
    if step is draft:
        step.handles = _handles(step)
    return Outputs(step.handles)


def _handles(draft: StepDraft) -> list[StepOutput]:
    declared: list[StepOutput] = []
    for out in draft.outputs:
        declared.append(ParameterOutput(draft, out.name, type=out.type))
    for art in draft.output_artifacts:
        declared.append(ArtifactOutput(draft, art.name, art.path))
    if isinstance(draft.body, ir.ScriptSpec):
        return [draft.stdout_handle(), *declared]
    if isinstance(draft.body, ir.ContainerSpec) and not declared:
        return [draft.stdout_handle()]
    return declared


def _manifest(manifest: str | Mapping[str, object]) -> dict[str, object]:
    if isinstance(manifest, Mapping):
        body: object = copy.deepcopy(dict(manifest))
    elif isinstance(manifest, str):
        try:
            body = json.loads(manifest)
        except ValueError:
            try:
                body = yaml.safe_load(manifest)
            except yaml.YAMLError as e:
                raise UserError(f"run_job: the manifest is neither JSON nor YAML: {e}") from e
    else:
        raise UserError(f"run_job: manifest must be YAML text or a dict, not "
                        f"{type(manifest).__name__}")
    if not isinstance(body, dict):
        raise UserError("run_job: the manifest must be a mapping (apiVersion, kind, ...)")
    return body


def _manifest_name(body: Mapping[str, object]) -> str:
    meta = body.get("metadata")
    if isinstance(meta, Mapping):
        for key in ("name", "generateName"):
            value = meta.get(key)
            if isinstance(value, str) and value.strip("-"):
                return naming.sanitize(value.strip("-"))
    kind = body.get("kind")
    return naming.sanitize(str(kind), fallback="job") if kind else "job"
