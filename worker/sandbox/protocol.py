"""What the parent and the sandbox child say to each other: one request model and one reply model per op.

A request model names its op (`op`) and, through its generic argument, its reply model (`reply_type`); defining one
registers it in REQUESTS. The child validates every request before serving it (worker.sandbox.child) and the parent
validates every reply against the op's reply model (worker.sandbox.runner): the child runs the submission, so a
reply is hostile data until it validates, and one that does not is never read field by field.

The models hold the frame's data, not its transport: tensors still travel as worker.sandbox.framing,
worker.sandbox.spill and worker.sandbox.device_share carry them, and are validated once they are tensors again.
Reply models are strict (no "3" for 3, no tuple for a list) and forbid unknown fields; a reply's tensors must be
plain torch.Tensor (the child sends copies, never subclasses). The ops of other packages define their models next
to their handler (the canary's: worker.canary.child_ops); handlers register in worker.sandbox.registry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, ClassVar, Generic, Literal, TypeVar

import torch
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator


def _plain_tensor(t: torch.Tensor) -> torch.Tensor:
    # a subclass can run code when the parent touches it, or defer work into the parent's checks
    if type(t) is not torch.Tensor:
        raise ValueError(f"a {type(t).__name__}, not a plain torch.Tensor")
    return t


PlainTensor = Annotated[torch.Tensor, AfterValidator(_plain_tensor)]


class Reply(BaseModel):
    """Base of every op's reply (the fields of a frame with ok=True, less `ok` and `nonce`)."""

    model_config = ConfigDict(extra="forbid", strict=True, arbitrary_types_allowed=True)

    def wire(self) -> dict[str, Any]:
        """The frame's fields; tensors stay the objects they are (framing, spill and device_share carry them)."""
        return self.model_dump()


ReplyT = TypeVar("ReplyT", bound=Reply)

# every request model by op name, filled as the models are defined
REQUESTS: dict[str, type[Request[Any]]] = {}


class Request(BaseModel, Generic[ReplyT]):
    """Base of every op's request: `class CallRequest(Request[CallReply])` with `op = "call"`."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    op: ClassVar[str] = ""
    reply_type: ClassVar[type[Reply]] = Reply

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if not cls.op:  # the parametrised base itself (Request[CallReply]), not an op's model
            return
        cls.reply_type = _reply_argument(cls)
        known = REQUESTS.get(cls.op)
        if known is not None and known.__qualname__ != cls.__qualname__:
            raise TypeError(f"two request models for op '{cls.op}': {known.__qualname__} and {cls.__qualname__}")
        REQUESTS[cls.op] = cls

    def wire(self) -> dict[str, Any]:
        """The frame's fields, less `op` and `nonce` (the runner adds them)."""
        return self.model_dump()


def _reply_argument(cls: type[Request[Any]]) -> type[Reply]:
    """The reply model a request model was declared with (`Request[ThatReply]`)."""
    for base in cls.__mro__:
        meta = getattr(base, "__pydantic_generic_metadata__", None)
        if meta and meta.get("origin") is Request and meta.get("args"):
            reply = meta["args"][0]
            if isinstance(reply, type) and issubclass(reply, Reply) and reply is not Reply:
                return reply
    raise TypeError(f"{cls.__qualname__} (op '{cls.op}') does not name its reply model: subclass Request[ItsReply]")


class ErrorReply(Reply):
    """A frame with ok=False. `harness`: the child could not serve the request (unknown op, malformed request);
    `submission`: serving it raised (the submission's import, its kernel, or anything it broke)."""

    kind: Literal["harness", "submission"]
    error: str
    traceback: str = ""


class MalformedMessage(ValueError):
    """A frame that does not validate against its op's model; the message says where, never what it held."""


def describe(err: ValidationError, limit: int = 5) -> str:
    """The first problems of a failed validation, by field: no input values (a hostile reply's strings or tensors
    are not copied into the parent's messages)."""
    problems = [
        f"{'.'.join(str(p) for p in e['loc']) or '(frame)'}: {e['msg']}"
        for e in err.errors(include_input=False, include_url=False)
    ]
    more = f" (and {len(problems) - limit} more)" if len(problems) > limit else ""
    return "; ".join(problems[:limit]) + more


def parse(model: type[Reply] | type[Request[Any]], fields: Mapping[str, Any], what: str) -> Any:
    """`fields` as `model`, or MalformedMessage naming `what` and the problems."""
    try:
        return model.model_validate(dict(fields))
    except ValidationError as err:
        raise MalformedMessage(f"malformed {what}: {describe(err)}") from None


def request_for(op: str, fields: Mapping[str, Any]) -> Request[Any]:
    """The request model of `op` made from a plain dict (worker.sandbox.runner's `request`, for scripts and
    tests); MalformedMessage for an unknown op or fields the op does not take."""
    model = REQUESTS.get(op)
    if model is None:
        raise MalformedMessage(f"unknown op '{op}' (known: {sorted(REQUESTS)})")
    request: Request[Any] = parse(model, fields, f"'{op}' request")
    return request


