"""Which Python runs a script step on the local engine, by the step's image.

A script step's image does not exist on the host; its Python code runs with
``sys.executable`` unless the image is mapped to another interpreter, e.g. the catalog's
tabular image to ``.venv-ml/bin/python`` (``scripts/setup-ml-venv.sh``). The map comes
from ``LocalEngine(image_python=...)`` or the ``COULER_LOCAL_PYTHON`` setting::

    COULER_LOCAL_PYTHON='ghcr.io/couler-io/ml-tabular:*=.venv-ml/bin/python'

An image pattern may use shell wildcards (``*``, ``?``); an exact name wins over a pattern,
then the first matching pattern in the order given.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["LOCAL_PYTHON_ENV", "from_env", "interpreter_for", "parse"]

LOCAL_PYTHON_ENV = "COULER_LOCAL_PYTHON"


def parse(text: str) -> dict[str, str]:
    """``"IMAGE=PATH,IMAGE=PATH"`` as a mapping (relative paths made absolute).

    Raises:
        ValueError: An entry is not ``IMAGE=PATH``; the message names the setting.
    """
    mapping: dict[str, str] = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        image, sep, path = entry.rpartition("=")
        if not sep or not image.strip() or not path.strip():
            raise ValueError(f"{LOCAL_PYTHON_ENV}: {entry!r} is not IMAGE=PATH "
                             "(e.g. 'ghcr.io/couler-io/ml-tabular:*=.venv-ml/bin/python')")
        mapping[image.strip()] = str(Path(path.strip()).expanduser().absolute())
    return mapping


def from_env() -> dict[str, str]:
    """The ``COULER_LOCAL_PYTHON`` setting's map (empty when unset)."""
    return parse(os.environ.get(LOCAL_PYTHON_ENV, ""))


def interpreter_for(image: str, mapping: Mapping[str, str]) -> str | None:
    """The interpreter mapped to ``image``, or None (then ``sys.executable`` runs it)."""
    if image in mapping:
        return mapping[image]
    return next((path for pattern, path in mapping.items()
                 if fnmatch.fnmatchcase(image, pattern)), None)
