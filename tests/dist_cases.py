"""What the ranks of tests/test_distributed.py run, in processes it spawns: each job compares the sequence-parallel
(or data-parallel) computation with the single-process one, computed in the same process, and returns the
failures it found and how many comparisons it made."""
import datetime
import json
import os
import pathlib
import socket
import time
import traceback
import zlib

import conftest  # noqa: F401  (the Triton interpreter switch, before normlib imports triton)
import torch
import torch.distributed as dist
from conftest import NORMS, SPECS, make_affine, make_state, make_x, rel_err, time_dim, unit_floor
from torch import nn

import normlib
from normlib import distributed as nd

# each world's split of the time axis: uneven, a one-frame slice; and lengths that end on a slice's last frame,
# inside a slice (the later slices all padding), or at 0
SPLITS = {1: [5], 2: [1, 6], 3: [3, 1, 4]}
LENGTHS = {1: [5, 2, 1, 0], 2: [7, 1, 3, 0], 3: [8, 2, 4, 0]}
TOLS = {torch.float64: 1e-10, torch.float32: 2e-5}
DEVICE = torch.device("cpu")  # main() sets this rank's device


class Record:
    def __init__(self):
        self.failures, self.checks = [], 0

    def close(self, what, out, ref, tol, floor=0.0):
        self.checks += 1
        if out is None or ref is None:
            if (out is None) != (ref is None) and float((out if ref is None else ref).abs().max()) != 0:
                self.failures.append(f"{what}: one gradient is None, the other nonzero")
            return
        err = rel_err(out, ref, floor)
        if not err <= tol:
            self.failures.append(f"{what}: relative error {err:.3e} > {tol:.1e}")


def _slice(t, layout, rank, split):
    start = sum(split[:rank])
    return t.narrow(time_dim(layout), start, split[rank])


def _leaf(t):
    return None if t is None else t.detach().clone().requires_grad_()


def _run_norm(name, x, w, b, layout, lengths, state, return_state, backend, group, decay):
    kw = dict(layout=layout, lengths=lengths, state=state, return_state=return_state, backend=backend)
    if decay is not None:
        kw["decay"] = decay
    return normlib.functional.norm(name, x, w, b, group=group, **kw)


