"""Signed messages: an HMAC-SHA256 over each message's routing key and body, under a key every
Palomino service of a stack shares ($PALOMINO_MESSAGE_KEY) and the broker does not.

The broker's password lets a client publish anything; the message key is what makes a message
Palomino's. It binds the routing key too, so a signed `Stop` for one worker cannot be re-routed
to another. Without a key nothing is signed or checked (a laptop's single-user default; `palomino
up` makes one for its own stack). A signed message is not encrypted, and a copy can be replayed
to the address it was meant for: see docs/security.md.
"""

from __future__ import annotations

import hashlib
import hmac

from palomino.errors import SnapshotError

HEADER = "palomino-mac"


class MessageKey:
    def __init__(self, secret: str) -> None:
        self._secret = secret.encode()

    def sign(self, routing_key: str, body: bytes) -> dict[str, str]:
        """The headers that carry the signature of `body` sent to `routing_key`."""
        return {HEADER: self._mac(routing_key, body)}

    def check(self, routing_key: str | None, body: bytes, headers: dict | None) -> None:
        """SnapshotError (the consumers' rejection) unless `headers` sign `body` for `routing_key`."""
        mac = (headers or {}).get(HEADER)
        if isinstance(mac, bytes):
            mac = mac.decode("ascii", "replace")
        if not isinstance(mac, str):
            raise SnapshotError(f"unsigned message (no {HEADER} header): this stack signs with PALOMINO_MESSAGE_KEY")
        if not hmac.compare_digest(mac, self._mac(routing_key or "", body)):
            raise SnapshotError("bad signature: not signed with this stack's PALOMINO_MESSAGE_KEY, or re-routed")

    def _mac(self, routing_key: str, body: bytes) -> str:
        return hmac.new(self._secret, routing_key.encode() + b"\n" + body, hashlib.sha256).hexdigest()


def sign_headers(key: MessageKey | None, routing_key: str, body: bytes) -> dict[str, str] | None:
    return key.sign(routing_key, body) if key else None


def check_signature(key: MessageKey | None, message) -> None:
    """Check an incoming aio-pika message against `key` (nothing to check without one)."""
    if key is not None:
        key.check(message.routing_key, message.body, message.headers)
