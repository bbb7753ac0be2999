"""``--split-nsqd``: which child consumes from which nsqd, so the group holds one connection per nsqd.

One job, pure: given the children's current assignments and the nsqd that exist now,
the new assignments, moving as few nsqd as possible. An nsqd that is gone is dropped;
a new one goes to the child with the fewest; then nsqd move one at a time from the
child with the most to the one with the fewest until they differ by at most one. The
supervisor finds the nsqd (nsqlookupd and ``--nsqd-tcp-address``) and sends each child
its list over the pipe.
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
