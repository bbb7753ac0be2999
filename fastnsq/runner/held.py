"""The worker's failed batches: held and retried in-process while everything fails (issue 58).

The rule: a failure is charged to a message (a REQ, one of nsqd's attempts towards
``max_attempts`` and the dead letter) only when something else succeeded beside it. While
every try fails, the failures are the dependency's: the consumer holds (RDY 0, nothing new
handed out), the failed batches stay here, TOUCHed every third of nsqd's ``msg_timeout``, and
are retried every ``ready_check_interval`` (0.25 s) as the consumer's ``ready_check``; the
retry that succeeds ends the hold at once (full ``max_in_flight``), and no delivery was added
in nsqd.

Finding a poison message: a held batch is retried in halves (each failing round doubles the
pieces, up to :data:`MAX_PIECES`, so a round costs at most that many handler calls while the
dependency is down). In a round where some piece succeeds, a failed piece of one message is
charged (REQ at once); a failed piece of several is halved and tried again in the same round,
until the poison message stands alone beside a success. A batch of one message that fails
has nothing beside it: it is held without holding the consumer (the traffic goes on), retried
at the same pace, and charged as soon as another batch succeeds; a second failure with no
success between them holds the consumer. Anything held :data:`HOLD_LIMIT` is charged anyway
(before nsqd's ``--max-msg-timeout``, 15 min by default, would give it out again).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ..codec import Message
from ..config import LoggerLike
from ..consumer import Batch

__all__ = ["HOLD_LIMIT", "MAX_PIECES", "HeldBatches"]

#: The most pieces a held batch is cut into while every try fails: handler calls per retry round.
MAX_PIECES = 8
#: How long a message is held before its failure is charged anyway (nsqd's --max-msg-timeout,
#: 15 min by default, bounds what TOUCH can extend).
HOLD_LIMIT = 600.0
#: How long the consumer's check waits for a retry round before it answers "still failing"
#: (under the check's own 1 s timeout: a slow round is awaited again, never started twice).
ROUND_WAIT = 0.75


@dataclass
class _Piece:
    messages: list[Message]
    successes: int  # the worker's successes when these failed: more since, and their failures are their own
    since: float = field(default_factory=time.monotonic)


class HeldBatches:
    """Failed batches kept in the worker; :meth:`retry` is the consumer's ``ready_check``."""

    #: What the consumer's hold lines call :meth:`retry` (not the user's ready_check: there is none).
    check_name = "the failed batch's handler again"

    def __init__(self, run: Callable[[Batch], Awaitable[None]], msg_timeout: Callable[[], float],
                 interval: float, log: LoggerLike) -> None:
        self._run = run  # the batch handler, called as for a new batch (loop, thread or coroutine)
        self._msg_timeout = msg_timeout
        self._interval = interval
        self._log = log
        self._pieces: list[_Piece] = []
        self._round: asyncio.Task[None] | None = None
        self._round_started = 0.0
        self._keeper: asyncio.Task[None] | None = None
        #: Batches and held pieces that succeeded: what tells a poison message from an outage.
        self.successes = 0
        self._touched = time.monotonic()
        self.error: BaseException | None = None
        #: Messages charged (REQ, an attempt): failed beside a success, or held past HOLD_LIMIT.
        self.charged = 0
        #: Retries that ran the handler on a held piece.
        self.tries = 0

    def __len__(self) -> int:
        return sum(len(piece.messages) for piece in self._pieces)

    def add(self, batch: Batch, error: BaseException) -> bool:
        """A failed batch: held, in halves (a poison message shows beside a half that succeeds).
        True when the consumer should hold: two held pieces fail and nothing succeeded since."""
        self.error = error
        unanswered = [message for message in batch if not message.has_responded]  # the handler's own answers stand
        if not unanswered:
            return False
        self._pieces.extend(_Piece(half, self.successes) for half in _halves(unanswered))
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.get_running_loop().create_task(self._keep())
        return len(self._pieces) > 1

    def succeeded(self) -> None:
        """A new batch succeeded: what is held is retried now, and what fails is charged."""
        self.successes += 1
        if self._pieces:
            self._start_round()

    async def retry(self) -> None:
        """The consumer's ready_check: retry what is held; raise the handler's error while all fails."""
        round_ = self._start_round()
        done, _ = await asyncio.wait({round_}, timeout=ROUND_WAIT)
        if not done:  # still running: answer with what is known, await the same round next time
            raise self.error or RuntimeError("the held batches' retry is still running")
        round_.result()

    def _start_round(self) -> asyncio.Task[None]:
        """The round running, else a new one: the same messages are never tried twice at once."""
        if self._round is None or self._round.done():
            self._round_started = time.monotonic()
            self._round = asyncio.get_running_loop().create_task(self._retry_round())
            self._round.add_done_callback(_retrieved)
        return self._round

    async def _keep(self) -> None:
        """Retries while something is held and the consumer does not (a lone failed message:
        the traffic goes on beside it), at the check's pace, and TOUCHes."""
        while self._pieces:
            await asyncio.sleep(self._interval)
            if time.monotonic() - self._round_started >= self._interval:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._start_round())

    def requeue_all(self) -> int:
        """The worker stops: every held message back to nsqd at once; how many."""
        if self._round is not None:
            self._round.cancel()  # a handler already running in a thread ends on its own
        count = 0
        for piece in self._pieces:
            for message in piece.messages:
                if not message.has_responded:
                    message.requeue(0, backoff=False)
                    count += 1
        self._pieces = []
        return count

    async def _retry_round(self) -> None:
        self._touch_if_due()
        while self._pieces:  # batches that failed during the round are retried before the hold ends
            await self._retry_pieces()

    async def _retry_pieces(self) -> None:
        pieces, self._pieces = self._pieces, []
        while pieces:
            failed = [piece for piece in pieces if not await self._try(piece)]
            if len(failed) == len(pieces):  # everything failed: the dependency's, not the messages'
                self._pieces = self._charge_lone(_split(failed)) + self._pieces
                if not self._pieces:
                    return  # what failed was charged: nothing holds the consumer
                assert self.error is not None
                raise self.error
            self.successes += 1
            pieces = []  # something succeeded beside these: their failures are their own
            for piece in failed:
                if len(piece.messages) == 1:
                    self._charge(piece.messages)
                else:
                    pieces.extend(_Piece(half, piece.successes, piece.since) for half in _halves(piece.messages))

    async def _try(self, piece: _Piece) -> bool:
        self.tries += 1
        batch = Batch(piece.messages)
        try:
            await self._run(batch)
        except Exception as error:  # noqa: BLE001 - the user's handler: its failure is the answer
            self.error = error
            self._log.debug("held batch of %d failed again: %s: %s", len(batch), type(error).__name__, error)
            return False
        batch.finish()
        return True

    def _charge(self, messages: list[Message]) -> None:
        """REQ (an attempt in nsqd): at once, the consumer's ready_check is on."""
        for message in messages:
            if not message.has_responded:
                message.requeue(0, backoff=False)
                self.charged += 1

    def _charge_lone(self, pieces: list[_Piece]) -> list[_Piece]:
        """After a round where all failed: a message that failed alone while other batches
        succeeded is charged; so is a piece held past HOLD_LIMIT."""
        now, kept = time.monotonic(), []
        for piece in pieces:
            if len(piece.messages) == 1 and self.successes > piece.successes:
                self._charge(piece.messages)
            elif now - piece.since >= HOLD_LIMIT:
                self._log.warning("held %d message%s for %.0f s, failing alone (%s: %s): requeueing them "
                                  "(an attempt each)", len(piece.messages), "" if len(piece.messages) == 1
                                  else "s", now - piece.since, type(self.error).__name__, self.error)
                self._charge(piece.messages)
            else:
                kept.append(piece)
        return kept

    def _touch_if_due(self) -> None:
        """TOUCH every held message once a third of nsqd's msg_timeout has passed."""
        now = time.monotonic()
        if now - self._touched < self._msg_timeout() / 3:
            return
        self._touched = now
        for piece in self._pieces:
            for message in piece.messages:
                if not message.has_responded:
                    message.touch()


def _halves(messages: list[Message]) -> list[list[Message]]:
    middle = len(messages) // 2
    return [messages] if middle == 0 else [messages[:middle], messages[middle:]]


def _split(pieces: list[_Piece]) -> list[_Piece]:
    """After a round where all failed: each piece in halves while that stays within MAX_PIECES."""
    if len(pieces) * 2 > MAX_PIECES:
        return pieces
    return [_Piece(half, piece.successes, piece.since) for piece in pieces for half in _halves(piece.messages)]


def _retrieved(task: asyncio.Task[None]) -> None:
    """A round the check stopped waiting for: its error is known (self.error), not lost in the log."""
    if not task.cancelled():
        task.exception()
