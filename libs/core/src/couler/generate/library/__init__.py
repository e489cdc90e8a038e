"""The template catalog: reviewed scripts that do real work, by category.

``TEMPLATES`` maps each template's name to its :class:`~couler.generate.templates.Template`
(ingest, process, train, evaluate, deliver; see :mod:`couler.generate.templates` for the
calling convention). The scripts are package data (``scripts/<name>.py``), read the first
time the catalog is used, not on import. Tabular templates run in :data:`TABULAR_IMAGE`
(or, on the local engine, in ``.venv-ml``: ``scripts/setup-ml-venv.sh``), deep-learning
ones in :data:`TORCH_IMAGE`; ``deploy/images/README.md`` lists which is which.
"""

from __future__ import annotations

import difflib
import functools

from couler.generate.library import deliver, evaluate, generic, ingest, process, train
from couler.generate.library._define import TABULAR_IMAGE, TORCH_IMAGE, script_source
from couler.generate.templates import Template

__all__ = ["IMAGES", "TABULAR_IMAGE", "TEMPLATES", "TORCH_IMAGE", "script_source", "template"]

#: The images the catalog's templates run in.
IMAGES = (TABULAR_IMAGE, TORCH_IMAGE)

# Bound on first access by __getattr__ (the scripts are read then, not on import).
TEMPLATES: dict[str, Template]


@functools.cache
def _catalog() -> dict[str, Template]:
    catalog: dict[str, Template] = {}
    for module in (ingest, process, train, evaluate, deliver, generic):
        for t in module.templates():
            if t.name in catalog:
                raise ValueError(f"template {t.name!r} is defined twice")
            catalog[t.name] = t
    return catalog


def __getattr__(name: str) -> dict[str, Template]:
    if name == "TEMPLATES":
        return dict(_catalog())  # a copy: callers cannot change the catalog
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def template(name: str) -> Template:
    """The template called ``name``.

    Raises:
        KeyError: No such template; the message names the closest ones.
    """
    catalog = _catalog()
    found = catalog.get(name)
    if found is None:
        near = difflib.get_close_matches(name, catalog, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        raise KeyError(f"no template named {name!r} in the catalog "
                       f"({len(catalog)} templates){hint}")
    return found
