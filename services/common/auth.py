"""Bearer tokens for the HTTP APIs (orchestrator and dashboard), and what counts as a placeholder.

One check for both: constant-time comparison, 401 with `WWW-Authenticate: Bearer`, and the name
of the variable that holds the token in the message, so a refused user knows what to set."""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Callable

from fastapi import HTTPException, Request

MIN_TOKEN_LENGTH = 16
# What example files ship (.env.example, values.yaml): a service started with one is one anybody can guess.
PLACEHOLDER_MARKS = ("change-me", "changeme", "change_me")


def is_placeholder(secret: str) -> bool:
    return any(mark in secret.lower() for mark in PLACEHOLDER_MARKS)


def bearer_guard(token: str | None, variable: str, *, query: bool = False) -> Callable[[Request], None]:
    """A FastAPI dependency: with a token, every request must bring it (`query`: also as ?access_token=,
    for EventSource and <img>, which cannot send headers); without one, everything passes."""

    def authorised(request: Request) -> None:
        if token is None:
            return
        header = request.headers.get("authorization", "")
        if header.lower().startswith("bearer "):
            supplied = header[7:].strip()
        else:
            supplied = request.query_params.get("access_token", "") if query else ""
        if not secrets.compare_digest(supplied.encode(), token.encode()):
            raise HTTPException(
                401,
                f"missing or wrong token: send 'Authorization: Bearer <{variable}>'",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return authorised


def check_token(token: str, variable: str) -> str:
    """The token, unless it is a placeholder or too short to resist guessing (ValueError says which)."""
    if is_placeholder(token):
        raise ValueError(
            f"{variable} is still the example's placeholder: set a real secret, e.g. `openssl rand -hex 32`"
        )
    if len(token.strip()) < MIN_TOKEN_LENGTH:
        raise ValueError(
            f"{variable} has {len(token.strip())} characters; use at least {MIN_TOKEN_LENGTH} (e.g. `openssl rand -hex 32`)"
        )
    return token.strip()


def is_loopback(host: str) -> bool:
    """Whether serving on `host` reaches this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


def refuse_placeholder_passwords(**urls: str) -> None:
    """ValueError naming the URL whose password is an example's placeholder (never the password itself)."""
    from urllib.parse import urlsplit

    for name, url in urls.items():
        password = urlsplit(url).password or ""
        if is_placeholder(password):
            raise ValueError(
                f"{name}: its password is still the example's placeholder ('change-me…'); set a real one (e.g. `openssl rand -hex 24`) in .env or the Secret"
            )
