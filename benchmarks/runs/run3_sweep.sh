# tile sweeps of the chunked pooled kernels and the per-channel kernels (fp32 unless said)
export PYTHONPATH=.
S="timeout 100 python benchmarks/sweep.py"
$S --norm cln --block-t 16,32,64 --block-c 64,128 --warps 4 --bwd
$S --norm cln --dtype bf16 --block-t 32,64 --block-c 32,64 --warps 4 --bwd
$S --norm cln --layout "b t c" --block-t 16,32 --block-c 128,256 --warps 4 --bwd
$S --norm frameln
$S --norm gln --bwd
$S --norm emaln --dtype bf16
$S --norm ccln --block-t 128,256,512 --block-c 4,8,16 --warps 4
$S --norm ccln --layout "b t c" --block-t 32,64 --block-c 32,64 --warps 4
