"""Every error the API answers, in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

FastAPI's own `{"detail": ...}` bodies and its 422 are replaced: invalid input is a 400 that names
the field. Anything unexpected is logged with its traceback and answered as a plain 500 in the
same shape; no stack trace ever reaches a client.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from api.protocol import ErrorDetail, ErrorResponse
from api.speech.contract import KeyShareFull, Overloaded
from worker.request_errors import RequestFieldError

log = logging.getLogger("kokoro_fleet.api")

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
SERVER_ERROR = "server_error"
OVERLOADED = "overloaded_error"


class ApiError(Exception):
    """An error with everything the client needs to see; raised anywhere in serving code."""

    def __init__(self, status: int, message: str, *, type: str = INVALID_REQUEST, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def detail(self) -> ErrorDetail:
        return ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(ErrorResponse(error=self.detail()).model_dump(), status_code=self.status, headers=self.headers)


# --- the speech service's domain errors, as HTTP: the one place they get a status -------------

def overloaded_error(exc: Overloaded) -> ApiError:
    """No capacity now: 503 with when to come back, in the two headers the OpenAI client reads
    (`retry-after-ms` first, then `Retry-After` in whole seconds for everyone else). An API key at
    its share (KeyShareFull) is a 429, as OpenAI's rate limit answers (the client retries it)."""
    status, kind, code = (429, "requests", "rate_limit_exceeded") if isinstance(exc, KeyShareFull) else \
        (503, OVERLOADED, "overloaded")
    return ApiError(status, str(exc), type=kind, code=code,
                    headers={"Retry-After": str(max(1, math.ceil(exc.retry_after_s))),
                             "retry-after-ms": str(exc.retry_after_ms)})


def field_error(exc: RequestFieldError, params: dict[str, str] | None = None) -> ApiError:
    """A request field's error (the text frontend's TextError, the voices' VoiceError) as the 400
    naming that field; `params` renames the field where an endpoint calls it otherwise."""
    param = (params or {}).get(exc.param, exc.param)
    return bad_request(str(exc), param=param, code=exc.code or f"invalid_{param}")


@contextlib.contextmanager
def request_field_errors(**params: str) -> Iterator[None]:
    """Inside: a request field's error leaves as its 400 ApiError (`field_error`), for code that
    answers outside an HTTP handler (the live socket) or names the field otherwise (`params`)."""
    try:
        yield
    except RequestFieldError as e:
        raise field_error(e, params) from None


def as_api_error(exc: ApiError | Overloaded | RequestFieldError) -> ApiError:
    """What the client is told of an error: an ApiError as it is, a domain error mapped; its
    `detail()` is the OpenAI error body, for HTTP and the live socket alike."""
    if isinstance(exc, Overloaded):
        return overloaded_error(exc)
    return field_error(exc) if isinstance(exc, RequestFieldError) else exc


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


# --- reading a JSON body ----------------------------------------------------------------------

JSON_TYPES = ("application/json",)
# A client that sends a body over the limit gets its 413 only if we read what it already sent
# before answering (closing on unread data resets the connection and the client sees a broken
# pipe instead). Bodies are drained up to this many bytes, then the connection is dropped.
DRAIN_LIMIT_BYTES = 64 << 20


async def read_json_object(request: Request, max_bytes: int) -> dict[str, Any]:
    """The request body as a JSON object, checked in the order a client can fix things:
    content type (415), size (413, counted while reading, before any parsing), JSON syntax and
    top-level type (400)."""
    data = await read_json(request, max_bytes)
    if not isinstance(data, dict):
        raise bad_request(f"The request body must be a JSON object, not a JSON {json_kind(data)}.")
    return data


