"""What a catalog template is: a reviewed script, its image, parameters and data kinds.

The generator composes workflows from templates (the paper's "code lake"); it never
writes code. A template is a Python script run as an IR script step in its image, with
one calling convention so the spec can wire any template to any other::

    python script.py --<param> VALUE ...            every parameter, as text
                     --in-<kind> PATH ...           each kind it consumes (a directory)
                     --out-<kind> PATH ...          each kind it produces (a directory)
                     --metric-file PATH             when it reports a metric

Kinds are ``data`` (tables, files, shards), ``model`` (a trained model and its card),
``predictions`` and ``report``. A template that reports a metric writes one number to
``--metric-file``; the step exposes it as the output parameter named :attr:`Template.metric`
and conditions compare it ("only if F1 is above 0.9").

Scripts fail clearly: a missing input file or an unknown parameter exits non-zero with
the path or name in the message. Sample data is made only when asked (a ``sample://NAME``
source).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CATEGORIES", "KINDS", "Template", "TemplateParam"]

#: The stages of an ML workflow, in their usual order.
CATEGORIES = ("ingest", "process", "train", "evaluate", "deliver")
#: The artifact kinds templates pass to each other.
KINDS = ("data", "model", "predictions", "report")


@dataclass(frozen=True, slots=True)
class TemplateParam:
    """One parameter of a template. ``default`` None: the step must set it."""

    name: str
    default: str | None = None
    description: str = ""


@dataclass(frozen=True, slots=True)
class Template:
    """One reusable step of the catalog."""

    name: str  # DNS-1123, e.g. "train-xgboost"
    category: str  # one of CATEGORIES
    description: str  # one line: what it does (retrieval and the LLM prompt read it)
    keywords: tuple[str, ...]  # words and phrases of requests that ask for it
    image: str  # the image it runs in; deploy/images/ has its Dockerfile
    source: str  # the Python script
    params: tuple[TemplateParam, ...] = ()
    consumes: tuple[str, ...] = ()  # kinds read (KINDS)
    optional: tuple[str, ...] = ()  # of those, the kinds it runs without (read when given)
    produces: tuple[str, ...] = ()  # kinds written (KINDS)
    metric: str = ""  # the metric it reports ("" = none), e.g. "f1"
    gpu: bool = False  # meant for a GPU (deep learning)

    def param(self, name: str) -> TemplateParam | None:
        """The parameter called ``name``, or None."""
        return next((p for p in self.params if p.name == name), None)