# --- the sandbox's own ops (handlers: worker.sandbox.ops; "warm" is served by worker.canary.child_ops) -----------


class Message(BaseModel):
    """A nested part of a request."""

    model_config = ConfigDict(extra="forbid")


class OutputSpec(Message):
    """One output buffer the child allocates: shape and torch dtype name ("float32", "bfloat16", ...)."""

    shape: list[int]
    dtype: str

    @field_validator("dtype")
    @classmethod
    def _a_dtype(cls, v: str) -> str:
        if not isinstance(getattr(torch, v, None), torch.dtype):
            raise ValueError(f"'{v}' is not a torch dtype")
        return v


def output_specs(specs: Iterable[Mapping[str, Any]]) -> list[OutputSpec]:
    """Output specs as the definitions' helpers write them ({"shape": [...], "dtype": name}), as models."""
    return [OutputSpec.model_validate(s) for s in specs]


class HelloReply(Reply):
    pid: int
    torch: str
    device_share: bool  # whether the child exports its device outputs (worker.sandbox.device_share)


class HelloRequest(Request[HelloReply]):
    """Start-up (and the liveness round trip after a reply): the child's device, and whether the parent takes
    device outputs as exported memory."""

    op: ClassVar[str] = "hello"
    device: str = "cpu"
    device_share: bool = False


class WarmReply(Reply):
    seconds: float


class WarmRequest(Request[WarmReply]):
    """First use of the device's kernels, before any submission is loaded (a spare child, off the audit's clock)."""

    op: ClassVar[str] = "warm"
    steps: int = Field(2, ge=1)


class SourceWire(Message):
    path: str  # canonical relative path, as the static stage scanned it
    content: str


class ArtifactWire(Message):
    """A C++ solution's built extension: exactly the bytes its build produced, checked against `sha256`."""

    sha256: str
    entry_symbol: str
    data: bytes


class LoadReply(Reply):
    pass


class LoadRequest(Request[LoadReply]):
    op: ClassVar[str] = "load"
    sources: list[SourceWire]
    entry_file: str
    entry_function: str
    dps: bool  # destination-passing style: outputs are allocated by the harness and passed in
    artifact: ArtifactWire | None = None


class CustomInputsReply(Reply):
    inputs: dict[str, PlainTensor]


class CustomInputsRequest(Request[CustomInputsReply]):
    """An uploaded definition's `custom_inputs_entrypoint`, run in its reference's sandbox."""

    op: ClassVar[str] = "custom_inputs"
    entrypoint: str
    seed: int
    axes_and_scalars: dict[str, int | float | bool]


class CallReply(Reply):
    tampered: list[str]  # the child's tripwire (worker.sandbox.harness.HarnessState.tampered)
    outputs: list[PlainTensor]
    exact_tensor_types: list[bool]  # per output: was it a plain tensor before the child copied it
    # per argument: a tensor, a digest ({worker.generated.DIGEST_KEY: int}) or the scalar as sent
    args_after: list[Any]
    made_digests: list[int]  # digests of the inputs the child made from recipes, in argument order
    # the first Triton interpreter op that took a bf16 operand (worker.sandbox.interpreter_bf16); None: none did
    interpreter_bf16: str | None = None


class CallRequest(Request[CallReply]):
    """One call of the loaded entry point."""

    op: ClassVar[str] = "call"
    # tensors, scalars, or recipes the child makes inputs from (worker.generated)
    args: list[Any]
    outputs: list[OutputSpec] = Field(default_factory=list)
    poison: float | None = None  # the value output buffers are pre-filled with
    noncontiguous: list[int] = Field(default_factory=list)  # argument positions handed over as strided views
    reorder: str | None = None  # an uploaded reference re-run in another honest order (worker.numerics.reorder)
    digest_after: bool = False  # every tensor input comes back as a digest, not a copy


class TimeReply(Reply):
    times_ms: list[float]
    clock: Literal["cuda_events", "wall_clock_cpu"]
    host_times_ms: list[float] | None = None
    outputs: list[PlainTensor]  # the checked calls' outputs, one call after another
    checked: list[int]
    tampered: list[str]
    made_digests: list[list[int]]  # per checked call, the digests of the inputs the child made


class TimeRequest(Request[TimeReply]):
    """`reps` timed calls, call i on its own input set: `args` holds the sets one after another, `n_args` each (one
    more set, if sent, is the warm-up calls'); without `n_args` all of `args` is one set, reused by every call."""

    op: ClassVar[str] = "time"
    args: list[Any]
    n_args: int | None = Field(None, ge=0)
    outputs: list[OutputSpec]
    poison: float | None = None
    noncontiguous: list[int] = Field(default_factory=list)
    check: list[int] = Field(default_factory=list)  # the calls whose outputs come back
    warmup: int = Field(ge=0)
    reps: int = Field(ge=1)
    flush_l2: bool = True
