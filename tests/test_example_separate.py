"""examples/separate.py: its SI-SDR, its stream (equal to the offline model, chunk sizes of every kind), and a
short training run that separates."""
import importlib.util
import pathlib

import pytest
import torch

import normlib

_PATH = pathlib.Path(__file__).resolve().parents[1] / "examples" / "separate.py"
_spec = importlib.util.spec_from_file_location("separate_example", _PATH)
sep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sep)


@pytest.fixture(autouse=True)
def _one_thread():
    """Two test workers share two cores: a second thread each only waits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_si_sdr_known_cases():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(3, 1000, generator=g, dtype=torch.float64)
    noise = torch.randn(3, 1000, generator=g, dtype=torch.float64)
    assert (sep.si_sdr(0.3 * ref + 2.0, ref) > 90).all()  # a scaled, shifted copy: no error (eps caps it)
    assert (sep.si_sdr(noise, ref) < -10).all()  # independent noise: its projection on ref is ~1/sqrt(T) of it
    # ref + e with e orthogonal to ref: exactly 10 log10(|ref|^2 / |e|^2)
    e = noise - noise.mean(-1, keepdim=True)
    r = ref - ref.mean(-1, keepdim=True)
    e = e - (e * r).sum(-1, keepdim=True) / r.square().sum(-1, keepdim=True) * r
    e = e * (r.norm(dim=-1, keepdim=True) / e.norm(dim=-1, keepdim=True) / 10)  # 20 dB below
    torch.testing.assert_close(sep.si_sdr(r + e, r), torch.full((3,), 20.0, dtype=torch.float64))


def test_pit_picks_the_order():
    g = torch.Generator().manual_seed(1)
    mix, src = sep.make_mixtures(4, 800, g)
    assert mix.shape == (4, 800) and src.shape == (4, 2, 800)
    torch.testing.assert_close(mix, src.sum(1))
    score, perm = sep.pit_si_sdr(src.flip(1), src)
    assert (score > 90).all() and (perm == torch.tensor([1, 0])).all()


@pytest.mark.parametrize("hops", [pytest.param([8], id="one-frame"), pytest.param([3, 21, 1, 64], id="uneven"),
                                  pytest.param([1000], id="whole")])
@pytest.mark.parametrize("norm", ["cln", "emaln"])
def test_stream_equals_offline(norm, hops):
    model = sep.build(norm, quick=True).double().eval()
    for p in model.parameters():  # away from the initial weights, so the mask is not flat
        p.data.add_(0.1 * torch.randn_like(p))
    mix = torch.randn(2, 1003, dtype=torch.float64)  # 1003: samples left over after the last frame
    with torch.no_grad():
        offline = model(mix)
    buffers, parts, lo = sep.ConvBuffers(model), [], 0
    with torch.no_grad(), normlib.stream(model):
        for hop in hops * (1003 // sum(hops) + 1):
            parts.append(buffers(mix[:, lo:lo + hop]))
            lo += hop
            if lo >= 1003:
                break
        parts.append(buffers.flush())
    streamed = torch.cat(parts, -1)
    assert streamed.shape == offline.shape
    torch.testing.assert_close(streamed, offline, rtol=1e-10, atol=1e-10)


def test_stream_separate_fp32():
    model = sep.build("cln", quick=True).eval()
    mix = torch.randn(1, 2000)
    with torch.no_grad():
        offline = model(mix)
    streamed, times = sep.stream_separate(model, mix)
    assert len(times) == 250
    torch.testing.assert_close(streamed, offline, rtol=0, atol=1e-4)


def test_short_training_separates():
    model = sep.build("cln", quick=True, seed=0)
    test_mix, test_src = sep.make_mixtures(32, 2000, torch.Generator().manual_seed(1000))
    before = sep.si_sdri(model.eval(), test_mix, test_src)
    losses = sep.train(model, 100, length=2000, seed=0, log_every=0)
    after = sep.si_sdri(model, test_mix, test_src)
    assert sum(losses[-10:]) / 10 < sum(losses[:10]) / 10 - 10  # the loss falls by over 10 dB
    assert after > 0 and after > before + 10, (before, after)


def test_main_quick(capsys):
    sep.main(["--quick", "--steps", "2"])
    out = capsys.readouterr().out
    assert "held-out SI-SDRi" in out and "real-time factor" in out
