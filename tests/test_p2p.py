"""Point-to-point: send / recv / sendrecv, blocking and nonblocking, against numpy;
tags out of order and ANY_TAG; messages that do not fit their receive; p2p mixed
with collectives; large exchanges both ways (no deadlock)."""
import pytest

import exchange_workers as xw
from procs import launch_timing_out_fast
from reference import ALL_DTYPES


@pytest.mark.parametrize("P", range(1, 9))
def test_send_recv_against_numpy(pools, P):
    dtypes = ALL_DTYPES + ["bool", "complex64"] if P in (2, 3) else ["float32", "int64"]
    for rank, problems in enumerate(pools(P).run(xw.p2p_basics, dtypes)):
        assert problems == [], (rank, problems[:5])


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_large_exchanges_both_ways_do_not_deadlock(pools, P):
    for rank, problems in enumerate(pools(P).run(xw.p2p_exchanges, 2_000_003)):
        assert problems == [], (rank, problems)


@pytest.mark.parametrize("n", [3, 300_001])
@pytest.mark.parametrize("P", [1, 2, 3])
def test_a_nonblocking_send_or_receive_completes_when_its_message_does(pools, P, n):
    for rank, problems in enumerate(pools(P).run(xw.p2p_completes_on_its_own, n)):
        assert problems == [], (rank, problems)


@pytest.mark.parametrize("n", [3, 300_001])
@pytest.mark.parametrize("P", [1, 2, 3])
def test_messages_and_collectives_never_wait_for_each_other(pools, P, n):
    for rank, problems in enumerate(pools(P).run(xw.p2p_and_collectives_apart, n)):
        assert problems == [], (rank, problems)


def test_a_completed_send_keeps_its_outcome_when_its_group_fails_later():
    import shmcoll
    got = shmcoll.launch(xw.p2p_completed_work_outlives_its_group, 2, timeout=60)[0]
    assert got == [None, "PeerLostError", None, None, True]


@pytest.mark.parametrize("P", [1, 2, 3])
def test_a_message_that_does_not_fit_is_an_error_on_the_receiver_only(pools, P):
    for rank, seen in enumerate(pools(P).run(xw.p2p_mismatches)):
        field, text = seen["size"]
        assert field == "count" and "48 bytes of float64" in text and "40 bytes" in text
        field, text = seen["dtype"]
        assert field == "dtype" and "float32" in text and "int32" in text
        assert seen["after"] == [(rank - 1) % P] * 3
        assert seen["collective"] == float(P)


def test_bad_arguments_are_refused(pools):
    seen = pools(2).run(xw.p2p_refusals)[0]
    assert seen == {"dst": "ValueError", "negative_tag": "ValueError", "bool_rank": "TypeError",
                    "objects": "TypeError", "readonly": "ValueError", "to_itself": "ValueError",
                    "after": [0.0, 1.0, 2.0], "second_to_itself": True,
                    "then": [2.0, 3.0, 2.0, 3.0], "empty_when_full": True, "full": True,
                    "empty": (0,)}


def test_a_message_broken_half_way_spares_the_collectives(tmp_path):
    import shmcoll
    sender, receiver = shmcoll.launch(xw.p2p_broken_halfway_spares_collectives, 2,
                                      args=(300_001, str(tmp_path)), timeout=120)
    for seen in (sender, receiver):
        assert seen[0] == "Interrupted" and seen[1] == [3] and seen[3] == [[0], [1]], seen
        assert seen[2].startswith("CommunicatorBrokenError") and "an earlier call failed" \
            in seen[2] and "interrupted by a signal" in seen[2], seen


def test_a_nonblocking_message_after_a_failed_collective_fails(tmp_path):
    import shmcoll
    seen = shmcoll.launch(xw.p2p_after_a_failed_collective, 2, args=(str(tmp_path),),
                          timeout=120)[0]
    assert seen == ["Interrupted", "CommunicatorBrokenError", "CommunicatorBrokenError"]


def test_a_timed_out_receive_can_wait_again_and_a_closed_sender_is_an_error():
    got = launch_timing_out_fast(xw.p2p_failures, 2)[0]
    assert got == ["TimeoutError", [0.0, 1.0], "PeerLostError"]
