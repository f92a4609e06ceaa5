"""The one error the text frontend raises for a bad request."""

from __future__ import annotations

from worker.request_errors import RequestFieldError


class TextError(RequestFieldError):
    """The request's text (`param` input) or language (`param` lang_code) cannot be turned into
    speech; the message says why."""

    param: str = "input"


class NothingToSay(TextError):
    """The text holds nothing to pronounce once normalized (only markup, code or emoji): an error
    for a request, but a live session just skips such a piece of its text."""

    code = "nothing_to_say"


class MarkupRefused(TextError):
    """Markup the reader refuses rather than reads aloud: an SSML or XML document that declares a
    DTD (`<!DOCTYPE>`, `<!ENTITY>`...), whose entities and external references are never expanded."""

    code = "unsupported_markup"