def norm_case(rec, rank, world, name, layout, backend, dtype, full):
    """One norm, forward and every gradient, on this rank's slice against the whole sequence."""
    spec = SPECS[name]
    split = SPLITS[world]
    B, C, T = 4, 3, sum(split)
    g = torch.Generator().manual_seed(zlib.crc32(f"{name} {layout} {backend} {full}".encode()))  # not hash(): salted per process
    x = make_x(B, C, T, layout, dtype, g).to(DEVICE)
    w, b = (t.to(DEVICE) for t in make_affine(C, dtype, g))
    lengths = torch.tensor(LENGTHS[world], device=DEVICE) if full else None
    causal = spec.causal
    state = make_state(name, B, C, generator=g).to(DEVICE) if causal and full else None
    return_state = causal and full
    decay = 0.7 if spec.time is normlib.TimeMode.EMA else None
    gy = torch.randn(x.shape, dtype=torch.float64, generator=g).to(DEVICE, dtype)
    gm, gm2 = (torch.randn((B, C) if spec.per_channel else (B,), dtype=torch.float64, generator=g).to(DEVICE)
               for _ in "12")

    def loss(out, with_state):
        y, s = out if return_state else (out, None)
        total = (y * (gy if y.shape == gy.shape else _slice(gy, layout, rank, split))).sum()
        if s is not None and with_state:
            total = total + (s.m * gm).sum() + (s.m2 * gm2).sum()
        return total, y, s

    what = f"{name} {layout!r} {backend} {'lengths+state' if full else 'plain'} world={world}"
    # the single process on the whole sequence
    xf, wf, bf = _leaf(x), _leaf(w), _leaf(b)
    sf = None if state is None else normlib.NormState(state.w, _leaf(state.m), _leaf(state.m2))
    lf, yf, stf = loss(_run_norm(name, xf, wf, bf, layout, lengths, sf, return_state, backend, None, decay), True)
    lf.backward()
    # this rank's slice; the state term of the loss on one rank (it is the same state on every rank)
    xr, wr, br = _leaf(_slice(x, layout, rank, split)), _leaf(w), _leaf(b)
    sr = None if state is None else normlib.NormState(state.w, _leaf(state.m), _leaf(state.m2))
    lr, yr, str_ = loss(_run_norm(name, xr, wr, br, layout, lengths, sr, return_state, backend, dist.group.WORLD,
                                  decay), rank == 0)
    lr.backward()
    tol = TOLS[dtype]
    rec.close(f"{what}: y", yr, _slice(yf, layout, rank, split), tol)
    rec.close(f"{what}: dx", xr.grad, _slice(xf.grad, layout, rank, split), tol)
    for label, mine, ref in (("dweight", wr.grad, wf.grad), ("dbias", br.grad, bf.grad)):
        total = mine.detach().clone()
        dist.all_reduce(total)  # each rank's share: their sum is the single-device gradient
        rec.close(f"{what}: {label} summed over ranks", total, ref, tol)
    if return_state:
        for field in normlib.NormState._fields:
            rec.close(f"{what}: returned state.{field}", getattr(str_, field), getattr(stf, field), tol)
        if rank == 0:  # the incoming state enters on the first rank
            rec.close(f"{what}: dstate.m", sr.m.grad, sf.m.grad, tol)
            rec.close(f"{what}: dstate.m2", sr.m2.grad, sf.m2.grad, tol)


def collectives(rec, rank, world):
    """After a size's first call, one all_gather forward and one all_reduce backward per call (lengths too)."""
    split = SPLITS[world]
    x = make_x(2, 3, sum(split), dtype=torch.float64).to(DEVICE)
    counts = {"all_gather": 0, "all_reduce": 0}
    real = {k: getattr(nd.dist, k) for k in counts}

    def counting(k):
        def call(*a, **kw):
            counts[k] += 1
            return real[k](*a, **kw)
        return call

    lengths = torch.tensor([sum(split), 1], device=DEVICE)
    for name in ("cln", "gln"):
        for first in (True, False):
            xr = _leaf(_slice(x, "b c t", rank, split))
            for k in counts:
                counts[k] = 0
                setattr(nd.dist, k, counting(k))
            try:
                y = normlib.functional.norm(name, xr, lengths=lengths, backend="torch", group=dist.group.WORLD)
                y.sum().backward()
            finally:
                for k in counts:
                    setattr(nd.dist, k, real[k])
            if not first:
                rec.checks += 1
                if counts != {"all_gather": 1, "all_reduce": 1}:
                    rec.failures.append(f"{name}: collectives per call {counts}, wanted one of each")


def norms(rank, world, rec):
    for backend, dtype in (("torch", torch.float64), ("triton", torch.float32), ("torch", torch.float32))[
            :3 if DEVICE.type == "cuda" else 2]:
        for name in NORMS:
            for layout in ("b c t", "b t c"):
                # the interpreter is slow: Triton on the CPU runs each norm once per layout
                for full in ((False, True) if backend == "torch" or DEVICE.type == "cuda" else (layout == "b c t",)):
                    norm_case(rec, rank, world, name, layout, backend, dtype, full)
    collectives(rec, rank, world)


