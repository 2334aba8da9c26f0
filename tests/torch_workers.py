"""Rank functions of test_torch_backend: torch.distributed calls on the "shmcoll"
backend (module level, so spawned ranks import them).  Each rank of a RankPool joins
one default torch group, through a FileStore the test names, at its first call."""
import numpy as np

from array_workers import to_numpy, to_torch
from reference import make_input


def group(comm, store_path):
    """This rank's default torch group on the shmcoll backend (created once)."""
    import torch.distributed as dist
    import shmcoll.torch  # noqa: F401 - registers the backend
    if not dist.is_initialized():
        dist.init_process_group("shmcoll", store=dist.FileStore(store_path, comm.world_size),
                                rank=comm.rank, world_size=comm.world_size)
    return dist


def torch_op(dist, op):
    return {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
            "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG, "band": dist.ReduceOp.BAND,
            "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}[op]


def _finish(work, async_op, how):
    """Complete an async call by wait() or through its future."""
    if not async_op:
        assert work is None
    elif how % 2:
        fut = work.get_future()
        fut.wait()
        assert work.is_completed() and work.is_success()
    else:
        assert work.wait() is True


def run_case(dist, comm, case, async_op, how):
    """One reference case (tests/reference.py) through torch.distributed; `inplace`
    picks the tensor variant (all_gather_into_tensor, reduce_scatter_tensor).
    Returns the result as numpy (None where the reference has none)."""
    import torch
    collective, shape, dt, op, variant, _, seed, root = case
    P, r = comm.world_size, comm.rank
    x = to_torch(make_input(r, shape, dt, op, seed)).clone()
    kw = {"async_op": async_op}
    if collective == "allreduce":
        _finish(dist.all_reduce(x, op=torch_op(dist, op), **kw), async_op, how)
        return to_numpy(x)
    if collective == "reduce":
        before = x.clone()
        _finish(dist.reduce(x, dst=root, op=torch_op(dist, op), **kw), async_op, how)
        if r != root:
            assert torch.equal(x, before), "reduce changed a non-root's tensor"
            return None
        return to_numpy(x)
    if collective == "broadcast":
        buf = x if r == root else torch.zeros_like(x)
        _finish(dist.broadcast(buf, src=root, **kw), async_op, how)
        return to_numpy(buf)
    if collective == "allgather":
        if variant:
            out = torch.empty((P * x.numel(),), dtype=x.dtype)
            _finish(dist.all_gather_into_tensor(out, x, **kw), async_op, how)
            return to_numpy(out).reshape((P,) + tuple(shape))
        outs = [torch.empty_like(x) for _ in range(P)]
        _finish(dist.all_gather(outs, x, **kw), async_op, how)
        return np.stack([to_numpy(o) for o in outs])
    if collective == "reduce_scatter":
        out = torch.empty((shape[0] // P,) + tuple(shape[1:]), dtype=x.dtype)
        if variant:
            work = dist.reduce_scatter_tensor(out, x, op=torch_op(dist, op), **kw)
        else:
            work = dist.reduce_scatter(out, list(x.chunk(P)) if shape[0] else
                                       [x.clone() for _ in range(P)], op=torch_op(dist, op), **kw)
        _finish(work, async_op, how)
        return to_numpy(out)
    if collective == "gather":
        outs = [torch.empty_like(x) for _ in range(P)] if r == root else None
        _finish(dist.gather(x, outs, dst=root, **kw), async_op, how)
        return np.stack([to_numpy(o) for o in outs]) if r == root else None
    if collective == "scatter":
        out = torch.empty_like(x)
        ins = [to_torch(make_input(q, shape, dt, op, seed)) for q in range(P)] if r == root else None
        _finish(dist.scatter(out, ins, src=root, **kw), async_op, how)
        return to_numpy(out)
    raise ValueError(collective)


def run_cases(comm, store_path, cases, async_op):
    dist = group(comm, store_path)
    return [None if (got := run_case(dist, comm, case, async_op, i)) is None else got.copy()
            for i, case in enumerate(cases)]


def torch_specifics(comm, store_path):
    """What torch users do beyond the reference's collectives; returns a dict of
    observations the test checks."""
    import torch
    dist = group(comm, store_path)
    P, r = comm.world_size, comm.rank
    seen = {}
    # bool SUM / PRODUCT are NCCL's logical or / and
    b = torch.tensor([r == 0, True, False])
    dist.all_reduce(b)
    c = torch.tensor([r == 0, True, False])
    dist.all_reduce(c, op=dist.ReduceOp.PRODUCT)
    seen["bool"] = (b.tolist(), c.tolist())
    # PREMUL_SUM: every input scaled first
    p = torch.full((5,), float(r + 1))
    dist.all_reduce(p, op=dist._make_nccl_premul_sum(0.5))
    seen["premul"] = p.tolist()
    # non-contiguous tensors are reduced, broadcast and gathered in place
    nc = (torch.arange(12.0).view(3, 4) * (r + 1)).t()
    dist.all_reduce(nc)
    bc = torch.full((4, 3), float(r)).t()
    dist.broadcast(bc, src=P - 1)
    gt = torch.zeros(3, P * 2).t()
    dist.all_gather_into_tensor(gt, torch.full((2, 3), float(r)))
    seen["noncontig"] = (nc.tolist(), bc.tolist(), gt.tolist())
    # coalesced: the coalescing manager and the coalesced calls
    a1, a2, a3 = torch.ones(3) * r, torch.ones(2, dtype=torch.float64) * r, torch.ones(4) * 2
    with dist._coalescing_manager():
        dist.all_reduce(a1)
        dist.all_reduce(a2)
        dist.all_reduce(a3, op=dist.ReduceOp.SUM)
    outs = [torch.empty(P * 2), torch.empty(P * 3)]
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_gather_into_tensor(outs[0], torch.full((2,), float(r)))
        dist.all_gather_into_tensor(outs[1], torch.full((3,), float(r)))
    cm.wait()
    rs = [torch.empty(1), torch.empty(2)]
    with dist._coalescing_manager():
        dist.reduce_scatter_tensor(rs[0], torch.arange(float(P)))
        dist.reduce_scatter_tensor(rs[1], torch.arange(float(2 * P)))
    seen["coalesced"] = (a1.tolist(), a2.tolist(), a3.tolist(), [o.tolist() for o in outs],
                         [t.tolist() for t in rs])
    # objects
    objs = [None] * P
    dist.all_gather_object(objs, {"rank": r, "text": "x" * r})
    lst = [{"from": r}, r]
    dist.broadcast_object_list(lst, src=0)
    seen["objects"] = (objs, lst)
    # a future's value, then() chaining, several works waited out of order
    t = torch.ones(3)
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 10)
    works = [dist.all_reduce(torch.ones(2) * i, async_op=True) for i in range(4)]
    for w in reversed(works):
        w.wait()
    seen["future"] = (fut.wait().tolist(), [w.result()[0].tolist() for w in works])
    # barrier, a zero-size tensor
    dist.barrier()
    z = torch.empty(0)
    dist.all_reduce(z)
    seen["zero"] = z.numel()
    # unsupported calls name themselves
    refused = {}
    for name, call in (("recv_from_any_source", lambda: dist.recv(torch.empty(1))),):
        try:
            call()
            refused[name] = None
        except RuntimeError as e:
            refused[name] = str(e)
    seen["refused"] = refused
    # a dtype shmcoll has no reduction for is a RuntimeError naming the call
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.bool), op=dist.ReduceOp.AVG)
        seen["bad_op"] = None
    except Exception as e:     # noqa: BLE001 - the test checks the text
        seen["bad_op"] = f"{type(e).__name__}: {e}"
    seen["backend"] = dist.get_backend()
    return seen


