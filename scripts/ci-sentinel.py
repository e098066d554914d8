"""A sentinel in this machine's own RabbitMQ and Redis, planted before CI's tests and checked after:
the tests bring their own throwaway servers (tests/servers.py) and must never stop, restart or
flush these.

    python scripts/ci-sentinel.py plant STATE   # before: a key in Redis, two queues with a message each
    python scripts/ci-sentinel.py check STATE   # after: exit 1 unless all is as planted; then removes it
    python scripts/ci-sentinel.py clean STATE   # removes it unchecked (CI interrupted)

A server that does not answer at `plant` is skipped, with a message. Redis's run_id changes when it
restarts; a non-durable queue goes when RabbitMQ restarts, a durable one with its persistent message
when it is reset. SENTINEL_REDIS_URL and SENTINEL_BROKER_URL name other servers than the defaults.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import sys
from pathlib import Path

REDIS_URL = os.environ.get("SENTINEL_REDIS_URL", "redis://127.0.0.1:6379/0")
BROKER_URL = os.environ.get("SENTINEL_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672/")
TIMEOUT = 5.0


def say(message: str) -> None:
    print(f"ci-sentinel: {message}", file=sys.stderr, flush=True)


def redis_client():
    import redis

    return redis.Redis.from_url(REDIS_URL, socket_connect_timeout=TIMEOUT, socket_timeout=TIMEOUT)


def plant_redis() -> dict | None:
    import redis

    sentinel = {"key": f"palomino-ci-sentinel-{secrets.token_hex(4)}", "value": secrets.token_hex(16)}
    try:
        with redis_client() as client:
            client.set(sentinel["key"], sentinel["value"])
            sentinel["run_id"] = client.info("server")["run_id"]
    except redis.RedisError as error:
        say(f"Redis at {REDIS_URL} does not answer ({error}): no sentinel there")
        return None
    say(f"Redis: key {sentinel['key']} set")
    return sentinel


def check_redis(sentinel: dict) -> list[str]:
    import redis

    try:
        with redis_client() as client:
            value, run_id = client.get(sentinel["key"]), client.info("server")["run_id"]
    except redis.RedisError as error:
        return [f"Redis at {REDIS_URL} answered before the tests and does not now: {error}"]
    problems = []
    if run_id != sentinel["run_id"]:
        problems.append("Redis restarted during the tests (its run_id changed)")
    if value is None:
        problems.append(f"Redis key {sentinel['key']} is gone: flushed during the tests")
    elif value.decode() != sentinel["value"]:
        problems.append(f"Redis key {sentinel['key']} was overwritten during the tests")
    return problems


def clean_redis(sentinel: dict) -> None:
    with redis_client() as client:
        client.delete(sentinel["key"])


async def broker():
    import aio_pika

    return await aio_pika.connect(BROKER_URL, timeout=TIMEOUT)


async def plant_rabbitmq() -> dict | None:
    import aio_pika

    name = f"palomino-ci-sentinel-{secrets.token_hex(4)}"
    sentinel = {"durable": name, "transient": f"{name}-transient", "body": secrets.token_hex(16)}
    try:
        connection = await broker()
    except Exception as error:  # noqa: BLE001 — whatever stops the connection: no broker to guard
        say(f"RabbitMQ at {BROKER_URL.split('@')[-1]} does not answer ({error}): no sentinel there")
        return None
    async with connection:
        channel = await connection.channel()
        for queue, durable in ((sentinel["durable"], True), (sentinel["transient"], False)):
            await channel.declare_queue(queue, durable=durable)
            mode = aio_pika.DeliveryMode.PERSISTENT if durable else aio_pika.DeliveryMode.NOT_PERSISTENT
            message = aio_pika.Message(sentinel["body"].encode(), delivery_mode=mode)
            await channel.default_exchange.publish(message, routing_key=queue)
    say(f"RabbitMQ: queues {sentinel['durable']} (durable) and {sentinel['transient']} hold a message each")
    return sentinel


async def check_rabbitmq(sentinel: dict) -> list[str]:
    import aiormq

    try:
        connection = await broker()
    except Exception as error:  # noqa: BLE001
        return [f"RabbitMQ answered before the tests and does not now: {error}"]
    problems = []
    async with connection:
        for queue, why in (
            (sentinel["durable"], "deleted, or the broker reset"),
            (sentinel["transient"], "the broker restarted"),
        ):
            channel = await connection.channel()  # a missing queue closes the channel that asked
            try:
                declared = await channel.declare_queue(queue, passive=True)
            except aiormq.exceptions.ChannelNotFoundEntity:
                problems.append(f"RabbitMQ queue {queue} went during the tests: {why}")
                continue
            message = await declared.get(fail=False, no_ack=False)
            count = declared.declaration_result.message_count
            if message is None or message.body.decode() != sentinel["body"] or count != 1:
                problems.append(f"RabbitMQ queue {queue} holds {count} messages, not the one put there")
            if message is not None:
                await message.nack(requeue=True)
            await channel.close()
    return problems


async def clean_rabbitmq(sentinel: dict) -> None:
    async with await broker() as connection:
        channel = await connection.channel()
        for queue in (sentinel["durable"], sentinel["transient"]):
            await channel.queue_delete(queue)


def main(action: str, state_path: str) -> int:
    state_file = Path(state_path)
    if action == "plant":
        state = {"redis": plant_redis(), "rabbitmq": asyncio.run(plant_rabbitmq())}
        state_file.write_text(json.dumps(state))
        return 0
    state = json.loads(state_file.read_text() or "{}") if state_file.exists() else {}
    problems: list[str] = []
    if action == "check":
        if state.get("redis"):
            problems += check_redis(state["redis"])
        if state.get("rabbitmq"):
            problems += asyncio.run(check_rabbitmq(state["rabbitmq"]))
    try:
        if state.get("redis"):
            clean_redis(state["redis"])
        if state.get("rabbitmq"):
            asyncio.run(clean_rabbitmq(state["rabbitmq"]))
    except Exception as error:  # noqa: BLE001 — what the check found still decides
        say(f"the sentinel could not be removed: {error}")
    state_file.write_text("{}")  # a second clean does nothing
    for problem in problems:
        say(f"FAILED: {problem}")
    if action == "check" and not problems and (state.get("redis") or state.get("rabbitmq")):
        say("this machine's RabbitMQ and Redis are as they were before the tests")
    return 1 if problems else 0


if __name__ == "__main__":
    logging.getLogger("aio_pika").setLevel(logging.CRITICAL)  # a refused connection is said once, below
    if len(sys.argv) != 3 or sys.argv[1] not in ("plant", "check", "clean"):
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
