"""Where a GPU collective's fixed cost goes, on the machine at hand: per rank (every
rank on the one GPU it finds), the mean time of an empty stream synchronisation, of a
tiny kernel then a synchronisation (spinning, or sleeping on a blocking event), of
the host barrier alone, and of both together
(what one host-sync barrier of the device path costs), at P ranks.

    python bench/cuda_probe.py -np 2
"""
import argparse
import sys
import time


def probe(comm, reps):
    import cupy
    stream = cupy.cuda.get_current_stream()
    x = cupy.zeros(1, cupy.float32)

    def mean(call):
        for _ in range(20):
            call()
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            call()
        return (time.perf_counter() - t0) / reps * 1e6

    def kernel_sync():
        x.fill(1)
        stream.synchronize()

    def kernel_event_sync():
        x.fill(1)
        event = cupy.cuda.Event(block=True, disable_timing=True)
        event.record(stream)
        event.synchronize()

    def both():
        x.fill(1)
        stream.synchronize()
        comm.barrier()
    rows = {"empty sync": mean(stream.synchronize), "kernel + sync": mean(kernel_sync),
            "kernel + blocking event sync": mean(kernel_event_sync),
            "host barrier": mean(comm.barrier), "kernel + sync + barrier": mean(both)}
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-np", type=int, default=2)
    p.add_argument("-n", type=int, default=500)
    opts = p.parse_args()
    import shmcoll
    for rank, rows in enumerate(shmcoll.launch(probe, opts.np, args=(opts.n,))):
        print(f"P={opts.np} rank {rank}: " +
              ", ".join(f"{k} {v:.1f} us" for k, v in rows.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