def subgroup(comm, store_path):
    """A group of the even ranks (new_group), then destroyed; the default group goes on."""
    import torch
    dist = group(comm, store_path)
    evens = list(range(0, comm.world_size, 2))
    g = dist.new_group(evens)
    got = None
    if comm.rank in evens:
        t = torch.full((3,), float(comm.rank))
        dist.all_reduce(t, group=g)
        got = t.tolist()
        dist.destroy_process_group(g)
    t = torch.ones(2)
    dist.all_reduce(t)
    return got, t.tolist()


def broken_group(comm, store_path):
    """A group whose ranks disagree (shapes differ): the async call's wait() raises
    shmcoll's MismatchError, a later call's future fails naming the error (torch's
    futures raise a RuntimeError carrying it); the default group is unaffected."""
    import torch
    dist = group(comm, store_path)
    g = dist.new_group(list(range(comm.world_size)))
    work = dist.all_reduce(torch.ones(2 + comm.rank), group=g, async_op=True)
    try:
        work.wait()
        waited = None
    except Exception as e:  # noqa: BLE001 - reported
        waited = type(e).__name__
    failed = work.is_completed() and not work.is_success() and work.exception() is not None
    try:
        dist.all_reduce(torch.ones(2), group=g, async_op=True).get_future().wait()
        later = None
    except Exception as e:  # noqa: BLE001 - reported
        later = f"{type(e).__name__}: {e}"
    dist.destroy_process_group(g)
    t = torch.ones(2)
    dist.all_reduce(t)
    return waited, failed, later, t.tolist()


