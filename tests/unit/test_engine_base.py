"""The engine contract: feature scan and capability check."""

from __future__ import annotations

import pytest

from couler import ir
from couler.engines.base import Capability, Feature, Support, check_capabilities, features_used
from couler.errors import UnsupportedFeatureError


def _wf() -> ir.Workflow:
    score = ir.Step(
        "score",
        ir.ScriptSpec("python:3.12", "print(1)"),
        outputs=(ir.OutputParameter("result", ir.OutputSource.STDOUT),),
    )
    deploy = ir.Step(
        "deploy",
        ir.ContainerSpec("alpine"),
        dependencies=(ir.Dependency("score"),),
        when=ir.When(
            ir.Condition(ir.StepOutputRef("score", "result"), ir.CompareOp.GT, ir.Literal.of(1)),
            expect=False,
        ),
        retry=ir.RetryPolicy(limit=2, backoff=ir.Backoff()),
    )
    fan = ir.Step(
        "fan",
        ir.ContainerSpec("alpine", args=("{{item}}",)),
        foreach=ir.ForEach(items=(ir.Literal.of(1), ir.Literal.of(2)), parallelism=1),
    )
    return ir.Workflow(
        "w",
        (score, deploy, fan),
        schedule=ir.CronSchedule("0 * * * *"),
        defaults=ir.StepDefaults(timeout_seconds=60),
    )


def test_features_used_names_the_steps() -> None:
    used = features_used(_wf())
    assert used[Feature.SCRIPT] == ["score"]
    assert used[Feature.ELSE] == ["deploy"]
    assert Feature.WHEN not in used
    assert used[Feature.RETRY_BACKOFF] == ["deploy"]
    assert used[Feature.MAP_STATIC] == ["fan"] and used[Feature.MAP_PARALLELISM] == ["fan"]
    assert used[Feature.CRON] == [""]
    assert used[Feature.TIMEOUT] == ["score", "deploy", "fan"]  # from the workflow defaults
    assert Feature.LOOP not in used


def test_check_capabilities_names_step_and_feature() -> None:
    caps = {f: Capability(Support.NATIVE) for f in Feature}
    check_capabilities("demo", caps, _wf())  # everything supported: no error
    caps[Feature.ELSE] = Capability(Support.UNSUPPORTED, "no negated conditions")
    with pytest.raises(UnsupportedFeatureError) as err:
        check_capabilities("demo", caps, _wf())
    msg = str(err.value)
    assert "step 'deploy'" in msg and "else branch" in msg and "no negated conditions" in msg
    del caps[Feature.ELSE]
    caps[Feature.ELSE] = Capability(Support.REWRITTEN, "negated operator")
    del caps[Feature.CRON]  # a feature an engine does not list counts as unsupported
    with pytest.raises(UnsupportedFeatureError, match="cron schedule"):
        check_capabilities("demo", caps, _wf())
