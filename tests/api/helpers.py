"""Assertions shared by the API tests."""

from __future__ import annotations

import io
from typing import Any

import httpx
from PIL import Image

__all__ = ["assert_error", "decode", "near"]


def assert_error(response: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    """The response is ``status`` with the error body of API.md, of type ``kind``."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"type", "message", "request_id"}, error
    assert error["type"] == kind, error
    assert error["message"] and isinstance(error["message"], str)
    assert error["request_id"].startswith("req_")
    assert response.headers["x-request-id"] == error["request_id"]
    return error


def decode(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


def near(pixel: Any, expected: tuple[int, int, int], tolerance: int = 24) -> bool:
    return all(abs(int(p) - e) <= tolerance for p, e in zip(pixel, expected, strict=True))