async def read_json(request: Request, max_bytes: int) -> Any:
    """The request body as any JSON value, checked as `read_json_object` checks it, but for its type."""
    content_type = request.headers.get("content-type", "")
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type and media_type not in JSON_TYPES and not media_type.endswith("+json"):
        await _drain(request)
        raise ApiError(415, f"Content-Type must be application/json, got {content_type!r}.",
                       code="unsupported_media_type")

    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        await _drain(request)
        raise _too_large(max_bytes)
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > max_bytes:
            await _drain(request, already=len(body))
            raise _too_large(max_bytes)

    if not body.strip():
        raise bad_request("The request body is empty; send a JSON object such as "
                          '{"model": "kokoro", "input": "Hello", "voice": "af_heart"}.')
    try:
        data = json.loads(bytes(body))
    except UnicodeDecodeError as e:
        raise bad_request(f"The request body is not valid UTF-8 (byte {e.start}).") from None
    except json.JSONDecodeError as e:
        raise bad_request(f"The request body is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}.") from None
    except RecursionError:  # the decoder recurses once per level of arrays and objects
        raise bad_request("The request body is nested too deeply to read; send a flat JSON object.") from None
    return data


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"The request body is larger than the limit of {max_bytes} bytes.", code="request_too_large")


async def _drain(request: Request, already: int = 0) -> None:
    seen = already
    try:
        async for part in request.stream():
            seen += len(part)
            if seen > DRAIN_LIMIT_BYTES:
                break
    except Exception:  # the stream was consumed or the client left: nothing more to drain
        pass


def json_kind(value: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


# --- translating validation errors ------------------------------------------------------------

def validation_error(exc: ValidationError | RequestValidationError) -> ApiError:
    """The first problem of a pydantic validation, as a 400 naming its field."""
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    kind = first.get("type", "")
    msg = str(first.get("msg", "invalid value"))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if kind == "extra_forbidden":
        return bad_request(f"Unrecognized request argument supplied: {param}.", param=param, code="unknown_parameter")
    if kind == "missing":
        return bad_request(f"Missing required parameter: {param}.", param=param, code="missing_required_parameter")
    more = f" ({len(errors) - 1} more problem{'s' if len(errors) > 2 else ''} in the request)" if len(errors) > 1 else ""
    return bad_request(f"Invalid value for {param}: {msg}.{more}" if param else f"{msg}{more}", param=param,
                       code="invalid_value")


# --- handlers -------------------------------------------------------------------------------

_STATUS_MESSAGES = {
    404: "Not found: {method} {path}. The API serves /v1/audio/speech, /v1/audio/voices and /v1/models.",
    405: "Method {method} is not allowed on {path}.",
}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(Overloaded)
    async def _overloaded(request: Request, exc: Overloaded) -> JSONResponse:
        return overloaded_error(exc).response()

    @app.exception_handler(RequestFieldError)
    async def _request_field(request: Request, exc: RequestFieldError) -> JSONResponse:
        return field_error(exc).response()

    @app.exception_handler(RequestValidationError)
    async def _request_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc).response()

    @app.exception_handler(ValidationError)
    async def _validation(request: Request, exc: ValidationError) -> JSONResponse:
        return validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        template = _STATUS_MESSAGES.get(exc.status_code)
        message = template.format(method=request.method, path=request.url.path) if template else str(exc.detail)
        kind = INVALID_REQUEST if exc.status_code < 500 else SERVER_ERROR
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return ApiError(exc.status_code, message, type=kind, code=code, headers=dict(exc.headers or {})).response()

    @app.exception_handler(ClientDisconnect)
    async def _client_left(request: Request, exc: ClientDisconnect) -> JSONResponse:
        # The client hung up while its body was arriving: nobody reads this answer, and the access
        # log records the request as disconnected (it saw the http.disconnect), not as an error.
        return client_closed_request().response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return internal_error().response()


def internal_error() -> ApiError:
    return ApiError(500, "The server had an error while processing your request. The error has been logged; "
                         "retry, and report it with the request id if it persists.",
                    type=SERVER_ERROR, code="internal_error")


def client_closed_request() -> ApiError:
    """What a request whose client left before sending all of its body ends with: nginx's 499."""
    return ApiError(499, "The client closed the connection before sending the whole request body.",
                    code="client_closed_request")
