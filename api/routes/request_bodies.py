"""The OpenAPI request bodies of routes that read their JSON themselves (so a bad body gets the
OpenAI error shape, not FastAPI's): each route names its model (`json_body`), and the models'
schemas join the app's components (`document_request_bodies`)."""

from __future__ import annotations

from fastapi import FastAPI
from pydantic import BaseModel

from api.protocol import (CaptionedSpeechRequest, DialogueRequest, PhonemeSpeechRequest, PhonemizeRequest,
                          SpeechRequestBody)

REQUEST_MODELS = (SpeechRequestBody, CaptionedSpeechRequest, PhonemizeRequest, PhonemeSpeechRequest, DialogueRequest)


def json_body(model: type[BaseModel]) -> dict:
    """The OpenAPI request body of a route that reads its JSON itself: `model`'s schema, which
    `document_request_bodies` adds."""
    schema = {"$ref": f"#/components/schemas/{_schema_name(model)}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _schema_name(model: type[BaseModel]) -> str:
    """The name a body's schema is documented under: its title where it sets one (OpenAI's names)."""
    return model.model_config.get("title") or model.__name__


def document_request_bodies(app: FastAPI, models: tuple[type[BaseModel], ...] = REQUEST_MODELS) -> None:
    """Put the request models (and the models they use) into the OpenAPI components, so /docs and
    client generators show every field of the bodies `json_body` names."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()  # FastAPI's, cached on the app: completed in place
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(model_schema.pop("$defs", {}))
            components[_schema_name(model)] = model_schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
