"""A publish call's one deadline: from the call's start, across its waits and retries.

Issue 57: a publish failed by a connection declared dead just before its ``publish_timeout``
was retried with a timeout of its own and ended 0.2 s (``fail_fast``) or a whole timeout late.
Now the producer fixes the deadline when the call begins (on its fast paths too) and every
wait of the call (for a connection, between retries, for the answer) ends by it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..errors import ConnectionClosedError, PublishTimeoutError

__all__ = ["SWEEP_EARLY", "answer_by", "past_deadline"]

#: Seconds a call may have spent before its write and still leave its deadline to the pool's
#: sweeper (which counts publish_timeout from the write, with no timer per publish): more, and
#: the call gets a timer of its own.
SWEEP_EARLY = 0.005


async def answer_by(future: asyncio.Future[Any], deadline: float, publish_timeout: float, explicit: bool) -> Any:
    """nsqd's answer in ``future``, or :class:`PublishTimeoutError` at ``deadline`` (the loop's
    clock); ``explicit``: the caller gave a timeout of its own."""
    remaining = deadline - asyncio.get_running_loop().time()
    if not explicit and remaining >= publish_timeout - SWEEP_EARLY:
        return await future  # written in this pass: the sweeper's deadline is the call's
    # A timeout of the caller's own, or the call began earlier (a retry, a wait for a connection).
    try:
        return await asyncio.wait_for(asyncio.shield(future), max(remaining, 0))
    except asyncio.TimeoutError:
        where = "" if explicit else f" (publish_timeout={publish_timeout} s from the call's start)"
        raise PublishTimeoutError(f"no answer from nsqd within {remaining:.3f} s{where}; it may still arrive") \
            from None


def past_deadline(error: BaseException, publish_timeout: float, other_reason: bool) -> BaseException:
    """What a call raises when it stops retrying after ``error``: a connection lost while its
    deadline passed is publish()'s documented PublishTimeoutError (the message may have reached
    nsqd), not the attempt's ConnectionClosedError; anything else (no connection: nothing was
    sent; ``other_reason``: retries spent, the producer closing) is raised as it is."""
    if other_reason or not isinstance(error, ConnectionClosedError):
        return error
    timeout = PublishTimeoutError(f"no answer within publish_timeout={publish_timeout} s from the call's start "
                                  f"(the last attempt: {error}); it may still arrive")
    timeout.__cause__ = error
    return timeout
