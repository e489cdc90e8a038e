"""Translate :mod:`couler.errors` to gRPC statuses and back.

Server side (:func:`status_for`), by the exception's type::

    ValidationError, UserError      INVALID_ARGUMENT
    NotFoundError                   NOT_FOUND
    ConflictError                   ALREADY_EXISTS
    UnsupportedFeatureError         FAILED_PRECONDITION
    OperationTimeoutError           DEADLINE_EXCEEDED
    RetryableError                  UNAVAILABLE
    anything else                   INTERNAL, with a generic message (the server logs it)

The status message is the exception's own (it names the workflow, step and field);
the trailing metadata ``couler-error-bin`` carries a ``couler.v1.ErrorDetail``
(the class name, a ValidationError's issues, an UnsupportedFeatureError's fields)
so a Couler client raises the very type the server raised (:func:`error_from_status`).
Other clients need only the code and the message.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc

from couler import errors
from couler.v1 import common_pb2

__all__ = ["ERROR_DETAIL_KEY", "error_from_rpc", "error_from_status", "status_for"]

ERROR_DETAIL_KEY = "couler-error-bin"
INTERNAL_MESSAGE = "internal server error (logged by the server)"

# Most specific first: the first isinstance match decides.
_CODES: tuple[tuple[type[errors.CoulerError], grpc.StatusCode], ...] = (
    (errors.NotFoundError, grpc.StatusCode.NOT_FOUND),
    (errors.ConflictError, grpc.StatusCode.ALREADY_EXISTS),
    (errors.UnsupportedFeatureError, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.UserError, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.OperationTimeoutError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.RetryableError, grpc.StatusCode.UNAVAILABLE),
)

# The classes a client can rebuild from ErrorDetail.kind.
_KINDS: dict[str, type[errors.CoulerError]] = {
    cls.__name__: cls
    for cls in (
        errors.UserError,
        errors.InvalidWorkflowError,
        errors.ValidationError,
        errors.UnsupportedFeatureError,
        errors.NotFoundError,
        errors.ConflictError,
        errors.RetryableError,
        errors.OperationTimeoutError,
    )
}

# grpc's words for a message over the size limit (either side's): RESOURCE_EXHAUSTED, but
# not a shortage that passes.
_TOO_LARGE = "larger than max"

# Without an ErrorDetail (another server, or a status the server's grpc layer set).
_BY_CODE: dict[grpc.StatusCode, type[errors.CoulerError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.UserError,
    grpc.StatusCode.NOT_FOUND: errors.NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: errors.ConflictError,
    grpc.StatusCode.FAILED_PRECONDITION: errors.UserError,
    grpc.StatusCode.OUT_OF_RANGE: errors.UserError,
    grpc.StatusCode.UNAUTHENTICATED: errors.UserError,
    grpc.StatusCode.PERMISSION_DENIED: errors.UserError,
    grpc.StatusCode.UNIMPLEMENTED: errors.UserError,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.OperationTimeoutError,
    grpc.StatusCode.UNAVAILABLE: errors.RetryableError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.RetryableError,
    grpc.StatusCode.ABORTED: errors.RetryableError,
}


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str, tuple[tuple[str, bytes], ...]]:
    """The status code, message and trailing metadata that report ``exc`` to a client."""
    if not isinstance(exc, errors.CoulerError):
        return grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE, ()
    code = next((c for cls, c in _CODES if isinstance(exc, cls)), grpc.StatusCode.INTERNAL)
    if code is grpc.StatusCode.INTERNAL:  # a bare CoulerError: a bug, not the caller's fault
        return code, INTERNAL_MESSAGE, ()
    detail = common_pb2.ErrorDetail(kind=_kind_of(exc))
    if isinstance(exc, errors.ValidationError):
        detail.issues.extend(
            common_pb2.Issue(workflow=i.workflow, step=i.step, field=i.field, message=i.message)
            for i in exc.issues
        )
    elif isinstance(exc, errors.UnsupportedFeatureError):
        detail.engine, detail.workflow = exc.engine, exc.workflow
        detail.step, detail.feature = exc.step, exc.feature
    return code, str(exc), ((ERROR_DETAIL_KEY, detail.SerializeToString()),)


def _kind_of(exc: errors.CoulerError) -> str:
    """The nearest class of ``exc`` a client knows how to rebuild."""
    for cls in type(exc).__mro__:
        if cls.__name__ in _KINDS and _KINDS[cls.__name__] is cls:
            return cls.__name__
    return ""


def error_from_status(
    code: grpc.StatusCode,
    message: str,
    trailing_metadata: Iterable[tuple[str, str | bytes]] | None = None,
) -> errors.CoulerError:
    """The :mod:`couler.errors` exception for a failed call's status.

    The server's message is kept as the exception's message. With a
    ``couler-error-bin`` detail the exception has the server's class (a
    ValidationError keeps its issues); otherwise the class follows the code, and
    codes with no user or retryable meaning (INTERNAL, UNKNOWN, DATA_LOSS,
    CANCELLED) give a plain :class:`~couler.errors.CoulerError`.
    """
    detail = _detail(trailing_metadata)
    cls = _KINDS.get(detail.kind) if detail is not None else None
    exc: errors.CoulerError
    if detail is not None and cls is errors.ValidationError:
        exc = errors.ValidationError(
            [errors.Issue(i.workflow, i.step, i.field, i.message) for i in detail.issues]
        )
    elif detail is not None and cls is errors.UnsupportedFeatureError:
        exc = errors.UnsupportedFeatureError(
            detail.engine, detail.workflow, detail.step, detail.feature
        )
    elif cls is not None:
        exc = cls(message)
    else:
        exc = _BY_CODE.get(code, errors.CoulerError)(message)
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and _TOO_LARGE in message:
        # A message over the size limit fails the same way however often it is sent.
        message = (f"{message}: the message is over the gRPC size limit "
                   "(COULER_GRPC_MAX_MESSAGE_BYTES); send a large workflow by reference "
                   "(UploadWorkflow, what `couler submit` does) and read large runs by page")
        exc = errors.UserError(message)
    exc.args = (message,)  # the server's words, whatever the constructor made of them
    return exc


def error_from_rpc(err: grpc.RpcError) -> errors.CoulerError:
    """:func:`error_from_status` for a raised ``grpc.RpcError`` (sync or asyncio)."""
    if isinstance(err, grpc.aio.AioRpcError):
        return error_from_status(err.code(), err.details() or "", err.trailing_metadata())
    if isinstance(err, grpc.Call):
        return error_from_status(err.code(), err.details() or "", err.trailing_metadata())
    return errors.CoulerError(str(err))


def _detail(
    metadata: Iterable[tuple[str, str | bytes]] | None,
) -> common_pb2.ErrorDetail | None:
    for key, value in metadata or ():
        if key == ERROR_DETAIL_KEY and isinstance(value, bytes):
            detail = common_pb2.ErrorDetail()
            detail.ParseFromString(value)
            return detail
    return None
