"""Liveness over Redis (redis.asyncio): one sorted set `palomino:[<namespace>:]alive`, each worker
(slot) scored by when its heartbeat expires.

A set rather than a key a worker: a process beats for all its slots in one command, and the
orchestrator learns who is alive in one round trip (a SCAN over 4,096 keys took nine, twice a
second). Both scripts read Redis's own clock, so hosts' clocks need not agree.
"""

from __future__ import annotations

import redis.asyncio as redis
from redis.exceptions import RedisError

from palomino.errors import TransportError
from palomino.transport.urls import redact

KEY = "palomino:alive"
# The set itself goes this long after the last heartbeat of anyone (a namespace whose workers all
# stopped leaves nothing behind).
LINGER_MS = 3_600_000

# KEYS[1] the set; ARGV: ttl (seconds), worker, ttl, worker, ...
_BEAT = f"""
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
for i = 1, #ARGV, 2 do
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[i]), ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[1], {LINGER_MS})
return #ARGV / 2
"""

# Expired members leave the set; those left are alive.
_ALIVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""


def liveness_key(namespace: str = "") -> str:
    """Stacks sharing a Redis see only their own workers (as on the broker, by namespace)."""
    return f"palomino:{namespace}:alive" if namespace else KEY


class RedisLiveness:
    def __init__(self, url: str, key: str = KEY) -> None:
        self.url, self.key = url, key
        self._redis = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self._beat = self._redis.register_script(_BEAT)
        self._alive = self._redis.register_script(_ALIVE)

    def _unreachable(self, error: Exception) -> TransportError:
        return TransportError(f"cannot reach Redis at {redact(self.url)}: {error}")

    async def heartbeat(self, worker: str, ttl: float) -> None:
        await self.heartbeat_many([worker], ttl)

    async def heartbeat_many(self, workers: list[str], ttl: float) -> None:
        """Several workers' heartbeats in one command (the slots of a multi-cell worker)."""
        if not workers:
            return
        args: list[str | float] = []
        for worker in workers:
            args += [ttl, worker]
        try:
            await self._beat(keys=[self.key], args=args)
        except (RedisError, OSError) as error:
            raise self._unreachable(error) from None

    async def alive(self) -> set[str]:
        """Workers whose heartbeat has not expired. Raises TransportError when Redis is unreachable:
        an unknown answer must never be read as 'everyone is dead'."""
        try:
            members = await self._alive(keys=[self.key])
        except (RedisError, OSError) as error:
            raise self._unreachable(error) from None
        return {m.decode() if isinstance(m, bytes) else m for m in members}

    async def close(self) -> None:
        await self._redis.aclose()
