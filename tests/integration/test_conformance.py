"""Conformance: every program in tests/conformance/programs on every engine.

Each program x engine is compiled (Argo, Tekton, Airflow in-process; KFP in one
``.venv-kfp`` subprocess; local / Ray through their capability check) or
rejected with an ``UnsupportedFeatureError`` naming a feature the engine's
``CAPABILITIES`` marks unsupported -- never another exception. Compiled Argo and
Tekton documents must validate against their schemas. Every program also runs
on the local engine and must reach the states and outputs written from the semantics
(tests/conformance/expected.py), or be refused for a feature the local engine's
``CAPABILITIES`` declare unsupported (``LOCAL_REFUSES``).
The tables (``pytest -s`` prints them) must match tests/conformance/RESULTS.md.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from couler.engines.base import Feature, Support
from tests.argo_schema import assert_valid_argo
from tests.conformance import harness
from tests.conformance.expected import EXPECTED
from tests.conformance.loader import load_program, program_paths
from tests.unit.test_tekton_compiler import schema_errors as tekton_schema_errors

PROGRAMS = [p.stem for p in program_paths()]
ENGINES = harness.engines()
# Programs the local engine cannot express: refused when run, naming the feature.
LOCAL_REFUSES: dict[str, str] = {"job_step": "job step (Kubernetes resource)"}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> harness.Results:
    try:
        kfp = harness.compile_kfp(program_paths())
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    res = harness.collect(tmp_path_factory.mktemp("conformance-runs"), kfp=kfp)
    print("\n" + harness.render_results(res))
    return res


def test_programs_cover_every_feature() -> None:
    assert len(PROGRAMS) >= 12
    used = {f for p in program_paths() for f in harness.features_used(load_program(p))}
    assert used == set(Feature), f"not covered: {sorted(set(Feature) - used)}"


def test_expected_lists_every_program() -> None:
    assert sorted(EXPECTED) == sorted(PROGRAMS)


def _feature(engine: str, name: str) -> Feature:
    try:
        return Feature(name)
    except ValueError:
        pytest.fail(f"{engine} rejected with {name!r}, which is not a Feature")


@pytest.mark.parametrize("engine", [name for name, _ in ENGINES])
@pytest.mark.parametrize("program", PROGRAMS)
def test_compiled_or_unsupported(results: harness.Results, engine: str, program: str) -> None:
    outcome = results.outcomes[(engine, program)]
    assert outcome.status in ("compiled", "unsupported"), outcome.error
    caps = harness.capabilities(dict(ENGINES)[engine])
    used = {Feature(f) for f in results.features[program]}
    unsupported = {f for f in used
                   if f not in caps or caps[f].support is Support.UNSUPPORTED}
    if outcome.status == "unsupported":
        feature = _feature(engine, outcome.feature)
        # a feature rewritten for some cases only: its note must say which it rejects
        partial = (feature in used and feature in caps
                   and caps[feature].support is Support.REWRITTEN
                   and re.search(r"\b(rejected|refused)\b", caps[feature].note) is not None)
        assert feature in unsupported or partial, (
            f"{engine} rejected {program} for {feature.value!r}, which its CAPABILITIES "
            f"declare {caps[feature].support.value if feature in caps else 'missing'} "
            f"or the program does not use")
        return
    assert not unsupported, f"{engine} compiled {program} despite {sorted(unsupported)}"
    if engine == "argo":
        assert_valid_argo(outcome.document)
    elif engine == "tekton":
        for doc in outcome.document:
            assert tekton_schema_errors(doc) == []
    elif engine == "airflow":
        compile(outcome.document, f"{program}.py", "exec")  # valid Python DAG source


@pytest.mark.parametrize("program", PROGRAMS)
def test_local_run_matches_expected(results: harness.Results, program: str) -> None:
    actual: dict[str, Any] = results.local_runs[program]
    if program in LOCAL_REFUSES:
        feature = LOCAL_REFUSES[program]
        assert actual == {"state": "unsupported", "feature": feature}
        assert results.outcomes[("local", program)].feature == feature
        return
    assert harness.matches(EXPECTED[program], actual) == []


def test_results_md_is_up_to_date(results: harness.Results) -> None:
    committed = harness.RESULTS.read_text(encoding="utf-8") if harness.RESULTS.exists() else ""
    assert committed == harness.render_results(results), (
        "run: python scripts/conformance_table.py --update")


def test_missing_kfp_venv_fails_with_setup_hint(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    monkeypatch.setattr(harness, "KFP_PYTHON", tmp_path / "missing" / "python")
    with pytest.raises(RuntimeError, match=r"scripts/setup-engine-venv\.sh kfp"):
        harness.compile_kfp(program_paths())
