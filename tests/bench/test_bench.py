"""mhalab.bench: configs, closed forms against counted FLOPs, fits, the three subcommands on tiny shapes, and the GPU
command's dry run. Correctness only: no test asserts a timing."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from mhalab.cli import run_command
from mhalab.options import parse
from mhalab.bench import complexity, config, decode, gpu, gpu_report, output, throughput
from mhalab.bench.fit import local_exponents, loglog_fit
from mhalab.bench.timing import interleaved, sdpa_kernels
from mhalab.cost import (attention_peak_bytes, decode_step_bytes, encoder_flops, kv_cache_bytes, measured_flops,
                         train_flops)
from mhalab.model import LanguageModel, build_model
from mhalab.architecture import Architecture, AttentionConfig, ModelConfig

REPO = Path(__file__).resolve().parents[2]
SHAPES = [  # d_model, n_heads, d_head, n_kv_heads, n, batch
    (32, 4, 8, 4, 24, 1),  # MHA, d_head = d_model / n_heads
    (32, 8, 6, 2, 17, 2),  # GQA, d_head != d_model / n_heads
    (48, 6, 5, 1, 9, 3),  # MQA, odd d_head
    (24, 4, 32, 4, 12, 2),  # n_heads * d_head > d_model
]


def _spec(backend, d_model, n_heads, d_head, n_kv_heads, n, batch, **kw):
    spec = dict(device="cpu", dtype="float32", threads=None, seed=0, warmup=0, repeats=1, min_time_s=0.0,
                memory="none", sdpa_kernel=None, backend=backend, n=n, d_model=d_model, n_heads=n_heads,
                d_head=d_head, n_kv_heads=n_kv_heads, batch=batch)
    return {**spec, **kw}


# -- configs and the CLI ---------------------------------------------------------------------------------------

def test_configs_are_dataclasses_with_dotlist_overrides():
    c = parse(config.ComplexityConfig, ["grid.n=[64,128]", "backends=[math]", "decode.n_kv_heads=[8,1]",
                                        "threads=1"])
    assert isinstance(c, config.ComplexityConfig) and c.grid.n == [64, 128] and c.backends == ["math"]
    assert c.decode.kv_heads() == [8, 1] and config.DecodeConfig(n_heads=8).kv_heads() == [8, 4, 2, 1]
    assert config.DecodeConfig(n_heads=6, d_model=48).kv_heads() == [6, 3, 1]
    t = parse(config.ThroughputConfig, ["stats.every_n_steps=7", "objective=classification"])
    assert t.stats.every_n_steps == 7 and t.architecture(4).model.pooling == "mean"
    assert parse(config.GpuConfig, ["dry_run=true"]).dry_run
    assert not (REPO / "src" / "mhalab" / "bench_conf").exists()


@pytest.mark.parametrize("sub,override,names", [
    ("complexity", "no_such_key=1", "no_such_key"), ("complexity", "backends=[flash]", "backends"),
    ("complexity", "repeats=abc", "repeats"), ("complexity", "grid.n_kv_heads=[3]", "grid.n_kv_heads"),
    ("train", "n_heads=[3]", "n_heads"), ("train", "stats.every_n_steps=0", "every_n_steps"),
    ("train", "pos=rotary", "pos"), ("gpu", "steps=[nope]", "steps"), ("gpu", "d_models=[100]", "d_models"),
    ("gpu", "stats_every_n_steps=0", "stats_every_n_steps"), ("complexity", "grid.n", "grid.n")])
def test_a_bad_override_is_one_sentence_naming_the_key_and_exit_2(sub, override, names, capsys):
    argv = [sub, override, "out_dir=/nonexistent/never"] if sub != "gpu" else [sub, override]
    assert run_command(["bench", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and names in err and len(err.splitlines()) == 1, err


def test_cli_usage_cfg_and_unknown_subcommand(capsys):
    assert run_command(["bench", "--help"]) == 0 and "complexity,train,startup,overhead,pace,gpu" in \
        capsys.readouterr().out
    assert run_command(["bench", "train", "--cfg"]) == 0 and "every_n_steps: 50" in capsys.readouterr().out
    assert run_command(["bench", "nope"]) == 2 and "unknown subcommand" in capsys.readouterr().err
    from mhalab.cli import main as cli_main

    with pytest.raises(SystemExit) as exit_:  # `mhalab bench ...` passes the status on
        cli_main(["bench", "complexity", "no_such_key=1"])
    assert exit_.value.code == 2


@pytest.mark.proc
def test_the_cli_parses_before_importing_torch():
    code = ("import sys; import mhalab.bench, mhalab.bench.config, mhalab.cost; "
            "from mhalab.options import parse; parse(mhalab.bench.config.GpuConfig, ['dry_run=true']); "
            "assert 'torch' not in sys.modules, 'torch'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# -- closed forms (mhalab.cost) against what torch counts ------------------------------------------------------

@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("shape", SHAPES)
def test_flop_counter_equals_closed_form_and_the_kernel_is_named(backend, shape):
    row = complexity.attention_case(_spec(backend, *shape))
    assert row["flops_fwd_counted"] == row["flops_fwd_closed"]
    # forward+backward: 3x forward, plus one recomputed Q K^T in the fused SDPA backward
    assert row["flops_fwdbwd_counted"] == row["flops_fwdbwd_closed"]
    assert row["kernel"] == ("flash (cpu)" if backend == "sdpa" else "math (explicit softmax)")
    assert 0 < row["fwd_ms_min"] <= row["fwd_ms"]


@pytest.mark.parametrize("backend,objective", [("math", "mlm"), ("sdpa", "classification")])
def test_train_flops_is_what_a_training_step_counts(backend, objective):
    arch = Architecture(vocab_size=40, objective=objective, n_classes=3 if objective == "classification" else None,
                        model=ModelConfig(d_model=32, n_layers=2, d_ff=48, max_len=16),
                        attention=AttentionConfig(n_heads=4, n_kv_heads=2, backend=backend))
    model = build_model(arch)
    ids = torch.randint(0, 40, (3, 16))
    counted = measured_flops(lambda: model(ids).logits.sum().backward())
    recompute = 3 * arch.model.n_layers * 2 * 16 * 16 * 4 * 8 if backend == "sdpa" else 0  # B L (Q K^T) again
    assert counted == 3 * train_flops(arch, 16) + recompute
    assert train_flops(arch, 16) == 3 * encoder_flops(arch, 16)["total"]


def test_decode_step_bytes_are_the_weights_and_the_cache():
    arch = Architecture(vocab_size=30, objective="clm", model=ModelConfig(d_model=32, n_layers=2, d_ff=64, max_len=40),
                        attention=AttentionConfig(n_heads=4, n_kv_heads=2))
    model = LanguageModel(arch)
    caches = model.encoder.new_caches(3, max_len=20)
    with torch.no_grad():
        model(torch.randint(0, 30, (3, 20)), caches=caches)
    weights = sum(p.numel() for p in model.parameters()) - model.encoder.pos_emb.weight.numel()
    assert decode_step_bytes(arch, 20, 3, 4) == 4 * weights + sum(c.nbytes for c in caches)
    assert sum(c.nbytes for c in caches) == kv_cache_bytes(2, 8, 4, 20, 2, 3)


@pytest.mark.proc
def test_memory_is_measured_in_a_fresh_process_and_the_prediction_bounds_it():
    spec = _spec("math", 32, 4, 8, 4, 256, 1, memory="rss")
    row = complexity.run_memory(spec)
    # the math path materialises (B, H, n, n) float32 scores: 1 MiB here; the forward peak holds about two
    assert 0.5 < row["mem_fwd_mib"] < 8 and row["mem_fwdbwd_mib"] >= row["mem_fwd_mib"]
    assert attention_peak_bytes(256, 32, 4, 8, "math", 4) >= row["mem_fwdbwd_mib"] * 2 ** 20
    assert complexity.run_memory({**spec, "memory": "none"}) == {}


# -- fits and timing -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("exponent", [0.5, 2.0])
def test_fit_recovers_known_exponents(exponent):
    n = np.array([64, 128, 256, 512, 1024, 2048, 4096], dtype=float)
    exact = loglog_fit(n, 3e-4 * n ** exponent)
    assert exact["exponent"] == pytest.approx(exponent, abs=1e-12) and exact["prefactor"] == pytest.approx(3e-4)
    noisy = loglog_fit(n, 3e-4 * n ** exponent * np.exp(np.random.default_rng(0).normal(0, 0.05, n.size)))
    lo, hi = noisy["ci95"]
    assert noisy["exponent"] == pytest.approx(exponent, abs=0.05) and lo < exponent < hi
    # the 95% interval uses Student's t with k - 2 degrees of freedom: 2.571 for 7 points
    assert (hi - lo) / 2 == pytest.approx(2.5706 * noisy["stderr"], rel=1e-4)


def test_fit_range_and_local_exponents_show_where_a_power_law_bends():
    n = np.array([16, 32, 64, 128, 256, 512, 1024], dtype=float)
    y = 5.0 + 1e-3 * n ** 2  # constant overhead, then quadratic
    fit = loglog_fit(n, y, min_x=256)
    assert fit["exponent"] == pytest.approx(2.0, abs=0.05) and fit["x_min"] == 256 and fit["points"] == 3
    slopes = [s for _, _, s in local_exponents(n, y)]
    assert slopes[0] < 0.3 and slopes[-1] > 1.9 and slopes == sorted(slopes)
    assert loglog_fit([1, 2, 4, 8], [0.0, 2.0, 4.0, 8.0])["points"] == 3  # non-positive values left out
    with pytest.raises(ValueError):
        loglog_fit([4, 4], [1.0, 2.0])


def test_interleaved_rounds_alternate_the_order():
    calls = []
    samples = interleaved([lambda: calls.append("a"), lambda: calls.append("b")], 3, torch.device("cpu"),
                          min_calls=[2, 1], warmup=1)
    assert calls == ["a", "b"] + ["a", "a", "b"] + ["b", "a", "a"] + ["a", "a", "b"]
    assert [len(s) for s in samples] == [3, 3] and all(t > 0 for s in samples for t in s)


# -- decoding --------------------------------------------------------------------------------------------------

DECODE = dict(backend="sdpa", batch=2, context=12, n_kv_heads=2, n_heads=4, d_model=32, n_layers=2, d_ff=64,
              vocab_size=40, pos="learned", steps=3, warmup_steps=1, seed=0, check=True, prefill=True)


@pytest.mark.parametrize("backend,pos", [("sdpa", "rotary"), ("math", "learned")])
def test_decode_case_cache_bytes_and_agreement_with_a_full_pass(backend, pos):
    row = decode.decode_case({**DECODE, "backend": backend, "pos": pos}, torch.device("cpu"), torch.float32)
    assert row["cache_bytes"] == row["cache_bytes_closed"] == kv_cache_bytes(2, 8, 4, 12, 2, 2)
    assert row["max_abs_diff_vs_full"] < 1e-5 and row["cache_filled_by"] == "prefill"


def test_decode_with_a_random_cache_has_the_same_cache_and_no_check():
    row = decode.decode_case({**DECODE, "prefill": False}, torch.device("cpu"), torch.float32)
    assert row["cache_bytes"] == row["cache_bytes_closed"] and row["cache_filled_by"] == "random"
    assert "max_abs_diff_vs_full" not in row and "prefill_ms" not in row


# -- the subcommands end to end --------------------------------------------------------------------------------

TINY_COMPLEXITY = [
    "threads=1", "backends=[sdpa,math]", "grid.n=[16,32]", "grid.d_model=[16]", "grid.n_heads=[2]", "fit_min_n=16",
    "equal_cost.width=16", "equal_cost.n_heads=[1,2]", "equal_cost.n=[16]", "decode.batch=[1]",
    "decode.context=[6]", "decode.d_model=16", "decode.n_heads=2", "decode.d_ff=32", "decode.vocab_size=20",
    "decode.steps=2", "decode.warmup_steps=1", "repeats=2", "warmup=0", "min_time_s=0", "memory=none",
]


def test_complexity_command_end_to_end_tiny_grid(tmp_path, capsys):
    """The CLI path; the gpu dry run below runs every section with plots."""
    assert run_command(["bench", "complexity", *TINY_COMPLEXITY, "sections=[equal_cost]", "plots=false",
                       f"out_dir={tmp_path}"]) == 0
    assert all((tmp_path / name).stat().st_size > 0 for name in ("results.csv", "results.json", "report.md"))
    res = json.loads((tmp_path / "results.json").read_text())
    assert len(res["equal_cost"]) == 4 and res["skipped"] == [] and "scaling" not in res
    assert all(r["flops_match"] and r["flops_fwdbwd_match"] and r["flops_equal_to_ref"] for r in res["equal_cost"])
    assert "## Equal cost" in capsys.readouterr().out


def test_cases_that_would_not_fit_are_skipped_saying_so(tmp_path):
    cfg = parse(config.ComplexityConfig, [*TINY_COMPLEXITY, "max_case_gib=1e-9", "sections=[scaling,decode]",
                                      f"out_dir={tmp_path}", "plots=false"])
    res = complexity.run_complexity(cfg)
    assert res["scaling"] == [] and res["decode"] == [] and len(res["skipped"]) == 6
    assert "skipped: predicted peak" in res["skipped"][0]
    assert "## Skipped (would not fit in memory)" in (tmp_path / "report.md").read_text()


def test_a_case_that_runs_out_of_memory_is_skipped_saying_so(tmp_path, monkeypatch):
    def oom(spec):
        if spec["n"] == 32:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return {}

    monkeypatch.setattr(complexity, "run_memory", oom)
    cfg = parse(config.ComplexityConfig, [*TINY_COMPLEXITY, "sections=[scaling]", "backends=[sdpa]", "plots=false",
                                      f"out_dir={tmp_path}"])
    res = complexity.run_complexity(cfg)
    assert [r["n"] for r in res["scaling"]] == [16] and "out of memory" in res["skipped"][0]


TINY_TRAIN = ["threads=1", "n_heads=[2]", "d_model=16", "n_layers=1", "d_ff=32", "seq_len=8", "batch=2",
              "vocab_size=20", "rounds=2", "steps_per_round=1", "warmup_steps=1", "stats.probe_size=2",
              "stats.every_n_steps=2", "stats.importance_batches=1", "stats.plots=false", "peak_matmul_size=64",
              "plots=false"]


def test_train_command_measures_the_callbacks_own_pass(tmp_path, monkeypatch):
    from mhalab.training.callbacks import HeadStatsCallback

    measured = []
    real = HeadStatsCallback.measure

    def spy(self, module):
        measured.append((type(module).__name__, module.arch.model.pooling, self.probe["padding_mask"].any().item()))
        return real(self, module)

    monkeypatch.setattr(HeadStatsCallback, "measure", spy)
    args = TINY_TRAIN + ["objective=classification", "pooling=cls", f"out_dir={tmp_path}"]
    assert run_command(["bench", "train", *args]) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert [r["model"] for r in res["rows"]] == ["mhalab", "mhalab+stats", output.BASELINE]
    assert res["rows"][2]["ratio_vs_baseline"] == 1.0 and len({r["params"] for r in res["rows"]}) == 1
    (stats,) = res["stats"]
    assert 0 < stats["stats_fraction"] < 1 and stats["importance_s"] > 0
    # warm-up + one pass per round (+ one for the end-of-training update), on the real module with its pooling
    assert len(measured) == 1 + 2 + 1 and set(measured) == {("AttentionLitModule", "cls", True)}
    assert (tmp_path / "report.md").read_text().count("statistics pass") == 1


@pytest.mark.parametrize("objective,norm,pooling", [("mlm", "pre", "mean"), ("classification", "post", "cls")])
def test_the_baseline_computes_the_same_function(objective, norm, pooling):
    cfg = config.ThroughputConfig(d_model=16, n_layers=2, d_ff=32, seq_len=8, vocab_size=30, objective=objective,
                                  norm=norm, pooling=pooling, dropout=0.0)
    arch = cfg.architecture(4)
    ours, base = build_model(arch).eval(), throughput.baseline_model(arch).eval()
    base.load_state_dict({k: v for k, v in ours.state_dict().items() if ".blocks." not in k}, strict=False)
    for block, layer in zip(ours.encoder.blocks, base.encoder.blocks[0].encoder.layers):
        a = block.attn
        with torch.no_grad():
            layer.self_attn.in_proj_weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
            layer.self_attn.in_proj_bias.copy_(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
            for dst, src in ((layer.self_attn.out_proj, a.out_proj), (layer.linear1, block.ff.fc),
                             (layer.linear2, block.ff.proj), (layer.norm1, block.ln1), (layer.norm2, block.ln2)):
                dst.weight.copy_(src.weight)
                dst.bias.copy_(src.bias)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in base.parameters())
    ids = torch.randint(0, 30, (3, 8))
    with torch.no_grad():
        torch.testing.assert_close(base(ids).logits, ours(ids).logits, atol=1e-5, rtol=1e-5)


# -- the GPU command -------------------------------------------------------------------------------------------

def test_gpu_command_without_cuda_says_so_and_exits_2(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert run_command(["bench", "gpu", "out=/nonexistent/never"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def _fake_run(commands):
    """Stands in for the two subprocesses of `mhalab bench gpu` (pytest and mhalab train), writing what they write."""
    def run(cmd, log, cwd, env, timeout):
        commands.append(cmd)
        log.write_text("fake\n")
        if "pytest" in cmd:
            junit = Path(next(a for a in cmd if a.startswith("--junitxml=")).split("=", 1)[1])
            junit.write_text('<testsuites><testsuite tests="26" failures="0" errors="0" skipped="26"/></testsuites>')
        else:
            run_dir = Path(env["MHALAB_ROOT"]) / "logs" / "gpu_check" / "runs" / "x"
            run_dir.mkdir(parents=True)
            (run_dir / "summary.json").write_text(json.dumps({
                "status": "ok", "metrics": {"val/acc": 0.5}, "timings": {"train_steps": 3, "tokens_per_s": 1e3}}))
        return {"returncode": 0, "log": str(log)}
    return run


def test_gpu_dry_run_writes_the_folder_and_a_report_without_gpu_figures(tmp_path, monkeypatch):
    commands = []
    monkeypatch.setattr(gpu, "_run", _fake_run(commands))
    monkeypatch.chdir(REPO)  # the GPU tests are found in the checkout it runs from, however mhalab was installed
    # compile=[false]: torch.compile's tracing takes seconds even on toy sizes (the slow test runs both)
    res = gpu.run_gpu(parse(config.GpuConfig, ["dry_run=true", f"out={tmp_path}", "compile=[false]"]))
    assert res["exit_status"] == 0 and {k: s["status"] for k, s in res["steps"].items()} == {
        "tests": "ok", "train": "ok", "throughput": "ok", "complexity": "ok", "decode": "ok"}
    pytest_cmd, *train_cmds = commands
    assert pytest_cmd[1:5] == ["-m", "pytest", "-m", "gpu"] and pytest_cmd[5].endswith("tests/bench/test_gpu.py")
    assert [c[1:3] for c in train_cmds] == [["-m", "mhalab.training.train"]] * 2  # the default task and mqar
    assert all("trainer.accelerator=cpu" in c for c in train_cmds) and any("data=mqar" in c for c in train_cmds)
    for path in ("report.md", "summary.json", "tests/pytest.log", "tests/junit.xml", "train/bbc_news-summary.json",
                 "throughput/d32-eager/report.md", "throughput/d32-eager/results.json", "complexity/report.md",
                 "complexity/scaling_time.png", "complexity/equal_cost.png", "decode/decode.png"):
        assert (tmp_path / path).is_file(), path
    scaling = json.loads((tmp_path / "complexity" / "results.json").read_text())
    assert all(r["flops_match"] and r["flops_fwdbwd_match"] for r in scaling["scaling"] + scaling["equal_cost"])
    assert {f["metric"] for f in scaling["fits"]} >= {"fwd_ms", "fwdbwd_ms"}
    assert math.isfinite(scaling["fits"][0]["fit"]["exponent"])
    rows = json.loads((tmp_path / "decode" / "results.json").read_text())["decode"]
    assert {r["cache_filled_by"] for r in rows} == {"prefill", "random"}
    assert all(r["cache_bytes"] == r["cache_bytes_closed"] for r in rows)
    fig = output.decode_figure(rows)  # the decoding plots are log-log
    assert all(ax.get_xscale() == "log" and ax.get_yscale() == "log" for ax in fig.axes if ax.has_data())
    colours = {}  # a shape (batch, context) keeps its colour in every panel, whichever shapes a backend skipped
    for ax in fig.axes:
        for line in ax.get_lines():
            assert colours.setdefault(line.get_label(), line.get_color()) == line.get_color(), line.get_label()
    skipped = [r for r in rows if not (r["backend"] == "math" and r["batch"] == min(x["batch"] for x in rows))]
    first = {line.get_label(): line.get_color() for line in output.decode_figure(skipped).axes[0].get_lines()}
    assert all(colours[label] == c for label, c in first.items())
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# GPU check: CPU (dry run, no GPU)")
    assert "CPU DRY RUN: tiny shapes, no GPU figures" in report
    assert all(c["measured"] == "not measured (CPU dry run)" and c["verdict"] == "-" for c in res["claims"])
    assert len(res["claims"]) == 6 and "GiB" not in report.split("## Claims")[1]
    assert {r["kernel"] for r in res["sdpa_kernels"]} == {"flash (cpu)"}


def test_gpu_train_command_composes_for_the_default_task(monkeypatch, tmp_path):
    from mhalab.runs.preflight import check_job, compose

    monkeypatch.setenv("MHALAB_ROOT", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # trainer=gpu is refused without CUDA
    cfg = parse(config.GpuConfig, [])
    assert gpu.train_tasks(cfg) == ["bbc_news"] + (["mqar"] if "mqar" in __import__(
        "mhalab.data.config", fromlist=["TASKS"]).TASKS else [])
    for dry in (False, True):
        cfg.dry_run = dry
        tc = check_job(compose(gpu.train_command(cfg, "bbc_news")))
        assert tc.trainer.max_steps == (3 if dry else 200) and tc.trainer.max_epochs == -1
        assert tc.trainer.accelerator == ("cpu" if dry else "gpu") and tc.data.task == "bbc_news"
        assert tc.trainer.precision == ("32-true" if dry else "bf16-mixed")


def test_gpu_batches_size_themselves_from_free_memory(monkeypatch):
    cfg = parse(config.GpuConfig, ["d_models=[512]", "compile=[false]"])
    monkeypatch.setattr(gpu, "free_memory_bytes", lambda device: 40 * 2 ** 30)
    ((label, tc, note),) = gpu.throughput_configs(cfg, torch.device("cpu"))
    assert label == "d512-eager" and tc.batch in (1, 2, 4, 8, 16, 32, 64) and tc.amp_bf16 and tc.n_heads == [8]
    assert tc.stats.every_n_steps == 500  # the MQAR setups' interval (stats_every_n_steps)
    monkeypatch.setattr(gpu, "free_memory_bytes", lambda device: 2 ** 20)
    ((label, tc, note),) = gpu.throughput_configs(cfg, torch.device("cpu"))
    assert tc is None and "not even batch 1 fits" in note


def test_claims_say_by_how_much_a_goal_is_missed():
    run = {"d_model": 1024, "compile": True, "batch": 8, "seq_len": 1024, "n_layers": 8, "stats": [
        {"stats_fraction": 0.031, "stats_pass_ms": 90.0, "every_n_steps": 50}], "rows": [
        {"model": "mhalab", "mfu": 0.40, "ratio_vs_baseline": 1.1},
        {"model": "mhalab+stats", "mfu": 0.39, "ratio_vs_baseline": 0.95},
        {"model": output.BASELINE, "mfu": 0.36, "ratio_vs_baseline": 1.0}]}
    fit = {"exponent": 1.02, "ci95": (0.98, 1.06), "x_min": 2048, "x_max": 32768, "points": 5}
    result = {"dry_run": False, "device_name": "NVIDIA H100 80GB HBM3", "steps": {
        "throughput": {"runs": {"d1024-compiled": run}},
        "complexity": {"fits": [{"backend": "sdpa", "metric": "mem_fwdbwd_mib", "fit": fit, "fit_all": None},
                                {"backend": "math", "metric": "mem_fwdbwd_mib", "fit": {**fit, "exponent": 1.7},
                                 "fit_all": None}]},
        "decode": {"decode": [{"n_kv_heads": 1, "batch": 64, "context": 32768, "backend": "sdpa",
                               "speedup_vs_mha": 11.2}]}}}
    verdicts = [c["verdict"] for c in gpu_report.claim_rows(result)]
    assert verdicts == ["missed by 5.0 points (best 40.0%, d1024-compiled)", "missed by 5.0% at d1024-compiled",
                        "missed by 1.10 points at d1024-compiled", "holds", "off by -0.30", "reached (>= 10x)"]


@pytest.mark.proc
@pytest.mark.slow
def test_gpu_dry_run_with_its_real_subprocesses(tmp_path, data_cache):
    r = subprocess.run([sys.executable, "-m", "mhalab", "bench", "gpu", "dry_run=true", f"out={tmp_path}",
                        f"train_overrides=[data.cache_dir={data_cache}]"], capture_output=True, text=True,
                       cwd=REPO, env={**os.environ, "MHALAB_ROOT": str(tmp_path)}, timeout=600)  # from the checkout,
    # as its docs say, so the GPU tests are found under any install (CI's is not editable)
    res = json.loads((tmp_path / "summary.json").read_text())
    assert r.returncode == 0, {k: s.get("error") or s.get("log") for k, s in res["steps"].items()}
    assert (tmp_path / "throughput" / "d32-compiled" / "results.json").is_file()
    assert res["steps"]["tests"]["skipped"] == res["steps"]["tests"]["tests"] > 0  # no CUDA: every GPU test skips
    assert json.loads((tmp_path / "train" / "bbc_news-summary.json").read_text())["status"] == "ok"


def test_sdpa_kernels_names_the_fused_kernel():
    q = torch.randn(1, 2, 8, 4, requires_grad=True)
    kernels = sdpa_kernels(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q).sum().backward())
    assert kernels == ["_scaled_dot_product_flash_attention_for_cpu",
                       "_scaled_dot_product_flash_attention_for_cpu_backward"]


def test_startup_rotates_the_order_and_reports_the_median_ratio(tmp_path, monkeypatch):
    """One warm-up run, then rounds in which baseline, run and frozen baseline each take every position in turn;
    the report's ratios are the medians of the per-round ratios (the processes are stand-ins here; `pytest -m slow`
    runs the real ones)."""
    from mhalab.bench import startup
    from mhalab.bench.config import StartupConfig

    order = []
    walls = iter([9.0, 2.0, 3.0, 2.5, 6.0, 2.4, 4.0, 2.2, 2.0, 2.2])  # warm-up, then in the order the commands run

    def fake(cmd, env):
        order.append("run" if "train" in cmd else "frozen" if "gc.freeze()" in cmd[-1] else "baseline")
        wall = next(walls)
        return wall, wall / 2

    monkeypatch.setattr(startup, "timed", fake)
    monkeypatch.setattr(startup, "time_sweep_preflight", lambda cfg, env: 4.5)
    monkeypatch.setattr(startup, "time_sweep", lambda cfg, env, root: None)  # tests/training/test_overhead.py runs it
    r = startup.run_startup(parse(StartupConfig, ["rounds=3", f"out_dir={tmp_path}"]))
    assert order == ["run", "baseline", "run", "frozen", "run", "frozen", "baseline", "frozen", "baseline", "run"]
    # round 1: baseline 2.0, run 3.0, frozen 2.5; round 2: run 6.0, frozen 2.4, baseline 4.0;
    # round 3: frozen 2.2, baseline 2.0, run 2.2
    assert [round(x["ratio"], 3) for x in r["rows"]] == [1.5, 1.5, 1.1] and r["ratio"] == pytest.approx(1.5)
    assert [round(x["frozen_ratio"], 3) for x in r["rows"]] == [1.2, 2.5, 1.0]
    assert r["frozen_ratio"] == pytest.approx(1.2)
    text = (tmp_path / "report.md").read_text()
    assert "median run / baseline: 1.500 wall, 1.500 CPU" in text and "**1.200** wall" in text
    assert "preflight of a 100-job sweep" in text and "**4.5 s**" in text and r["sweep_preflight"]["jobs"] == 100


@pytest.mark.proc
@pytest.mark.slow
def test_startup_measures_real_processes(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mhalab", "bench", "startup", "rounds=1", f"out_dir={tmp_path}"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads((tmp_path / "results.json").read_text())
    assert got["ratio"] > 0 and len(got["rows"]) == 1


def test_pace_puts_the_three_figures_of_its_two_benches_in_one_table(tmp_path, monkeypatch):
    """`bench pace` runs `bench overhead` and `bench startup` (real ones are tested in tests/training/test_overhead.py
    and above) each into its own folder with the pace's threads, and judges each figure against that bench's goal."""
    from mhalab.bench import pace

    got = {}

    def overhead(cfg):  # the step's recipe, then the sweep's runs
        got["sweep_step" if "overhead" in got else "overhead"] = cfg
        if cfg.out_dir.endswith("sweep_step"):
            return {"config": {"recipe": cfg.recipe}, "ratio": 1.21, "cpu_ratio": 1.2, "floor_ratio": 1.15,
                    "null_ratio": 1.0}
        return {"config": {"recipe": cfg.recipe}, "ratio": 1.04, "cpu_ratio": 1.06, "peak_gflops": 120.0,
                "run_peak": 0.2, "plain_peak": 0.21, "floor_ratio": 1.03, "fabric_ratio": 1.01,
                "null_ratio": 1.002}

    def startup(cfg):
        got["startup"] = cfg
        return {"frozen_ratio": 1.31, "ratio": 1.01, "sweep": {"runs": cfg.sweep_runs, "steps": cfg.sweep_steps,
                                                              "ratio": 1.2, "cpu_ratio": 1.25, "command": "x"}}

    monkeypatch.setattr(pace, "run_overhead", overhead)
    monkeypatch.setattr(pace, "run_startup", startup)
    r = pace.run_pace(parse(config.PaceConfig, ["threads=1", "step_rounds=3", "sweep_runs=4", f"out_dir={tmp_path}"]))
    assert got["overhead"].out_dir == str(tmp_path / "overhead") and got["startup"].out_dir == str(tmp_path / "startup")
    assert got["overhead"].threads == got["startup"].threads == 1 and got["overhead"].rounds == 3
    step, job, sweep = r["rows"]
    assert (step["wall"], step["goal"], step["verdict"]) == (1.04, config.OverheadConfig().goal, "within")
    assert (job["wall"], job["goal"], job["verdict"]) == (1.31, config.StartupConfig().goal, "OVER by 0.060")
    assert (sweep["wall"], sweep["goal"]) == (1.2, config.StartupConfig().sweep_goal)
    assert sweep["figure"] == "4-job, 100-step sweep"
    assert sweep["verdict"] == ("OVER by 0.100; the goal is under Lightning's own floor (1.150, 1.150 against the "
                                "bench's null)")
    # the sweep's own runs (bench startup's tiny run, steps set by the bench) timed as the step is
    assert got["sweep_step"].out_dir == str(tmp_path / "sweep_step")
    assert got["sweep_step"].recipe == [o for o in config.TINY_RUN if not o.startswith("trainer.max_steps=")]
    assert "its runs' training step against the plain loop: 1.210" in sweep["detail"]
    assert "(`Trainer(barebones=True)`, same model, the floor): 1.150" in sweep["detail"]
    assert step["detail"].endswith("the floor): 1.030; a hand loop under Lightning Fabric: 1.010; the bench's null "
                                   "(plain / plain): 1.002")
    assert r["within_goals"] is False
    text = (tmp_path / "report.md").read_text()
    assert "| 1.040 | 1.060 | 1.05 | within |" in text and "run 0.200, plain 0.210" in text
    assert json.loads((tmp_path / "results.json").read_text())["rows"][1]["verdict"] == "OVER by 0.060"
    # a floor within the bench's null of the goal is no claim: 1.041 against a null of 1.020 is 1.021 < 1.05
    step_over = {"config": {"recipe": ["x"]}, "ratio": 1.079, "cpu_ratio": 1.08, "peak_gflops": 120.0,
                 "run_peak": 0.2, "plain_peak": 0.21, "floor_ratio": 1.041, "null_ratio": 1.020}
    job_only = {"frozen_ratio": 1.2, "ratio": 1.0}
    assert pace.pace_rows(step_over, job_only, 1.05, 1.25, 1.1)[0]["verdict"] == "OVER by 0.029"


@pytest.mark.proc
def test_pace_is_a_bench_subcommand_and_checks_its_settings():
    r = subprocess.run([sys.executable, "-m", "mhalab", "bench", "pace", "step_rounds=0"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "step_rounds" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
