"""Train a small causal Conv-TasNet on synthetic two-source mixtures, then separate one mixture offline and
streamed hop by hop, and check that both give the same signal.

    python examples/separate.py                    # a few minutes on a CPU
    python examples/separate.py --device cuda      # the training on a GPU; the stream runs on the CPU
    python examples/separate.py --quick            # a short run of every part

The sources are made here from a seed (no downloads): a harmonic tone with a wandering amplitude, and
band-passed noise in bursts, mixed at 8 kHz. The loss is the negative SI-SDR under the best of the two
source orders (permutation invariant training); the score is the SI-SDR improvement over the mixture on
held-out mixtures.

The stream: ``normlib.stream(model)`` keeps each norm's statistics from one call to the next, and
:class:`ConvBuffers` keeps what the convolutions need of the past (the encoder's last samples, each dilated
convolution's last frames, the decoder's overlap-add tail). It runs the model's own modules on each hop of
``stride`` samples.
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

import normlib

SAMPLE_RATE = 8000
# CPU sizes: 17 norm layers on (B, 64, T); asteroid's full model is conv_tasnet(norm) with no kwargs.
MODEL_KWARGS = dict(n_filters=64, kernel_size=16, stride=8, bn_chan=32, hid_chan=64, skip_chan=32,
                    n_blocks=4, n_repeats=2)
QUICK_KWARGS = dict(n_filters=16, kernel_size=16, stride=8, bn_chan=8, hid_chan=16, skip_chan=8,
                    n_blocks=3, n_repeats=1)


# ------------------------------------------------------------------------------------------------------
# Data
def _smooth(g, batch, points, length, device):
    """Random values at ``points`` evenly spaced instants, linearly joined: (batch, length) in [0, 1)."""
    knots = torch.rand(batch, 1, points, generator=g)
    return F.interpolate(knots, size=length, mode="linear", align_corners=True)[:, 0].to(device)


def make_sources(batch, length, g, device="cpu"):
    """(batch, 2, length) unit-power sources: a harmonic tone (f0 100 to 300 Hz, five harmonics, a slow
    random envelope) and noise band-passed to 1 to 3.5 kHz in bursts."""
    t = torch.arange(length) / SAMPLE_RATE
    f0 = 100 + 200 * torch.rand(batch, 1, 1, generator=g)
    k = torch.arange(1, 6).view(1, 5, 1)
    amp = torch.rand(batch, 5, 1, generator=g) / k  # a random timbre, falling with the harmonic's number
    phase = 2 * torch.pi * torch.rand(batch, 5, 1, generator=g)
    tone = (amp * torch.sin(2 * torch.pi * f0 * k * t + phase)).sum(1)
    tone = tone * (0.2 + _smooth(g, batch, 6, length, "cpu"))

    spec = torch.fft.rfft(torch.randn(batch, length, generator=g))
    freqs = torch.fft.rfftfreq(length, 1 / SAMPLE_RATE)
    lo = 1000 + 1500 * torch.rand(batch, 1, generator=g)
    width = 500 + 1000 * torch.rand(batch, 1, generator=g)
    noise = torch.fft.irfft(spec * ((freqs >= lo) & (freqs <= lo + width)), n=length)
    gate = (_smooth(g, batch, 12, length, "cpu") * 2 - 0.6).clamp(0, 1)  # silent about 30 % of the time
    noise = noise * gate

    src = torch.stack([tone, noise], 1)
    src = src / src.square().mean(-1, keepdim=True).add(1e-8).sqrt()
    return src.to(device)


def make_mixtures(batch, length, g, device="cpu"):
    """(mixture (batch, length), sources (batch, 2, length)): the two sources at a random ratio of -5 to
    5 dB."""
    src = make_sources(batch, length, g, device)
    gain = 10 ** ((10 * torch.rand(batch, 1, generator=g) - 5) / 20)
    src = torch.stack([src[:, 0], src[:, 1] * gain.to(device)], 1)
    return src.sum(1), src


# ------------------------------------------------------------------------------------------------------
# Scores
def si_sdr(est, ref, eps=1e-8):
    """Scale-invariant SDR in dB over the last dim (Le Roux et al. 2019): the part of ``est`` along ``ref``
    against the rest, both zero-mean."""
    est = est - est.mean(-1, keepdim=True)
    ref = ref - ref.mean(-1, keepdim=True)
    target = (est * ref).sum(-1, keepdim=True) / (ref.square().sum(-1, keepdim=True) + eps) * ref
    return 10 * torch.log10(target.square().sum(-1) / ((est - target).square().sum(-1) + eps) + eps)


def pit_si_sdr(est, ref):
    """(B,) SI-SDR averaged over the sources, in the source order that scores best, and that order (B, n)."""
    n = ref.shape[1]
    perms = list(itertools.permutations(range(n)))
    scores = torch.stack([si_sdr(est[:, list(p)], ref).mean(-1) for p in perms], -1)  # (B, n!)
    best = scores.argmax(-1)
    return scores.gather(-1, best[:, None])[:, 0], torch.tensor(perms, device=est.device)[best]


def si_sdri(model, mix, src):
    """Mean SI-SDR improvement in dB of the model's estimates over the mixture itself."""
    with torch.no_grad():
        est = model(mix)[..., :src.shape[-1]]
    score, _ = pit_si_sdr(est, src)
    base = si_sdr(mix[:, None].expand_as(src), src).mean(-1)
    return (score - base).mean().item()


