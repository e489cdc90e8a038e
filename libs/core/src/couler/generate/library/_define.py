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
    """The self-contained source of the script ``scripts/<name>.py``: its ``from _common
    import ...`` line replaced by the helpers it uses (and those they use), nothing else.

    Raises:
        FileNotFoundError: No such script in the package.
        ValueError: The script does not import the shared helpers.
    """
    scripts = resources.files(__package__).joinpath("scripts")
    text = scripts.joinpath(f"{name}.py").read_text(encoding="utf-8")
    match = _COMMON_IMPORT.search(text)
    if match is None:
        raise ValueError(f"script {name}.py: no 'from _common import ...' line to inline")
    wanted = set(re.findall(r"\w+", match.group(0).split("import", 1)[1]))
    helpers = _helpers(scripts.joinpath("_common.py").read_text(encoding="utf-8"), wanted)
    return text[: match.start()] + helpers + text[match.end():]


def _helpers(common: str, wanted: set[str]) -> str:
    """The parts of ``_common.py`` that define ``wanted`` and what they need, in order."""
    tree = ast.parse(common)
    defined: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    defined[target.id] = node
    keep: set[str] = set()
    todo = [n for n in wanted if n in defined]
    while todo:
        n = todo.pop()
        if n in keep:
            continue
        keep.add(n)
        todo.extend(sub.id for sub in ast.walk(defined[n])
                    if isinstance(sub, ast.Name) and sub.id in defined and sub.id not in keep)
    lines = common.splitlines()
    parts = ["# --- the catalog's shared helpers this script uses (scripts/_common.py) ---"]
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) or any(
                defined.get(k) is node for k in keep):
            start = node.lineno - 1 - len(getattr(node, "decorator_list", []))
            parts.append("\n".join(lines[start: node.end_lineno]) + "\n")
    parts.append("# --- end of the shared helpers ---")
    return "\n".join(parts) + "\n"


def param(name: str, default: str | None = None, description: str = "") -> TemplateParam:
    """A template parameter (``default`` None: the step must set it)."""
    return TemplateParam(name, default, description)


def script_kinds(name: str) -> dict[str, tuple[str, ...]]:
    """The kinds the script ``scripts/<name>.py`` reads, writes and can do without, and
    ``("metric",)`` under "metric" when it writes one: the arguments of its ``parser(...)``
    call, the one place they are stated."""
    text = resources.files(__package__).joinpath("scripts", f"{name}.py").read_text(
        encoding="utf-8")
    for node in ast.walk(ast.parse(text)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "parser"):
            kinds = {k.arg: ast.literal_eval(k.value) for k in node.keywords
                     if k.arg in ("consumes", "produces", "optional", "metric")}
            out = {k: tuple(kinds.get(k, ())) for k in ("consumes", "produces", "optional")}
            out["metric"] = ("metric",) if kinds.get("metric") else ()
            return out
    raise ValueError(f"script {name}.py: no parser(...) call stating its kinds")


def define(name: str, category: str, description: str, keywords: str, *, image: str,
           params: tuple[TemplateParam, ...] = (), consumes: tuple[str, ...] = (),
           produces: tuple[str, ...] = (), metric: str = "", gpu: bool = False) -> Template:
    """The template ``name`` with its script; ``keywords`` is comma-separated.

    The kinds it consumes, produces and can do without are its script's (``consumes`` and
    ``produces`` here only document them).
    """
    kinds = script_kinds(name)
    if bool(metric) != bool(kinds["metric"]):
        raise ValueError(f"template {name!r}: metric {metric!r}, but its script "
                         f"{'writes' if kinds['metric'] else 'writes no'} metric file")
    return Template(
        name=name, category=category, description=description,
        keywords=tuple(k.strip() for k in keywords.split(",") if k.strip()),
        image=image, source=script_source(name), params=params, consumes=kinds["consumes"],
        optional=kinds["optional"], produces=kinds["produces"], metric=metric, gpu=gpu)
