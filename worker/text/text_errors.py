"""The one error the text frontend raises for a bad request."""

from __future__ import annotations


class TextError(ValueError):
    """The request's text or language cannot be turned into speech; the message says why.

    `param` names the request field at fault, for the API's OpenAI-style error body.
    """

    param: str = "input"
    code: str | None = None  # the API error's code, when not `invalid_<param>`

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        if param is not None:
            self.param = param


class NothingToSay(TextError):
    """The text holds nothing to pronounce once normalized (only markup, code or emoji): an error
    for a request, but a live session just skips such a piece of its text."""

    code = "nothing_to_say"


class MarkupRefused(TextError):
    """Markup the reader refuses rather than reads aloud: an SSML or XML document that declares a
    DTD (`<!DOCTYPE>`, `<!ENTITY>`...), whose entities and external references are never expanded."""

    code = "unsupported_markup"
