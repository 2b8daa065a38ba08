export PYTHONPATH=.
timeout 60 python - <<'PY'
import torch, normlib
from normlib.functional import norm
from normlib import reference as R
torch.manual_seed(0)
def rel(a, b): return float((a.double() - b.double()).norm() / b.double().norm())
for layout in ("b c t", "b t c"):
  for (B, C, T) in ((2, 64, 30000), (3, 50, 40001)):
    x = torch.randn(B, C, T, device="cuda") * 2
    xl = x if layout == "b c t" else x.transpose(1, 2).contiguous()
    for name in ("ccln", "ccemaln", "cln"):
        spec = normlib.get(name).spec
        ref = R.REFERENCES[name](x.double())
        y1 = norm(spec, xl, layout=layout, backend="triton"); y2 = norm(spec, xl, layout=layout, backend="triton")
        if layout == "b t c": y1, y2 = y1.transpose(1, 2), y2.transpose(1, 2)
        print(f"{name} {layout} {B}x{C}x{T}: vs ref {rel(y1, ref):.1e} {rel(y2, ref):.1e}", flush=True)
PY
timeout 230 python benchmarks/gpu_report.py --quick --stages eager --out $OUT > $OUT/eager.log 2>&1
tail -30 $OUT/eager.log
