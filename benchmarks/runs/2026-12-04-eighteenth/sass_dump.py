import sys
import compile_check as cc
from normlib.backends.triton.kernels import running_norm_fwd
want = dict(kv.split("=") for kv in sys.argv[2].split(","))
dt = sys.argv[1]
for args in cc.configs():
    kernel, const, ints, d, warps, ph = args
    if kernel is not running_norm_fwd or d != dt or (ints["B"], ints["C"], ints["T"]) != (16, 512, 16000):
        continue
    if want.pop("layout", "bct") != ("btc" if ints["sxc"] == 1 else "bct") and False:
        continue
    if ints["sxc"] == 1:
        continue
    if all(str(const.get(k)) == v for k, v in want.items()):
        k = cc.compile_one(args)
        res, sass = cc._sass(k)
        print(res, file=sys.stderr)
        print({k: const.get(k) for k in ("MODE", "BLOCK_C", "BLOCK_T", "HOLD", "STRIP")}, file=sys.stderr)
        print(sass)
        break
