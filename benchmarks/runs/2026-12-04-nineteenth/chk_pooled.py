"""Pooled norms' outputs and gradients against float64 autograd of the reference at the default tiles: DC offset,
a drifting mean, and an outlier channel 0 (fp32)."""
import sys
import torch
import normlib
torch.manual_seed(0)
bad = 0
norms = sys.argv[1].split(",") if len(sys.argv) > 1 else ["cln", "emaln", "frameln"]
for name in norms:
    spec = normlib.get(name).spec
    for (B, C, T) in [(4, 512, 4000), (3, 300, 999)]:
        for layout in ("b c t", "b t c"):
            for dt, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
                for data in ("dc", "drift", "outlier") if dt == torch.float32 else ("plain",):
                    x = torch.randn(B, C, T, device="cuda")
                    if data == "dc":
                        x += 1e4
                    elif data == "drift":
                        x += 300 * torch.linspace(-1, 1, T, device="cuda")
                    elif data == "outlier":
                        x[:, 0] += 100
                    if layout == "b t c":
                        x = x.transpose(1, 2).contiguous()
                    x = x.to(dt).requires_grad_()
                    gy = torch.randn(x.shape, device="cuda").to(dt)
                    w = torch.randn(C, device="cuda", requires_grad=True)
                    b = torch.randn(C, device="cuda", requires_grad=True)
                    lengths = torch.tensor([T] + [T // 2 + 1] * (B - 1), device="cuda")
                    y = normlib.functional.norm(spec, x, weight=w, bias=b, layout=layout, lengths=lengths,
                                                backend="triton")
                    got = (y,) + torch.autograd.grad(y, (x, w, b), gy)
                    xr, wr, br = (t.detach().double().requires_grad_() for t in (x, w, b))
                    yr = normlib.functional.norm(spec, xr, weight=wr, bias=br, layout=layout, lengths=lengths,
                                                 backend="torch")
                    want = (yr,) + torch.autograd.grad(yr, (xr, wr, br), gy.double())
                    for n, g, r in zip(("y", "dx", "dw", "db"), got, want):
                        err = ((g.double() - r).norm() / r.norm()).item()
                        ok = err <= tol and bool(torch.isfinite(g).all())
                        bad += not ok
                        print(("PASS" if ok else "FAIL"), name, (B, C, T), layout, dt, data, n, f"{err:.2e}",
                              flush=True)
print(bad, "failed")
