"""`python -m normlib`: the list of norms and the demo (the README's `make demo` runs it on its defaults)."""
import subprocess
import sys

import pytest

import normlib
from normlib.__main__ import main


def test_list_prints_every_norm_with_its_aliases(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["name", "pooled"]
    names = [line.split()[0] for line in lines[2:]]
    assert names == sorted(normlib.available())
    assert "cumln, cgln" in next(line for line in lines if line.startswith("cln "))


def test_demo_on_a_small_input_passes(capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the PyTorch backend on the CPU: quick
    assert main(["demo", "--batch", "2", "--channels", "6", "--frames", "40"]) == 0
    out = capsys.readouterr().out
    assert "(B, C, T) = (2, 6, 40)" in out and out.rstrip().endswith("OK (threshold 1e-4)")
    for name in normlib.available():
        assert f"\n{name} " in out or getattr(normlib.get(name), "spec", None) is None  # a module: skipped


def test_demo_checks_a_registered_spec_against_its_reference(capsys, monkeypatch):
    """A user's NormSpec has no named reference function: the demo builds one from the spec (it raised
    KeyError)."""
    import uuid

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    name = f"usertest{uuid.uuid4().hex[:10]}"
    normlib.register(name, normlib.NormSpec(name, normlib.Pool.ALL, normlib.TimeMode.EMA, "UserEMA", "mine",
                                            decay=0.5))
    assert main(["demo", "--batch", "2", "--channels", "6", "--frames", "40"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith(f"{name} "))
    assert float(row.split()[3]) < 1e-4, row


def test_a_reader_that_stops_early_gets_no_traceback():
    """`python -m normlib list | head -1`: the closed pipe ends the command quietly."""
    p = subprocess.Popen([sys.executable, "-m", "normlib", "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # before anything is written: the first write meets a closed pipe
    err = p.stderr.read().decode()
    p.wait(timeout=60)
    assert "Traceback" not in err, err


@pytest.mark.parametrize("argv", [[], ["nonsense"]])
def test_bad_commands_exit_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and "usage: normlib" in capsys.readouterr().err


@pytest.mark.parametrize("argv, what", [(["--batch", "-1"], "--batch: expected an integer >= 1"),
                                        (["--frames", "0"], "--frames: expected an integer >= 1"),
                                        (["--channels", "2.5"], "--channels: expected an integer >= 1"),
                                        (["--offset", "nan"], "--offset: expected a finite number")])
def test_demo_refuses_bad_sizes_and_offsets_by_name(argv, what, capsys):
    with pytest.raises(SystemExit) as e:
        main(["demo", *argv])
    assert e.value.code == 2 and what in capsys.readouterr().err


def test_demo_fails_on_a_nan_error(capsys, monkeypatch):
    """A backend that returns NaN fails the demo (max(worst, nan) kept the number, and it printed OK)."""
    import normlib.__main__ as cli

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    real = cli.norm
    monkeypatch.setattr(cli, "norm", lambda spec, x, *a, **kw: (
        lambda out: (out[0] * float("nan"), out[1]) if isinstance(out, tuple) else out * float("nan"))(
            real(spec, x, *a, **kw)) if spec.name == "gln" else real(spec, x, *a, **kw))
    assert main(["demo", "--batch", "2", "--channels", "6", "--frames", "40"]) == 1
    assert capsys.readouterr().out.rstrip().endswith("FAILED (threshold 1e-4)")


def test_bench_times_norms_and_baselines_and_writes_json_and_png(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    js, png = tmp_path / "b.json", tmp_path / "b.png"
    assert main(["bench", "--quick", "--norms", "cln,gln,ccemaln", "--shapes", "2x8x30", "--json", str(js),
                 "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "**forward**" in out and "**forward+backward**" in out and "**stream**" in out
    import json

    rows = json.loads(js.read_text())["rows"]
    fwd = {r["norm"]: r["ms"] for r in rows if r["what"] == "forward"}
    assert set(fwd) == {"cln", "gln", "ccemaln"}
    assert {"normlib", "formula", "copy"} <= set(fwd["cln"]) and "GroupNorm" in fwd["gln"]
    assert all(v > 0 for ms in fwd.values() for v in ms.values())
    assert {r["norm"] for r in rows if r["what"] == "stream"} == {"cln", "ccemaln"}  # gln takes no state
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, says", [(["--norms", "nope"], "unknown norm 'nope'"),
                                        (["--shapes", "4x512"], "B x C x T"),
                                        (["--dtypes", "fp8"], "fp32, bf16")])
def test_bench_refuses_bad_options_naming_them(args, says, capsys):
    with pytest.raises(SystemExit):
        main(["bench", *args])
    assert says in capsys.readouterr().err
