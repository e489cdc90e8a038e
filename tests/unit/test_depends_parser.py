"""``couler.api.depends``: Argo's enhanced ``depends`` syntax, term by term and error by error.

Expected trees and messages are written from the grammar in the module's docstring and
Argo's meanings (a bare ``A`` is the default edge, ``A.Succeeded`` means it ran).
"""

from __future__ import annotations

import pytest

from couler import ir
from couler.api.depends import DEPENDS_STATUSES, depends_steps, parse_depends
from couler.errors import UserError

E = ir.EdgeCondition
T = ir.DependsTerm


@pytest.mark.parametrize(("status", "condition"), [
    ("Succeeded", E.SUCCEEDED_ONLY), ("Failed", E.FAILED), ("Errored", E.ERRORED),
    ("Skipped", E.SKIPPED), ("Omitted", E.OMITTED), ("Completed", E.COMPLETED),
    ("AnySucceeded", E.ANY_SUCCEEDED), ("AllFailed", E.ALL_FAILED),
])
def test_each_status_maps_to_its_edge_condition(status: str, condition: ir.EdgeCondition,
                                                ) -> None:
    assert parse_depends(f"a.{status}") == (T("a", condition), (ir.Dependency("a", condition),))


def test_the_statuses_are_argos_without_daemoned() -> None:
    argo = {"Succeeded", "Failed", "Errored", "Skipped", "Omitted", "Completed",
            "AnySucceeded", "AllFailed"}
    assert argo == DEPENDS_STATUSES


def test_a_bare_step_is_the_default_edge() -> None:
    assert parse_depends("a") == (T("a", E.SUCCEEDED), (ir.Dependency("a", E.SUCCEEDED),))


def test_and_binds_tighter_than_or_and_runs_are_flattened() -> None:
    expr, _ = parse_depends("a || b && c || d")
    assert expr == ir.DependsAny((T("a"), ir.DependsAll((T("b"), T("c"))), T("d")))
    expr, _ = parse_depends("a && b && c")
    assert expr == ir.DependsAll((T("a"), T("b"), T("c")))
    expr, _ = parse_depends("(a || b) || (c && d) && e")
    # a parenthesized run of the same operator is flattened into it (associativity)
    assert expr == ir.DependsAny((T("a"), T("b"), ir.DependsAll((T("c"), T("d"), T("e")))))
    expr, _ = parse_depends("(a && b) && c")
    assert expr == ir.DependsAll((T("a"), T("b"), T("c")))


def test_not_applies_to_the_next_unary_only() -> None:
    expr, _ = parse_depends("!a && !!(b || c.Failed)")
    assert expr == ir.DependsAll((ir.DependsNot(T("a")), ir.DependsNot(ir.DependsNot(
        ir.DependsAny((T("b"), T("c", E.FAILED)))))))


def test_spaces_anywhere_and_none_at_all() -> None:
    spaced, _ = parse_depends("  ( a.Failed ||b )&&c  ")
    tight, _ = parse_depends("(a.Failed||b)&&c")
    assert spaced == tight == ir.DependsAll(
        (ir.DependsAny((T("a", E.FAILED), T("b"))), T("c")))


def test_the_dependencies_list_each_step_once_in_order_of_first_mention() -> None:
    _, deps = parse_depends("c.Failed && (a || c.Failed) && b.Skipped && !a")
    assert deps == (ir.Dependency("c", E.FAILED), ir.Dependency("a", E.SUCCEEDED),
                    ir.Dependency("b", E.SKIPPED))


def test_a_step_named_with_two_conditions_depends_on_any_outcome() -> None:
    _, deps = parse_depends("a.Succeeded || a.Failed")
    assert deps == (ir.Dependency("a", E.ANY),)


def test_step_names_are_sanitized_like_the_api_sanitizes_them() -> None:
    expr, deps = parse_depends("Train_Model.Failed")
    assert expr == T("train-model", E.FAILED)
    assert deps == (ir.Dependency("train-model", E.FAILED),)
    assert depends_steps(parse_depends("step-1 && x9")[0]) == {"step-1", "x9"}


def test_depends_steps_reaches_every_term() -> None:
    expr, _ = parse_depends("!(a || b.Failed) && (c && !d)")
    assert depends_steps(expr) == {"a", "b", "c", "d"}


@pytest.mark.parametrize("text", ["", "   ", "\t\n"])
def test_an_empty_expression_is_refused(text: str) -> None:
    with pytest.raises(UserError, match=r"^depends expression is empty$"):
        parse_depends(text)


def test_a_non_string_is_refused_as_empty() -> None:
    with pytest.raises(UserError, match=r"^depends expression is empty$"):
        parse_depends(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "message"), [
    ("a && ", "depends expression 'a && ': expected a step name, '!' or '(' at position "
              "5, found the end"),
    ("a b", "depends expression 'a b': expected '&&', '||' or the end at position 2, "
            "found 'b'"),
    ("(a || b", "depends expression '(a || b': expected ')' at position 7, found the end"),
    ("(a b)", "depends expression '(a b)': expected ')' at position 3, found 'b'"),
    ("(a !b)", "depends expression '(a !b)': expected ')' at position 3, found '!'"),
    ("a && )", "depends expression 'a && )': expected a step name, '!' or '(' at "
               "position 5, found ')'"),
    ("a &&  $b", "depends expression 'a &&  $b': unexpected character '$' at position 6"),
    ("a & b", "depends expression 'a & b': unexpected character '&' at position 2"),
    ("a.Bogus", "depends expression 'a.Bogus': unknown status 'Bogus' at position 0; use "
                "one of ['AllFailed', 'AnySucceeded', 'Completed', 'Errored', 'Failed', "
                "'Omitted', 'Skipped', 'Succeeded']"),
    ("x ||  a.Daemoned", "depends expression 'x ||  a.Daemoned': unknown status "
                         "'Daemoned' at position 6 (not supported by Couler's IR); use one "
                         "of ['AllFailed', 'AnySucceeded', 'Completed', 'Errored', 'Failed', "
                         "'Omitted', 'Skipped', 'Succeeded']"),
])
def test_errors_name_the_position_and_what_was_found(text: str, message: str) -> None:
    with pytest.raises(UserError) as err:
        parse_depends(text)
    assert str(err.value) == message


def test_a_term_keeps_no_status_after_the_dot_when_none_is_given() -> None:
    with pytest.raises(UserError, match=r"unexpected character '\.' at position 1$"):
        parse_depends("a.")
