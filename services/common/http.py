"""Shapes shared by the orchestrator's and the dashboard's HTTP APIs."""

from __future__ import annotations

from fastapi import HTTPException


def unprocessable(location: str, name: str, message: str) -> HTTPException:
    """A 422 in the shape both APIs' OpenAPI schemas promise for one (FastAPI's validation error:
    a list of {loc, msg, type}), for the checks a parameter's type cannot express."""
    return HTTPException(422, [{"loc": [location, name], "msg": message, "type": "value_error"}])
