"""The template catalog: names, kinds, keywords, and scripts that parse the documented flags."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from couler.generate import library
from couler.generate.library._define import script_kinds
from couler.generate.templates import CATEGORIES, KINDS
from couler_runtime.local import interpreters

DNS_1123 = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
TEMPLATES = library.TEMPLATES


def test_the_catalog_has_enough_templates_in_every_category() -> None:
    assert len(TEMPLATES) >= 44
    by_category = {c: [t for t in TEMPLATES.values() if t.category == c] for c in CATEGORIES}
    assert all(len(ts) >= 5 for ts in by_category.values()), {
        c: len(ts) for c, ts in by_category.items()}


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_a_template_is_well_formed(name: str) -> None:
    t = TEMPLATES[name]
    assert t.name == name and DNS_1123.fullmatch(name)
    assert t.category in CATEGORIES
    assert set(t.consumes) <= set(KINDS) and set(t.produces) <= set(KINDS)
    assert t.consumes or t.produces
    assert t.keywords and all(k and k == k.strip() for k in t.keywords)
    assert t.description and "\n" not in t.description
    assert t.image in library.IMAGES
    assert len({p.name for p in t.params}) == len(t.params)
    # a template names its metric exactly when its script writes one
    assert bool(t.metric) == bool(script_kinds(name)["metric"])
    if t.category == "evaluate" and name != "explain-feature-importance":
        assert t.metric
    if t.gpu:
        assert t.image == library.TORCH_IMAGE
    compile(t.source, f"{name}.py", "exec")
    assert "from _common import" not in t.source  # the helpers are inlined


def test_every_script_accepts_its_documented_flags(tmp_path: Path) -> None:
    # --help parses before any ML library is imported: it works with this interpreter
    for name, t in TEMPLATES.items():
        script = tmp_path / f"{name}.py"
        script.write_text(t.source)
        done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0, (name, done.stderr)
        flags = set(re.findall(r"--[a-z][a-z0-9-]*", done.stdout))
        wanted = {f"--{p.name}" for p in t.params}
        wanted |= {f"--in-{k}" for k in t.consumes} | {f"--out-{k}" for k in t.produces}
        assert wanted <= flags, (name, wanted - flags)
        assert ("--metric-file" in flags) == bool(t.metric), name


def test_required_parameters_are_the_scripts_required_flags(tmp_path: Path) -> None:
    script = tmp_path / "ingest-sql.py"
    script.write_text(library.template("ingest-sql").source)
    done = subprocess.run([sys.executable, str(script), "--out-data", str(tmp_path)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "--query" in done.stderr
    assert library.template("ingest-sql").param("query").default is None  # type: ignore[union-attr]


def test_an_unknown_template_is_a_key_error_naming_close_ones() -> None:
    with pytest.raises(KeyError, match=r"no template named 'train-xgbost'.*train-xgboost"):
        library.template("train-xgbost")


def test_the_catalog_cannot_be_changed_through_templates() -> None:
    library.TEMPLATES.pop("train-xgboost")
    assert "train-xgboost" in library.TEMPLATES


@pytest.mark.parametrize(("request_words", "expected"), [
    ("one-hot encode the categorical columns", "encode-categorical"),
    ("fit ridge, lasso and elasticnet regressors", "train-sklearn"),
    ("upsert into redis", "upsert-key-value"),
    ("post to the #sre-alerts slack channel", "notify-webhook"),
    ("rank trials by rmse", "rank-models"),
    ("query the snowflake warehouse", "ingest-sql"),
    ("forecast demand with sarima", "train-forecaster"),
])
def test_keywords_name_the_template_a_request_asks_for(request_words: str,
                                                        expected: str) -> None:
    def hits(name: str) -> int:
        words = set(re.findall(r"[\w#-]+", request_words))
        return sum(1 for k in TEMPLATES[name].keywords
                   if k in request_words or set(k.split()) & words)

    best = max(TEMPLATES, key=hits)
    assert hits(expected) == hits(best), (expected, best)


def test_image_python_patterns_and_exact_names() -> None:
    mapping = interpreters.parse("ghcr.io/couler-io/ml-tabular:*=/opt/ml/bin/python, "
                                 "ghcr.io/couler-io/ml-tabular:0.1=/venv/bin/python")
    assert interpreters.interpreter_for("ghcr.io/couler-io/ml-tabular:0.1",
                                        mapping) == "/venv/bin/python"
    assert interpreters.interpreter_for("ghcr.io/couler-io/ml-tabular:0.2",
                                        mapping) == "/opt/ml/bin/python"
    assert interpreters.interpreter_for("python:3.12", mapping) is None
    assert interpreters.parse("img=.venv-ml/bin/python")["img"] == str(
        Path(".venv-ml/bin/python").absolute())
    with pytest.raises(ValueError, match="COULER_LOCAL_PYTHON: 'nothing' is not IMAGE=PATH"):
        interpreters.parse("nothing")
