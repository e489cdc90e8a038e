"""Hypothesis strategies for IR values, for round-trip and property tests.

``workflows()`` and ``steps()`` draw structurally arbitrary IR values: every
dataclass, every member of every union and every enum value, optional fields
both set and unset, nested sub-workflows (to a bounded depth), recursive
depends expressions, unicode text, finite floats (``-0.0``, subnormals and
extremes included) and ints across the whole int64 range. The values are not
meant to be *valid* workflows (names are arbitrary text, references dangle);
use them where only structure matters, such as serialisation round trips.

Sizes are kept small so that a few hundred examples run in seconds.
"""

from __future__ import annotations

import enum
from typing import Any, TypeVar

from hypothesis import strategies as st

from couler import ir

__all__ = [
    "artifact_locations",
    "conditions",
    "depends_exprs",
    "floats",
    "int64s",
    "literals",
    "pairs",
    "steps",
    "texts",
    "value_sources",
    "workflows",
]

T = TypeVar("T")

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

#: Arbitrary unicode text (no lone surrogates: they cannot be UTF-8 encoded).
texts = st.text(max_size=6)
#: Any int that fits int64.
int64s = st.integers(min_value=INT64_MIN, max_value=INT64_MAX)
#: Finite floats; the edge cases (-0.0, the smallest subnormal, the largest doubles)
#: are drawn often, since equality alone cannot tell -0.0 from 0.0.
floats = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([-0.0, 0.0, 5e-324, -5e-324, 1.7976931348623157e308, -1.7976931348623157e308]),
)
bools = st.booleans()


def _opt(strategy: st.SearchStrategy[T]) -> st.SearchStrategy[T | None]:
    return st.none() | strategy


def _tuples(strategy: st.SearchStrategy[T], max_size: int = 2) -> st.SearchStrategy[tuple[T, ...]]:
    return st.lists(strategy, max_size=max_size).map(tuple)


def _enum(cls: type[enum.Enum]) -> st.SearchStrategy[Any]:
    return st.sampled_from(list(cls))


#: Key/value pairs, drawn in any order (the IR sorts them), duplicate keys allowed.
pairs = _tuples(st.tuples(texts, texts), max_size=3)

_json_values = st.recursive(
    st.none() | bools | int64s | floats | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=5,
)

#: Literals: canonical JSON of arbitrary values, and arbitrary (even non-JSON) text.
literals = st.one_of(
    _json_values.map(ir.Literal.of),
    st.builds(ir.Literal, json=texts),
)

step_output_refs = st.builds(ir.StepOutputRef, step=texts, output=texts)
workflow_param_refs = st.builds(ir.WorkflowParamRef, name=texts)
item_refs = st.one_of(st.builds(ir.ItemRef), st.builds(ir.ItemRef, key=texts))

#: Every member of ``ValueSource``.
value_sources: st.SearchStrategy[ir.ValueSource] = st.one_of(
    literals, step_output_refs, workflow_param_refs, item_refs
)

secret_refs = st.builds(ir.SecretRef, name=texts, key=texts)

# --------------------------------------------------------------------------- parameters

parameters = st.builds(
    ir.Parameter,
    name=texts,
    type=_enum(ir.ValueType),
    default=_opt(literals),
    description=texts,
    enum=_tuples(literals),
)
input_parameters = st.builds(
    ir.InputParameter, name=texts, value=value_sources, type=_enum(ir.ValueType)
)
output_parameters = st.builds(
    ir.OutputParameter,
    name=texts,
    source=_enum(ir.OutputSource),
    selector=texts,
    type=_enum(ir.ValueType),
    global_name=texts,
)

# --------------------------------------------------------------------------- artifacts

artifact_locations = st.builds(
    ir.ArtifactLocation,
    storage=_enum(ir.StorageKind),
    endpoint=texts,
    bucket=texts,
    key=texts,
    url=texts,
    revision=texts,
    insecure=bools,
    access_key=_opt(secret_refs),
    secret_key=_opt(secret_refs),
)
step_artifact_refs = st.builds(ir.StepArtifactRef, step=texts, artifact=texts)
input_artifacts = st.builds(
    ir.InputArtifact,
    name=texts,
    path=texts,
    source=st.one_of(artifact_locations, step_artifact_refs),
)
output_artifacts = st.builds(
    ir.OutputArtifact,
    name=texts,
    path=texts,
    location=_opt(artifact_locations),
    digest=texts,
    global_name=texts,
)

