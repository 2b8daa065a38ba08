"""Conv-TasNet on one long sequence split over two GPUs (NCCL, one process each) against the whole sequence on one
GPU: time per training step, peak memory per GPU, and what the norms' collective costs per call.

    python benchmarks/sequence_parallel.py                          # two GPUs, NCCL (the issue's run)
    python benchmarks/sequence_parallel.py --seconds 240 --norm gln
    python benchmarks/sequence_parallel.py --device cpu --small     # a dry run: gloo, two CPU processes

What runs on each rank:

- the single-device baseline: rank 0 trains on the whole sequence (the other ranks wait), one step at a time;
- sequence parallel: each rank holds a slice of the encoder's frames, in rank order. The waveform slice reaches
  back the encoder's overlap (data, no communication); each causal dilated convolution takes the frames it
  reaches back from the previous ranks through a halo exchange (an all_gather of each rank's last frames, its
  backward an all_reduce), and every normlib layer runs under ``normlib.sequence_parallel``. The decoder's
  overlap-add at a slice's boundary (kernel - stride samples) is left to each rank's own frames: the loss differs
  there from the single-device one, the work does not;
- the norms' collective: one norm call (forward + backward) on a slice of Conv-TasNet's shape, with ``group`` and
  without it (the same kernels, given an incoming state instead of the merged one), and the bare all_gather and
  all_reduce of a norm's packet; in microseconds and as a fraction of the norm's own time.

Writes JSON lines (one per measurement) to $OUT, or benchmarks/out, as sequence_parallel.jsonl.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import socket
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import normlib  # noqa: E402
from normlib import models  # noqa: E402

SMALL = dict(n_filters=64, hid_chan=64, bn_chan=32, skip_chan=32, n_blocks=4, n_repeats=1)


class _Halo(torch.autograd.Function):
    """x's first frames preceded by the last ``h`` frames of the ranks before this one (zeros on rank 0: causal
    padding). Forward: an all_gather of every rank's last h frames; backward: an all_reduce of their gradients."""

    @staticmethod
    def forward(ctx, x, h, group):
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        ctx.group, ctx.rank = group, rank
        tail = x[..., -h:] if x.shape[-1] >= h else F.pad(x, (h - x.shape[-1], 0))
        out = x.new_empty((world,) + tail.shape)
        dist.all_gather(list(out.unbind(0)), tail.contiguous(), group=group)
        ctx.h, ctx.T = h, x.shape[-1]
        # frames before this slice, nearest last: a short earlier slice reaches further back (slices >= h assumed
        # beyond one rank back, which the script's split guarantees)
        halo = out[rank - 1] if rank > 0 else torch.zeros_like(tail)
        return torch.cat([halo, x], dim=-1)

    @staticmethod
    def backward(ctx, g):
        world = dist.get_world_size(ctx.group)
        gh = g.new_zeros((world,) + g[..., :ctx.h].shape)
        if ctx.rank > 0:
            gh[ctx.rank - 1] = g[..., :ctx.h]
        dist.all_reduce(gh, group=ctx.group)
        gx = g[..., ctx.h:].clone()
        n = min(ctx.h, ctx.T)
        gx[..., ctx.T - n:] += gh[ctx.rank][..., ctx.h - n:]
        return gx, None, None


