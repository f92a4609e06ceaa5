"""Models: `GET /v1/models` and `GET /v1/models/{model_id}`, as OpenAI lists them."""

from __future__ import annotations

from fastapi import APIRouter

from api.errors import ApiError
from api.protocol import MODEL_IDS, ModelCard, ModelList, model_cards
from api.routes.dependencies import AUTHORIZED

model_router = APIRouter(dependencies=AUTHORIZED)


@model_router.get("/v1/models", response_model=ModelList)
async def models() -> ModelList:
    return ModelList(data=model_cards())


@model_router.get("/v1/models/{model_id}", response_model=ModelCard)
async def model(model_id: str) -> ModelCard:
    for card in model_cards():
        if card.id == model_id:
            return card
    raise ApiError(404, f"The model {model_id!r} does not exist; this server has {', '.join(MODEL_IDS)}.",
                   param="model", code="model_not_found")
