# tile sweeps of the chunked pooled kernels and the per-channel kernels
export PYTHONPATH=.
S="python benchmarks/sweep.py"
$S --norm cln --block-t 16,32,64 --block-c 32,64,128 --warps 4 --bwd
$S --norm cln --block-t 32 --block-c 64,128 --warps 2,8
$S --norm cln --dtype bf16 --block-t 32,64,128 --block-c 32,64 --warps 4 --bwd
$S --norm cln --layout "b t c" --block-t 8,16,32 --block-c 64,128,256 --warps 4 --bwd
$S --norm frameln --block-t 32,64 --block-c 64,128 --warps 4
$S --norm gln
$S --norm ccln --block-t 64,128,256 --block-c 4,8,16 --warps 4 --bwd
$S --norm ccln --layout "b t c" --block-t 16,32,64 --block-c 32,64,128 --warps 4 --bwd
