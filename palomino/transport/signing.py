"""Signed messages: an HMAC-SHA256 over each message's routing key, its sender's stream position
and its body, under a key every Palomino service of a stack shares ($PALOMINO_MESSAGE_KEY) and
the broker does not.

The broker's password lets a client publish anything; the message key is what makes a message
Palomino's. It binds the routing key too, so a signed `Stop` for one worker cannot be re-routed
to another. Each signing key object is a sender of its own (a random id, so a restarted process
is a new sender) that numbers what it signs and stamps when; a receiver refuses a copy of a
message it has taken (the same sender and number), one too far behind that sender's newest, and
one issued longer ago than `max_age` (`palomino.transport.replay`). Without a key nothing is
signed or checked (a laptop's single-user default; `palomino up` makes one for its own stack). A
signed message is not encrypted.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import secrets
import time
from collections.abc import Callable

from palomino.errors import SnapshotError
from palomino.transport.replay import MAX_AGE, ReplayGuard

HEADER = "palomino-mac"
SENDER = "palomino-sender"
SEQUENCE = "palomino-seq"
ISSUED = "palomino-at"


class MessageKey:
    def __init__(self, secret: str, *, max_age: float = MAX_AGE, clock: Callable[[], float] = time.time) -> None:
        self._secret = secret.encode()
        self.sender = secrets.token_hex(8)
        self._numbers = itertools.count(1)
        self._clock = clock
        self.replays = ReplayGuard(max_age, clock)

    def sign(self, routing_key: str, body: bytes) -> dict[str, str]:
        """The headers that carry `body`'s signature for `routing_key`, with this sender's next number."""
        stamp = {SENDER: self.sender, SEQUENCE: str(next(self._numbers)), ISSUED: f"{self._clock():.3f}"}
        return {**stamp, HEADER: self._mac(routing_key, stamp, body)}

    def check(self, routing_key: str | None, body: bytes, headers: dict | None, redelivered: bool = False) -> None:
        """SnapshotError (the consumers' rejection) unless `headers` sign `body` for `routing_key` and
        it is not a replay. `redelivered`: the broker's own flag on a message a consumer did not
        acknowledge (a copy sent again by anyone else arrives without it)."""
        headers = {k: v.decode("ascii", "replace") if isinstance(v, bytes) else v for k, v in (headers or {}).items()}
        mac = headers.get(HEADER)
        if not isinstance(mac, str):
            raise SnapshotError(f"unsigned message (no {HEADER} header): this stack signs with PALOMINO_MESSAGE_KEY")
        stamp = {name: headers.get(name) for name in (SENDER, SEQUENCE, ISSUED)}
        if not all(isinstance(value, str) for value in stamp.values()):
            raise SnapshotError(
                f"signed message without {SENDER}, {SEQUENCE} and {ISSUED}: sent by an older version of Palomino"
            )
        if not hmac.compare_digest(mac, self._mac(routing_key or "", stamp, body)):
            raise SnapshotError("bad signature: not signed with this stack's PALOMINO_MESSAGE_KEY, or re-routed")
        try:
            number, issued = int(stamp[SEQUENCE]), float(stamp[ISSUED])
        except ValueError:
            raise SnapshotError(f"signed message with an unreadable {SEQUENCE} or {ISSUED}") from None
        self.replays.admit(stamp[SENDER], number, issued, redelivered)

    def _mac(self, routing_key: str, stamp: dict, body: bytes) -> str:
        signed = "\n".join([routing_key, stamp[SENDER], stamp[SEQUENCE], stamp[ISSUED], ""]).encode() + body
        return hmac.new(self._secret, signed, hashlib.sha256).hexdigest()


def sign_headers(key: MessageKey | None, routing_key: str, body: bytes) -> dict[str, str] | None:
    return key.sign(routing_key, body) if key else None


def check_signature(key: MessageKey | None, message) -> None:
    """Check an incoming aio-pika message against `key` (nothing to check without one)."""
    if key is not None:
        key.check(message.routing_key, message.body, message.headers, bool(getattr(message, "redelivered", False)))
