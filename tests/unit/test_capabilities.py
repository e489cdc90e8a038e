"""Tests of the engines' capability matrices and of the generated docs/engines.md."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from couler.api.capture import capture_program
from couler.compilers import argo_capabilities, tekton
from couler.engines.base import Feature, Support, check_capabilities

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = sorted((ROOT / "tests" / "golden" / "programs").glob("*.py"))


def _gen_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_engine_docs",
                                                  ROOT / "scripts" / "gen_engine_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_argo_matrix_covers_every_feature() -> None:
    assert set(argo_capabilities.CAPABILITIES) == set(Feature)
    unsupported = {f for f, c in argo_capabilities.CAPABILITIES.items()
                   if c.support is Support.UNSUPPORTED}
    assert unsupported == {Feature.PRIORITY}
    for feature, cap in argo_capabilities.CAPABILITIES.items():
        assert cap.note, feature


def test_argo_limits_have_sources() -> None:
    assert any(lim.value == 1572864 for lim in argo_capabilities.LIMITS)
    for lim in argo_capabilities.LIMITS:
        assert lim.source.strip() and lim.value > 0 and lim.unit


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_argo_accepts_every_golden_program(program: Path) -> None:
    for wf in capture_program(str(program)):
        check_capabilities("argo", argo_capabilities.CAPABILITIES, wf)


def test_engines_doc_is_up_to_date() -> None:
    gen = _gen_script()
    committed = (ROOT / "docs" / "engines.md").read_text(encoding="utf-8")
    assert committed == gen.render(), "run: python scripts/gen_engine_docs.py"


def test_engines_doc_lists_every_feature_and_engine() -> None:
    gen = _gen_script()
    text = gen.render()
    assert [name for name, _ in gen.ENGINES] == ["argo", "tekton", "kfp", "airflow", "local", "ray"]
    for feature in Feature:
        assert f"| {feature.value} |" in text
    for lim in (*argo_capabilities.LIMITS, *tekton.LIMITS):
        assert lim.name in text
