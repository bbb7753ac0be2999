"""Tests for fastnsq.rdy: RDY distribution and backoff, driven with a fake clock and a seeded RNG.

No sockets: :class:`Sim` stands in for the consumer and its nsqd connections. Its nsqd side
behaves like nsqd 1.x: ``RDY n`` is absolute, a message is sent while the server's in-flight
count for that connection is below ``n``, and a connection's commands (RDY, FIN/REQ) are read
in order, each within ``rdy_settle_time`` of being sent (the controller's stated assumption).
"""

from __future__ import annotations

import doctest
import itertools
import random
from collections import deque
from collections.abc import Hashable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import fastnsq.rdy
from fastnsq.errors import InvalidValueError
from fastnsq.rdy import Outcome, RdyController, RdyUpdate

SUCCESS, FAILURE, NEUTRAL = Outcome.SUCCESS, Outcome.FAILURE, Outcome.NEUTRAL


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make(
    mif: int = 1, *, settle: float = 0.0, seed: int = 7, **options: Any
) -> tuple[RdyController, FakeClock]:
    clock = FakeClock()
    ctl = RdyController(mif, clock=clock, rng=random.Random(seed), rdy_settle_time=settle, **options)
    return ctl, clock


def as_dict(updates: list[RdyUpdate]) -> dict[Hashable, int]:
    return {u.conn_id: u.rdy for u in updates}


def rdy_of(ctl: RdyController) -> dict[Hashable, int]:
    return {conn_id: s.rdy for conn_id, s in ctl.stats().items()}


class _Server:
    """nsqd's side of one connection."""

    def __init__(self, max_rdy: int) -> None:
        self.max_rdy = max_rdy
        self.rdy = 0  # the value nsqd has read
        self.in_flight: set[int] = set()
        self.commands: deque[tuple[str, int, float]] = deque()  # ("RDY", n, sent_at) / ("DONE", msg, sent_at)
        self.has_messages = True

    def read(self, count: int | None = None) -> None:
        for _ in range(len(self.commands) if count is None else min(count, len(self.commands))):
            kind, value, _ = self.commands.popleft()
            if kind == "RDY":
                self.rdy = value
            else:
                self.in_flight.discard(value)

    def read_settled(self, now: float, settle: float) -> None:
        """Read every command sent at least ``settle`` ago, in the controller's arithmetic
        (``sent + settle <= now``: ``now - settle`` can land a float below ``sent`` at the deadline)."""
        while self.commands and self.commands[0][2] + settle <= now:
            self.read(1)

    def can_send(self) -> bool:
        return self.has_messages and len(self.in_flight) < self.rdy


class Sim:
    """A consumer with its nsqd connections around one RdyController.

    It sends every returned RDY, checks the invariants each time, and calls ``tick()`` at every
    deadline the controller names while time moves on.
    """

    def __init__(self, ctl: RdyController, clock: FakeClock, settle: float) -> None:
        self.ctl = ctl
        self.clock = clock
        self.settle = settle
        self.servers: dict[int, _Server] = {}
        self.client: dict[int, set[int]] = {}  # messages in flight at the client, removed conns included
        self.sent: dict[int, int] = {}  # last RDY sent, live connections
        self.limits: list[tuple[float, int]] = [(clock.now, ctl.max_in_flight)]
        self.msg_ids = itertools.count(1)
        self.conn_ids = itertools.count(1)
        self.check_every_update = True  # run_busy checks once per step instead (speed)
        self.first_rdy_at: dict[int, float] = {}
        self.last_delivery_at: dict[int, float] = {}
        self.deliveries = 0
        self.keys: dict[int, Hashable] = {}  # the key each connection was added with
        self.per_key = False  # the controller's backoff_per_key
        self.paused: set[Hashable] = set()

    # invariants
    def window_limit(self) -> int:
        """The largest max_in_flight in force during the last rdy_settle_time."""
        now = self.clock.now
        in_force = [mif for t, mif in self.limits if t + self.settle > now]
        before = [mif for t, mif in self.limits if t + self.settle <= now]
        if before:
            in_force.append(before[-1])
        return max(in_force)

    def total_in_flight(self) -> int:
        return sum(len(msgs) for msgs in self.client.values())

    def check(self) -> None:
        assert sum(self.sent.values()) <= self.ctl.max_in_flight, (self.sent, self.ctl.max_in_flight)
        if self.ctl.in_backoff and not self.per_key:  # consumer-wide: one probe at RDY 1 in all
            holding = [n for n in self.sent.values() if n > 0]
            assert len(holding) <= 1 and sum(holding) <= 1, self.sent
        for key in set(self.keys.values()):
            members = [conn_id for conn_id in self.sent if self.keys[conn_id] == key]
            if self.ctl.backoff_level_of(key):  # a key in backoff: at most one probe at RDY 1
                holding = [self.sent[c] for c in members if self.sent[c] > 0]
                assert len(holding) <= 1 and sum(holding) <= 1, (key, self.sent)
            if key in self.paused:
                assert all(self.sent[c] == 0 for c in members), (key, self.sent)
        assert rdy_of(self.ctl) == self.sent
        assert self.ctl.in_flight == self.total_in_flight()

    def apply(self, updates: list[RdyUpdate]) -> None:
        for conn_id, count in updates:
            assert isinstance(conn_id, int)
            server = self.servers[conn_id]  # never a RDY for a connection that is gone
            assert 0 <= count <= server.max_rdy, (conn_id, count, server.max_rdy)
            server.commands.append(("RDY", count, self.clock.now))
            self.sent[conn_id] = count
            if count > 0:
                self.first_rdy_at.setdefault(conn_id, self.clock.now)
        if self.check_every_update:
            self.check()
        else:
            assert sum(self.sent.values()) <= self.ctl.max_in_flight, (self.sent, self.ctl.max_in_flight)

    # events
    def add(self, max_rdy: int = 2500, key: Hashable = None) -> int:
        conn_id = next(self.conn_ids)
        self.servers[conn_id] = _Server(max_rdy)
        self.client[conn_id] = set()
        self.sent[conn_id] = 0
        self.keys[conn_id] = key
        self.apply(self.ctl.add_connection(conn_id, max_rdy, key))
        return conn_id

    def set_paused(self, key: Hashable, paused: bool) -> None:
        (self.paused.add if paused else self.paused.discard)(key)
        self.apply(self.ctl.set_paused(key, paused))

    def remove(self, conn_id: int) -> None:
        del self.servers[conn_id]
        del self.sent[conn_id]
        self.apply(self.ctl.remove_connection(conn_id))

    def set_mif(self, mif: int) -> None:
        self.limits.append((self.clock.now, mif))
        self.apply(self.ctl.set_max_in_flight(mif))

    def deliverable(self) -> list[int]:
        for server in self.servers.values():
            server.read_settled(self.clock.now, self.settle)
        return [conn_id for conn_id, server in self.servers.items() if server.can_send()]

    def deliver(self, conn_id: int) -> int:
        assert conn_id in self.deliverable()
        msg = next(self.msg_ids)
        self.servers[conn_id].in_flight.add(msg)
        self.client[conn_id].add(msg)
        self.deliveries += 1
        self.last_delivery_at[conn_id] = self.clock.now
        # The invariant the controller promises (module docstring of fastnsq.rdy).
        assert self.total_in_flight() <= self.window_limit(), (self.total_in_flight(), self.limits)
        self.apply(self.ctl.on_message(conn_id, msg))
        return msg

    def finish(self, conn_id: int, msg: int, outcome: Outcome = SUCCESS, rdy_first: bool = False) -> None:
        self.client[conn_id].remove(msg)
        updates = self.ctl.on_message_done(conn_id, msg, outcome)
        server = self.servers.get(conn_id)
        if server is not None and not rdy_first:
            server.commands.append(("DONE", msg, self.clock.now))
        self.apply(updates)
        if server is not None and rdy_first:
            server.commands.append(("DONE", msg, self.clock.now))

    def finish_all(self, outcome: Outcome = SUCCESS) -> None:
        for conn_id, msgs in list(self.client.items()):
            for msg in sorted(msgs):
                self.finish(conn_id, msg, outcome)

    def advance(self, seconds: float) -> None:
        """Move time on, calling tick() at each deadline on the way (as the consumer's timer would)."""
        end = self.clock.now + seconds
        while True:
            deadline = self.ctl.next_deadline()
            if deadline is None or deadline > end:
                break
            self.clock.now = max(self.clock.now, deadline)
            for server in self.servers.values():
                server.read_settled(self.clock.now, self.settle)
            self.apply(self.ctl.tick())
        self.clock.now = end

    def run_busy(self, seconds: float, step: float = 0.1, handler_time: float = 0.0) -> None:
        """Every connection has messages; handlers finish ``handler_time`` after delivery (SUCCESS)."""
        started: dict[int, float] = {}
        end = self.clock.now + seconds
        self.check_every_update = False
        while self.clock.now < end:
            for conn_id, msgs in list(self.client.items()):
                for msg in sorted(msgs):
                    if self.clock.now - started.get(msg, -1e9) >= handler_time:
                        self.finish(conn_id, msg)
            for server in self.servers.values():
                server.read()
            while True:
                ready = [c for c in self.deliverable() if self.servers[c].has_messages]
                if not ready:
                    break
                for conn_id in ready:
                    if self.servers[conn_id].can_send():
                        started[self.deliver(conn_id)] = self.clock.now
            self.advance(step)
            self.check()
        self.check_every_update = True