# --------------------------------------------------------------------------- control flow

dependencies = st.builds(ir.Dependency, step=texts, condition=_enum(ir.EdgeCondition))

#: Recursive depends expressions: terms combined with all / any / not.
depends_exprs: st.SearchStrategy[ir.DependsExpr] = st.recursive(
    st.builds(ir.DependsTerm, step=texts, condition=_enum(ir.EdgeCondition)),
    lambda inner: st.one_of(
        st.builds(ir.DependsAll, terms=_tuples(inner, max_size=3)),
        st.builds(ir.DependsAny, terms=_tuples(inner, max_size=3)),
        st.builds(ir.DependsNot, term=inner),
    ),
    max_leaves=6,
)

conditions = st.builds(
    ir.Condition, left=value_sources, op=_enum(ir.CompareOp), right=value_sources
)
whens = st.builds(ir.When, condition=conditions, expect=bools)
foreaches = st.builds(
    ir.ForEach,
    items=_tuples(literals, max_size=3),
    source=_opt(st.one_of(step_output_refs, workflow_param_refs)),
    parallelism=_opt(int64s),
)
loops = st.builds(ir.Loop, condition=conditions, max_iterations=int64s)
tune_params = st.builds(
    ir.TuneParam, name=texts, kind=_enum(ir.TuneKind), low=floats, high=floats,
    step=_opt(floats), log=bools, choices=_tuples(literals, max_size=3))
tunes = st.builds(
    ir.Tune, space=_tuples(tune_params, max_size=3), objective=texts, trials=int64s,
    parallel=int64s, direction=_enum(ir.TuneDirection), sampler=_enum(ir.TuneSampler),
    pruner=_enum(ir.TunePruner), seed=_opt(int64s), storage=_opt(secret_refs), image=texts)

# --------------------------------------------------------------------------- policies

backoffs = st.builds(ir.Backoff, base_seconds=floats, factor=floats, cap_seconds=_opt(floats))
retry_policies = st.builds(
    ir.RetryPolicy,
    limit=int64s,
    backoff=_opt(backoffs),
    on=_tuples(_enum(ir.FailureClass), max_size=3),
    memory_factor=_opt(floats),
    memory_ceiling=texts,
)
resources = st.builds(
    ir.Resources,
    cpu_request=texts,
    cpu_limit=texts,
    memory_request=texts,
    memory_limit=texts,
    gpu=int64s,
    gpu_resource=texts,
)
cache_policies = st.builds(
    ir.CachePolicy,
    enabled=bools,
    salt=texts,
    max_age_seconds=_opt(int64s),
    key=texts,
    name=texts,
)
tolerations = st.builds(
    ir.Toleration,
    key=texts,
    operator=texts,
    value=texts,
    effect=texts,
    toleration_seconds=_opt(int64s),
)
volumes = st.builds(
    ir.Volume,
    name=texts,
    kind=_enum(ir.VolumeKind),
    claim_name=texts,
    size=texts,
    access_modes=_tuples(texts),
    storage_class=texts,
)
volume_mounts = st.builds(
    ir.VolumeMount, name=texts, mount_path=texts, read_only=bools, sub_path=texts
)
env_vars = st.builds(ir.EnvVar, name=texts, value=texts, secret=_opt(secret_refs))

# --------------------------------------------------------------------------- step bodies

containers = st.builds(
    ir.ContainerSpec,
    image=texts,
    command=_tuples(texts),
    args=_tuples(texts),
    working_dir=texts,
    image_pull_policy=texts,
)
scripts = st.builds(
    ir.ScriptSpec,
    image=texts,
    source=st.text(max_size=20),
    language=_enum(ir.ScriptLanguage),
    command=_tuples(texts),
    args=_tuples(texts),
    working_dir=texts,
    image_pull_policy=texts,
)
jobs = st.builds(
    ir.JobSpec,
    manifest=st.one_of(
        texts, st.dictionaries(texts, _json_values, max_size=3).map(lambda d: ir.Literal.of(d).json)
    ),
    action=_enum(ir.JobAction),
    success_condition=texts,
    failure_condition=texts,
    set_owner_reference=bools,
)


