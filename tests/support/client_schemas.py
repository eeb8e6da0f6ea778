"""JSON schemas as clients write them: Pydantic models made strict the way the openai SDK
does (`to_strict_json_schema`), one per shape a grammar must handle. Shared by the
constrained-decoding tests and loadtests/bench_grammar.py."""

from __future__ import annotations

import enum
from typing import Literal

from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel


class Address(BaseModel):
    city: str
    zip: str


class Person(BaseModel):  # nested object
    name: str
    age: int
    address: Address


class LineItem(BaseModel):
    sku: str
    quantity: int
    price: float


class Order(BaseModel):  # array of objects
    order_id: str
    items: list[LineItem]


class Priority(enum.Enum):
    LOW = "low"
    HIGH = "high"


class Ticket(BaseModel):  # enums
    priority: Priority
    status: Literal["open", "closed", "blocked"]
    escalated: bool


class Profile(BaseModel):  # nullable fields
    handle: str
    bio: str | None
    followers: int | None


class Point(BaseModel):
    x: float
    y: float


class Route(BaseModel):  # $defs, one definition referred to twice
    start: Point
    end: Point
    via: list[Point]


MODELS: dict[str, type[BaseModel]] = {
    "person": Person,
    "order": Order,
    "ticket": Ticket,
    "profile": Profile,
    "route": Route,
}
SCHEMAS = {name: to_strict_json_schema(model) for name, model in MODELS.items()}
