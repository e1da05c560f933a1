"""MHA to GQA conversion: `mhalab convert <checkpoint> [<checkpoint> ...] --n-kv-heads G`.

Ainslie et al. 2023: a multi-head checkpoint becomes a grouped-query one by mean-pooling, per group, the key and
value projection heads of the query heads that will share one KV head; then the model is *uptrained* for a small
fraction of the original steps. For comparison the KV heads can also start from the first head of each group
(`first`) or at random (`random`, N(0, 0.02) as a fresh model).

The source may be MHA or GQA with S KV heads; G must divide S (each new KV head pools S / G contiguous source heads,
so query head i still reads the pool of the heads it read before).

For every source checkpoint (one per seed) the command evaluates, on `--split` (default test):
- the source as trained;
- the **MHA control**: the source trained on for the same extra steps as the uptraining, with the same schedule
  (so "matches the MHA source" compares equal total steps);
- each init before and after uptraining for ceil(uptrain_fraction x original steps) optimizer steps (the run's
  data, batch size and optimiser; warm-up 10% of the uptraining, then cosine);
- GQA trained from scratch for the uptraining steps (`--scratch budget`, equal extra compute) and for the converted
  model's total steps (`--scratch total`, equal total steps).
Evaluation uses the whole split unless `--batches N` limits it. Across sources, every arm gets its mean with a 95%
interval over seeds, and the paired differences that decide the claims (mean-pool vs first, vs random, vs the MHA
control, vs GQA from scratch; exact sign-flip tests, Holm-adjusted; `mhalab.stats`); `--margin D`, declared
before the run, tests mean-pool vs the MHA control for equivalence within +-D (TOST).
Outputs in `--out` (default `<run_dir of the first source>/convert_gqa<G>`): conversion.md/.csv/.json, conversion.png,
and runs.csv (each source's seed and environment): conversion.json's comparisons carry `mhalab report`'s arm,
baseline, endpoint and estimate, so `mhalab report --numerics` judges them under each numerics.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from mhalab.training.checkpoint import build_data, load_module, load_run, require_files
from mhalab.checks import check_int, check_number
from mhalab.config.writes import check_links
from mhalab.training.console import each_with_progress, quiet_lightning
from mhalab.errors import ConfigError
from mhalab.training.evaluation import evaluate, headline, split_batches
from mhalab.heads import resolve_heads
from mhalab.runs.summary import ENV_COLUMNS, env_row
from mhalab.stats import holm, lower_is_better, mean_ci, paired, tost
from mhalab.tables import Table, write_csv
from mhalab.analysis.options import ConvertOptions
from mhalab.pictures import new_figure

INITS = ("mean", "first", "random")
SCRATCH = ("budget", "total")  # GQA from scratch for the uptraining steps, or for the converted model's total steps


def pool_heads(heads: torch.Tensor, n_dst: int, init: str) -> torch.Tensor:
    """(n_src, ...) per-head weights -> (n_dst, ...): new head g from the n_src / n_dst contiguous old heads of its
    group, their mean ("mean") or the first ("first")."""
    w = heads.detach().reshape(n_dst, heads.shape[0] // n_dst, *heads.shape[1:])  # (G, r, ...)
    return w.mean(1) if init == "mean" else w[:, 0]


def convert_module(module, n_kv_heads: int, init: str = "mean", seed: int = 0):
    """A new AttentionLitModule with n_kv_heads KV heads per layer, every other weight copied from `module`: the key
    and value heads of each layer (`W_K`, `W_V` and their biases, per head) pooled by group, or for "random" drawn
    as a fresh model's (N(0, 0.02) weights, zero biases)."""
    from mhalab.training.module import variant

    if init not in INITS:
        raise ConfigError(f"--init {init!r}: init must be one of {', '.join(INITS)}")
    a = module.arch.attention
    check_int("--n-kv-heads", n_kv_heads, 1)
    resolve_heads(module.arch.model.d_model, a.n_heads, n_kv_heads, a.d_head)  # n_kv_heads must divide n_heads
    if a.n_kv_heads % n_kv_heads:
        raise ConfigError(f"--n-kv-heads {n_kv_heads} with a source of {a.n_kv_heads} KV heads: n_kv_heads must "
                          "divide the source's KV heads (each new KV head pools a group of them)")
    new = variant(module, n_kv_heads=n_kv_heads)
    new_state = new.state_dict()
    new.load_state_dict({k: v.clone() if k in new_state and v.shape == new_state[k].shape else new_state[k]
                         for k, v in module.state_dict().items()}, strict=True)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for src, dst in zip(module.attention_layers(), new.attention_layers()):
            for proj in ("k", "v"):
                weight, bias = getattr(dst, f"{proj}_proj").weight, dst.head_bias(proj)
                if init == "random":  # drawn in the Linear's own layout, so a seed gives the same draws as before
                    weight.normal_(0.0, 0.02, generator=g)
                    if bias is not None:
                        bias.zero_()
                    continue
                getattr(dst, f"W_{proj.upper()}").copy_(pool_heads(getattr(src, f"W_{proj.upper()}"), n_kv_heads, init))
                if bias is not None:
                    bias.copy_(pool_heads(src.head_bias(proj), n_kv_heads, init))
    return new.eval()


