"""What every model of a request body shares: strict JSON types, unused fields ignored, and
the marker of fields the model never reads as text."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

# Pydantic's strict mode: no coercion between JSON types (a boolean is not a number, a number
# not a string), as OpenAI answers; an integer still passes where a number is expected. Every
# request model sets it, so fields added later inherit it.
STRICT_TYPES = ConfigDict(strict=True)


class Lenient(BaseModel):
    """Ignore fields we do not use (clients send many: ids, status, client_metadata...), but
    take the ones we use only with their JSON type."""

    model_config = ConfigDict(**STRICT_TYPES, extra="ignore")


class Opaque:
    """Marks a field the model never reads as text (``Annotated[str, OPAQUE]``): a sealed blob,
    which the server opens with its key or treats as one it cannot open. It is never tokenized,
    so the rule for text the tokenizer reads (serve_app.serving.admission.responses.check_text)
    passes over it."""

    def __repr__(self) -> str:
        return "OPAQUE"


OPAQUE = Opaque()


# The longest item id a client may choose. The store keeps any id up to it (and indexes it:
# 256 characters fit a PostgreSQL index entry); longer is a 400 naming the item's `id`.
MAX_ITEM_ID_LENGTH = 256
ItemId = Annotated[str, Field(max_length=MAX_ITEM_ID_LENGTH)]
