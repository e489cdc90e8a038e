"""Parser of Argo's enhanced ``depends`` syntax into the IR's :data:`~couler.ir.DependsExpr`.

Grammar::

    expr    := and ( "||" and )*
    and     := unary ( "&&" unary )*
    unary   := "!" unary | "(" expr ")" | term
    term    := STEP ( "." STATUS )?
    STATUS  := Succeeded | Failed | Errored | Skipped | Omitted | Completed
             | AnySucceeded | AllFailed

The meanings follow Argo's: a bare ``STEP`` means "succeeded, or skipped by
its own ``when``" (Argo's plain ``depends: A``), the IR's
:attr:`~couler.ir.EdgeCondition.SUCCEEDED`; ``A.Succeeded`` means "ran and
succeeded" (:attr:`~couler.ir.EdgeCondition.SUCCEEDED_ONLY`), so a step whose
upstream was skipped by its ``when`` does not run. ``Skipped`` is a skip by the
step's own ``when``; ``Omitted`` a step not run because its dependencies did
not hold. ``AnySucceeded`` / ``AllFailed`` count the items of a map step.
``Completed`` (succeeded or failed) is Couler's. ``Daemoned`` is refused: the
IR has no daemon outcome.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from couler import ir
from couler.api.naming import sanitize
from couler.errors import UserError

__all__ = ["DEPENDS_STATUSES", "depends_steps", "parse_depends"]

_STATUS = {
    "Succeeded": ir.EdgeCondition.SUCCEEDED_ONLY,
    "Failed": ir.EdgeCondition.FAILED,
    "Errored": ir.EdgeCondition.ERRORED,
    "Skipped": ir.EdgeCondition.SKIPPED,
    "Omitted": ir.EdgeCondition.OMITTED,
    "Completed": ir.EdgeCondition.COMPLETED,
    "AnySucceeded": ir.EdgeCondition.ANY_SUCCEEDED,
    "AllFailed": ir.EdgeCondition.ALL_FAILED,
}
_UNSUPPORTED = ("Daemoned",)
DEPENDS_STATUSES = frozenset(_STATUS)  # the ``.Status`` suffixes a term may carry
_TOKEN = re.compile(r"\s*(?:(?P<op>&&|\|\||!|\(|\))|(?P<name>[A-Za-z0-9_][-A-Za-z0-9_]*)"
                    r"(?:\.(?P<status>[A-Za-z]+))?)")


@dataclass(frozen=True)
class _Tok:
    kind: str  # "op" | "term" | "end"
    text: str
    pos: int
    status: str = ""


def parse_depends(text: str) -> tuple[ir.DependsExpr, tuple[ir.Dependency, ...]]:
    """Parse an enhanced depends expression.

    Args:
        text: e.g. ``"A && (C.Succeeded || C.Failed)"``.

    Returns:
        The expression, and one dependency per step it names (in order of
        first mention; the condition is the step's only condition in the
        expression, else ANY).

    Raises:
        UserError: for bad syntax, naming the position.
    """
    tokens = _tokenize(text)
    parser = _Parser(text, tokens)
    expr = parser.parse()
    seen: dict[str, set[ir.EdgeCondition]] = {}
    for term in _terms(expr):
        seen.setdefault(term.step, set()).add(term.condition)
    deps = tuple(ir.Dependency(step, next(iter(conds)) if len(conds) == 1 else ir.EdgeCondition.ANY)
                 for step, conds in seen.items())
    return expr, deps


def _tokenize(text: str) -> list[_Tok]:
    if not isinstance(text, str) or not text.strip():
        raise UserError("depends expression is empty")
    tokens: list[_Tok] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise UserError(f"depends expression {text!r}: unexpected character "
                            f"{text[pos:].lstrip()[:1]!r} at position {_skip(text, pos)}")
        start = _skip(text, pos)
        if m.group("op"):
            tokens.append(_Tok("op", m.group("op"), start))
        else:
            status = m.group("status") or ""
            if status and status not in _STATUS:
                hint = " (not supported by Couler's IR)" if status in _UNSUPPORTED else ""
                raise UserError(f"depends expression {text!r}: unknown status {status!r} at "
                                f"position {start}{hint}; use one of {sorted(_STATUS)}")
            tokens.append(_Tok("term", m.group("name"), start, status))
        pos = m.end()
    tokens.append(_Tok("end", "", len(text)))
    return tokens


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


class _Parser:
    def __init__(self, text: str, tokens: list[_Tok]) -> None:
        self.text = text
        self.tokens = tokens
        self.i = 0

    def peek(self) -> _Tok:
        return self.tokens[self.i]

    def take(self) -> _Tok:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def error(self, tok: _Tok, expected: str) -> UserError:
        found = repr(tok.text) if tok.kind != "end" else "the end"
        return UserError(f"depends expression {self.text!r}: expected {expected} at position "
                         f"{tok.pos}, found {found}")

    def parse(self) -> ir.DependsExpr:
        expr = self.parse_or()
        if self.peek().kind != "end":
            raise self.error(self.peek(), "'&&', '||' or the end")
        return expr

    def parse_or(self) -> ir.DependsExpr:
        terms = [self.parse_and()]
        while self.peek().kind == "op" and self.peek().text == "||":
            self.take()
            terms.append(self.parse_and())
        return terms[0] if len(terms) == 1 else ir.DependsAny(tuple(_flatten(terms, ir.DependsAny)))

    def parse_and(self) -> ir.DependsExpr:
        terms = [self.parse_unary()]
        while self.peek().kind == "op" and self.peek().text == "&&":
            self.take()
            terms.append(self.parse_unary())
        return terms[0] if len(terms) == 1 else ir.DependsAll(tuple(_flatten(terms, ir.DependsAll)))

    def parse_unary(self) -> ir.DependsExpr:
        tok = self.take()
        if tok.kind == "op" and tok.text == "!":
            return ir.DependsNot(self.parse_unary())
        if tok.kind == "op" and tok.text == "(":
            expr = self.parse_or()
            close = self.take()
            if close.kind != "op" or close.text != ")":
                raise self.error(close, "')'")
            return expr
        if tok.kind == "term":
            condition = _STATUS[tok.status] if tok.status else ir.EdgeCondition.SUCCEEDED
            return ir.DependsTerm(sanitize(tok.text), condition)
        raise self.error(tok, "a step name, '!' or '('")


def _flatten(terms: list[ir.DependsExpr], kind: type[ir.DependsAll] | type[ir.DependsAny],
             ) -> list[ir.DependsExpr]:
    out: list[ir.DependsExpr] = []
    for t in terms:
        if isinstance(t, kind):
            out.extend(t.terms)
        else:
            out.append(t)
    return out


def depends_steps(expr: ir.DependsExpr) -> set[str]:
    """The steps a depends expression names."""
    return {t.step for t in _terms(expr)}


def _terms(expr: ir.DependsExpr) -> list[ir.DependsTerm]:
    if isinstance(expr, ir.DependsTerm):
        return [expr]
    if isinstance(expr, (ir.DependsAll, ir.DependsAny)):
        return [t for sub in expr.terms for t in _terms(sub)]
    return _terms(expr.term)