# -- DistributedDataParallel ---------------------------------------------------------
def mlp(torch):
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 16), nn.Tanh(),
                         nn.Linear(16, 3)).double()


def batches(torch, steps, micro, rows):
    """(x, y) of every step and micro-batch, all ranks' rows together."""
    g = torch.Generator().manual_seed(7)
    return (torch.randn(steps, micro, rows, 12, generator=g, dtype=torch.float64),
            torch.randn(steps, micro, rows, 3, generator=g, dtype=torch.float64))


def ddp_train(comm, store_path, steps, micro, static_graph, bucket_cap_mb):
    """DDP training of mlp() on this rank's rows of batches(); micro > 1 accumulates
    the micro-batches under no_sync() but the last.  Returns the parameters."""
    import contextlib

    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    group(comm, store_path)
    P, r = comm.world_size, comm.rank
    model = DDP(mlp(torch), static_graph=static_graph, bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs, ys = batches(torch, steps, micro, 2 * P)
    for s in range(steps):
        opt.zero_grad()
        for m in range(micro):
            mine = slice(2 * r, 2 * r + 2)
            sync = contextlib.nullcontext() if m == micro - 1 else model.no_sync()
            with sync:
                loss = torch.nn.functional.mse_loss(model(xs[s, m, mine]), ys[s, m, mine])
                loss.backward()
        opt.step()
    return [p.detach().numpy().copy() for p in model.module.parameters()]


def single_process_train(steps, micro, P):
    """The same training in one process on the full batch."""
    import torch
    model = mlp(torch)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs, ys = batches(torch, steps, micro, 2 * P)
    for s in range(steps):
        opt.zero_grad()
        for m in range(micro):
            torch.nn.functional.mse_loss(model(xs[s, m]), ys[s, m]).backward()
        opt.step()
    return [p.detach().numpy().copy() for p in model.parameters()]


def all_to_all_and_p2p(comm, store_path):
    """all_to_all_single (even and split), all_to_all on lists of several sizes,
    send/recv, and an exchange of large tensors both ways with batch_isend_irecv (a
    deadlock unless the isend and irecv progress together)."""
    import torch
    dist = group(comm, store_path)
    P, r = comm.world_size, comm.rank
    seen = {}
    x = torch.arange(P * 3, dtype=torch.float32) + 100 * r
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x)
    seen["even"] = out.tolist()
    sends = [(r + q) % 3 for q in range(P)]
    receives = [(q + r) % 3 for q in range(P)]
    x = torch.arange(sum(sends) * 2, dtype=torch.int64).view(-1, 2) + 1000 * r
    out = torch.empty((sum(receives), 2), dtype=torch.int64)
    work = dist.all_to_all_single(out, x, receives, sends, async_op=True)
    work.wait()
    seen["split"] = out.tolist()
    ins = [torch.full((q + 1, r + 1), float(r * 10 + q)) for q in range(P)]
    outs = [torch.empty((r + 1, q + 1)) for q in range(P)]
    dist.all_to_all(outs, ins)
    seen["lists"] = [o.tolist() for o in outs]
    if P > 1:
        nxt, prv = (r + 1) % P, (r - 1) % P
        if r % 2 == 0:
            dist.send(torch.tensor([float(r)] * 3), nxt, tag=7)
            got = torch.empty(3)
            dist.recv(got, prv, tag=7)
        else:
            got = torch.empty(3)
            dist.recv(got, prv, tag=7)
            dist.send(torch.tensor([float(r)] * 3), nxt, tag=7)
        seen["sendrecv"] = got.tolist()
        big = torch.full((1 << 21,), float(r))
        into = torch.empty(1 << 21)
        ops = [dist.P2POp(dist.isend, big, nxt), dist.P2POp(dist.irecv, into, prv)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        seen["batch"] = (float(into[0]), float(into[-1]))
        # irecv first, then two sends the peer receives before it answers the irecv
        if r < 2:
            answer, peer = torch.empty(3), 1 - r
            if r == 0:
                pending = dist.irecv(answer, peer, tag=9)
                dist.send(torch.full((3,), 1.0), peer, tag=10)
                dist.send(torch.full((3,), 2.0), peer, tag=11)
                pending.wait()
            else:
                dist.recv(answer, peer, tag=10)
                dist.recv(answer, peer, tag=11)
                dist.send(answer + 1, peer, tag=9)
            seen["irecv_first"] = answer.tolist()
        # a receive pending across an all_reduce waited through its future: the peer
        # sends only after its own all_reduce
        got = torch.empty(4)
        pending = dist.irecv(got, prv, tag=12)
        pending.get_future()
        total = dist.all_reduce(torch.full((4,), float(r + 1)), async_op=True).get_future()
        seen["across"] = total.wait()[0].tolist()
        dist.send(torch.full((4,), float(r)), nxt, tag=12)
        pending.wait()
        seen["across"] += got.tolist()
    return seen


def symmetric_tensors(comm, store_path):
    """shmcoll.torch.empty: all_reduce / reduce_scatter_tensor / all_gather_into_tensor
    on symmetric tensors, against numpy; what the group's communicator runs on them."""
    import torch
    import shmcoll.torch
    dist = group(comm, store_path)
    P, r, n = comm.world_size, comm.rank, 70000
    t = shmcoll.torch.empty(n)
    zero = bool((t == 0).all())
    t.copy_(torch.arange(n, dtype=torch.float32) * (r + 1))
    dist.all_reduce(t)
    big = shmcoll.torch.empty((P * 4, 3), dtype=torch.float64)
    big.copy_(torch.arange(P * 12, dtype=torch.float64).reshape(P * 4, 3) + r)
    part = torch.empty((4, 3), dtype=torch.float64)
    dist.reduce_scatter_tensor(part, big)
    bf = shmcoll.torch.empty(5, dtype=torch.bfloat16)
    bf.fill_(r + 1)
    dist.all_reduce(bf)
    backend = shmcoll.torch.symmetric._backend(None)
    runs = backend.comm.algorithm_for("allreduce", t.numel() * 4, symmetric="in place")
    try:
        shmcoll.torch.empty(3, group=dist.new_group(backend="gloo"))
        foreign = "accepted"
    except ValueError as e:
        foreign = str(e)
    return {"zero": zero, "allreduce": t.numpy().copy(), "reduce_scatter": part.numpy().copy(),
            "bf16": bf.float().numpy().copy(), "runs": runs, "foreign": foreign}
