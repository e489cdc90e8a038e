"""How the category modules define templates: the images, and scripts read as package data.

A template's script is ``scripts/<name>.py``. Its first ``from _common import ...`` line
is replaced by ``scripts/_common.py`` (the helpers every script shares: the calling
convention's parser, tables, model files, sample data, clear failures), so the
:attr:`Template.source` a step runs is one self-contained file.
"""

from __future__ import annotations

import ast
import re
from importlib import resources

from couler.generate.templates import Template, TemplateParam

__all__ = ["TABULAR_IMAGE", "TORCH_IMAGE", "define", "param", "script_source"]

#: scikit-learn, XGBoost, LightGBM, CatBoost, pandas, statsmodels, SQL drivers, fsspec
#: (deploy/images/ml-tabular/Dockerfile).
TABULAR_IMAGE = "ghcr.io/couler-io/ml-tabular:0.1"
#: PyTorch with torchvision, torchaudio, transformers, peft, sentence-transformers
#: (deploy/images/ml-torch/Dockerfile).
TORCH_IMAGE = "ghcr.io/couler-io/ml-torch:0.1"

_COMMON_IMPORT = re.compile(r"^from _common import (?:\([^)]*\)|[^\n]*)\n", re.MULTILINE)


def script_source(name: str) -> str:
    """The self-contained source of the script ``scripts/<name>.py``.

    Raises:
        FileNotFoundError: No such script in the package.
        ValueError: The script does not import the shared helpers.
    """
    scripts = resources.files(__package__).joinpath("scripts")
    text = scripts.joinpath(f"{name}.py").read_text(encoding="utf-8")
    common = scripts.joinpath("_common.py").read_text(encoding="utf-8")
    source, count = _COMMON_IMPORT.subn(lambda _: common, text, count=1)
    if count != 1:
        raise ValueError(f"script {name}.py: no 'from _common import ...' line to inline")
    return source


def param(name: str, default: str | None = None, description: str = "") -> TemplateParam:
    """A template parameter (``default`` None: the step must set it)."""
    return TemplateParam(name, default, description)


def script_kinds(name: str) -> dict[str, tuple[str, ...]]:
    """The kinds the script ``scripts/<name>.py`` reads, writes and can do without: the
    arguments of its ``parser(...)`` call, the one place they are stated."""
    text = resources.files(__package__).joinpath("scripts", f"{name}.py").read_text(
        encoding="utf-8")
    for node in ast.walk(ast.parse(text)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "parser"):
            kinds = {k.arg: ast.literal_eval(k.value) for k in node.keywords
                     if k.arg in ("consumes", "produces", "optional")}
            return {k: tuple(kinds.get(k, ())) for k in ("consumes", "produces", "optional")}
    raise ValueError(f"script {name}.py: no parser(...) call stating its kinds")


def define(name: str, category: str, description: str, keywords: str, *, image: str,
           params: tuple[TemplateParam, ...] = (), consumes: tuple[str, ...] = (),
           produces: tuple[str, ...] = (), metric: str = "", gpu: bool = False) -> Template:
    """The template ``name`` with its script; ``keywords`` is comma-separated.

    The kinds it consumes, produces and can do without are its script's (``consumes`` and
    ``produces`` here only document them).
    """
    kinds = script_kinds(name)
    return Template(
        name=name, category=category, description=description,
        keywords=tuple(k.strip() for k in keywords.split(",") if k.strip()),
        image=image, source=script_source(name), params=params, consumes=kinds["consumes"],
        optional=kinds["optional"], produces=kinds["produces"], metric=metric, gpu=gpu)