def _halo_convs(model, group):
    """Each causal convolution of ``model`` takes its left context from the previous rank instead of zeros."""
    for m in model.modules():
        if isinstance(m, models._CausalConv):
            h = (m.kernel_size[0] - 1) * m.dilation[0]

            def forward(x, m=m, h=h):
                return torch.nn.Conv1d.forward(m, _Halo.apply(x, h, group) if h else x)

            m.forward = forward


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device, steps, warmup, group=None):
    """Median seconds of ``fn`` over ``steps`` calls (after ``warmup``), every rank of ``group`` in step."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        if group is not None:
            dist.barrier(group)
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _step(model, wav, opt):
    def step():
        opt.zero_grad(set_to_none=True)
        est = model(wav)
        est.square().mean().backward()
        opt.step()
    return step


def _peak_reset(device):
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device):
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def worker(rank, world, port, args, out_path):
    cuda = args.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=600))
    group = dist.group.WORLD
    rows = []

    def emit(**row):
        row.update(rank=rank, world=world, device=torch.cuda.get_device_name(device) if cuda else "cpu",
                   norm=args.norm, torch=torch.__version__, date=time.strftime("%Y-%m-%d"))
        rows.append(row)
        print(json.dumps(row), flush=True)

    kwargs = SMALL if args.small else {}
    torch.manual_seed(0)
    model = models.conv_tasnet(args.norm, **kwargs).to(device)
    K, S = model.encoder.kernel_size[0], model.encoder.stride[0]
    samples = int(args.seconds * args.rate)
    frames = (samples - K) // S + 1
    wav = torch.randn(1, samples, device=device)

    # 1. the whole sequence on one GPU (rank 0)
    if rank == 0 and not args.skip_single:
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        _peak_reset(device)
        try:
            t = _timed(_step(model, wav, opt), device, args.steps, 1)
            emit(what="single device step", frames=frames, samples=samples, ms=t * 1e3, peak_gib=_peak(device))
        except torch.OutOfMemoryError:
            emit(what="single device step", frames=frames, samples=samples, ms=None, peak_gib=None, oom=True)
        opt = None
    dist.barrier(group)

    # 2. the sequence split over the ranks: frames [F_r, F_r+1), samples from F_r * S to F_r+1 * S + K - S
    bounds = [frames * r // world for r in range(world + 1)]
    f0, f1 = bounds[rank], bounds[rank + 1]
    mine = wav[:, f0 * S:(f1 - 1) * S + K]
    _halo_convs(model, group)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    _peak_reset(device)
    with normlib.sequence_parallel(model, group):
        t = _timed(_step(model, mine, opt), device, args.steps, 1, group)
    emit(what="sequence parallel step", frames=f1 - f0, total_frames=frames, samples=mine.shape[-1], ms=t * 1e3,
         peak_gib=_peak(device))

    # 3. one norm call on a slice of Conv-TasNet's widest activations: with the collective and without it
    C = model.encoder.out_channels
    x = torch.randn(1, C, f1 - f0, device=device, requires_grad=True)
    layer = normlib.get(args.norm)(C).to(device)
    state = None
    if layer.spec.causal:
        state = normlib.NormState(*(torch.rand(1, dtype=torch.float64, device=device).expand(
            (1, C) if layer.spec.per_channel else (1,)).contiguous() for _ in range(3)))

    def local():
        y = layer(x, state=state) if layer.spec.causal else layer(x)
        y.backward(torch.ones_like(y))

    def parallel():
        with normlib.sequence_parallel(layer, group):
            y = layer(x)
        y.backward(torch.ones_like(y))

    t_local = _timed(local, device, args.norm_steps, 3, group)
    t_par = _timed(parallel, device, args.norm_steps, 3, group)
    packet = torch.zeros(2 + 3 * (C if layer.spec.per_channel else 1), dtype=torch.float64, device=device)
    gathered = packet.new_empty((world, packet.numel()))

    def gather():
        dist.all_gather(list(gathered.unbind(0)), packet, group=group)

    def reduce():
        dist.all_reduce(gathered, group=group)

    t_gather = _timed(gather, device, args.norm_steps, 3, group)
    t_reduce = _timed(reduce, device, args.norm_steps, 3, group)
    emit(what="norm call", shape=[1, C, f1 - f0], local_us=t_local * 1e6, parallel_us=t_par * 1e6,
         overhead_us=(t_par - t_local) * 1e6, overhead_fraction=(t_par - t_local) / t_local,
         all_gather_us=t_gather * 1e6, all_reduce_us=t_reduce * 1e6,
         collectives_fraction=(t_gather + t_reduce) / t_local, packet_floats=packet.numel())

    with open(out_path, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    dist.barrier(group)
    dist.destroy_process_group()
    sys.stdout.flush()
    # no interpreter teardown of gloo's threads: it aborted a finished rank now and then ("terminate called
    # without an active exception"), as in tests/dist_cases.py
    os._exit(0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--small", action="store_true", help="a narrow Conv-TasNet on a short sequence (a dry run)")
    ap.add_argument("--world", type=int, default=2, help="processes (GPUs)")
    ap.add_argument("--norm", default="cln")
    ap.add_argument("--seconds", type=float, default=None, help="audio length (default 120 s; 0.5 s with --small)")
    ap.add_argument("--rate", type=int, default=8000)
    ap.add_argument("--steps", type=int, default=None, help="timed training steps (default 5; 2 with --small)")
    ap.add_argument("--norm-steps", type=int, default=None, help="timed norm calls (default 50; 3 with --small)")
    ap.add_argument("--skip-single", action="store_true", help="no single-device baseline (it may not fit)")
    args = ap.parse_args(argv)
    args.seconds = args.seconds if args.seconds is not None else (0.5 if args.small else 120.0)
    args.steps = args.steps or (2 if args.small else 5)
    args.norm_steps = args.norm_steps or (3 if args.small else 50)
    if args.device == "cuda" and torch.cuda.device_count() < args.world:
        print(f"needs {args.world} GPUs, this machine has {torch.cuda.device_count()}: run it on a machine with "
              f"{args.world}, or with --device cpu --small for a dry run")
        return 2
    out_dir = pathlib.Path(os.environ.get("OUT") or ROOT / "benchmarks" / "out")
    out_dir.mkdir(parents=True, exist_ok=True)
    out_path = out_dir / "sequence_parallel.jsonl"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(worker, args=(args.world, port, args, str(out_path)), nprocs=args.world, join=True,
                       start_method="spawn")
    print(f"wrote {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