def uptrain(module, dm, steps: int, trainer_cfg: dict[str, Any], out: Path, name: str, seed: int,
            lr: float | None = None) -> dict[str, Any]:
    """Train `module` in place for `steps` optimizer steps on the run's training data, warm-up 10% then cosine."""
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    if steps <= 0:
        return {"steps": 0, "fit_s": 0.0}
    optim = dict(module.hparams.optim, warmup_ratio=0.1, warmup_steps=0)
    if lr is not None:
        optim["lr"] = lr
    module.hparams.optim = optim
    quiet_lightning()
    L.seed_everything(seed, workers=True, verbose=False)
    trainer = L.Trainer(accelerator="cpu" if not torch.cuda.is_available() else "auto", devices=1,
                        max_steps=steps, max_epochs=-1, limit_val_batches=0, num_sanity_val_steps=0,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        gradient_clip_val=trainer_cfg.get("gradient_clip_val", 1.0),
                        precision=trainer_cfg.get("precision", "32-true"), deterministic=True,
                        logger=CSVLogger(str(out), name="uptrain", version=name), log_every_n_steps=max(1, steps // 10))
    t = time.perf_counter()
    module.train()
    trainer.fit(module, train_dataloaders=dm.train_dataloader())
    module.eval()
    return {"steps": int(trainer.global_step), "fit_s": time.perf_counter() - t}


def convert_one(ckpt: Path, n_kv_heads: int, inits: list[str], uptrain_fraction: float, scratch: list[str],
                mha_control: bool, split: str, max_batches: int | None, seed: int, lr: float | None,
                out: Path) -> list[dict[str, Any]]:
    """Every arm for one source checkpoint: one row each."""
    from mhalab.training.module import variant

    src = load_module(ckpt)
    run_dir, summary = load_run(ckpt)
    convert_module(src, n_kv_heads, inits[0])  # fail early on a wrong architecture, before any data is read
    original = summary.timings.get("train_steps")
    if not original:
        raise ConfigError(f"{run_dir}/summary.json has no timings.train_steps: the source run did not finish")
    steps = math.ceil(uptrain_fraction * int(original))
    dm = build_data(summary, where=f"{run_dir}/summary.json")
    batches = split_batches(dm, split, max_batches)
    trainer_cfg = summary.config.get("trainer", {})
    name = f"seed{summary.config.get('seed')}"
    n_src = src.arch.attention.n_kv_heads
    kind = "MHA" if n_src == src.arch.attention.n_heads else f"GQA-{n_src}"
    params = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731

    n_examples = sum(int(b["input_ids"].shape[0]) for b in batches)

    def row(arm: str, init: str, stage: str, total_steps: int, module) -> dict[str, Any]:
        return {"source": ckpt.name, "seed": summary.config.get("seed"), "arm": arm, "init": init, "stage": stage,
                "total_steps": total_steps, "params": params(module), "eval_examples": n_examples,
                **evaluate(module, batches)}

    rows = [{**row(f"source ({kind})", "-", "trained", original, src),
             "environment": env_row(summary.environment)}]  # runs.csv's env_* columns
    if mha_control:
        control = variant(src)
        control.load_state_dict(src.state_dict())
        uptrain(control, dm, steps, trainer_cfg, out, f"{name}-control", seed, lr)
        rows.append(row(f"source ({kind}) + extra steps", "-", "same total steps", original + steps, control))
    for init in inits:
        conv = convert_module(src, n_kv_heads, init, seed=seed)
        rows.append(row(f"converted GQA-{n_kv_heads}", init, "before uptraining", original, conv))
        uptrain(conv, dm, steps, trainer_cfg, out, f"{name}-{init}", seed, lr)
        rows.append(row(f"converted GQA-{n_kv_heads}", init, "after uptraining", original + steps, conv))
    for budget in scratch:  # GQA from scratch: for the uptraining steps, or for all the steps the converted model had
        total = steps if budget == "budget" else original + steps
        torch.manual_seed(seed)
        fresh = variant(src, n_kv_heads=n_kv_heads)
        uptrain(fresh, dm, total, trainer_cfg, out, f"{name}-scratch-{budget}", seed, lr)
        rows.append(row(f"GQA-{n_kv_heads} from scratch", "random",
                        "uptraining steps only" if budget == "budget" else "same total steps", total, fresh))
    for r in rows:
        r["uptrain_steps"] = steps
    return rows


def summarise(rows: list[dict[str, Any]], key: str, margin: float | None = None) -> tuple[list[dict], list[dict]]:
    """(per-arm mean and 95% interval over seeds, the comparisons that decide the claims). The arms of one source
    share its weights, so they are paired by source (exact sign-flip test); p is Holm-adjusted over the comparisons;
    with a margin, mean-pool vs the MHA control is also tested for equivalence (TOST)."""
    arms: dict[tuple, list[dict]] = {}
    for r in rows:
        arms.setdefault((r["arm"], r["init"], r["stage"]), []).append(r)
    table = []
    for (arm, init, stage), rs in arms.items():
        mean, lo, hi = mean_ci([r[key] for r in rs])
        table.append({"arm": arm, "init": init, "stage": stage, "n": len(rs), "total_steps": rs[0]["total_steps"],
                      "params": rs[0]["params"], key: mean, "ci95_low": lo, "ci95_high": hi,
                      "per_seed": " ".join(f"{r[key]:.4f}" for r in rs)})

    def values(match) -> dict:
        return {r["seed"]: r[key] for r in rows if match(r)}

    def at(init: str, stage: str) -> dict:
        return values(lambda r: r["init"] == init and r["stage"] == stage)

    control = values(lambda r: r["stage"] == "same total steps" and "from scratch" not in r["arm"])
    scratch_total = values(lambda r: r["stage"] == "same total steps" and "from scratch" in r["arm"])
    comparisons = []
    for label, a, b in (("mean-pool - first (before uptraining)", at("mean", "before uptraining"),
                         at("first", "before uptraining")),
                        ("mean-pool - first (after uptraining)", at("mean", "after uptraining"),
                         at("first", "after uptraining")),
                        ("mean-pool - random (after uptraining)", at("mean", "after uptraining"),
                         at("random", "after uptraining")),
                        ("mean-pool - MHA control (same total steps)", at("mean", "after uptraining"), control),
                        ("mean-pool - GQA from scratch (same total steps)", at("mean", "after uptraining"),
                         scratch_total)):
        common = sorted(set(a) & set(b), key=str)
        if common:
            c = {"comparison": label, **report_form(label, key), **paired([a[s] - b[s] for s in common]).to_dict()}
            if margin is not None and "MHA control" in label and len(common) >= 2:
                t = tost([a[s] - b[s] for s in common], margin)
                c.update({"tost_margin": margin, "tost_p": t["p"], "equivalent": t["equivalent"],
                          "equivalence": f"equivalent within ±{margin:g} (TOST p {t['p']:.2g})" if t["equivalent"]
                          else f"not shown equivalent within ±{margin:g} (TOST p {t['p']:.2g})"})
            comparisons.append(c)
    for c, adj in zip(comparisons, holm([c["p"] for c in comparisons])):
        c["p_holm"] = adj
        if adj is not None and not c.get("degenerate"):
            c["verdict"] = "separated" if adj < 0.05 else "not separated"
    if margin is not None:
        comparisons += negative_controls(at, values(lambda r: r["stage"] == "trained"), margin, key)
    for c in comparisons:
        c["estimate"] = c["mean"]  # `mhalab report`'s name for the difference
    return table, comparisons


def report_form(label: str, key: str) -> dict[str, str]:
    """A comparison's arm, baseline and endpoint as `mhalab report` names them ("mean-pool - first (after
    uptraining)" -> arm "mean-pool", baseline "first (after uptraining)"), so that `mhalab report --numerics` reads
    conversion.json beside a report's."""
    arm, baseline = label.split(" - ", 1)
    return {"arm": arm, "baseline": baseline, "endpoint": f"{key}, paired by source"}


def negative_controls(at, source: dict, margin: float, key: str) -> list[dict]:
    """Inits that must FAIL the equivalence test with the source (outside the Holm family: their TOST is the
    point): KV heads converted by a random or first-head init, before uptraining. One that passes means the margin
    cannot tell a broken model from the source (issue 27), and the verdict says so."""
    out = []
    for init in ("random", "first"):
        a = at(init, "before uptraining")
        common = sorted(set(a) & set(source), key=str)
        if len(common) < 2:
            continue
        t = tost([a[s] - source[s] for s in common], margin)
        label = f"{init} init - source (before uptraining; negative control)"
        out.append({"comparison": label, **report_form(label, key),
                    **paired([a[s] - source[s] for s in common]).to_dict(), "tost_margin": margin, "tost_p": t["p"],
                    "equivalent": t["equivalent"],
                    "equivalence": f"{'EQUIVALENT' if t['equivalent'] else 'not equivalent'} within ±{margin:g} "
                                   f"(TOST p {t['p']:.2g})",
                    "verdict": "negative control PASSED equivalence: the margin cannot fail" if t["equivalent"]
                    else "negative control fails equivalence, as it must"})
    return out


def plot_conversion(table: list[dict], key: str, path: Path, g: int, task: str):
    """Each arm's mean (a dot, its value printed) on an axis fitted to the arms, with its 95% interval over source
    seeds where there are at least two (none is drawn from one source run)."""
    fig = new_figure(figsize=(9, 4.4))
    ax = fig.add_subplot()
    labels = [f"{r['arm']}\n{r['init']} {r['stage']}" if r["init"] != "-" else f"{r['arm']}\n{r['stage']}"
              for r in table]
    colors = ["C7" if "extra steps" in r["arm"] else "C0" if "source" in r["arm"] else "C3" if "before" in r["stage"]
              else "C2" if "after" in r["stage"] else "C7" for r in table]  # the MHA control is a control: grey
    for i, (r, color) in enumerate(zip(table, colors)):
        y, lo, hi = r[key], r["ci95_low"], r["ci95_high"]
        shown = r["n"] >= 2 and lo is not None and hi is not None
        ax.errorbar([i], [y], yerr=[[y - lo], [hi - y]] if shown else None, fmt="o", capsize=4, color=color, ms=7)
        ax.annotate(f"{y:.4g}", (i, y), textcoords="offset points", xytext=(6, 0), fontsize=7, va="center")
    ax.set_xticks(range(len(table)))
    ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=8)
    ax.set_xlim(-0.5, len(table) - 0.3)
    ax.grid(alpha=0.3, axis="y")
    ax.set_ylabel(key + (" (lower is better)" if lower_is_better(key) else " (higher is better)"))
    n = sorted({r["n"] for r in table})
    what = ("one source run: no interval" if n == [1] else
            f"mean and 95% interval over {'/'.join(map(str, n))} source seeds (none from one run)")
    ax.set_title(f"{task}: MHA -> GQA-{g} ({what})\nblue: source, red: converted, green: uptrained, grey: controls",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return fig


def convert(checkpoints: list[Path], n_kv_heads: int, inits: list[str] | None = None, uptrain_fraction: float = 0.05,
            scratch: list[str] | None = None, mha_control: bool = True, out: Path | None = None, split: str = "test",
            max_batches: int | None = None, seed: int = 0, lr: float | None = None,
            margin: float | None = None) -> dict[str, Any]:
    """Convert, uptrain, evaluate and write the outputs; returns {"rows", "table", "comparisons", "out"}.
    `max_batches` None evaluates the whole split; `margin` (declared before the run) adds the equivalence test."""
    scratch = list(SCRATCH) if scratch is None else scratch
    for budget in scratch:
        if budget not in SCRATCH:
            raise ConfigError(f"--scratch {budget!r}: scratch must be a comma-separated list of {', '.join(SCRATCH)} "
                              "or none")
    if margin is not None:
        check_number("--margin", margin, 0, 1e6, low_open=True)
    inits = inits or list(INITS)
    for i in inits:
        if i not in INITS:
            raise ConfigError(f"--init {i!r}: init must be one of {', '.join(INITS)}")
    check_int("--n-kv-heads", n_kv_heads, 1)
    check_number("--uptrain-fraction", uptrain_fraction, 0, 10, low_open=True)
    if max_batches is not None:
        check_int("--batches", max_batches, 1)
    if lr is not None:
        check_number("--lr", lr, 0, 10, low_open=True)
    require_files(checkpoints)
    if out is None:  # inside a run someone else may have made: no link may carry the outputs elsewhere
        out = load_run(checkpoints[0])[0] / f"convert_gqa{n_kv_heads}"
        check_links(out, out.parent, "write the conversion there")
    out = Path(out)
    rows = [r for c in each_with_progress("convert", checkpoints)
            for r in convert_one(Path(c), n_kv_heads, inits, uptrain_fraction, scratch, mha_control, split,
                                 max_batches, seed, lr, out)]
    out.mkdir(parents=True, exist_ok=True)  # after the sources were read and checked
    key = headline(rows[0])
    table, comparisons = summarise(rows, key, margin)
    task = load_run(checkpoints[0])[1].task
    cols = ["source", "seed", "arm", "init", "stage", "total_steps", "uptrain_steps", "params", "loss", "acc", "bpb"]
    write_csv(out / "conversion.csv", [c for c in cols if c in rows[0]], rows)
    fmt = lambda v: f"{v:.4f}" if isinstance(v, float) else ("-" if v is None else str(v))  # noqa: E731
    tcols = ["arm", "init", "stage", "n", "total_steps", "params", key, "ci95_low", "ci95_high", "per_seed"]
    ccols = ["comparison", "n", "mean", "ci95_low", "ci95_high", "test", "p", "p_holm", "verdict", "equivalence"]
    arms_t, comps_t = Table(tcols), Table(ccols)
    for r in table:
        arms_t.add([fmt(r.get(c)) for c in tcols])
    for r in comparisons:
        comps_t.add([fmt(r.get(c)) for c in ccols])
    evaluated = "the whole split" if max_batches is None else f"its first {max_batches} batches"
    md = [f"# MHA -> GQA-{n_kv_heads} conversion\n",
          f"Task {task}; {len(checkpoints)} source checkpoint(s); `{key}` on the {split} split ({evaluated}, "
          f"{rows[0]['eval_examples']} examples). Uptraining: {rows[0]['uptrain_steps']} steps = {uptrain_fraction:g} "
          "x the source's steps. Mean and 95% interval over sources (seeds).\n", arms_t.markdown(),
          "", "Paired by source (the arms start from the same weights): exact sign-flip test, 95% interval by "
          "inverting it, p Holm-adjusted over these comparisons"
          + (f"; equivalence of mean-pool and the MHA control by TOST within the margin ±{margin:g} given before the "
             "run" if margin is not None else "; no equivalence margin was declared (--margin), so \"not separated\" "
             "is not a claim of equivalence") + ".", "", comps_t.markdown()]
    (out / "conversion.md").write_text("\n".join(md) + "\n")
    result = {"checkpoints": [str(c) for c in checkpoints], "task": task, "n_kv_heads": n_kv_heads,
              "uptrain_fraction": uptrain_fraction, "key": key, "margin": margin, "split": split,
              "max_batches": max_batches, "rows": rows, "table": table, "comparisons": comparisons}
    write_csv(out / "runs.csv", ["seed", "checkpoint", "in_verdicts", *ENV_COLUMNS],
              [{"seed": r["seed"], "checkpoint": c, "in_verdicts": True, **r["environment"]}
               for c, r in zip(checkpoints, (r for r in rows if r["stage"] == "trained"))])
    (out / "conversion.json").write_text(json.dumps(result, indent=2))
    plot_conversion(table, key, out / "conversion.png", n_kv_heads, task)
    result["out"] = out
    return result


def convert_command(o: ConvertOptions) -> int:
    """`mhalab convert`: `convert` on the options, its table printed."""
    r = convert(o.checkpoints, o.n_kv_heads, [s for s in o.init if s], o.uptrain_fraction,
                [s for s in o.scratch if s and s != "none"], o.mha_control, o.out, o.split, o.batches or None, o.seed,
                o.lr, o.margin)
    print((r["out"] / "conversion.md").read_text())
    print(f"wrote {r['out']}")
    return 0


if __name__ == "__main__":
    import sys

    from mhalab.cli import main

    main(["convert", *sys.argv[1:]])
