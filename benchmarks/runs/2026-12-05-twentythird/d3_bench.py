import torch, normlib, sys
from triton.testing import do_bench
from normlib.backends.triton import tile_size
torch.manual_seed(0); d = "cuda"; tag = sys.argv[1]
def bench(name, shape, state, layout, strip, bwd):
    B, C, T = shape
    x = torch.randn(*((B, C, T) if layout == "b c t" else (B, T, C)), device=d, requires_grad=bool(bwd))
    sh = (B, C) if name.startswith("cc") else (B,)
    o = lambda v: torch.full(sh, v, dtype=torch.float64, device=d)
    st = normlib.NormState(o(5.), o(0.3), o(5.)) if state else None
    f = getattr(normlib.functional, name)
    kw = dict(state=st, layout=layout, backend="triton")
    with tile_size(strip=strip, bwd_strip=strip):
        if bwd:
            y = f(x, **kw); gy = torch.randn_like(y)
            fn = lambda: torch.autograd.grad(y, x, gy, retain_graph=True)
        else:
            fn = lambda: f(x, **kw)
        fn(); torch.cuda.synchronize()
        ms = sorted(do_bench(fn, warmup=50, rep=300) for _ in range(5))
    print(tag, name, shape, layout, "state" if state else "-", strip, "bwd" if bwd else "fwd",
          f"{ms[0]*1e3:.1f} us (median {ms[2]*1e3:.1f})", flush=True)
for a in [("ccln", (16, 256, 8000), 1, "b c t", None, 1), ("ccln", (16, 256, 8000), 0, "b c t", None, 1),
          ("ccln", (64, 128, 4000), 1, "b c t", 1, 1), ("ccln", (8, 256, 16000), 1, "b t c", None, 1),
          ("ccln", (8, 256, 16000), 0, "b t c", None, 1), ("ccemaln", (16, 256, 8000), 1, "b c t", None, 1)]:
    bench(*a)