# -- construction ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [
        (
            "low_rdy_idle_timeout",
            0.5,
            "low_rdy_idle_timeout must be a number of seconds in [1, 300], got 0.5",
        ),
        ("low_rdy_idle_timeout", 301, "[1, 300], got 301"),
        ("low_rdy_timeout", 0, "low_rdy_timeout must be a number of seconds in [1, 300], got 0"),
        (
            "rdy_redistribute_interval",
            6.0,
            "rdy_redistribute_interval must be a number of seconds in [0.001, 5]",
        ),
        ("rdy_redistribute_interval", 0.0005, "got 0.0005"),
        ("max_backoff_duration", -1, "max_backoff_duration must be a number of seconds in [0, 3600], got -1"),
        ("max_backoff_duration", 3601, "got 3601"),
        (
            "backoff_multiplier",
            float("nan"),
            "backoff_multiplier must be a number of seconds in [0, 3600], got nan",
        ),
        ("backoff_multiplier", "1s", "got '1s'"),
        ("rdy_settle_time", True, "rdy_settle_time must be a number of seconds in [0, 60], got True"),
        ("backoff_strategy", "pynsq", "backoff_strategy must be one of"),
        ("clock", 1.0, "clock must be a callable"),
        ("rng", 42, "rng must be a random.Random or None, got 42"),
    ],
)
def test_bad_options_are_rejected_with_name_value_and_range(
    option: str, value: object, fragment: str
) -> None:
    options: dict[str, Any] = {option: value}
    with pytest.raises(InvalidValueError) as info:
        RdyController(1, **options)
    assert fragment in str(info.value)


@pytest.mark.parametrize("value", [-1, 1.5, True, "3", None])
def test_bad_max_in_flight_is_rejected(value: object) -> None:
    with pytest.raises(InvalidValueError, match=r"max_in_flight must be an int >= 0 \(0 pauses\), got"):
        RdyController(value)  # type: ignore[arg-type]
    ctl, _ = make(1)
    with pytest.raises(InvalidValueError, match="max_in_flight"):
        ctl.set_max_in_flight(value)  # type: ignore[arg-type]
    assert ctl.max_in_flight == 1


def test_go_nsq_bounds_themselves_are_accepted() -> None:
    ctl = RdyController(
        0,
        low_rdy_idle_timeout=1,
        low_rdy_timeout=300,
        rdy_redistribute_interval=0.001,
        max_backoff_duration=3600,
        backoff_multiplier=0,
        rdy_settle_time=60,
        backoff_strategy="full_jitter",
    )
    assert ctl.max_in_flight == 0 and ctl.backoff_level == 0 and ctl.next_deadline() is None


def test_bad_max_rdy_count_and_contract_violations() -> None:
    ctl, _ = make(2)
    with pytest.raises(InvalidValueError, match="max_rdy_count must be an int >= 0, got -1"):
        ctl.add_connection("a", -1)
    ctl.add_connection("a", 10)
    with pytest.raises(ValueError, match="already registered"):
        ctl.add_connection("a", 10)
    with pytest.raises(ValueError, match="without a message in flight"):
        ctl.on_message_done("a", b"x", SUCCESS)
    with pytest.raises(InvalidValueError, match="outcome must be an Outcome"):
        ctl.on_message_done("a", b"x", "fin")  # type: ignore[arg-type]
    assert ctl.remove_connection("nope") == []


def test_module_example_runs() -> None:
    failed, attempted = doctest.testmod(fastnsq.rdy)
    assert attempted > 0 and failed == 0


# -- distribution ---------------------------------------------------------------------------------------------


def test_new_connection_gets_rdy_only_within_max_in_flight() -> None:
    """pynsq#252-254: connecting must not push the RDY sum above max_in_flight."""
    ctl, clock = make(1, settle=0.5)
    assert ctl.add_connection("a", 2500) == [RdyUpdate("a", 1)]
    assert ctl.add_connection("b", 2500) == []  # a holds the only slot
    assert rdy_of(ctl) == {"a": 1, "b": 0}

    ctl, clock = make(2, settle=0.5)
    assert ctl.add_connection("a", 2500) == [RdyUpdate("a", 2)]
    # a is lowered first; b waits until nsqd has surely read a's new RDY.
    assert ctl.add_connection("b", 2500) == [RdyUpdate("a", 1)]
    assert ctl.next_deadline() == 0.5
    clock.now = 0.4
    assert ctl.tick() == []
    clock.now = 0.5
    assert ctl.tick() == [RdyUpdate("b", 1)]
    assert sum(rdy_of(ctl).values()) == 2


def test_a_connection_with_its_own_settle_time_frees_a_lowered_rdy_sooner() -> None:
    """The consumer gives each connection a settle time from its SUB's round trip: a lowered
    RDY counts at its old value for that long (never longer than rdy_settle_time)."""
    ctl, clock = make(2, settle=0.5)
    ctl.add_connection("a", 2500, settle=0.05)
    assert ctl.add_connection("b", 2500, settle=0.05) == [RdyUpdate("a", 1)]
    assert ctl.next_deadline() == 0.05
    clock.now = 0.05
    assert ctl.tick() == [RdyUpdate("b", 1)]
    ctl, clock = make(2, settle=0.5)
    ctl.add_connection("a", 2500, settle=3.0)  # capped at the controller's rdy_settle_time
    ctl.add_connection("b", 2500)
    assert ctl.next_deadline() == 0.5


def test_remainder_is_spread_not_lost() -> None:
    """go-nsq#378: max_in_flight 10 over 3 connections is 4+3+3, not 3+3+3."""
    ctl, _ = make(10)
    for conn_id in "abc":
        ctl.add_connection(conn_id, 2500)
    assert sorted(rdy_of(ctl).values()) == [3, 3, 4]
    assert sorted(s.target for s in ctl.stats().values()) == [3, 3, 4]


def test_max_rdy_count_caps_a_connection_and_the_rest_goes_elsewhere() -> None:
    ctl, _ = make(100)
    ctl.add_connection("small", 10)
    ctl.add_connection("big", 2500)
    assert rdy_of(ctl) == {"small": 10, "big": 90}

    ctl, _ = make(10_000)
    ctl.add_connection("a", 2500)
    ctl.add_connection("b", 2500)
    assert rdy_of(ctl) == {"a": 2500, "b": 2500}  # never above max_rdy_count, even if mif allows more


