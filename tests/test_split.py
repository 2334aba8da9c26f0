"""comm.split(color, key): sub-communicators as MPI's Comm_split makes them, each
with a segment of its own, at P = 1..8."""
import pytest

import shmcoll
import split_workers as sw


def expected(P, colors, keys):
    groups = {}
    for r in range(P):
        if colors[r] is not None:
            groups.setdefault(colors[r], []).append((keys[r], r))
    return {c: [r for _, r in sorted(m)] for c, m in groups.items()}


@pytest.mark.parametrize("P", range(1, 9))
@pytest.mark.parametrize("pattern", ["halves", "keys_reversed", "with_none", "one_group"])
def test_split_groups_ranks_by_color_then_key(pools, P, pattern):
    colors = {"halves": [r % 2 for r in range(P)], "keys_reversed": [r // 3 for r in range(P)],
              "with_none": [None if r % 3 == 1 else 5 for r in range(P)],
              "one_group": [0] * P}[pattern]
    keys = [-r for r in range(P)] if pattern == "keys_reversed" else [0] * P
    groups = expected(P, colors, keys)
    for r, (seen, after) in enumerate(pools(P).run(sw.split_and_use, colors, keys)):
        assert after == float(P)
        if colors[r] is None:
            assert seen is None
            continue
        members = groups[colors[r]]
        assert seen["rank"] == members.index(r) and seen["size"] == len(members)
        assert seen["sum"] == float(sum(members)) and seen["order"] == members
        i = members.index(r)
        half = [m for j, m in enumerate(members) if j % 2 == i % 2]
        assert seen["half"] == half[::-1]       # key = -rank in the child: reversed
        assert seen["ring"] == members[(i - 1) % len(members)]


def test_a_child_outlives_its_closed_parent():
    assert shmcoll.launch(sw.parent_closed_first, 3) == [3.0, 3.0, 3.0]


def test_a_refused_color_is_an_error_on_every_rank(pools):
    for r, (negative, text, after) in enumerate(pools(3).run(sw.bad_split)):
        assert after == 3.0
        if r == 0:
            assert negative[0] == "ValueError" and ">= 0" in negative[1]
        else:
            assert negative[0] == "ValueError" and "rank(s) [0]" in negative[1]
        if r == 1:
            assert text[0] == "TypeError" and "integer" in text[1]
        else:
            assert text[0] == "ValueError" and "rank(s) [1]" in text[1]
