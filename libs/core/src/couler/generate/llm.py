"""Generation through an LLM: prompt, parse, validate, repair — never execute.

:func:`generate_with_llm` asks a chat model (through a ``complete`` callable the
caller wires to the ``openai`` client or anything OpenAI-compatible) for a
:class:`~couler.generate.spec.WorkflowSpec` as JSON, parses and assembles it into
IR, and validates it (schema, DAG, and the target engine's capabilities). When
anything is wrong it sends the model the errors — each naming the workflow, step
and field — and asks for a corrected answer, at most ``max_rounds`` times; then it
refuses with a ValidationError rather than return an invalid workflow. The model
chooses catalog entries, parameters and order only: its text is parsed as JSON,
never run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from couler import ir
from couler.errors import UserError, ValidationError
from couler.generate.catalog import CATALOG, MODELS
from couler.generate.planner import GenerationReport
from couler.generate.spec import SPEC_SCHEMA, assemble, parse_spec

__all__ = ["Complete", "Message", "generate_with_llm", "system_prompt"]

Message = dict[str, str]
Complete = Callable[[Sequence[Message]], str]


def system_prompt() -> str:
    """The instructions: decompose, pick catalog entries, answer with JSON only."""
    entries = "\n".join(
        f"- {e.name} ({e.kind}): {e.description}; params: "
        f"{', '.join(f'{k} (default {v})' for k, v in e.params.items()) or 'none'}"
        for e in CATALOG.values())
    return (
        "You turn a machine-learning request into a workflow of catalog steps.\n"
        "First decompose the request into sub-tasks (data loading, data processing, model "
        "training, evaluation, selection); then pick one catalog entry per sub-task.\n"
        f"Catalog:\n{entries}\n"
        f"Models: {', '.join(MODELS)}.\n"
        "Order steps with 'after' (names of earlier steps). Data flows by kind: preprocess "
        "after load-table, train / train-trial after preprocess, evaluate after train, "
        "select-best after evaluate or train-trial steps. A sweep is a train-trial step "
        "with \"sweep\": {\"param\": ..., \"values\": [...]}. Hyperparameter tuning "
        "(\"tune with N trials\", Bayesian optimization, random search) is a train-trial "
        "step with \"tune\": {\"trials\": N, \"sampler\": \"tpe\" or \"random\"} and no "
        "select-best step: it outputs its best setting itself.\n"
        "Put the data source (a path or URL) in \"table\".\n"
        "Answer with one JSON object and nothing else, matching this JSON schema:\n"
        + json.dumps(SPEC_SCHEMA, sort_keys=True))


def generate_with_llm(text: str, complete: Complete, *, max_rounds: int = 3,
                      check: Callable[[ir.Workflow], None] | None = None,
                      name: str = "") -> tuple[ir.Workflow, GenerationReport]:
    """Generate a workflow for ``text`` with ``complete``; raise when no valid one results.

    ``check`` runs extra validation (e.g. the target engine's capability check) and
    raises a UserError whose message is sent back for repair.
    """
    if not text.strip():
        raise UserError("generate: the request text is empty")
    workflow = name or "generated"
    messages: list[Message] = [
        {"role": "system", "content": system_prompt()},
        {"role": "user", "content": text.strip()},
    ]
    last_error = ""
    for round_no in range(1, max_rounds + 1):
        answer = complete(messages)
        try:
            spec = parse_spec(answer, workflow)
            wf = assemble(spec)
            if check is not None:
                check(wf)
        except ValidationError as exc:
            last_error = "\n".join(str(i) for i in exc.issues) or str(exc)
        except UserError as exc:
            last_error = str(exc)
        else:
            entries = tuple(dict.fromkeys(s.entry for s in spec.steps))
            subtasks = tuple(f"{s.name}: {CATALOG[s.entry].description}" for s in spec.steps)
            return wf, GenerationReport(subtasks, entries, planner="llm", rounds=round_no)
        messages.append({"role": "assistant", "content": answer})
        messages.append({"role": "user", "content":
                         "That answer is not valid:\n" + last_error +
                         "\nAnswer again with the corrected JSON object only."})
    raise UserError(f"generate: no valid workflow after {max_rounds} rounds; last errors:\n"
                    + last_error)