def test_updates_put_decreases_before_increases() -> None:
    ctl, _ = make(4)
    ctl.add_connection("a", 2500)
    assert ctl.add_connection("b", 2500) == [RdyUpdate("a", 2), RdyUpdate("b", 2)]


def test_a_lowered_busy_connection_frees_room_only_as_its_messages_finish() -> None:
    ctl, _ = make(4, settle=1.0)
    ctl.add_connection("a", 2500)
    for msg in range(4):
        ctl.on_message("a", msg)
    # a is full (4 in flight): lowering it frees nothing until messages finish.
    assert ctl.add_connection("b", 2500) == [RdyUpdate("a", 2)]
    assert ctl.on_message_done("a", 0, SUCCESS) == [RdyUpdate("b", 1)]
    assert ctl.on_message_done("a", 1, SUCCESS) == [RdyUpdate("b", 2)]
    assert rdy_of(ctl) == {"a": 2, "b": 2}
    assert ctl.in_flight == 2


def test_refill_when_a_quarter_of_the_last_rdy_is_left() -> None:
    ctl, _ = make(8)
    ctl.add_connection("a", 2500)
    assert ctl.on_message("a", 0) == [RdyUpdate("a", 8)]  # the first message: see below
    for msg in range(1, 6):
        assert ctl.on_message("a", msg) == []
    assert ctl.connection_stats("a").rdy_remaining == 3
    assert ctl.on_message("a", 6) == [RdyUpdate("a", 8)]  # 2 left: 25 % of 8
    stats = ctl.connection_stats("a")
    assert (stats.rdy, stats.rdy_remaining, stats.in_flight) == (8, 8, 7)


def test_a_connections_first_message_brings_its_rdy_again() -> None:
    """The consumer sends RDY 1 until a connection's first message (nsqd then writes it out at
    once); the controller answers that message with the connection's RDY, and keeps the
    connection's hot path slow until then so that the message reaches it."""
    ctl = RdyController(10)  # the real clock: the hot path may open
    ctl.add_connection("a", 2500)
    assert not ctl.record("a").fast
    assert ctl.on_message("a", b"m1") == [RdyUpdate("a", 10)]
    assert ctl.record("a").fast
    assert ctl.on_message("a", b"m2") == []


def test_a_first_message_under_a_settling_rdy_still_brings_the_rdy() -> None:
    """a's RDY is lowered for b before a's first message; that message comes while the lowered
    value settles (the rebalance path): a's RDY is still sent again, else nsqd keeps RDY 1."""
    ctl = RdyController(10, rdy_settle_time=60.0)
    ctl.add_connection("a", 2500)
    ctl.add_connection("b", 2500)
    assert ctl.record("a").pending > 0
    assert RdyUpdate("a", 5) in ctl.on_message("a", b"m1")


def test_rdy_is_recomputed_when_the_connection_count_changes() -> None:
    ctl, _ = make(6)
    for conn_id in "abc":
        ctl.add_connection(conn_id, 2500)
    assert rdy_of(ctl) == {"a": 2, "b": 2, "c": 2}
    assert as_dict(ctl.remove_connection("c")) == {"a": 3, "b": 3}


def test_fewer_slots_than_connections_only_max_in_flight_hold_rdy() -> None:
    ctl, _ = make(2)
    for conn_id in "abcde":
        ctl.add_connection(conn_id, 2500)
    assert sorted(rdy_of(ctl).values()) == [0, 0, 0, 1, 1]


def test_idle_holder_gives_rdy_to_the_connection_that_waited_longest() -> None:
    ctl, clock = make(1)
    ctl.add_connection("a", 2500)
    clock.now = 1.0
    ctl.add_connection("b", 2500)
    clock.now = 2.0
    ctl.add_connection("c", 2500)
    assert rdy_of(ctl) == {"a": 1, "b": 0, "c": 0}
    assert ctl.next_deadline() == 6.0  # one rdy_redistribute_interval after rotation became needed
    clock.now = 6.0
    assert ctl.tick() == []  # a idle for 6 s < low_rdy_idle_timeout
    assert ctl.next_deadline() == 11.0
    clock.now = 11.0
    assert ctl.tick() == [RdyUpdate("a", 0), RdyUpdate("b", 1)]  # b waited since 1.0, c since 2.0
    clock.now = 16.0
    assert ctl.tick() == []
    clock.now = 21.0
    assert ctl.tick() == [RdyUpdate("b", 0), RdyUpdate("c", 1)]  # c waited longest, a only since 11.0
    clock.now = 31.0
    assert ctl.tick() == [RdyUpdate("c", 0), RdyUpdate("a", 1)]


def test_busy_holder_gives_rdy_away_after_low_rdy_timeout() -> None:
    ctl, clock = make(1)
    ctl.add_connection("a", 2500)
    ctl.add_connection("b", 2500)
    updates = []
    for second in range(1, 41):
        clock.now = float(second)
        if rdy_of(ctl)["a"]:
            ctl.on_message("a", second)
            ctl.on_message_done("a", second, SUCCESS)
        deadline = ctl.next_deadline()
        if deadline is not None and deadline <= clock.now:
            updates += [(clock.now, u) for u in ctl.tick()]
    # a never goes idle but must still hand over after holding RDY for 30 s; b, idle, gives it
    # back after low_rdy_idle_timeout.
    assert updates == [
        (30.0, RdyUpdate("a", 0)),
        (30.0, RdyUpdate("b", 1)),
        (40.0, RdyUpdate("b", 0)),
        (40.0, RdyUpdate("a", 1)),
    ]


def _twenty_connections(settle: float = 0.5) -> Sim:
    ctl, clock = make(1, settle=settle, seed=3)
    sim = Sim(ctl, clock, settle)
    for _ in range(20):
        sim.add()
    return sim


def test_twenty_connections_max_in_flight_one_idle_all_get_rdy() -> None:
    """go-nsq#179 / nsqjs#242: with mif 1 and 20 nsqd, no connection waits for RDY forever."""
    sim = _twenty_connections()
    for server in sim.servers.values():
        server.has_messages = False
    # Each idle holder keeps RDY for low_rdy_idle_timeout, rounded up to the next redistribution,
    # plus rdy_settle_time before the next one may have it.
    bound = 20 * (10.0 + 5.0 + 0.5)
    sim.advance(bound)
    assert set(sim.first_rdy_at) == set(sim.servers)
    assert max(sim.first_rdy_at.values()) <= bound


def test_twenty_connections_max_in_flight_one_only_one_nsqd_has_messages() -> None:
    sim = _twenty_connections()
    lonely = max(sim.servers)
    for conn_id, server in sim.servers.items():
        server.has_messages = conn_id == lonely
    sim.run_busy(20 * (10.0 + 5.0 + 0.5), step=0.5)
    assert sim.last_delivery_at.keys() == {lonely}


def test_twenty_connections_max_in_flight_one_all_busy_take_turns() -> None:
    sim = _twenty_connections()
    bound = 20 * (30.0 + 5.0 + 0.5 + 1.0)  # low_rdy_timeout per holder, plus a handler's second
    sim.run_busy(bound, step=0.5, handler_time=1.0)
    assert set(sim.last_delivery_at) == set(sim.servers)
    assert max(sim.first_rdy_at.values()) <= bound


def test_set_max_in_flight_zero_pauses_and_raising_resumes() -> None:
    ctl, _ = make(4)
    ctl.add_connection("a", 2500)
    ctl.add_connection("b", 2500)
    assert as_dict(ctl.set_max_in_flight(0)) == {"a": 0, "b": 0}
    assert ctl.next_deadline() is None
    assert as_dict(ctl.set_max_in_flight(6)) == {"a": 3, "b": 3}
    assert as_dict(ctl.set_max_in_flight(8)) == {"a": 4, "b": 4}


