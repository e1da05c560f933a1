"""`mhalab bench train`: training throughput of the mhalab model against torch.nn.TransformerEncoder, and the cost
of the statistics callback.

Both models come from one `Architecture` (`ThroughputConfig.architecture`): the mhalab one is the model of a real
`AttentionLitModule`; the baseline is the same model (embeddings, positions, pooling or LM head, final norm) with its
blocks replaced by one `torch.nn.TransformerEncoder` of the same sizes (GELU, norm_first for pre-LN, batch_first,
attention-weight dropout set to attn_dropout, and its dropout between GELU and the second linear made an Identity,
because mhalab's feed-forward has none), so the two compute the same function with the same parameter count
(checked). Training steps (AdamW, cross-entropy, optional bf16 autocast and torch.compile) alternate in rounds in one
process (`timing.interleaved`); the figure that carries over between machines and loads is the ratio.

The statistics figure is the callback's own pass: `HeadStatsCallback.measure` on the AttentionLitModule (attention
weights through the math path, every statistic, head and KV-group similarity), on a padded probe batch, timed once
per round outside autocast as in a run; and once, the end-of-training extras (importance over
`stats.importance_batches` batches, the pictures, drawn into a temporary folder) through the callback's own code.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from mhalab.bench import output
from mhalab.bench.output import BASELINE
from mhalab.bench.timing import interleaved, loadavg, measure_peak_flops, median, release, resolve_device, sync
from mhalab.cost import encoder_params, train_flops
from mhalab.training.evaluation import mean_cross_entropy
from mhalab.model import build_model
from mhalab.architecture import Architecture
from mhalab.bench.config import ThroughputConfig


class TorchEncoderStack(nn.Module):
    """torch.nn.TransformerEncoder in the place of mhalab's blocks: it takes a Block's arguments (x, padding_mask,
    causal, rotary, cache) and returns x. The encoder's own final norm is mhalab's ln_f."""

    def __init__(self, arch: Architecture):
        super().__init__()
        m, a = arch.model, arch.attention
        if a.n_kv_heads != a.n_heads or a.d_head * a.n_heads != m.d_model or m.pos == "rotary" or arch.causal:
            raise ValueError("the torch.nn.TransformerEncoder baseline needs MHA with d_head = d_model / n_heads, "
                             "no rotary positions and a bidirectional objective")
        layer = nn.TransformerEncoderLayer(m.d_model, a.n_heads, m.d_ff, m.dropout, activation="gelu",
                                           batch_first=True, norm_first=m.norm == "pre", bias=m.bias)
        self.encoder = nn.TransformerEncoder(layer, m.n_layers, enable_nested_tensor=False)
        for lay in self.encoder.layers:
            lay.self_attn.dropout = a.dropout
            lay.dropout = nn.Identity()

    def forward(self, x, padding_mask=None, causal=False, rotary=None, cache=None):
        return self.encoder(x, src_key_padding_mask=padding_mask)  # (B, T, d_model)


def baseline_model(arch: Architecture) -> nn.Module:
    """`build_model(arch)` with its blocks replaced by torch.nn.TransformerEncoder."""
    model = build_model(arch)
    model.encoder.blocks = nn.ModuleList([TorchEncoderStack(arch)])
    return model


def synthetic_batch(arch: Architecture, batch: int, seq_len: int, g: torch.Generator, padded: bool) -> dict:
    """Random tokens (B, T), labels ((B,) classes or (B, T) tokens) and, if padded, a padding mask (B, T) with
    lengths drawn from [T/2, T - 1] (the first row unpadded), as the data module's batches have."""
    ids = torch.randint(0, arch.vocab_size, (batch, seq_len), generator=g)  # (B, T)
    if arch.objective == "classification":
        labels = torch.randint(0, arch.n_classes, (batch,), generator=g)  # (B,)
    else:
        labels = torch.randint(0, arch.vocab_size, (batch, seq_len), generator=g)  # (B, T)
    out = {"input_ids": ids, "labels": labels}
    if padded:
        lengths = torch.randint(max(1, seq_len // 2), max(seq_len // 2, seq_len - 1) + 1, (batch,), generator=g)
        lengths[0] = seq_len
        out["padding_mask"] = torch.arange(seq_len)[None, :] >= lengths[:, None]  # (B, T) True = padding
    return out


def train_pair(cfg, n_heads: int, device: torch.device, plot_dir: Path | None = None) -> dict:
    """One comparison: per-round step times of both models, the statistics pass per round, the extras once."""
    from mhalab.training.callbacks import HeadStatsCallback
    from mhalab.training.evaluation import importance
    from mhalab.training.module import AttentionLitModule

    arch = cfg.architecture(n_heads)
    torch.manual_seed(cfg.seed)
    module = AttentionLitModule(arch.to_dict(), {"lr": cfg.lr, "weight_decay": 0.01}, None).to(device)
    models = {"mhalab": module.model, BASELINE: baseline_model(arch).to(device)}
    params = {k: sum(p.numel() for p in m.parameters()) for k, m in models.items()}
    if len(set(params.values()) | {encoder_params(arch)}) != 1:
        raise RuntimeError(f"the two models differ in size: {params}, closed form {encoder_params(arch)}")
    g = torch.Generator().manual_seed(cfg.seed)
    batch = {k: v.to(device) for k, v in synthetic_batch(arch, cfg.batch, cfg.seq_len, g, padded=False).items()}
    cb = HeadStatsCallback(stats=cfg.stats)
    cb.probe = synthetic_batch(arch, cfg.stats.probe_size, cfg.seq_len, g, padded=True)
    amp = cfg.amp_bf16

    def make_step(model: nn.Module):
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
        run = torch.compile(model, backend=cfg.compile_backend) if cfg.compile else model

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                logits = run(batch["input_ids"]).logits  # (B, n_classes) or (B, T, V)
            loss = mean_cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1))
            loss.backward()
            opt.step()

        return step

    steps = [make_step(m) for m in models.values()]
    for m in models.values():
        m.train()
    stats_fn = [lambda m=module: cb.measure(m)] if cfg.stats.enabled else []
    samples = interleaved(steps + stats_fn, cfg.rounds, device,
                          min_calls=[cfg.steps_per_round] * len(steps) + [1] * len(stats_fn), warmup=cfg.warmup_steps)
    per_step = dict(zip(models, samples))
    result = {"n_heads": n_heads, "arch": arch.to_dict(), "params": params["mhalab"],
              "tokens_per_step": cfg.batch * cfg.seq_len, "flops_per_step": cfg.batch * train_flops(arch, cfg.seq_len),
              "samples_s": per_step}
    if cfg.stats.enabled:
        result["stats_samples_s"] = samples[-1]
        result.update(_extras(cfg, cb, module, arch, g, plot_dir, importance))
    del models, steps, stats_fn, module
    release(device)
    return result


