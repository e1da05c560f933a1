"""mhalab.bench and mhalab.fit: correctness only (no timing assertions)."""

import json
import math

import numpy as np
import pytest
import torch

from mhalab import bench
from mhalab.cost import kv_cache_bytes
from mhalab.errors import ConfigError
from mhalab.fit import local_exponents, loglog_fit
from mhalab.model import EncoderConfig, LanguageModel

SHAPES = [  # d_model, n_heads, d_head, n_kv_heads, n, batch
    (32, 4, 8, 4, 24, 1),  # MHA, d_head = d_model / n_heads
    (32, 8, 6, 2, 17, 2),  # GQA, d_head != d_model / n_heads
    (48, 6, 5, 1, 9, 3),  # MQA, odd d_head
    (16, 1, 16, 1, 33, 1),  # one head
    (24, 4, 32, 4, 12, 2),  # n_heads * d_head > d_model
]


def _spec(backend, d_model, n_heads, d_head, n_kv_heads, n, batch, **kw):
    spec = dict(device="cpu", dtype="float32", threads=None, seed=0, warmup=0, repeats=1, min_time_s=0.0,
                memory="none", sdpa_kernel=None, backend=backend, n=n, d_model=d_model, n_heads=n_heads,
                d_head=d_head, n_kv_heads=n_kv_heads, batch=batch)
    spec.update(kw)
    return spec


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("shape", SHAPES)
def test_flop_counter_equals_closed_form(backend, shape):
    row = bench.attention_case(_spec(backend, *shape))
    assert row["flops_fwd_counted"] == row["flops_fwd_closed"]
    # forward+backward: 3x forward, plus one recomputed Q K^T in the fused SDPA backward
    assert row["flops_fwdbwd_counted"] == row["flops_fwdbwd_closed"]