def _train(model, batches, steps, loss_scale=1.0, opt="sgd"):
    optim = (torch.optim.SGD(model.parameters(), lr=0.1) if opt == "sgd"
             else torch.optim.Adam(model.parameters(), lr=0.01))
    for step in range(steps):
        x, target = batches[step]
        optim.zero_grad()
        loss = (model(x) - target).square().mean() * loss_scale
        loss.backward()
        optim.step()


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def data_parallel(rank, world, rec):
    """DistributedDataParallel over gloo, each rank half the batch, against one process on the whole batch."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    steps, B = 3, 4
    for norm, opt, backend in (("cln", "adam", "torch"), ("gln", "sgd", "torch"), ("ccemaln", "sgd", "torch"),
                               ("emaln", "sgd", "triton")):
        dtype = torch.float64 if backend == "torch" else torch.float32
        torch.manual_seed(1)
        build = lambda: normlib.models.channels_last_tcn(norm, in_features=4, out_features=4, channels=6,  # noqa: E731
                                                         n_blocks=1, kernel_size=3, mlp_ratio=1,
                                                         backend=backend).to(DEVICE, dtype)
        single = build()
        replica = build()
        replica.load_state_dict(single.state_dict())
        g = torch.Generator().manual_seed(2)
        batches = [(torch.randn(B, 9, 4, generator=g, dtype=torch.float64).to(DEVICE, dtype),
                    torch.randn(B, 9, 4, generator=g, dtype=torch.float64).to(DEVICE, dtype)) for _ in range(steps)]
        _train(single, batches, steps, opt=opt)
        per_rank = B // world
        mine = [(x[rank * per_rank:(rank + 1) * per_rank], t[rank * per_rank:(rank + 1) * per_rank])
                for x, t in batches]
        _train(DDP(replica), mine, steps, opt=opt)
        for i, (a, b) in enumerate(zip(_params(replica), _params(single))):
            rec.close(f"DDP {norm} {backend} {opt}: parameter {i} after {steps} steps", a, b, TOLS[dtype] * 10,
                      unit_floor(b))


class _Pointwise(nn.Module):
    """Layers that mix no frames, but for the norms: a model that a time split needs no halo for."""

    def __init__(self, C=5):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(3, C, 1), normlib.get("cln")(C, backend="torch"), nn.PReLU(),
                                 nn.Conv1d(C, C, 1), normlib.get("gln")(C, backend="torch"), nn.Conv1d(C, C, 1),
                                 normlib.get("ccemaln")(C, backend="torch", decay=0.8), nn.Conv1d(C, 2, 1))

    def forward(self, x):
        return self.net(x)


def model_parallel(rank, world, rec):
    """normlib.sequence_parallel(model) under DDP over the same group, the loss times the group's size: after 3
    steps, the single process's parameters (the weights' shares summed, as DDP's average of scaled losses)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    split, steps = SPLITS[world], 3
    torch.manual_seed(3)
    single = _Pointwise().to(DEVICE, torch.float64)
    replica = _Pointwise().to(DEVICE, torch.float64)
    replica.load_state_dict(single.state_dict())
    g = torch.Generator().manual_seed(4)
    T = sum(split)
    batches = [(torch.randn(2, 3, T, generator=g, dtype=torch.float64).to(DEVICE),
                torch.randn(2, 2, T, generator=g, dtype=torch.float64).to(DEVICE)) for _ in range(steps)]
    # the single process's loss: the mean over all frames; a rank's: its frames' share of that mean
    optim = torch.optim.SGD(single.parameters(), lr=0.1)
    for x, t in batches:
        optim.zero_grad()
        (single(x) - t).square().mean().backward()
        optim.step()
    ddp = DDP(replica)
    optim = torch.optim.SGD(ddp.parameters(), lr=0.1)
    with normlib.sequence_parallel(replica) as sp:
        rec.checks += 1
        if len(sp.layers) != 3 or any(layer._parallel is not sp for layer in sp.layers.values()):
            rec.failures.append(f"sequence_parallel covers {list(sp.layers)}")
        for x, t in batches:
            optim.zero_grad()
            xs, ts = (_slice(v, "b c t", rank, split) for v in (x, t))
            ((ddp(xs) - ts).square().sum() / t.numel() * world).backward()
            optim.step()
    rec.checks += 1
    if any(layer._parallel is not None for layer in sp.layers.values()):
        rec.failures.append("a layer keeps its group after the context")
    for i, (a, b) in enumerate(zip(_params(replica), _params(single))):
        # judged on the scale of unit parameters: some gradients are 0 but for rounding (gln's input bias)
        rec.close(f"sequence_parallel + DDP: parameter {i} after {steps} steps", a, b, 1e-10, unit_floor(b))


