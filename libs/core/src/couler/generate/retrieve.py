"""Retrieval of catalog templates for a sub-task: lexical scoring with a category prior.

A sub-task's words are matched against each template's keywords (phrases count whole,
and more when longer), its name and its description, on light stems; the clause's verb
gives the category it most likely belongs to (``download`` → ingest, ``fine-tune`` →
train, ``publish`` → deliver), which adds to that category's templates. Retrieval is
lexical only: the embedding models that run here come as wheels of a size the core
library should not carry, and the catalog's keywords are written for this matching —
the planner reports its top choices and scores (``couler generate --explain``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from couler.generate.parse import stem, words
from couler.generate.templates import Template

__all__ = ["Retriever", "category_of"]

def _wordset(text: str) -> frozenset[str]:
    return frozenset(text.split())


_VERB_CATEGORY = {
    **dict.fromkeys(_wordset(
        "download fetch pull grab get query scrape crawl ingest collect harvest "
        "consume read obtain stream export dump capture load"), "ingest"),
    **dict.fromkeys(_wordset(
        "train fine-tune finetune fit retrain pretrain distill tune backtest "
        "forecast launch"), "train"),
    **dict.fromkeys(_wordset(
        "evaluate benchmark validate test measure grade compare calibrate rank "
        "infer "
        "average collate keep choose select pick retain assess judge"), "evaluate"),
    **dict.fromkeys(_wordset(
        "deploy publish push register promote release notify email post send page "
        "upsert upload write store save persist serve open alert archive append "
        "report ping roll file"), "deliver"),
}
_STOP = _wordset("a an the of to in on for from with and or by at as into it its this that "
                  "them their our we all each every any is are be using via")


# Verbs every template of their category could answer to: they say nothing about which.
_GENERIC_VERBS = _wordset("pull fetch load read get grab download push write send publish save "
                          "store put run use take make do")


def category_of(verb: str) -> str:
    """The catalog category a verb usually asks for ("" when it says nothing)."""
    return _VERB_CATEGORY.get(verb.lower(), "process" if verb else "")


class Retriever:
    """Ranks the templates of a catalog for a sub-task."""

    def __init__(self, templates: Mapping[str, Template]) -> None:
        if not templates:
            raise ValueError("the catalog is empty")
        self.templates = dict(sorted(templates.items()))
        self._keys = {
            name: [tuple(stem(w) for w in words(k)) for k in t.keywords if words(k)]
            for name, t in self.templates.items()}
        self._names = {name: {stem(w) for w in re.split(r"[-_]", name) if len(w) > 2}
                       for name in self.templates}
        self._descriptions = {name: {stem(w) for w in words(t.description)} - _STOP
                              for name, t in self.templates.items()}

    def search(self, text: str, *, verb: str = "", category: str = "", limit: int = 5,
               allow: Callable[[Template], bool] | None = None) -> list[tuple[Template, float]]:
        """The best templates for ``text`` (best first, never empty), with their scores.

        ``category`` restricts the search to one category when it has templates; ``allow``
        to the templates it accepts.
        """
        tokens = [stem(w) for w in words(text) if w not in _STOP]
        # "BERT-base", "ResNet-50", "xgboost_v2", "NDCG@10": the parts name things too
        present = set(tokens) | {stem(p) for w in words(text) if re.search(r"[-_@]", w)
                                 for p in re.split(r"[-_@]+", w) if len(p) > 2
                                 and not p.isdigit() and p not in _STOP}
        # names of systems and tools ("Snowflake", "XGBoost") say more than common words
        named = {stem(w.lower()) for w in re.findall(r"(?<!^)(?<![.!?]\s)\b[A-Z][\w.+-]*", text)}
        joined = " " + " ".join(tokens) + " "
        prior = category or category_of(verb)
        scored: list[tuple[float, str]] = []
        for name, t in self.templates.items():
            if (category and t.category != category) or (allow is not None and not allow(t)):
                continue
            score = 0.0
            for key in self._keys[name]:
                if len(key) > 1 and f" {' '.join(key)} " in joined:
                    score += 1.5 * len(key) + 1
                elif len(key) == 1 and key[0] in present:
                    score += 2.0 if len(key[0]) > 3 else 1.0
                    if key[0] in named:
                        score += 2.0
            score += 0.5 * len(self._names[name] & present)
            score += 0.2 * len(self._descriptions[name] & present)
            if verb and verb not in _GENERIC_VERBS and (stem(verb) in self._names[name] or any(
                    key == (stem(verb),) for key in self._keys[name])):
                score += 2.0  # the clause's own verb names what the template does
            if prior and t.category == prior:
                score += 2.5
            scored.append((score, name))
        if not scored and (category or allow is not None):
            return self.search(text, verb=verb, limit=limit)
        if not scored:
            raise ValueError("the catalog is empty")
        scored.sort(key=lambda p: (-p[0], p[1]))
        return [(self.templates[n], s) for s, n in scored[:limit]]
