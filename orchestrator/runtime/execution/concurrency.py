"""Concurrency on the router's event loop: which downstream calls may block it.

A BLS call that is the only one in flight may use the blocking ``InferenceRequest.exec``
(no thread hand-offs); calls that run beside others (branches under ``gather``) or under a
timeout (``asyncio.wait_for`` must be able to give up on them) must use ``async_exec``.
The context variable below says which case a call is in.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Awaitable, Iterable, List, TypeVar

T = TypeVar("T")

# True inside a branch that runs beside others or under a timeout.
_CONCURRENT: contextvars.ContextVar[bool] = contextvars.ContextVar("orchestrator_concurrent", default=False)


def in_concurrent_branch() -> bool:
    """True when the current task runs beside others or under a timeout."""
    return _CONCURRENT.get()


async def as_concurrent(coro: Awaitable[T]) -> T:
    """Await ``coro`` marked concurrent (its downstream calls must not block the loop)."""
    token = _CONCURRENT.set(True)  # reset: Python 3.12's wait_for awaits in the caller's task
    try:
        return await coro
    finally:
        _CONCURRENT.reset(token)


async def gather(coros: Iterable[Awaitable[T]]) -> List[T]:
    """``asyncio.gather`` of ``coros``, marking them concurrent when there is more than one."""
    coros = list(coros)
    if len(coros) == 1:
        return [await coros[0]]
    return await asyncio.gather(*(as_concurrent(c) for c in coros))
