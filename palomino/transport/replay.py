"""Replays refused in bounded memory: what a receiver remembers of the senders it heard.

Each sender numbers what it signs (palomino.transport.signing). A receiver keeps, per sender,
the highest number taken and a bitmap of the WINDOW numbers below it (IPsec's anti-replay
window, RFC 4303 §3.4.3): a number taken before, or further behind than the window, is refused.
A message issued over `max_age` ago (or more than SKEW in the future) is refused whoever sent it:
that bounds what a receiver must remember. Past SENDERS senders the least recently heard is
forgotten, and from then on a message from a sender it does not know must be newer than the
last one taken from any forgotten sender.

What this cannot tell apart: a receiver that restarts remembers nobody, so until `max_age` has
passed a copy of a message sent to it before its restart is taken again. `max_age` bounds how
long a message may wait in a queue (a scorer that starts a day after its jobs were queued needs
more than a day): one week by default, PALOMINO_MESSAGE_MAX_AGE to change it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from palomino.errors import SnapshotError

WINDOW = 4096  # numbers of one sender that may arrive out of order (through several queues)
SENDERS = 65_536  # senders remembered at once: ~0.6 kB each
MAX_AGE = 7 * 24 * 3600.0  # seconds a message may wait in a queue
SKEW = 300.0  # seconds a sender's clock may run ahead of the receiver's


@dataclass
class Stream:
    """One sender's numbers as this receiver took them."""

    newest: int = 0
    seen: int = 0  # bit k: newest - k was taken
    issued: float = -math.inf  # the newest message's issue time

    def take(self, number: int, redelivered: bool) -> str | None:
        """Take `number`; why not, if it is refused. A redelivery may be taken again."""
        if number > self.newest:
            self.seen = ((self.seen << (number - self.newest)) | 1) & ((1 << WINDOW) - 1)
            self.newest = number
            return None
        behind = self.newest - number
        if behind >= WINDOW:
            return (
                f"number {number} is {behind} behind the sender's newest ({self.newest}): too old to tell from a replay"
            )
        if self.seen >> behind & 1 and not redelivered:
            return f"number {number} was taken before: a replay"
        self.seen |= 1 << behind
        return None


class ReplayGuard:
    def __init__(self, max_age: float, clock: Callable[[], float]) -> None:
        self.max_age, self._clock = max_age, clock
        self._streams: OrderedDict[str, Stream] = OrderedDict()
        self._forgotten_until = -math.inf  # the newest issue time of a forgotten sender's messages

    def admit(self, sender: str, number: int, issued: float, redelivered: bool = False) -> None:
        """SnapshotError unless the message (`sender`'s `number`, issued at `issued`) may be taken.
        A redelivery (the broker's flag: no consumer acknowledged it) is taken even if seen."""
        now = self._clock()
        if not math.isfinite(issued) or issued > now + SKEW:
            raise SnapshotError(f"message from {sender} issued {issued - now:.0f} s in the future: the clocks disagree")
        if issued < now - self.max_age:
            raise SnapshotError(
                f"message from {sender} issued {now - issued:.0f} s ago, over the {self.max_age:.0f} s a message may wait"
                " (PALOMINO_MESSAGE_MAX_AGE)"
            )
        stream = self._streams.get(sender)
        if stream is None:
            if issued <= self._forgotten_until:
                raise SnapshotError(f"message from {sender}, a sender not heard since older ones were forgotten")
            stream = self._streams[sender] = Stream()
            while len(self._streams) > SENDERS:
                _, forgotten = self._streams.popitem(last=False)
                self._forgotten_until = max(self._forgotten_until, forgotten.issued)
        self._streams.move_to_end(sender)
        refused = stream.take(number, redelivered)
        if refused:
            raise SnapshotError(f"message from {sender}: {refused}")
        stream.issued = max(stream.issued, issued)

    def __len__(self) -> int:
        return len(self._streams)
