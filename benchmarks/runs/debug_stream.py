"""One-off: where does per-channel 'b c t' streaming go wrong on the GPU?"""
import torch, normlib
from normlib.functional import norm
from normlib import reference as R
from normlib.backends.triton import launch
torch.manual_seed(0)
B, C, T = 2, 64, 30000
x = torch.randn(B, C, T, device="cuda") * 2
def rel(a, b): return float((a.double() - b.double()).norm() / b.double().norm())
for name in ("ccln", "ccemaln"):
    spec = normlib.get(name).spec
    ref = R.REFERENCES[name](x.double())
    for label, ctx in (("default", dict()), ("window64", dict(window=64)), ("bt128", dict(block_t=128)), ("bc4", dict(block_c=4))):
        with launch.tile_size(**ctx):
            w1 = norm(spec, x, backend="triton"); w2 = norm(spec, x, backend="triton")
            line = f"{name} {label}: whole vs ref {rel(w1, ref):.1e} repeat equal {torch.equal(w1, w2)}"
            for contig in (False, True):
                st, errs = None, []
                for lo, hi in zip([0, 1, 4097, 20000, 20001], [1, 4097, 20000, 20001, T]):
                    xs = x[..., lo:hi]
                    if contig: xs = xs.contiguous()
                    yc, st = norm(spec, xs, state=st, return_state=True, backend="triton")
                    errs.append(rel(yc, ref[..., lo:hi]))
                line += f" | chunks{' contig' if contig else ''} " + " ".join(f"{e:.0e}" for e in errs)
            print(line, flush=True)
