"""What `shmcoll perf`, `shmcoll calibrate`, `shmcoll bench-ab`, the benchmark suite
(bench/) and the tests share to run collectives between live ranks:

  calls    one driver that calls any collective by name (and its in-place form)
  case     one collective at one size: buffers, inputs, the call, its check
  timing   timed loops, size sweeps, the copy yardstick, pinning ranks to CPUs
  mirror   the live-rank protocol: rank 0 names a call, ranks 1..P-1 repeat it
"""
from shmcoll.tools.harness.calls import bind, in_place, invoke
from shmcoll.tools.harness.case import Case, count_wrong, fill_input, rank_input, reduced_block
from shmcoll.tools.harness.mirror import build, exchange_command, mirror, start_mirrors
from shmcoll.tools.harness.timing import (auto_iters, copy_reference_seconds,
                                          median_call_seconds, pin, size_sweep, time_calls)

__all__ = ["bind", "in_place", "invoke", "Case", "count_wrong", "fill_input", "rank_input",
           "reduced_block", "build", "exchange_command", "mirror", "start_mirrors",
           "auto_iters", "copy_reference_seconds", "median_call_seconds", "pin", "size_sweep",
           "time_calls"]
