"""The base of the errors a request's own fields cause (its text, its language, its voice)."""

from __future__ import annotations


class RequestFieldError(ValueError):
    """A field of the request cannot be used; the message says why and how to fix it.

    `param` names the request field at fault and `code` the error's code (None: `invalid_<param>`),
    for the API's OpenAI-style error body (api/errors.py maps every such error, once).
    """

    param: str = "input"
    code: str | None = None

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        if param is not None:
            self.param = param