def errors(rank, world, rec):
    """Bad input: errors that name the argument, raised on every rank alike (no rank left in a collective)."""
    x = torch.randn(2, 3, SPLITS[world][rank], dtype=torch.float64, device=DEVICE)
    for kwargs, match in ((dict(group="world"), "group must be a torch.distributed ProcessGroup"),
                          (dict(group=dist.group.WORLD, lengths=torch.tensor([1.0, 2.0], device=DEVICE)), "integer"),
                          (dict(group=dist.group.WORLD, lengths=torch.tensor([100, 1], device=DEVICE)),
                           "lengths must lie in"),
                          (dict(group=dist.group.WORLD, lengths=torch.tensor([1, rank], device=DEVICE)),
                           "lengths differ")):
        if match == "lengths differ" and world == 1:  # one rank: nothing to differ from
            continue
        rec.checks += 1
        try:
            normlib.functional.cln(x, backend="torch", **kwargs)
            rec.failures.append(f"{kwargs}: no error")
        except (TypeError, ValueError) as e:
            if match not in str(e):
                rec.failures.append(f"{kwargs}: {e}")
    if world > 1:  # the ranks still agree after the errors: one more call works
        y = normlib.functional.gln(x, backend="torch", group=dist.group.WORLD)
        rec.checks += 1
        if not torch.isfinite(y).all():
            rec.failures.append("a call after the errors failed")


JOBS = {"norms": norms, "data_parallel": data_parallel, "model_parallel": model_parallel, "errors": errors}


def main(rank, world, port, jobs, out, backend="gloo", device="cpu"):
    """Rank ``rank`` of ``world``: runs ``jobs`` and writes their failures and check counts to out/<rank>.json.
    ``device`` "cuda": NCCL gives each rank its GPU; gloo puts every rank on GPU 0 (CUDA tensors through gloo)."""
    global DEVICE
    torch.set_num_threads(1)
    if device == "cuda":
        DEVICE = torch.device("cuda", rank if backend == "nccl" else 0)
        torch.cuda.set_device(DEVICE)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    result = {}
    try:
        for job in jobs:
            rec = Record()
            try:
                JOBS[job](rank, world, rec)
            except Exception:
                rec.failures.append(traceback.format_exc())
            result[job] = {"failures": rec.failures, "checks": rec.checks}
    finally:
        pathlib.Path(out, f"{rank}.json").write_text(json.dumps(result))
        dist.destroy_process_group()
    os._exit(0)  # no interpreter teardown of gloo's threads


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(world, jobs, out, timeout, backend="gloo", device="cpu") -> tuple[dict, list[str]]:
    """Run ``jobs`` on ``world`` spawned ranks, writing their results under the folder ``out``; a rank still running
    after ``timeout`` seconds is killed. Returns ({rank: {job: {"checks", "failures"}}}, what went wrong with the
    processes: ranks that hung or wrote nothing)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=main, args=(r, world, port, jobs, str(out), backend, device)) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    results, problems = {}, []
    for r, p in enumerate(procs):
        if p.is_alive():
            p.kill()
            p.join()
            problems.append(f"rank {r} of {world}: still running after {timeout} s (a collective that hangs)")
            continue
        path = pathlib.Path(out, f"{r}.json")
        if not path.exists():
            problems.append(f"rank {r}: wrote no result (exit code {p.exitcode})")
            continue
        results[r] = json.loads(path.read_text())
    return results, problems
