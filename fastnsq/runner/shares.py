"""``--split-nsqd`` while the group runs: who holds which nsqd, changed without two connections to one nsqd.

One job: carrying out changes of the nsqd shares. A change (nsqd come or go, found by the
supervisor's lookupd polls, or a move of work) goes in two steps. First every child that
loses an nsqd lets it go: ``Consumer.disconnect_from_nsqd`` sends RDY 0 and CLS, lets its
handlers finish the messages in flight (what is left at ``drain_timeout`` is requeued) and
closes the connection, returning once nsqd has closed its side too (nsqd drops the client
from the channel, and ``/stats``, before that); the child then says so (``assigned``).
Only then do the children that gain an nsqd connect to it. So the group never holds two
connections to one nsqd; between the two steps that nsqd has none from the group (a few
milliseconds: two hops over the pipes, a connect, IDENTIFY and SUB), its messages wait in
its channel, and its ``/stats`` shows no client of the group, then the new one. A child
that dies while it lets go counts as having let go (its connections closed with it).

Moving work: each child reports its activity (:mod:`.activity`). When a child is idle
while another holds two or more nsqd that still deliver, one of those moves to the idle
child (:func:`.assign.pick_move`), one move at a time. That is what lets a group whose
nsqd hold unequal backlogs (three nsqd over two processes) finish together.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .assign import pick_move, rebalance
from .channel import Channel
from .spawning import ChildProcess

logger = logging.getLogger("fastnsq.worker")

#: Seconds past drain_timeout a child may take to say it let an nsqd go before the take goes ahead.
RELEASE_GRACE = 5.0


class Holder(Protocol):
    """What the shares need of a supervisor's slot."""

    index: int
    process: ChildProcess | None
    channel: Channel | None
    activity: dict[str, Any]
    applied: int
    sent: int
    acknowledged: asyncio.Event

    @property
    def alive(self) -> bool: ...


class Shares:
    """The nsqd each child holds (``assignments``) and the moves made so far (``moves``)."""

    def __init__(self, slots: Sequence[Holder], drain_timeout: float,
                 spawn: Callable[[Any], None]) -> None:
        self.slots = slots
        self.drain_timeout = drain_timeout
        self.assignments: dict[int, list[str]] = {slot.index: [] for slot in slots}
        self.moves = 0
        self.stopping = False
        self._spawn = spawn
        self._changing = asyncio.Lock()
        self._move_pending = False
        self._seq = 0

    def start(self, nsqd: Sequence[str]) -> None:
        """The first shares (before any child runs)."""
        self.assignments = rebalance({}, nsqd, len(self.slots))

    async def found(self, nsqd: set[str]) -> None:
        """The nsqd that exist now (a lookupd poll): a new share when they changed."""
        async with self._changing:  # after a move under way: its nsqd is between two children
            held = {address for addresses in self.assignments.values() for address in addresses}
            if nsqd != held:
                await self._change(rebalance(self.assignments, nsqd, len(self.slots)))

    async def _change(self, new: dict[int, list[str]]) -> None:
        """Every child lets go of what it loses (and says so), then the gainers connect (the lock held)."""
        kept = {index: [a for a in self.assignments.get(index, []) if a in addresses]
                for index, addresses in new.items()}
        await self._send(kept)
        if not self.stopping:
            await self._send(new)

    async def _send(self, target: dict[int, list[str]]) -> None:
        waits = []
        for index, addresses in target.items():
            if addresses == self.assignments.get(index):
                continue
            self.assignments[index] = list(addresses)  # a child (re)started from now on gets these
            logger.info("worker %d consumes from %s", index, ", ".join(addresses) or "no nsqd")
            slot = self.slots[index]
            slot.activity = {}  # what it said is about its old share: unknown until it reports again
            if slot.alive and slot.channel is not None and slot.process is not None:
                self._seq += 1
                slot.sent = self._seq
                slot.channel.send({"type": "assign", "nsqd": list(addresses), "seq": self._seq})
                waits.append(self._applied(slot, self._seq, slot.process))
        await asyncio.gather(*waits)

    async def _applied(self, slot: Holder, seq: int, process: ChildProcess) -> None:
        """Until the child says it applied ``seq``, or the process it was sent to exits."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_timeout + RELEASE_GRACE
        while slot.applied < seq and process.returncode is None and slot.process is process:
            slot.acknowledged.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                logger.warning("worker %d did not apply its nsqd assignment in %.0f s; going on", slot.index,
                               self.drain_timeout + RELEASE_GRACE)
                return
            try:
                await asyncio.wait_for(slot.acknowledged.wait(), remaining)
            except asyncio.TimeoutError:
                continue

    def reported(self, slot: Holder, activity: dict[str, Any], applied: int) -> None:
        """A child's activity; ignored while it is about a share older than the last one sent
        (a report already on its way when the new share left)."""
        if applied >= slot.sent:
            slot.activity = activity
            self.consider()

    def acknowledged(self, slot: Holder, seq: int) -> None:
        slot.applied = max(slot.applied, seq)
        slot.acknowledged.set()

    def exited(self, slot: Holder) -> None:
        slot.activity = {}
        slot.acknowledged.set()  # its connections closed with it: a release waiting on it is done

    # ---- moving work to an idle child ----------------------------------------------------

    def consider(self) -> None:
        """After a child's activity changed: start a move if one is due and none is under way."""
        if self.stopping or self._move_pending or self._changing.locked():
            return
        live = [slot for slot in self.slots if slot.alive and slot.activity]
        busy = {slot.index: slot.activity.get("busy", ()) for slot in live}
        idle = [slot.index for slot in live if slot.activity.get("idle")]
        move = pick_move({s.index: self.assignments.get(s.index, []) for s in live}, busy, idle)
        if move is not None:
            self._move_pending = True
            self._spawn(self._move(*move))

    async def _move(self, address: str, donor: int, taker: int) -> None:
        try:
            async with self._changing:
                if self.stopping or address not in self.assignments.get(donor, []):
                    return  # the shares changed since the move was picked
                logger.info("moving nsqd %s from worker %d (%d of its nsqd have messages) to worker %d (idle)",
                            address, donor, len(self.slots[donor].activity.get("busy", ())), taker)
                new = {index: list(addresses) for index, addresses in self.assignments.items()}
                new[donor].remove(address)
                new[taker] = sorted([*new.get(taker, []), address])
                self.moves += 1
                await self._change(new)
        finally:
            self._move_pending = False
