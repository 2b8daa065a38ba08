"""frameln gradients and outputs against float64 autograd of the reference, at the default (lean) tiles."""
import torch
import normlib
from normlib.backends.triton import launch
spec = normlib.get("frameln").spec
torch.manual_seed(0)
bad = 0
for (B, C, T) in [(4, 512, 4000), (2, 256, 6400), (3, 300, 999)]:
    for layout in ("b c t", "b t c"):
        for dt, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
            x = torch.randn(B, C, T, device="cuda") + 1e4 * (dt == torch.float32)
            if layout == "b t c":
                x = x.transpose(1, 2).contiguous()
            x = x.to(dt).requires_grad_()
            gy = torch.randn(x.shape, device="cuda").to(dt)
            w = torch.randn(C, device="cuda", requires_grad=True)
            b = torch.randn(C, device="cuda", requires_grad=True)
            lengths = torch.tensor([T] + [T // 2 + 1] * (B - 1), device="cuda")
            y = normlib.functional.norm(spec, x, weight=w, bias=b, layout=layout, lengths=lengths, backend="triton")
            got = (y,) + torch.autograd.grad(y, (x, w, b), gy)
            xr, wr, br = (t.detach().double().requires_grad_() for t in (x, w, b))
            yr = normlib.functional.norm(spec, xr, weight=wr, bias=br, layout=layout, lengths=lengths, backend="torch")
            want = (yr,) + torch.autograd.grad(yr, (xr, wr, br), gy.double())
            tiles = launch.tiles_for(x.transpose(1, 2) if layout == "b t c" else x, False, 0.0)
            for n, g, r in zip(("y", "dx", "dw", "db"), got, want):
                err = ((g.double() - r).norm() / r.norm()).item()
                ok = err <= tol and bool(torch.isfinite(g).all())
                bad += not ok
                print(("PASS" if ok else "FAIL"), (B, C, T), layout, dt, n, f"{err:.2e}", "hold", tiles[8], tiles[11],
                      flush=True)
print(bad, "failed")
