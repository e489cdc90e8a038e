"""The engine-neutral workflow IR: model, canonical JSON, digest and validation."""

from couler.ir.model import *  # noqa: F403 - the IR's public names are the model's
from couler.ir.model import __all__ as _model_all
from couler.ir.serialize import digest, from_dict, from_json, to_dict, to_json
from couler.ir.validate import find_issues, parse_quantity, validate

__all__ = [
    *_model_all,
    "digest",
    "find_issues",
    "from_dict",
    "from_json",
    "parse_quantity",
    "to_dict",
    "to_json",
    "validate",
]