def test_lowering_max_in_flight_under_in_flight_stops_deliveries_until_drained() -> None:
    ctl, _ = make(4)
    ctl.add_connection("a", 2500)
    ctl.add_connection("b", 2500)
    for conn_id, msg in [("a", 1), ("a", 2), ("b", 3), ("b", 4)]:
        ctl.on_message(conn_id, msg)
    # 4 in flight, limit 2: a connection keeping RDY 1 could take a 5th message.
    assert as_dict(ctl.set_max_in_flight(2)) == {"a": 0, "b": 0}
    assert ctl.on_message_done("a", 1, SUCCESS) == []  # 3 in flight
    # 2 in flight, both on b: b may have RDY 1 back (it holds 2, so it receives nothing until it is
    # under 1), a may not (it could take a message at once: 3 in flight).
    assert ctl.on_message_done("a", 2, SUCCESS) == [RdyUpdate("b", 1)]
    assert ctl.on_message_done("b", 3, SUCCESS) == [RdyUpdate("a", 1)]
    assert rdy_of(ctl) == {"a": 1, "b": 1} and ctl.in_flight == 1


def test_removed_connections_messages_still_count_until_done() -> None:
    ctl, _ = make(2)
    ctl.add_connection("a", 2500)
    ctl.on_message("a", 1)
    ctl.on_message("a", 2)
    ctl.remove_connection("a")
    assert ctl.in_flight == 2
    assert ctl.add_connection("b", 2500) == []  # two handlers still run
    with pytest.raises(ValueError, match="still has 2 messages in flight"):
        ctl.add_connection("a", 2500)
    assert ctl.on_message_done("a", 1, SUCCESS) == [RdyUpdate("b", 1)]
    assert ctl.on_message_done("a", 2, SUCCESS) == [RdyUpdate("b", 2)]
    assert ctl.add_connection("a", 2500) == [RdyUpdate("b", 1), RdyUpdate("a", 1)]


# -- backoff --------------------------------------------------------------------------------------------------


def _backoff_pair(**options: Any) -> tuple[RdyController, FakeClock]:
    ctl, clock = make(4, **options)
    ctl.add_connection("a", 2500)
    ctl.add_connection("b", 2500)
    return ctl, clock


def _probe(ctl: RdyController, clock: FakeClock) -> Hashable:
    """Advance to the end of the backoff wait; return the probe connection."""
    clock.now = ctl.backoff_until  # type: ignore[assignment]
    updates = ctl.tick()
    assert len(updates) == 1 and updates[0].rdy == 1, updates
    return updates[0].conn_id


def test_failure_sends_rdy_zero_everywhere_then_rdy_one_to_one_connection() -> None:
    ctl, clock = _backoff_pair()
    ctl.on_message("a", 1)
    assert as_dict(ctl.on_message_done("a", 1, FAILURE)) == {"a": 0, "b": 0}
    assert ctl.in_backoff and ctl.backoff_level == 1
    assert ctl.backoff_until == 2.0 and ctl.next_deadline() == 2.0  # 1 s * 2**1
    clock.now = 1.9
    assert ctl.tick() == []
    probe = _probe(ctl, clock)
    assert probe in ("a", "b") and clock.now == 2.0


def test_success_of_the_probe_restores_normal_rdy() -> None:
    ctl, clock = _backoff_pair()
    ctl.on_message("a", 1)
    ctl.on_message_done("a", 1, FAILURE)
    probe = _probe(ctl, clock)
    ctl.on_message(probe, 2)
    assert as_dict(ctl.on_message_done(probe, 2, SUCCESS)) == {"a": 2, "b": 2}
    assert not ctl.in_backoff and ctl.backoff_until is None


def test_failure_of_the_probe_steps_up_and_success_steps_down_one_at_a_time() -> None:
    ctl, clock = _backoff_pair()
    ctl.on_message("a", 1)
    ctl.on_message_done("a", 1, FAILURE)
    probe = _probe(ctl, clock)
    ctl.on_message(probe, 2)
    assert as_dict(ctl.on_message_done(probe, 2, FAILURE)) == {probe: 0}
    assert ctl.backoff_level == 2 and ctl.backoff_until == clock.now + 4.0
    probe = _probe(ctl, clock)
    ctl.on_message(probe, 3)
    assert as_dict(ctl.on_message_done(probe, 3, SUCCESS)) == {probe: 0}  # level 1: wait again
    assert ctl.backoff_level == 1 and ctl.backoff_until == clock.now + 2.0
    probe = _probe(ctl, clock)
    ctl.on_message(probe, 4)
    assert as_dict(ctl.on_message_done(probe, 4, SUCCESS)) == {"a": 2, "b": 2}
    assert ctl.backoff_level == 0


def _waits(ctl: RdyController, clock: FakeClock, failures: int) -> list[float]:
    """Fail the first message, then every probe; return each wait."""
    ctl.on_message("a", 0)
    ctl.on_message_done("a", 0, FAILURE)
    waits = [ctl.backoff_until - clock.now]  # type: ignore[operator]
    for msg in range(1, failures):
        probe = _probe(ctl, clock)
        ctl.on_message(probe, msg)
        ctl.on_message_done(probe, msg, FAILURE)
        waits.append(ctl.backoff_until - clock.now)  # type: ignore[operator]
    return waits


def test_exponential_waits_double_up_to_max_backoff_duration() -> None:
    ctl, clock = _backoff_pair()
    assert _waits(ctl, clock, 9) == [2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 120.0, 120.0, 120.0]
    assert ctl.backoff_level == 7  # stops deepening once the wait is capped
    ctl, clock = _backoff_pair(backoff_multiplier=0.5, max_backoff_duration=3.0)
    assert _waits(ctl, clock, 4) == [1.0, 2.0, 3.0, 3.0]


def test_full_jitter_waits_are_uniform_below_the_exponential_value() -> None:
    ctl, clock = _backoff_pair(backoff_strategy="full_jitter", seed=11)
    waits = _waits(ctl, clock, 8)
    ceilings = [2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 120.0, 120.0]
    assert all(0.0 <= w <= c for w, c in zip(waits, ceilings))
    assert len(set(waits)) == len(waits)  # random, not the ceilings themselves
    ctl2, clock2 = _backoff_pair(backoff_strategy="full_jitter", seed=11)
    assert _waits(ctl2, clock2, 8) == waits  # reproducible from the seed


def test_callable_strategy_is_used_and_clamped() -> None:
    ctl, clock = _backoff_pair(backoff_strategy=lambda level: [0, -5, 3, 1e9][level], max_backoff_duration=60)
    assert _waits(ctl, clock, 4) == [0.0, 3.0, 60.0, 60.0]
    assert ctl.backoff_level == 3


def test_only_one_result_counts_per_backoff_window() -> None:
    ctl, clock = _backoff_pair()
    for msg in (1, 2, 3, 4):
        ctl.on_message("a", msg)
    ctl.on_message_done("a", 1, FAILURE)
    assert ctl.backoff_level == 1
    assert ctl.on_message_done("a", 2, FAILURE) == []  # arrived while waiting: same window
    assert ctl.backoff_level == 1 and ctl.backoff_until == 2.0
    probe = _probe(ctl, clock)
    # Results of messages in flight since before the window don't count either.
    assert ctl.on_message_done("a", 3, FAILURE) == []
    assert ctl.on_message_done("a", 4, SUCCESS) == []
    assert ctl.backoff_level == 1 and ctl.backoff_until is None
    ctl.on_message(probe, 5)
    ctl.on_message_done(probe, 5, SUCCESS)
    assert ctl.backoff_level == 0


def test_requeue_without_backoff_never_counts() -> None:
    ctl, clock = _backoff_pair()
    ctl.on_message("a", 1)
    assert ctl.on_message_done("a", 1, NEUTRAL) == []
    assert not ctl.in_backoff
    ctl.on_message("a", 2)
    ctl.on_message_done("a", 2, FAILURE)
    probe = _probe(ctl, clock)
    ctl.on_message(probe, 3)
    ctl.on_message_done(probe, 3, NEUTRAL)
    # No verdict: same level, no new wait, the probe keeps RDY 1 and its next message is the probe.
    assert ctl.backoff_level == 1 and ctl.backoff_until is None
    assert rdy_of(ctl)[probe] == 1
    ctl.on_message(probe, 4)
    ctl.on_message_done(probe, 4, SUCCESS)
    assert ctl.backoff_level == 0