def _extras(cfg, cb, module, arch, g, plot_dir, importance) -> dict:
    """The end-of-training extras through the callback's own code, timed once."""
    out = {}
    cb.update(module)
    if cfg.stats.importance:
        batches = [synthetic_batch(arch, cfg.batch, cfg.seq_len, g, padded=True)
                   for _ in range(cfg.stats.importance_batches)]
        t = time.perf_counter()
        cb.importance = importance(module, batches)
        sync(module.device)
        out["importance_s"] = time.perf_counter() - t
    if cfg.stats.plots and plot_dir is not None:
        cb.plot_dir = plot_dir
        t = time.perf_counter()
        cb.draw(module)
        out["plots_s"] = time.perf_counter() - t
    return out


def run_train(cfg: ThroughputConfig) -> dict:
    """Every comparison of cfg.n_heads, then the report, results and plot in the output folder."""
    device = resolve_device(cfg.device)
    out, info = output.start(cfg, "train", device)
    peak_dtype = torch.bfloat16 if cfg.amp_bf16 else torch.float32
    info["peak_dtype"] = str(peak_dtype).replace("torch.", "")
    peak = measure_peak_flops(device, peak_dtype, cfg.peak_matmul_size)
    info["peak_matmul_tflops_measured"] = peak / 1e12
    result = {"subcommand": "train", "machine": info, "config": output.plain(cfg), "out_dir": str(out),
              "baseline": BASELINE, "rows": [], "stats": [], "pairs": []}
    t0 = time.perf_counter()
    every = cfg.stats.every_n_steps
    for h in cfg.n_heads:
        with tempfile.TemporaryDirectory(prefix="mhalab-bench-plots-") as plot_dir:  # timed, then thrown away
            pair = train_pair(cfg, h, device, Path(plot_dir))
        step_s = {name: median(ts) for name, ts in pair["samples_s"].items()}
        if cfg.stats.enabled:
            pass_s = median(pair["stats_samples_s"])
            step_s["mhalab+stats"] = step_s["mhalab"] + pass_s / every
            result["stats"].append({"n_heads": h, "stats_pass_ms": 1e3 * pass_s, "every_n_steps": every,
                                    "stats_fraction": pass_s / (every * step_s["mhalab"] + pass_s),
                                    "importance_s": pair.get("importance_s"), "plots_s": pair.get("plots_s")})
        rounds = [b / a for a, b in zip(pair["samples_s"]["mhalab"], pair["samples_s"][BASELINE])]
        for name in ("mhalab", "mhalab+stats", BASELINE):
            if name not in step_s:
                continue
            s = step_s[name]
            achieved = pair["flops_per_step"] / s
            result["rows"].append({
                "n_heads": h, "model": name, "params": pair["params"], "step_ms": 1e3 * s,
                "tokens_per_s": pair["tokens_per_step"] / s, "ratio_vs_baseline": step_s[BASELINE] / s,
                "round_ratio": f"{median(rounds):.3f} [{min(rounds):.3f}, {max(rounds):.3f}]" if name == "mhalab"
                else None, "achieved_tflops": achieved / 1e12, "mfu": achieved / peak})
        result["pairs"].append(pair)
        print(f"n_heads={h}: " + ", ".join(f"{k} {1e3 * v:.1f} ms/step" for k, v in step_s.items()), flush=True)
    result["wall_s"] = time.perf_counter() - t0
    info["loadavg_end"] = loadavg()
    report = output.train_report(result)
    print(report, flush=True)
    output.write(out, result, report, [("train", result["rows"]), ("stats", result["stats"])])
    if cfg.plots:
        result["plots"] = output.train_plots(result, out)
    return result
