"""The one error the text frontend raises for a bad request."""

from __future__ import annotations


class TextError(ValueError):
    """The request's text or language cannot be turned into speech; the message says why.

    `param` names the request field at fault, for the API's OpenAI-style error body.
    """

    param: str = "input"

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        if param is not None:
            self.param = param
