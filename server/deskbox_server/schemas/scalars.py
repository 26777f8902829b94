"""Numbers and booleans of request bodies, as strict as their JSON Schema type.

Pydantic's lax mode reads ``true`` as 1, ``"12"`` as 12 and ``"yes"`` as True, so the server
accepted bodies its own OpenAPI document calls invalid. Strict mode for whole models is no
cure: FastAPI validates parsed JSON in Python mode, where strict tuples refuse JSON arrays.
These types refuse what JSON Schema refuses and keep what it allows: ``640.0`` is an integer
(agents compute coordinates by division), ``1`` a number.

Put ``IntOnly``/``NumberOnly`` after a field's constraints (``Annotated[int, Field(ge=0),
IntOnly]``): before them, pydantic could no longer document ``ge`` as ``minimum``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Strict
from pydantic_core import PydanticCustomError

__all__ = ["Bool", "Float", "Int", "IntOnly", "NumberOnly"]


def _int_not_bool_or_text(value: object) -> object:
    if isinstance(value, bool | str | bytes):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


def _number_not_bool_or_text(value: object) -> object:
    if isinstance(value, bool | str | bytes):
        raise PydanticCustomError("float_type", "Input should be a valid number")
    return value


IntOnly = BeforeValidator(_int_not_bool_or_text)
NumberOnly = BeforeValidator(_number_not_bool_or_text)
Int = Annotated[int, IntOnly]
Float = Annotated[float, NumberOnly]
Bool = Annotated[bool, Strict()]
