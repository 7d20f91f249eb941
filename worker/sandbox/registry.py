"""The child's op handlers, registered by the modules that define them (`@op(ItsRequest)`), and the fixed list of
modules the child imports to find them.

The list is code, not configuration: the child imports exactly these modules before any submission code runs, and
nothing a submission or a request says can add a module to it. The sandbox itself imports none of them except its
own: an op of another package (the canary's training) lives with that package and registers itself from there.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Final, TypeVar

from worker.sandbox.protocol import REQUESTS, Reply, Request

# every module that serves ops in the child, by import path
OP_MODULES: Final = ("worker.sandbox.ops", "worker.canary.child_ops")

# (worker.sandbox.harness.HarnessState, the op's request model) -> the op's reply model
Handler = Callable[[Any, Any], Reply]
HandlerT = TypeVar("HandlerT", bound=Handler)

# op name -> handler; the child's dispatch table (worker.sandbox.child.OPS is this dict)
HANDLERS: dict[str, Handler] = {}


def op(request: type[Request[Any]]) -> Callable[[HandlerT], HandlerT]:
    """Register the decorated function as the handler of `request`'s op."""
    if REQUESTS.get(request.op) is not request:
        raise TypeError(f"{request.__qualname__} is not a registered request model")

    def register(handler: HandlerT) -> HandlerT:
        known = HANDLERS.get(request.op)
        if known is not None and known.__qualname__ != handler.__qualname__:
            raise TypeError(f"two handlers for op '{request.op}': {known.__qualname__} and {handler.__qualname__}")
        HANDLERS[request.op] = handler
        return handler

    return register


def load_ops() -> dict[str, Handler]:
    """Import every module of OP_MODULES (each registers its handlers); the handler table."""
    for module in OP_MODULES:
        importlib.import_module(module)
    return HANDLERS