def test_max_backoff_duration_zero_disables_backoff() -> None:
    ctl, _ = _backoff_pair(max_backoff_duration=0)
    ctl.on_message("a", 1)
    assert ctl.on_message_done("a", 1, FAILURE) == []
    assert not ctl.in_backoff and rdy_of(ctl) == {"a": 2, "b": 2}


def test_stuck_backoff_probe_connection_removed_picks_another() -> None:
    """go-nsq PR#106 / #132: the probe's connection dies during backoff."""
    ctl, clock = make(4)
    for conn_id in "abc":
        ctl.add_connection(conn_id, 2500)
    ctl.on_message("a", 1)
    ctl.on_message_done("a", 1, FAILURE)
    probe = _probe(ctl, clock)
    updates = ctl.remove_connection(probe)
    assert len(updates) == 1 and updates[0].rdy == 1 and updates[0].conn_id != probe
    new_probe = updates[0].conn_id
    ctl.on_message(new_probe, 2)
    ctl.on_message_done(new_probe, 2, SUCCESS)
    assert ctl.backoff_level == 0
    assert sum(rdy_of(ctl).values()) == 4


def test_stuck_backoff_probe_message_orphaned_does_not_count() -> None:
    ctl, clock = _backoff_pair()
    ctl.on_message("a", 1)
    ctl.on_message_done("a", 1, FAILURE)
    probe = _probe(ctl, clock)
    ctl.on_message(probe, 2)
    [(other, count)] = ctl.remove_connection(probe)
    assert count == 1 and other != probe
    ctl.on_message_done(probe, 2, SUCCESS)  # the old probe's handler finishes: not this window's result
    assert ctl.backoff_level == 1
    ctl.on_message(other, 3)
    ctl.on_message_done(other, 3, SUCCESS)
    assert ctl.backoff_level == 0 and rdy_of(ctl) == {other: 4}


def test_stuck_backoff_all_connections_gone_then_one_returns() -> None:
    ctl, clock = _backoff_pair()
    ctl.on_message("a", 1)
    ctl.on_message_done("a", 1, FAILURE)
    ctl.remove_connection("a")
    ctl.remove_connection("b")
    clock.now = 2.0
    assert ctl.tick() == []
    assert ctl.next_deadline() is None  # nothing to poll for
    clock.now = 50.0
    assert ctl.add_connection("c", 2500) == [RdyUpdate("c", 1)]  # the newcomer is the probe
    ctl.on_message("c", 2)
    assert ctl.on_message_done("c", 2, SUCCESS) == [RdyUpdate("c", 4)]
    assert not ctl.in_backoff


def test_stuck_backoff_requeues_without_backoff_during_backoff() -> None:
    """pynsq#89: REQ with backoff=False while backing off must not leave the consumer stuck."""
    ctl, clock = _backoff_pair()
    for msg in (1, 2):
        ctl.on_message("b", msg)
    ctl.on_message_done("b", 1, FAILURE)
    ctl.on_message_done("b", 2, NEUTRAL)  # while waiting
    probe = _probe(ctl, clock)
    for msg in (3, 4, 5):  # every probe message requeued without backoff
        ctl.on_message(probe, msg)
        ctl.on_message_done(probe, msg, NEUTRAL)
        assert rdy_of(ctl)[probe] == 1 and ctl.backoff_level == 1
    ctl.on_message(probe, 6)
    ctl.on_message_done(probe, 6, SUCCESS)
    assert not ctl.in_backoff and rdy_of(ctl) == {"a": 2, "b": 2}


def test_stuck_backoff_set_max_in_flight_during_backoff() -> None:
    ctl, clock = _backoff_pair()
    ctl.on_message("a", 1)
    ctl.on_message_done("a", 1, FAILURE)
    assert ctl.set_max_in_flight(10) == []  # still waiting: everything stays at 0
    probe = _probe(ctl, clock)
    assert ctl.set_max_in_flight(20) == []  # probing: only the probe, at 1
    assert ctl.set_max_in_flight(0) == [RdyUpdate(probe, 0)]  # paused wins
    assert ctl.set_max_in_flight(6) == [RdyUpdate(probe, 1)]
    ctl.on_message(probe, 2)
    assert as_dict(ctl.on_message_done(probe, 2, SUCCESS)) == {"a": 3, "b": 3}  # the new limit


def test_backoff_probe_moves_off_an_idle_connection() -> None:
    ctl, clock = make(4)
    for conn_id in "abc":
        ctl.add_connection(conn_id, 2500)
    ctl.on_message("a", 1)
    ctl.on_message_done("a", 1, FAILURE)
    probe = _probe(ctl, clock)  # t = 2
    moved: list[RdyUpdate] = []
    while not moved:
        clock.now = ctl.next_deadline()  # type: ignore[assignment]
        moved = ctl.tick()
    assert clock.now >= 2.0 + 10.0  # low_rdy_idle_timeout without a message
    assert moved[0] == RdyUpdate(probe, 0) and moved[1].rdy == 1 and moved[1].conn_id != probe


# -- is_starved -----------------------------------------------------------------------------------------------


def test_the_hot_path_record_is_fast_only_in_normal_operation() -> None:
    """record(conn).fast: when the consumer's C link may count deliveries and FINs itself."""
    ctl = RdyController(10, backoff_multiplier=0.01, max_backoff_duration=0.05)  # the real clock
    ctl.add_connection("a", 2500)
    record = ctl.record("a")
    ctl.on_message("a", b"m0")  # a connection's first message always comes through on_message
    ctl.on_message_done("a", b"m0", SUCCESS)
    assert record.fast and record.rdy == 10
    ctl.on_message("a", b"m1")
    ctl.on_message_done("a", b"m1", FAILURE)  # backoff: every answer must reach the controller
    assert ctl.in_backoff and not record.fast
    with pytest.raises(KeyError):
        ctl.record("b")


def test_a_lowered_rdy_keeps_its_record_slow_until_it_settles() -> None:
    ctl = RdyController(10, rdy_settle_time=60.0)
    ctl.add_connection("a", 2500)
    for i in range(6):
        ctl.on_message("a", i)  # 6 in flight under RDY 10
    ctl.add_connection("b", 2500)  # a is lowered to 5: nsqd may still send 4 under the old value
    a = ctl.record("a")
    assert a.rdy == 5 and a.pending > 0 and not a.fast


def test_an_injected_clock_never_opens_the_fast_lane() -> None:
    # The C link stamps deliveries with CLOCK_MONOTONIC: only the default clock agrees with it.
    ctl, _ = make(10)
    ctl.add_connection("a", 2500)
    assert not ctl.record("a").fast


def test_is_starved_at_85_percent_of_the_last_rdy() -> None:
    ctl, _ = make(10)
    assert not ctl.is_starved()
    ctl.add_connection("a", 2500)
    assert not ctl.is_starved()  # nothing in flight
    for msg in range(8):
        ctl.on_message("a", msg)
    assert not ctl.is_starved()  # 8 < 8.5
    ctl.on_message("a", 8)
    assert ctl.is_starved()  # 9 >= 8.5
    ctl.on_message_done("a", 0, SUCCESS)
    assert not ctl.is_starved()

    ctl, _ = make(1)
    ctl.add_connection("a", 2500)
    ctl.on_message("a", 1)
    assert ctl.is_starved()  # RDY 1, one in flight
    ctl.on_message_done("a", 1, FAILURE)
    ctl.on_message("a", 2)  # sent before nsqd read RDY 0
    assert rdy_of(ctl) == {"a": 0} and ctl.is_starved()  # RDY 0: nothing more will come


# -- random event sequences -----------------------------------------------------------------------------------


