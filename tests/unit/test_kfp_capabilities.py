"""The KFP capability matrix imports without kfp; compiling without kfp says how to fix it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from couler.api.capture import capture_program
from couler.compilers import kfp
from couler.engines.base import Feature, Support
from couler.errors import UnsupportedFeatureError, UserError

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "programs"


def test_every_feature_has_a_capability_with_a_note() -> None:
    assert set(kfp.CAPABILITIES) == set(Feature)
    for feature, cap in kfp.CAPABILITIES.items():
        assert cap.note, feature
    assert kfp.CAPABILITIES[Feature.LOOP].support is Support.REWRITTEN  # unrolled
    assert "10748" in kfp.CAPABILITIES[Feature.LOOP].note
    job = kfp.CAPABILITIES[Feature.JOB]
    assert job.support is Support.REWRITTEN  # a kubectl container component
    assert "service account" in job.note and "RBAC" in job.note
    assert "kfp-kubernetes" in kfp.CAPABILITIES[Feature.SECRETS].note


def test_limits_have_sources() -> None:
    assert kfp.LIMITS
    for lim in kfp.LIMITS:
        assert lim.value > 0 and lim.unit and lim.source


def test_main_venv_has_no_kfp() -> None:
    assert importlib.util.find_spec("kfp") is None  # kfp lives in .venv-kfp only


def test_compile_without_kfp_raises_clear_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kfp", None)  # import kfp → ImportError, even if installed
    wf = capture_program(str(GOLDEN / "dag_diamond.py"))[0]
    with pytest.raises(UserError, match=r"setup-engine-venv\.sh kfp") as info:
        kfp.compile_workflow(wf)
    assert not isinstance(info.value, UnsupportedFeatureError)
    assert "kfp" in str(info.value)