def test_equal_cost_flops_identical_across_head_counts():
    counted = {bench.attention_case(_spec(b, 64, h, 64 // h, h, 20, 1))["flops_fwd_counted"]
               for b in ("math", "sdpa") for h in (1, 2, 4, 8, 16)}
    assert len(counted) == 1


@pytest.mark.parametrize("exponent", [0.5, 1.0, 2.0, 3.0])
def test_fit_recovers_known_exponents(exponent):
    n = np.array([64, 128, 256, 512, 1024, 2048, 4096], dtype=float)
    exact = loglog_fit(n, 3e-4 * n ** exponent)
    assert exact["exponent"] == pytest.approx(exponent, abs=1e-12)
    assert exact["prefactor"] == pytest.approx(3e-4, rel=1e-9)
    assert exact["r2"] == pytest.approx(1.0)
    rng = np.random.default_rng(0)
    noisy = loglog_fit(n, 3e-4 * n ** exponent * np.exp(rng.normal(0, 0.05, n.size)))
    assert noisy["exponent"] == pytest.approx(exponent, abs=0.05)
    lo, hi = noisy["ci95"]
    assert lo < exponent < hi
    assert (noisy["x_min"], noisy["x_max"], noisy["points"]) == (64, 4096, 7)


def test_fit_range_and_local_exponents_show_where_a_power_law_bends():
    n = np.array([16, 32, 64, 128, 256, 512, 1024], dtype=float)
    y = 5.0 + 1e-3 * n ** 2  # constant overhead, then quadratic
    fit = loglog_fit(n, y, min_x=256)
    assert fit["exponent"] == pytest.approx(2.0, abs=0.05) and fit["x_min"] == 256 and fit["points"] == 3
    assert loglog_fit(n, y)["exponent"] < 1.9  # the full range is biased low by the overhead
    slopes = [s for _, _, s in local_exponents(n, y)]
    assert slopes[0] < 0.3 and slopes[-1] > 1.9 and slopes == sorted(slopes)
    # zero / negative values (e.g. memory below resolution) are left out, not log'd
    assert loglog_fit([1, 2, 4, 8], [0.0, 2.0, 4.0, 8.0])["points"] == 3
    with pytest.raises(ValueError):
        loglog_fit([4, 4], [1.0, 2.0])


@pytest.mark.parametrize("backend", ["sdpa", "math"])
@pytest.mark.parametrize("n_kv_heads,pos", [(4, "learned"), (2, "rotary"), (1, "sinusoidal")])
def test_kv_cache_decoding_matches_full_forward(backend, n_kv_heads, pos):
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=53, max_len=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads,
                        d_ff=64, dropout=0.0, causal=True, backend=backend, pos=pos)
    model = LanguageModel(cfg).eval()
    ids = torch.randint(0, 53, (3, 20))
    prefill = 7
    with torch.no_grad():
        full = model(ids).logits  # (B, T, V)
        caches = model.encoder.new_caches(3, max_len=20)
        steps = [model(ids[:, :prefill], caches=caches).logits]
        for t in range(prefill, 20):
            steps.append(model(ids[:, t:t + 1], caches=caches).logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert sum(c.nbytes for c in caches) == kv_cache_bytes(n_kv_heads, 8, 4, n_tokens=20, n_layers=2, batch_size=3)


def test_decode_case_reports_cache_bytes_and_agrees_with_full_pass():
    spec = dict(backend="sdpa", batch=2, context=12, n_kv_heads=2, n_heads=4, d_model=32, n_layers=2, d_ff=64,
                vocab_size=40, pos="learned", steps=3, warmup_steps=1, seed=0, check=True)
    row = bench.decode_case(spec, torch.device("cpu"), torch.float32)
    assert row["cache_bytes"] == row["cache_bytes_closed"] == kv_cache_bytes(2, 8, 4, 12, 2, 2)
    assert row["max_abs_diff_vs_full"] < 1e-5


def test_kv_series():
    assert bench.kv_series(8) == [8, 4, 2, 1]
    assert bench.kv_series(6) == [6, 3, 1]
    assert bench.kv_series(1) == [1]


TINY_COMPLEXITY = [
    "backends=[sdpa]", "grid.n=[16,32]", "grid.d_model=[16]", "grid.n_heads=[2]", "fit_min_n=16",
    "equal_cost.width=16", "equal_cost.n_heads=[1,2]", "equal_cost.n=[16]",
    "decode.batch=[1]", "decode.context=[6]", "decode.d_model=16", "decode.n_heads=2", "decode.d_ff=32",
    "decode.vocab_size=20", "decode.steps=2", "decode.warmup_steps=1",
    "repeats=2", "warmup=0", "min_time_s=0", "memory=none",
]


def test_complexity_command_end_to_end_tiny_grid(tmp_path, capsys):
    assert bench.main(["complexity", *TINY_COMPLEXITY, f"out_dir={tmp_path}"]) == 0
    for name in ("results.csv", "results.json", "report.md", "scaling_time.png",
                 "equal_cost.png", "decode.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    res = json.loads((tmp_path / "results.json").read_text())
    assert len(res["scaling"]) == 2 and len(res["equal_cost"]) == 2 and len(res["decode"]) == 2
    assert all(r["flops_match"] and r["flops_fwdbwd_match"] for r in res["scaling"] + res["equal_cost"])
    assert all(r["flops_equal_to_ref"] for r in res["equal_cost"])
    assert all(r["cache_bytes"] == r["cache_bytes_closed"] for r in res["decode"])
    assert {f["metric"] for f in res["fits"]} >= {"fwd_ms", "fwdbwd_ms"}
    assert math.isfinite(res["fits"][0]["fit"]["exponent"])
    out = capsys.readouterr().out
    assert "## Fitted exponents" in out and "| backend |" in out


def test_memory_is_measured_in_a_fresh_process():
    row = bench.run_memory(_spec("math", 32, 4, 8, 4, 256, 1, memory="rss"))
    # the math path materialises (B, H, n, n) float32 scores: 1 MiB here; the forward peak holds about two
    assert 0.5 < row["mem_fwd_mib"] < 8 and row["mem_fwdbwd_mib"] >= row["mem_fwd_mib"]
    assert bench.run_memory(_spec("math", 32, 4, 8, 4, 256, 1, memory="none")) == {}


def test_interleaved_timing_returns_one_row_per_case():
    specs = [_spec("math", 16, 2, 8, 2, n, 1) for n in (8, 16, 32)]
    rows = bench.time_cases(specs, rounds=3, warmup=1, min_time_s=0.0, device=torch.device("cpu"))
    assert len(rows) == 3
    assert all(0 < r["fwd_ms_min"] <= r["fwd_ms"] and 0 < r["fwdbwd_ms_min"] <= r["fwdbwd_ms"] for r in rows)


def test_train_command_end_to_end_tiny(tmp_path, capsys):
    args = ["train", "n_heads=[2]", "d_model=16", "n_layers=1", "d_ff=32", "seq_len=8", "batch=2", "vocab_size=20",
            "rounds=2", "steps_per_round=1", "warmup_steps=1", "stats.probe_size=2", "stats.every_n_steps=2",
            "peak_matmul_size=256",
            f"out_dir={tmp_path}"]
    assert bench.main(args) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    models = [r["model"] for r in res["rows"]]
    assert models == ["mhalab", "mhalab+stats", bench.BASELINE]
    assert res["rows"][2]["ratio_vs_baseline"] == 1.0
    assert (tmp_path / "train_throughput.png").exists() and (tmp_path / "results.csv").exists()
    assert bench.BASELINE in capsys.readouterr().out


def test_cli_errors_are_one_line_and_exit_2(capsys):
    assert bench.main(["complexity", "no_such_key=1"]) == 2
    assert bench.main(["complexity", "backends=[flash]"]) == 2
    assert bench.main(["nope"]) == 2
    err = capsys.readouterr().err
    assert "no_such_key" in err and "flash" in err
    with pytest.raises(ConfigError):
        bench.load_config("complexity", ["grid.n"])


def test_baseline_matches_mhalab_in_size():
    cfg = EncoderConfig(vocab_size=30, max_len=8, d_model=16, n_layers=2, n_heads=4, d_ff=32)
    a, b = bench.MhalabLM(cfg), bench.TorchLM(cfg)
    assert sum(p.numel() for p in a.parameters()) == sum(p.numel() for p in b.parameters())
    assert a(torch.randint(0, 30, (2, 8)))[0].shape == b(torch.randint(0, 30, (2, 8)))[0].shape == (2, 8, 30)