def _bodies(depth: int) -> st.SearchStrategy[ir.StepBody]:
    leaves: st.SearchStrategy[ir.StepBody] = st.one_of(containers, scripts, jobs)
    if depth <= 0:
        sub = st.builds(ir.SubWorkflowSpec, name=texts, digest=texts)  # a reference
    else:
        sub = st.builds(
            ir.SubWorkflowSpec, name=texts, steps=_tuples(steps(depth - 1)), digest=texts
        )
    return st.one_of(leaves, sub)


def steps(depth: int = 2) -> st.SearchStrategy[ir.Step]:
    """Steps with every field drawn; inline sub-workflows nest up to ``depth`` levels."""
    return st.builds(
        ir.Step,
        name=texts,
        body=_bodies(depth),
        template=texts,
        inputs=_tuples(input_parameters),
        outputs=_tuples(output_parameters),
        input_artifacts=_tuples(input_artifacts),
        output_artifacts=_tuples(output_artifacts),
        env=_tuples(env_vars),
        dependencies=_tuples(dependencies),
        depends=_opt(depends_exprs),
        when=_opt(whens),
        foreach=_opt(foreaches),
        loop=_opt(loops),
        retry=_opt(retry_policies),
        timeout_seconds=_opt(int64s),
        resources=_opt(resources),
        cache=_opt(cache_policies),
        priority=_opt(int64s),
        node_selector=pairs,
        tolerations=_tuples(tolerations),
        volume_mounts=_tuples(volume_mounts),
        daemon=bools,
        parallelism=_opt(int64s),
        labels=pairs,
        tune=_opt(tunes),
    )


# --------------------------------------------------------------------------- workflow

exit_hooks = st.builds(ir.ExitHook, on=_enum(ir.RunStatus), steps=_tuples(steps(depth=0)))
cron_schedules = st.builds(
    ir.CronSchedule,
    schedule=texts,
    timezone=texts,
    concurrency_policy=_enum(ir.ConcurrencyPolicy),
    starting_deadline_seconds=_opt(int64s),
    successful_history_limit=_opt(int64s),
    failed_history_limit=_opt(int64s),
    suspend=bools,
)
event_triggers = st.builds(ir.EventTrigger, subject=texts, filter=texts)
step_defaults = st.builds(
    ir.StepDefaults,
    retry=_opt(retry_policies),
    timeout_seconds=_opt(int64s),
    resources=_opt(resources),
    cache=_opt(cache_policies),
    priority=_opt(int64s),
)
dns_configs = st.builds(
    ir.DnsConfig,
    policy=texts,
    nameservers=_tuples(texts),
    searches=_tuples(texts),
    options=pairs,
)
se_linux_options = st.builds(ir.SELinuxOptions, user=texts, role=texts, type=texts,
                             level=texts)
security_contexts = st.builds(
    ir.SecurityContext,
    run_as_user=_opt(int64s),
    run_as_group=_opt(int64s),
    fs_group=_opt(int64s),
    run_as_non_root=_opt(bools),
    se_linux_options=_opt(se_linux_options),
)


def workflows(depth: int = 2) -> st.SearchStrategy[ir.Workflow]:
    """Whole workflows with every field drawn; see the module docstring."""
    return st.builds(
        ir.Workflow,
        name=texts,
        steps=_tuples(steps(depth), max_size=3),
        parameters=_tuples(parameters),
        exit_hooks=_tuples(exit_hooks, max_size=1),
        schedule=_opt(cron_schedules),
        triggers=_tuples(event_triggers),
        labels=pairs,
        annotations=pairs,
        tenant=texts,
        defaults=st.one_of(st.builds(ir.StepDefaults), step_defaults),
        volumes=_tuples(volumes),
        node_selector=pairs,
        tolerations=_tuples(tolerations),
        service_account=texts,
        image_pull_secrets=_tuples(texts),
        dns=_opt(dns_configs),
        security_context=_opt(security_contexts),
        timeout_seconds=_opt(int64s),
        ttl_seconds=_opt(int64s),
        parallelism=_opt(int64s),
    )