class RdyMachine(RuleBasedStateMachine):
    """Random consumers: connections come and go, messages arrive only where nsqd would send them.

    Invariants, after every step (``Sim.check`` and ``Sim.deliver``):

    * nsqd reads each command within ``rdy_settle_time``; under that assumption no delivery
      takes the client's in-flight count (removed connections included) above the largest
      max_in_flight in force during the last ``rdy_settle_time``: RDY is absolute in nsqd, so
      what a connection can still receive is up to its RDY minus what it holds, plus, for a
      RDY lowered less than ``rdy_settle_time`` ago, up to the old value;
    * the RDY values last sent sum to at most the current max_in_flight, each within its
      connection's max_rdy_count, none sent to a connection already removed;
    * in backoff at most one connection holds RDY, and at most 1;
    * the controller's view (RDY per connection, total in flight) matches the simulation.

    And at the end (liveness): once failures stop and every nsqd has messages, backoff ends
    and every connection receives messages within a bounded time.
    """

    #: RdyController(backoff_per_key=...): the keyed machines run both ways.
    PER_KEY = False

    @initialize(
        mif=st.sampled_from([0, 1, 2, 3, 5, 8, 100]),
        settle=st.sampled_from([0.0, 0.2, 0.5, 1.0]),
        strategy=st.sampled_from(["exponential", "full_jitter"]),
        seed=st.integers(0, 2**32),
        max_rdys=st.lists(st.sampled_from([1, 2, 3, 2500]), min_size=1, max_size=4),
    )
    def setup(self, mif: int, settle: float, strategy: str, seed: int, max_rdys: list[int]) -> None:
        clock = FakeClock()
        ctl = RdyController(
            mif,
            backoff_per_key=self.PER_KEY,
            clock=clock,
            rng=random.Random(seed),
            rdy_settle_time=settle,
            low_rdy_idle_timeout=1.0,
            low_rdy_timeout=2.0,
            rdy_redistribute_interval=0.5,
            max_backoff_duration=4.0,
            backoff_multiplier=0.5,
            backoff_strategy=strategy,  # type: ignore[arg-type]
        )
        self.sim = Sim(ctl, clock, settle)
        self.sim.per_key = self.PER_KEY
        self.rng = random.Random(seed)
        for max_rdy in max_rdys:
            self.sim.add(max_rdy)

    @rule(max_rdy=st.sampled_from([1, 2, 3, 2500]))
    def add(self, max_rdy: int) -> None:
        if len(self.sim.servers) < 6:
            self.sim.add(max_rdy)

    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        if self.sim.servers:
            self.sim.remove(data.draw(st.sampled_from(sorted(self.sim.servers))))

    @rule(data=st.data(), count=st.integers(1, 4), read_first=st.booleans())
    def deliver(self, data: st.DataObject, count: int, read_first: bool) -> None:
        if read_first:
            for server in self.sim.servers.values():
                server.read()
        for _ in range(count):
            ready = self.sim.deliverable()
            if not ready:
                return
            self.sim.deliver(data.draw(st.sampled_from(ready)))

    @rule(data=st.data())
    def one_nsqd_lags(self, data: st.DataObject) -> None:
        """The race RDY accounting must survive: every other nsqd has read all it was sent, one has
        not (within rdy_settle_time), and all of them send whatever they may."""
        if not self.sim.servers:
            return
        # Best a connection with an unread lower RDY: it may still fill up to the old one.
        lowered = [
            conn_id
            for conn_id, server in self.sim.servers.items()
            if any(kind == "RDY" and value < server.rdy for kind, value, _ in server.commands)
        ]
        lagging = data.draw(st.sampled_from(lowered or sorted(self.sim.servers)))
        for conn_id, server in self.sim.servers.items():
            if conn_id != lagging:
                server.read()
        while ready := self.sim.deliverable():
            self.sim.deliver(ready[0])

    @rule(data=st.data(), count=st.integers(1, 3))
    def nsqd_reads(self, data: st.DataObject, count: int) -> None:
        if self.sim.servers:
            self.sim.servers[data.draw(st.sampled_from(sorted(self.sim.servers)))].read(count)

    @rule(data=st.data(), outcome=st.sampled_from(list(Outcome)), rdy_first=st.booleans())
    def finish(self, data: st.DataObject, outcome: Outcome, rdy_first: bool) -> None:
        held = sorted((c, m) for c, msgs in self.sim.client.items() for m in msgs)
        if held:
            conn_id, msg = data.draw(st.sampled_from(held))
            self.sim.finish(conn_id, msg, outcome, rdy_first)

    @rule(seconds=st.sampled_from([0.05, 0.3, 1.0, 2.5, 7.0]))
    def advance(self, seconds: float) -> None:
        self.sim.advance(seconds)

    @rule(mif=st.sampled_from([0, 1, 2, 3, 5, 8, 100]))
    def set_max_in_flight(self, mif: int) -> None:
        self.sim.set_mif(mif)

    @invariant()
    def consistent(self) -> None:
        if hasattr(self, "sim"):
            self.sim.check()

    def teardown(self) -> None:
        if not hasattr(self, "sim"):
            return
        sim = self.sim
        # Liveness is in question when slots are scarce; a large limit only makes this phase slow.
        if not 0 < sim.ctl.max_in_flight <= 5:
            sim.set_mif(self.rng.choice([1, 3, 5]))
        if not sim.servers:
            sim.add(2500)
        for server in sim.servers.values():
            server.has_messages = True
        # Backoff ends: at most 3 levels here (0.5 s * 2**3 reaches the 4 s cap), each a wait and a probe.
        sim.finish_all(SUCCESS)
        sim.run_busy(20.0, step=0.2)
        assert not sim.ctl.in_backoff
        # Every connection then receives within one rotation of all (low_rdy_timeout + interval + settle each).
        start = sim.clock.now
        sim.run_busy(len(sim.servers) * (2.0 + 0.5 + 1.0) + 1.0, step=0.2)
        for conn_id in sim.servers:
            assert sim.last_delivery_at.get(conn_id, -1.0) >= start, (conn_id, sim.sent)