# ------------------------------------------------------------------------------------------------------
# Training
def train(model, steps, *, batch=8, length=4000, lr=3e-3, seed=0, device="cpu", log_every=50, log=print):
    """``steps`` steps of Adam on fresh mixtures; returns the loss (negative PIT SI-SDR, dB) at each step."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    model.train()
    for step in range(1, steps + 1):
        mix, src = make_mixtures(batch, length, g, device)
        score, _ = pit_si_sdr(model(mix)[..., :length], src)
        loss = -score.mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)  # keeps the first steps from blowing up
        opt.step()
        losses.append(loss.item())
        if log_every and (step % log_every == 0 or step == 1):
            window = losses[-log_every:]
            log(f"step {step:4d}  loss {sum(window) / len(window):7.2f} dB")
    model.eval()
    return losses


# ------------------------------------------------------------------------------------------------------
# Streaming
class ConvBuffers:
    """The convolutions' part of streaming a causal :class:`normlib.models.ConvTasNet`: it runs the model's
    own modules on a chunk of samples and keeps what each convolution needs of the past. The norms' states are
    ``normlib.stream``'s: call it inside ``with normlib.stream(model):``.

    A chunk may hold any number of samples. Frame f of the encoder needs samples f * stride .. f * stride +
    kernel - 1, so the output lags the input by ``kernel - stride`` samples; :meth:`flush` returns the
    decoder's last ``kernel - stride`` samples once the input has ended.
    """

    def __init__(self, model):
        self.model = model
        self.kernel, self.stride = model.encoder.kernel_size[0], model.encoder.stride[0]
        self.reset()

    def reset(self):
        self.samples = None  # encoder input not yet consumed: (B, 1, < kernel)
        self.frames = {}  # each dilated conv's last (kernel - 1) * dilation input frames, by the module
        self.tail = None  # the decoder's overlap-add tail: (B, n_src, kernel - stride)

    def _conv(self, conv, x):
        """A causal conv (``normlib.models``' left-padded Conv1d) on a chunk: its past frames instead of the
        zero padding, then plain ``nn.Conv1d`` over them."""
        past = (conv.kernel_size[0] - 1) * conv.dilation[0]
        buf = self.frames.get(conv)
        if buf is None:
            buf = x.new_zeros(x.shape[0], x.shape[1], past)  # what the offline model's padding sees
        x = torch.cat([buf, x], -1)
        self.frames[conv] = x[..., x.shape[-1] - past:]
        return nn.Conv1d.forward(conv, x)

    def _block(self, block, x):
        h = x
        for layer in block.body:
            causal = isinstance(layer, nn.Conv1d) and layer.kernel_size[0] > 1
            h = self._conv(layer, h) if causal else layer(h)
        return block.res(h), block.skip(h)

    def __call__(self, chunk):
        """(B, samples) in, (B, n_src, samples') out: the separated samples that this chunk completes."""
        m, K, S = self.model, self.kernel, self.stride
        x = chunk[:, None] if self.samples is None else torch.cat([self.samples, chunk[:, None]], -1)
        n = max(0, (x.shape[-1] - K) // S + 1)  # whole encoder frames in hand
        self.samples = x[..., n * S:]
        if self.tail is None:
            self.tail = x.new_zeros(x.shape[0], m.n_src, K - S)
        if n == 0:
            return x.new_zeros(x.shape[0], m.n_src, 0)
        # from here on, ConvTasNet.forward on n frames, with the buffered convolutions
        w = F.relu(m.encoder(x[..., :(n - 1) * S + K]))
        h = m.bottleneck(m.in_norm(w))
        skips = 0
        for block in m.blocks:
            res, skip = self._block(block, h)
            h, skips = h + res, skips + skip
        masks = torch.sigmoid(m.mask(skips)).view(w.shape[0], m.n_src, m.n_filters, -1)
        out = m.decoder((masks * w[:, None]).flatten(0, 1)).view(w.shape[0], m.n_src, -1)  # (n-1)*S + K
        out = torch.cat([out[..., :K - S] + self.tail, out[..., K - S:]], -1)
        self.tail = out[..., n * S:]
        return out[..., :n * S]

    def flush(self):
        """The last ``kernel - stride`` samples, which no later frame adds to."""
        tail, self.tail = self.tail, None
        return tail


def stream_separate(model, mix, hop=None):
    """Separate ``mix`` (B, samples) chunk by chunk (``hop`` samples each, the encoder's stride by default)
    with every norm's state and every conv's buffer carried over, on one CPU thread. Returns the signal
    (B, n_src, samples') and each chunk's wall time in seconds."""
    buffers = ConvBuffers(model)
    hop = hop or buffers.stride
    parts, times = [], []
    # One thread: a call's ops are too small to share, and two threads on a busy machine wait on each other
    # (30 times slower on the 2-core CI machine).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad(), normlib.stream(model):
            for chunk in mix.split(hop, -1):
                t0 = time.perf_counter()
                parts.append(buffers(chunk))
                times.append(time.perf_counter() - t0)
            parts.append(buffers.flush())
    finally:
        torch.set_num_threads(threads)
    return torch.cat(parts, -1), times


# ------------------------------------------------------------------------------------------------------
def build(norm="cln", quick=False, seed=0):
    torch.manual_seed(seed)
    return normlib.models.conv_tasnet(norm, **(QUICK_KWARGS if quick else MODEL_KWARGS))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=None, help="training steps (default 300; 100 with --quick)")
    p.add_argument("--device", default="cpu", help="where to train: cpu, cuda (the stream runs on the CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--norm", default="cln", help="a causal normlib norm: cln, ccln, emaln, ccemaln, frameln")
    p.add_argument("--quick", action="store_true", help="a tiny model, short mixtures, few steps")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads for training (default 1: on a busy 2-core machine, 2 threads made a step 50 "
                        "times slower); the stream always runs on one")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    steps = args.steps if args.steps is not None else (100 if args.quick else 300)
    length = 2000 if args.quick else 4000  # 0.25 or 0.5 s at 8 kHz

    t_start = time.perf_counter()
    model = build(args.norm, args.quick, args.seed).to(args.device)
    normlib.stream(model)  # refuses a norm that cannot stream (gln, instln) now rather than after training
    n_norms = sum(isinstance(m, normlib.NormLayer) for m in model.modules())
    n_params = sum(p.numel() for p in model.parameters())
    print(f"causal Conv-TasNet, {n_norms} {args.norm} layers, {n_params / 1e3:.0f} k parameters, "
          f"training on {args.device} (CPU threads: {torch.get_num_threads()})")
    test_mix, test_src = make_mixtures(64, length, torch.Generator().manual_seed(args.seed + 1000), args.device)
    model.eval()
    print(f"held-out SI-SDRi before training: {si_sdri(model, test_mix, test_src):6.2f} dB")
    t0 = time.perf_counter()
    train(model, steps, length=length, seed=args.seed, device=args.device,
          log_every=10 if args.quick else 50)
    t_train = time.perf_counter() - t0
    print(f"{steps} steps in {t_train:.1f} s; held-out SI-SDRi on 64 mixtures: "
          f"{si_sdri(model, test_mix, test_src):6.2f} dB")

    # One held-out mixture (1 s at 8 kHz; 0.5 s with --quick), offline and streamed hop by hop.
    model = model.cpu()
    mix = make_mixtures(1, 2 * length, torch.Generator().manual_seed(args.seed + 2000))[0]
    with torch.no_grad():
        offline = model(mix)
    stride = model.encoder.stride[0]
    worst = 0.0
    print(f"streaming {mix.shape[-1] / SAMPLE_RATE:.1f} s on the CPU (1 thread, B=1, no grad):")
    for hop in (stride, 10 * stride):  # one encoder frame a call; ten (10 ms at stride 8)
        streamed, times = stream_separate(model, mix, hop)
        diff = (streamed - offline).abs().max().item()
        worst = max(worst, diff)
        per_call = statistics.median(times[1:])  # the first call only fills the encoder's buffer (at hop 8)
        print(f"  {hop:3d} samples a call: max |streamed - offline| {diff:.1e}; median {per_call * 1e6:5.0f} us "
              f"per call for {hop / SAMPLE_RATE * 1e3:.0f} ms of audio, real-time factor "
              f"{per_call * SAMPLE_RATE / hop:.2f}")
    print(f"total {time.perf_counter() - t_start:.1f} s")
    if worst > 1e-4:
        raise SystemExit("the streamed signal differs from the offline one")


if __name__ == "__main__":
    main()
