"""Control messages between cells and the orchestrator (exchange `palomino.control`).

Each is a versioned pydantic model, framed like a snapshot (JSON header + checksummed
payload); `kind` tells them apart. Payloads: an assignment's checkpoint (safetensors),
a checkpoint, a PNG of samples, a finished cell's mixture (safetensors).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from palomino.wire import frame

CONTROL_MAX_BYTES = 256 * 1024 * 1024  # checkpoints of large networks travel here
MAX_CELLS_PER_WORKER = 4096  # slots of one `palomino cell --cells K` (a 64×64 grid on one device)


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: Literal[1] = 1


class Register(_Message):
    kind: Literal["register"] = "register"
    worker: str
    host: str = ""
    pid: int = 0
    device: str = "cpu"
    # The process this worker is a slot of (`palomino cell --cells K`): the orchestrator gives one
    # process's slots a compact patch of the grid. Empty: a worker of one cell.
    block: str = Field("", max_length=256)
    # The process's other idle slots, registered alike: one message a process, not one a slot
    # (4,096 slots announcing themselves every 2 s were 2,048 messages a second).
    slots: list[Annotated[str, Field(max_length=256)]] = Field(default_factory=list, max_length=MAX_CELLS_PER_WORKER)


class Hello(_Message):
    """The orchestrator sees a live slot it does not know (it restarted, or a Register was lost):
    register now. Idle slots register at a falling rate, so this is how a restarted orchestrator
    finds its spares at once."""

    kind: Literal["hello"] = "hello"
    worker: str


class Assign(_Message):
    """Train cell `coord` of a rows×cols grid; the payload, if any, is the checkpoint to restore."""

    kind: Literal["assign"] = "assign"
    experiment: str
    worker: str
    config: dict[str, Any]
    coord: tuple[int, int]
    rows: int
    cols: int
    epoch: int
    restore_meta: dict[str, Any] | None = None


class Resize(_Message):
    """A new layout: move to `coord` of a rows×cols grid (epoch increases), or become a spare."""

    kind: Literal["resize"] = "resize"
    experiment: str
    worker: str
    coord: tuple[int, int] | None
    rows: int
    cols: int
    epoch: int


class Stop(_Message):
    kind: Literal["stop"] = "stop"
    experiment: str
    reason: str = ""


class Metrics(_Message):
    kind: Literal["metrics"] = "metrics"
    experiment: str
    worker: str
    record: dict[str, Any]


class _AboutCell(_Message):
    """A message about one cell of an experiment at one iteration, in the name of the worker holding it."""

    experiment: str
    worker: str
    coord: tuple[int, int]
    iteration: int


class Samples(_AboutCell):
    """Payload: a PNG of a cell's generated samples, or (`real`) of real training data."""

    kind: Literal["samples"] = "samples"
    real: bool = False


class Checkpoint(_AboutCell):
    """Payload: the cell's state as safetensors; `meta` is its JSON side."""

    kind: Literal["checkpoint"] = "checkpoint"
    meta: dict[str, Any]


class Done(_AboutCell):
    """A cell finished; payload: its neighbourhood mixture (safetensors), `mixture` its JSON side."""

    kind: Literal["done"] = "done"
    score: float
    components: list[str]
    weights: list[float]
    mixture: dict[str, Any] = Field(description="mixture.json of the cell's neighbourhood mixture")
    samples_png: str = Field("", description="base64 PNG of the mixture's samples")


class DoneAck(_AboutCell):
    """The orchestrator has this Done, or will never take it (stale, late): the cell stops re-sending it."""

    kind: Literal["done-ack"] = "done-ack"


class Failed(_Message):
    """A cell cannot go on (e.g. its data is missing); the orchestrator records why."""

    kind: Literal["failed"] = "failed"
    experiment: str
    worker: str
    reason: str
    restore_failed: bool = False  # the assigned checkpoint or snapshot did not load: try an older one
    transient: bool = False  # it could not reach the broker: handled as the worker's death, not the experiment's


ControlMessage = Annotated[
    Register | Hello | Assign | Resize | Stop | Metrics | Samples | Checkpoint | Done | DoneAck | Failed,
    Field(discriminator="kind"),
]
_ADAPTER: TypeAdapter[ControlMessage] = TypeAdapter(ControlMessage)


def encode_control(message: _Message, payload: bytes = b"") -> bytes:
    return frame.pack(message.model_dump(mode="json"), payload)


def decode_control(body: bytes, *, max_bytes: int = CONTROL_MAX_BYTES) -> tuple[ControlMessage, bytes]:
    return frame.unpack_message(body, _ADAPTER.validate_python, max_bytes=max_bytes, what="control message")