TestRdyMachine = RdyMachine.TestCase
TestRdyMachine.settings = settings(
    max_examples=500,
    stateful_step_count=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

KEYS = ["p0", "p1", "p2"]


class KeyedRdyMachine(RdyMachine):
    """The same random consumers with keyed connections (a partition each), keys paused at times,
    and backoff per key (``PER_KEY``) or consumer-wide.

    Invariants on top of RdyMachine's: a key in backoff holds RDY on at most one of its
    connections, and at most 1 (consumer-wide: one connection in all, as before); a paused key
    holds none; the RDY sum stays within max_in_flight.
    Liveness at the end: resumed and succeeding, every key leaves backoff and every connection
    receives again.
    """

    @initialize(
        mif=st.sampled_from([0, 1, 2, 3, 5, 8, 100]),
        settle=st.sampled_from([0.0, 0.2, 0.5, 1.0]),
        strategy=st.sampled_from(["exponential", "full_jitter"]),
        seed=st.integers(0, 2**32),
        conns=st.lists(st.tuples(st.sampled_from([1, 2, 3, 2500]), st.sampled_from(KEYS)), min_size=1, max_size=4),
    )
    def setup(self, mif: int, settle: float, strategy: str, seed: int, conns: list[tuple[int, str]]) -> None:  # type: ignore[override]
        super().setup(mif, settle, strategy, seed, [])
        for max_rdy, key in conns:
            self.sim.add(max_rdy, key)

    @rule(max_rdy=st.sampled_from([1, 2, 3, 2500]), key=st.sampled_from(KEYS))
    def add(self, max_rdy: int, key: str) -> None:  # type: ignore[override]  # every connection has a key
        if len(self.sim.servers) < 6:
            self.sim.add(max_rdy, key)

    @rule(key=st.sampled_from(KEYS), paused=st.booleans())
    def pause(self, key: str, paused: bool) -> None:
        self.sim.set_paused(key, paused)

    def teardown(self) -> None:
        if hasattr(self, "sim"):
            for key in KEYS:
                self.sim.set_paused(key, False)
            if not self.sim.servers:
                self.sim.add(2500, "p0")
        super().teardown()


class PerKeyRdyMachine(KeyedRdyMachine):
    PER_KEY = True


TestKeyedRdyMachine = KeyedRdyMachine.TestCase
TestKeyedRdyMachine.settings = TestRdyMachine.settings
TestPerKeyRdyMachine = PerKeyRdyMachine.TestCase
TestPerKeyRdyMachine.settings = TestRdyMachine.settings


def _keyed(mif: int = 6, per_key: bool = True) -> tuple[RdyController, FakeClock]:
    ctl, clock = make(mif, backoff_per_key=per_key)
    ctl.add_connection("a0", 2500, "p0")
    ctl.add_connection("b0", 2500, "p1")
    ctl.add_connection("b1", 2500, "p1")
    return ctl, clock


def test_keyed_backoff_pauses_the_failing_key_alone_and_gives_its_share_to_the_others() -> None:
    ctl, clock = _keyed()
    assert rdy_of(ctl) == {"a0": 2, "b0": 2, "b1": 2}
    ctl.on_message("a0", 1)
    assert as_dict(ctl.on_message_done("a0", 1, FAILURE)) == {"a0": 0, "b0": 3, "b1": 3}
    assert ctl.backoff_level_of("p0") == 1 and ctl.backoff_level_of("p1") == 0
    assert ctl.backoff_until_of("p0") == 2.0 and ctl.backoff_until_of("p1") is None
    assert ctl.backoff_level == 1 and ctl.in_backoff  # the consumer-wide view: the highest level
    # The other key keeps consuming, and its FINs count for nobody's backoff.
    ctl.on_message("b0", 2)
    assert ctl.on_message_done("b0", 2, SUCCESS) == []
    clock.now = 2.0
    updates = as_dict(ctl.tick())
    assert updates == {"b0": 2, "a0": 1} or updates == {"b1": 2, "a0": 1}  # a probe for p0, within 6
    ctl.on_message("a0", 3)
    assert as_dict(ctl.on_message_done("a0", 3, SUCCESS))["a0"] == 2
    assert rdy_of(ctl) == {"a0": 2, "b0": 2, "b1": 2} and not ctl.in_backoff


def test_keys_back_off_independently() -> None:
    ctl, clock = _keyed()
    ctl.on_message("a0", 1)
    ctl.on_message_done("a0", 1, FAILURE)
    clock.now = 1.0
    ctl.on_message("b1", 2)
    assert as_dict(ctl.on_message_done("b1", 2, FAILURE)) == {"b0": 0, "b1": 0}
    assert (ctl.backoff_until_of("p0"), ctl.backoff_until_of("p1")) == (2.0, 3.0)
    clock.now = 2.0
    assert as_dict(ctl.tick()) == {"a0": 1}  # p0 probes; p1 still waits
    assert ctl.next_deadline() == 3.0


def test_a_paused_key_gets_rdy_zero_until_resumed_and_the_others_take_its_share() -> None:
    ctl, _ = _keyed()
    assert as_dict(ctl.set_paused("p1", True)) == {"b0": 0, "b1": 0, "a0": 6}
    assert ctl.is_paused("p1")
    ctl.on_message("a0", 1)
    assert ctl.on_message_done("a0", 1, SUCCESS) == []
    assert as_dict(ctl.set_paused("p1", False)) == {"a0": 2, "b0": 2, "b1": 2}
    assert not ctl.is_paused("p1")


def test_with_keys_but_without_backoff_per_key_backoff_stays_consumer_wide() -> None:
    ctl, clock = _keyed(per_key=False)
    ctl.on_message("a0", 1)
    assert as_dict(ctl.on_message_done("a0", 1, FAILURE)) == {"a0": 0, "b0": 0, "b1": 0}
    assert ctl.backoff_level_of("p0") == ctl.backoff_level_of("p1") == 1
    # A paused key is no probe: the probe is one of p1's connections.
    ctl.set_paused("p0", True)
    clock.now = 2.0
    updates = as_dict(ctl.tick())
    assert list(updates.values()) == [1] and set(updates) <= {"b0", "b1"}


def test_pausing_the_probes_key_moves_the_probe() -> None:
    ctl, clock = _keyed(per_key=False)
    ctl.on_message("a0", 1)
    ctl.on_message_done("a0", 1, FAILURE)
    clock.now = 2.0
    (probe,) = as_dict(ctl.tick())
    key = "p0" if probe == "a0" else "p1"
    updates = as_dict(ctl.set_paused(key, True))
    assert updates[probe] == 0 and sum(updates.values()) == 1 and ctl.is_paused(key)


class _RebalanceOnEveryDone(RdyController):
    """The reference: in deficit, re-check the budget after every finished message."""

    def _dones_to_progress(self, *args: Any) -> int:
        return 1


@pytest.mark.parametrize("seed", range(200))
def test_in_deficit_rebalancing_only_when_it_can_raise_changes_no_update(seed: int) -> None:
    """Skipping the rebalances that cannot raise anything sends exactly the RDY updates, at exactly
    the same finished messages, as re-checking after every one."""
    rng = random.Random(seed)
    clock = FakeClock()
    mif = rng.choice([1, 3, 10, 64, 500])
    ctls = [cls(mif, clock=clock, rng=random.Random(seed), rdy_settle_time=0.5)
            for cls in (RdyController, _RebalanceOnEveryDone)]
    in_flight: list[tuple[str, int]] = []
    conns: list[str] = []
    ids = itertools.count()

    def both(call: str, *args: Any) -> None:
        got, want = (getattr(ctl, call)(*args) for ctl in ctls)
        assert got == want, f"seed {seed}: {call}{args}"

    for _ in range(400):
        op = rng.random()
        if op < 0.08 and len(conns) < 8:
            conns.append(f"c{len(conns)}")
            both("add_connection", conns[-1], rng.choice([2, 50, 2500]))
        elif op < 0.55 and conns:
            conn = rng.choice(conns)
            msg = next(ids)
            in_flight.append((conn, msg))
            both("on_message", conn, msg)
        elif op < 0.9 and in_flight:
            conn, msg = in_flight.pop(rng.randrange(len(in_flight)))
            both("on_message_done", conn, msg, Outcome.SUCCESS)
        elif op < 0.95:
            both("set_max_in_flight", rng.choice([0, 1, 2, 5, 40, 200, 1000]))
        else:
            clock.now += rng.choice([0.1, 0.6, 6.0])
            both("tick")
    assert rdy_of(ctls[0]) == rdy_of(ctls[1])


def test_finishing_held_messages_in_deficit_rebalances_a_few_times_not_per_message() -> None:
    """The Spark source's pattern: 64 connections hold 160,000 messages, max_in_flight falls under
    what they hold (RDY 0 everywhere), then the batch is FINed at once."""
    ctl, _ = make(160_000)
    conns = [f"c{i}" for i in range(64)]
    for conn in conns:
        ctl.add_connection(conn, 2500)
    held = [(conn, n) for n, conn in enumerate(c for c in conns for _ in range(2500))]
    for conn, msg in held:
        ctl.on_message(conn, msg)
    assert set(as_dict(ctl.set_max_in_flight(60_000)).values()) == {0}
    calls = 0
    rebalance = ctl._rebalance

    def counted(now: float) -> list[RdyUpdate]:
        nonlocal calls
        calls += 1
        return rebalance(now)

    ctl._rebalance = counted  # type: ignore[method-assign]
    updates: list[RdyUpdate] = []
    for conn, msg in held:
        updates += ctl.on_message_done(conn, msg, SUCCESS)
    assert rdy_of(ctl) == dict.fromkeys(conns, 937) | dict.fromkeys(conns[:32], 938)  # 60,000 over 64
    assert calls < 1000, f"{calls} rebalances for {len(held)} finished messages"  # was one per message


def test_a_slot_reached_by_lowering_max_in_flight_still_rotates() -> None:
    """Found by the keyed state machine (it failed the same way without keys): a connection that
    never got its full target from below (a partial raise) and then reached it from above (max_in_flight
    lowered) was never judged stale, and kept the only slot forever."""
    clock = FakeClock()
    ctl = RdyController(8, clock=clock, rng=random.Random(1), rdy_settle_time=1.0, low_rdy_idle_timeout=1.0,
                        low_rdy_timeout=2.0, rdy_redistribute_interval=0.5)
    sim = Sim(ctl, clock, 1.0)
    for max_rdy in (1, 2500, 2500):
        sim.add(max_rdy)
    sim.advance(1.0)
    sim.set_mif(1)
    start = clock.now
    sim.run_busy(3 * (2.0 + 0.5 + 1.0) + 1.0, step=0.2)
    assert all(sim.last_delivery_at.get(conn_id, -1.0) >= start for conn_id in sim.servers), sim.last_delivery_at


def test_a_slot_whose_target_came_down_to_its_rdy_still_rotates() -> None:
    """Found by the keyed state machine: RDY 1 from a partial raise toward a larger target, then
    max_in_flight lowered so that the target came down to exactly that RDY. No RDY was sent, so the
    connection was never "granted", never judged stale, and kept the only slot while three waited."""
    clock = FakeClock()
    ctl = RdyController(1, clock=clock, rng=random.Random(0), rdy_settle_time=0.2, low_rdy_idle_timeout=1.0,
                        low_rdy_timeout=2.0, rdy_redistribute_interval=0.5)
    sim = Sim(ctl, clock, 0.2)
    first = sim.add(2500)
    sim.servers[first].read()
    sim.set_mif(100)
    second = sim.add(2500)
    sim.add(1)
    sim.set_mif(0)
    msg = sim.deliver(first)  # sent before nsqd read RDY 0
    sim.set_mif(100)
    sim.finish(first, msg)
    sim.set_mif(2)
    sim.set_mif(1)
    assert rdy_of(ctl)[second] == 1  # the partial raise, now the whole (lowered) target
    sim.add(1)
    for server in sim.servers.values():
        server.has_messages = True
    start = clock.now
    sim.run_busy(len(sim.servers) * (2.0 + 0.5 + 0.2) + 1.0, step=0.2)
    assert all(sim.last_delivery_at.get(conn_id, -1.0) >= start for conn_id in sim.servers), sim.last_delivery_at


def test_a_message_on_a_lowered_connection_lowers_the_others_when_they_no_longer_fit() -> None:
    """Found by the state machine: max_in_flight 2 -> 1 lowers one of two connections; before its nsqd
    reads RDY 0 it sends a message (allowed), which is still in flight when the other nsqd reads its
    RDY 1 and sends one too: 2 in flight under a limit of 1 past rdy_settle_time."""
    clock = FakeClock()
    ctl = RdyController(2, clock=clock, rng=random.Random(0), rdy_settle_time=0.2)
    sim = Sim(ctl, clock, 0.2)
    first, second = sim.add(1), sim.add(1)
    sim.set_mif(1)
    lowered = next(conn_id for conn_id in (first, second) if sim.sent[conn_id] == 0)
    sim.servers[lowered].read(1)  # its nsqd has read RDY 1, not yet RDY 0
    sim.deliver(lowered)
    sim.advance(0.3)
    for conn_id in sim.deliverable():
        sim.deliver(conn_id)  # asserts at most max_in_flight in flight
    assert sim.total_in_flight() == 1


def test_the_simulated_nsqd_reads_a_rdy_at_its_settle_deadline_as_the_controller_counts_it() -> None:
    """Found by the keyed state machine (a fault of the simulation, not of the controller): at
    1.55 + 1.0 = 2.55 the controller took RDY 0 as read, but 2.55 - 1.0 is a float below 1.55, so the
    simulated nsqd had not read it and sent a third message under max_in_flight 2."""

    class Draw:
        def __init__(self, value: int) -> None:
            self.value = value

        def draw(self, strategy: object) -> int:
            return self.value

    machine = KeyedRdyMachine()
    machine.setup(mif=0, settle=1.0, strategy="exponential", seed=0, conns=[(1, "p0")])
    machine.advance(seconds=0.05)
    machine.add(key="p0", max_rdy=1)
    machine.remove(data=Draw(1))  # type: ignore[arg-type]
    machine.set_max_in_flight(mif=2)
    machine.add(key="p0", max_rdy=1)
    machine.add(key="p0", max_rdy=1)
    machine.advance(seconds=2.5)
    machine.one_nsqd_lags(data=Draw(3))  # type: ignore[arg-type]
    assert machine.sim.total_in_flight() == 2


# -- settling, held connections (the consumer's express lane) --------------------------------------------------


def test_a_settle_deadline_passed_before_the_timer_is_armed_is_still_a_deadline() -> None:
    """A timer that fires a hair before the settle time, then a clock read just after it: the raise
    waiting for the settle must still get a deadline (it was lost, and a connection kept RDY 0)."""
    ctl, clock = make(2, settle=0.5)
    ctl.add_connection("a", 2500)
    ctl.add_connection("b", 2500)  # a lowered: b waits for it to settle
    clock.now = 0.4999
    assert ctl.tick() == []  # not settled yet
    clock.now = 0.5001  # the consumer reads the clock again to arm its timer
    assert ctl.next_deadline() == 0.5  # in the past: tick at once
    assert ctl.tick() == [RdyUpdate("b", 1)]
    assert ctl.next_deadline() is None


def test_a_held_connection_gets_no_rdy_and_its_reserve_is_kept_back() -> None:
    ctl, clock = make(100, settle=0.5)
    assert ctl.add_connection("bulk", 2500) == [RdyUpdate("bulk", 100)]
    # The express connection joins held, with 10 kept back for it: bulk is lowered to 90.
    assert ctl.add_connection("express", 10, held_reserve=10) == [RdyUpdate("bulk", 90)]
    assert rdy_of(ctl) == {"bulk": 90, "express": 0}
    clock.now = 1.0
    # Moving to the express lane: bulk held (lowered first), express raised at once from the reserve,
    # without waiting for bulk's old RDY to settle.
    assert ctl.set_held("bulk", True) == [RdyUpdate("bulk", 0)]
    assert ctl.set_held("express", False, reserve=0) == [RdyUpdate("express", 10)]
    clock.now = 2.0
    # And back: express held again with its reserve, bulk raised to the rest at once.
    assert ctl.set_held("express", True, reserve=10) == [RdyUpdate("express", 0)]
    assert ctl.set_held("bulk", False) == [RdyUpdate("bulk", 90)]
    assert sum(rdy_of(ctl).values()) <= 100


def test_held_connections_are_never_the_backoff_probe_and_validate_their_arguments() -> None:
    ctl, clock = make(10, settle=0.0, max_backoff_duration=1.0)
    ctl.add_connection("bulk", 2500)
    ctl.add_connection("express", 5, held_reserve=2)
    ctl.on_message("bulk", "m1")
    ctl.on_message_done("bulk", "m1", Outcome.FAILURE)  # backoff: RDY 0 everywhere, then a probe
    clock.now = 5.0
    assert ctl.tick() == [RdyUpdate("bulk", 1)]  # the probe is the connection that is not held
    with pytest.raises(InvalidValueError, match="reserve must be an int >= 0"):
        ctl.set_held("bulk", True, reserve=-1)
    with pytest.raises(KeyError):
        ctl.set_held("nope", True)
    with pytest.raises(InvalidValueError, match="max_rdy_count must be an int >= 0"):
        ctl.set_max_rdy("express", -3)
    ctl.remove_connection("express")
    with pytest.raises(KeyError):  # forgotten, held state included
        ctl.set_held("express", False)
    clock.now = 100.0  # backoff over: the whole max_in_flight for the one connection left
    ctl.on_message("bulk", "m2")
    ctl.on_message_done("bulk", "m2", Outcome.SUCCESS)
    assert rdy_of(ctl) == {"bulk": 10}
