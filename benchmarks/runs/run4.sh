export PYTHONPATH=.
timeout 150 python benchmarks/runs/debug_stream.py
S="timeout 60 python benchmarks/sweep.py"
$S --norm cln --dtype bf16 --block-t 64,128 --block-c 64,128 --warps 4,8
$S --norm cln --block-t 64 --block-c 128 --warps 8
