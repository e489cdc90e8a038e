"""The engine-neutral workflow IR: model, canonical JSON, digest and validation."""

from couler.ir import model
from couler.ir.model import *  # noqa: F403 - the model's public names are the IR's
from couler.ir.serialize import digest, from_dict, from_json, to_dict, to_json
from couler.ir.validate import check_parameters, find_issues, parse_quantity, validate

__all__ = [
    "check_parameters",
    "digest",
    "find_issues",
    "from_dict",
    "from_json",
    "parse_quantity",
    "to_dict",
    "to_json",
    "validate",
]
__all__ += model.__all__
