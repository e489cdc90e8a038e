"""The generator against request sets, through the ``couler generate`` command: the shared
development set (a copy in tests/nl), an extra set written without reading the generator,
and hostile or malformed inputs (each refused with exit 2 or answered with a valid
workflow). Expectations are checked by tests/nl_oracle.py."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from couler import ir
from couler.cli import main
from tests.nl_oracle import check

ROOT = Path(__file__).resolve().parents[2]
NL = ROOT / "tests" / "nl"


def _cases(name: str) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = yaml.safe_load((NL / name).read_text())
    return cases


def _generate(text: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(["generate", text, "--engine", "ir"], out=out, err=err)
    return status, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("name", ["dev-cases.yaml", "extra-cases.yaml", "probe-cases.yaml"])
def test_every_request_of_a_set_gets_the_workflow_it_asks_for(name: str) -> None:
    failures = []
    for case in _cases(name):
        status, out, err = _generate(case["text"])
        if status != 0:
            failures.append(f"{case['id']}: refused: {err.strip()[:300]}")
            continue
        wf = ir.from_json(ir.Workflow, out)
        ir.validate(wf)
        failures += [f"{case['id']}: {problem}" for problem in check(wf, case["expect"])]
    assert not failures, "\n".join(failures)


def _env() -> dict[str, str]:
    paths = [str(p) for p in sorted(ROOT.glob("libs/*/src")) + sorted(ROOT.glob("services/*/src"))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


BAD = _cases("bad-inputs.yaml")


@pytest.mark.parametrize("case", BAD, ids=[c["id"] for c in BAD])
def test_a_bad_input_is_refused_or_answered_with_a_valid_workflow(case: dict[str, Any]
                                                                  ) -> None:
    text = " ".join([str(case["text"])] * int(case.get("repeat", 1)))
    done = subprocess.run([sys.executable, "-m", "couler", "generate", "-", "--engine", "ir"],
                          input=text, capture_output=True, text=True, timeout=60, env=_env(),
                          check=False)
    assert "Traceback" not in done.stderr
    if case["expect"] == "refuse":
        assert done.returncode == 2, done.stdout[:500]
        assert done.stderr.startswith("couler: error: generate: ")
        return
    assert done.returncode == 0, done.stderr
    wf = ir.from_json(ir.Workflow, done.stdout)
    ir.validate(wf)
    steps = json.dumps([ir.to_dict(s) for s in wf.steps]).lower()
    for word in case.get("forbid", ()):
        assert str(word).lower() not in steps, word
