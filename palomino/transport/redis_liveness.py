"""Liveness over Redis (redis.asyncio): `palomino:[<namespace>:]worker:<id>` keys that expire unless refreshed."""

from __future__ import annotations

import time

import redis.asyncio as redis
from redis.exceptions import RedisError

from palomino.errors import TransportError
from palomino.transport.urls import redact

PREFIX = "palomino:worker:"


def liveness_prefix(namespace: str = "") -> str:
    """Stacks sharing a Redis see only their own workers (as on the broker, by namespace)."""
    return f"palomino:{namespace}:worker:" if namespace else PREFIX


class RedisLiveness:
    def __init__(self, url: str, prefix: str = PREFIX) -> None:
        self.url, self.prefix = url, prefix
        self._redis = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)

    async def heartbeat(self, worker: str, ttl: float) -> None:
        try:
            await self._redis.set(self.prefix + worker, repr(time.time()), px=max(1, int(ttl * 1000)))
        except (RedisError, OSError) as error:
            raise TransportError(f"cannot reach Redis at {redact(self.url)}: {error}") from None

    async def heartbeat_many(self, workers: list[str], ttl: float) -> None:
        """Several workers' heartbeats in one round trip (the slots of a multi-cell worker)."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for worker in workers:
                    pipe.set(self.prefix + worker, repr(time.time()), px=max(1, int(ttl * 1000)))
                await pipe.execute()
        except (RedisError, OSError) as error:
            raise TransportError(f"cannot reach Redis at {redact(self.url)}: {error}") from None

    async def alive(self) -> set[str]:
        """Workers whose key has not expired. Raises TransportError when Redis is unreachable:
        an unknown answer must never be read as 'everyone is dead'."""
        try:
            keys = [key async for key in self._redis.scan_iter(match=self.prefix + "*", count=500)]
        except (RedisError, OSError) as error:
            raise TransportError(f"cannot reach Redis at {redact(self.url)}: {error}") from None
        return {(k.decode() if isinstance(k, bytes) else k)[len(self.prefix) :] for k in keys}

    async def close(self) -> None:
        await self._redis.aclose()
