"""``--split-nsqd``: which child consumes from which nsqd, so the group holds one connection per nsqd.

One job, pure: given the children's current assignments and the nsqd that exist now,
the new assignments, moving as few nsqd as possible. An nsqd that is gone is dropped;
a new one goes to the child with the fewest; then nsqd move one at a time from the
child with the most to the one with the fewest until they differ by at most one. The
supervisor finds the nsqd (nsqlookupd and ``--nsqd-tcp-address``) and sends each child
its list over the pipe. :func:`pick_move`: which busy nsqd goes to an idle child while the
group runs (:mod:`.shares` carries it out).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def rebalance(current: Mapping[int, Iterable[str]], nsqd: Iterable[str], children: int) -> dict[int, list[str]]:
    """New assignments for children ``0..children-1``: every nsqd in ``nsqd`` to exactly one child."""
    wanted = set(nsqd)
    result: dict[int, list[str]] = {index: [] for index in range(children)}
    placed: set[str] = set()
    for index in range(children):
        for address in current.get(index, ()):
            if address in wanted and address not in placed:  # stays where it is
                result[index].append(address)
                placed.add(address)
    for address in sorted(wanted - placed):
        fewest = min(result, key=lambda i: (len(result[i]), i))
        result[fewest].append(address)
    while True:
        most = max(result, key=lambda i: (len(result[i]), -i))
        fewest = min(result, key=lambda i: (len(result[i]), i))
        if len(result[most]) - len(result[fewest]) <= 1:
            break
        result[fewest].append(result[most].pop())
    return {index: sorted(addresses) for index, addresses in result.items()}


def pick_move(
    assignments: Mapping[int, Iterable[str]], busy: Mapping[int, Iterable[str]], idle: Iterable[int]
) -> tuple[str, int, int] | None:
    """The move that gives an idle child work, as ``(nsqd, from_child, to_child)``, or None.

    ``busy[i]``: the nsqd child ``i`` reports delivering messages; ``idle``: the children with
    none of theirs delivering and nothing in flight. The donor is the child holding the most
    busy nsqd, and only if it holds two or more: it keeps one, so that an nsqd is never moved
    just to leave its old child idle in turn (no ping-pong). The idle child holding the fewest
    nsqd takes it.
    """
    held = {index: sorted(set(addresses)) for index, addresses in assignments.items()}
    working = {index: [a for a in held[index] if a in set(busy.get(index, ()))] for index in held}
    donor = max(working, key=lambda i: (len(working[i]), -i), default=None)
    if donor is None or len(working[donor]) < 2:
        return None
    takers = [index for index in idle if index in held and index != donor and not working[index]]
    if not takers:
        return None
    taker = min(takers, key=lambda i: (len(held[i]), i))
    return working[donor][-1], donor, taker
