"""Max-min fair shares of flows over links of given capacities: the allocation a network that shares each
link fairly among the flows crossing it converges to, and what a parking lot's flows are judged against.

Progressive filling (Bertsekas and Gallager, *Data Networks*, 6.5.2): every flow's rate grows at the same
pace until a link is full or a flow has what it asks for; the flows of a full link, and those satisfied, keep
their rate, and the others grow on. Written here rather than taken from a library: it is twenty lines, and
the graph libraries that have it (networkx has none) would bring much more.

A flow is bounded by the links that carry a rate; a link without one (line rate) bounds nothing. A flow that
no rate and no demand bound has no fair share (None): the physics names no number for it.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence

FULL = 1e-9  # relative: a link whose rest is below this part of its capacity is full


def max_min_shares(demands: Mapping[str, float], paths: Mapping[str, Sequence[Hashable]],
                   capacity: Mapping[Hashable, float]) -> dict[str, float | None]:
    """Each flow's max-min fair rate. `demands`: what each flow asks for (math.inf: as much as it gets);
    `paths`: the links (any keys, e.g. (name, direction)) each crosses; `capacity`: the rate of each link that
    has one (links not in it are unbounded)."""
    rate = {f: 0.0 for f in demands}
    rest = {link: float(c) for link, c in capacity.items()}
    bounded = {f: [link for link in dict.fromkeys(paths.get(f, ())) if link in rest] for f in demands}
    growing = {f for f in demands if demands[f] > 0}
    while growing:
        crossing = {link: [f for f in growing if link in bounded[f]] for link in rest}
        step = min([rest[link] / len(fs) for link, fs in crossing.items() if fs]
                   + [demands[f] - rate[f] for f in growing])
        if math.isinf(step):  # the flows left ask for everything and cross no rate
            break
        for f in growing:
            rate[f] += step
            for link in bounded[f]:
                rest[link] -= step
        full = {link for link, left in rest.items() if left <= FULL * max(capacity[link], 1.0)}
        growing = {f for f in growing if rate[f] < demands[f] * (1 - FULL) and not full.intersection(bounded[f])}
    return {f: None if f in growing else rate[f] for f in demands}


def share_fairness(measured: Mapping[str, float], shares: Mapping[str, float]) -> float | None:
    """Jain's fairness index of the flows' rates each relative to its max-min fair share (Jain, Chiu and Hawe
    1984, the index over x_i / o_i where o_i is the optimal allocation): 1 when every flow got the same part of
    its share, 1/n when one flow got everything. Flows whose fair share is 0 are left out; None for fewer than
    two flows (no fairness to judge)."""
    parts = [measured[f] / shares[f] for f in shares if f in measured and shares[f] > 0]
    if len(parts) < 2:
        return None
    total, squares = sum(parts), sum(x * x for x in parts)
    return total * total / (len(parts) * squares) if squares > 0 else None
