"""Which settings repeat a run of one CPU on another, bit for bit: saved runs of an AVX2-only CPU (head_width_dff's
d_head 64 arm at d_ff 128, trained on a 2-core AMD EPYC Zen 3 and kept in experiments/head_width_dff/runs/) trained
again here with the same frozen code, config and seed, once with ATen's kernels set as they were and once with
oneDNN's too (ONEDNN_MAX_CPU_ISA=AVX2), then compared on every metric and head statistic (the saved runs keep no
checkpoint, so weights are not compared). On an AVX-512 CPU (a Zen 4) it shows what ATEN_CPU_CAPABILITY leaves to
the CPU; on an AVX2-only CPU every row is identical and it shows nothing.

    python scripts/design_runs.py restore head_width_dff     # the saved runs, under logs/ (once)
    python experiments/determinism/across_cpus.py [OUT]      # OUT: default logs/determinism_across_cpus

prints a Markdown table, a row per run (the README copies it).
"""

import os
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path

from compare import summary_differences

from mhalab.runs.summary import cpu_name, read_summary
from mhalab.tables import Table

REPO = Path(__file__).resolve().parents[2]
CODE = "fa4422bcc85a"  # head_width_dff's frozen code (its design state names it)
SWEEPS = "logs/head_width_dff/multiruns/"
SAVED = {  # numerics -> (the d_ff 128 level's d_head 64 sweep, its first seed, ATEN_CPU_CAPABILITY it ran with)
    "default kernels (AVX2 on that CPU)": ("2026-11-27_07-23-25_868724_18925_3597", 10, "avx2"),
    "ATen unvectorised (scalar)": ("2026-11-27_08-07-00_997252_24298_bbbe", 20, "default"),
}
CONFIG = ["experiment=head_width_dff", "model.param_match=null", "attention.d_head=64", "optim.lr=0.00316",
          "torch_threads=1", "logger=csv"]
SEEDS = 3  # the first seeds of each saved sweep


def frozen_code(out: Path) -> Path:
    """The design's committed src/ (git archive of its commit), unpacked once under out/."""
    code = out / f"code-{CODE}"
    if not (code / "src" / "mhalab").is_dir():
        tar = subprocess.run(["git", "-C", str(REPO), "archive", CODE, "src"], capture_output=True, check=True).stdout
        tarfile.open(fileobj=BytesIO(tar)).extractall(code, filter="data")
    return code / "src"


def main(out: Path) -> None:
    src = frozen_code(out)
    t = Table(["saved run (Zen 3)", "seed", "here with", "metrics that differ", "head statistics that differ",
               "steps saved / here"])
    for numerics, (sweep, first, aten) in SAVED.items():
        for job in range(SEEDS):
            saved = read_summary(REPO / SWEEPS / sweep / str(job))
            for caps in ({"ATEN_CPU_CAPABILITY": aten}, {"ATEN_CPU_CAPABILITY": aten, "ONEDNN_MAX_CPU_ISA": "AVX2"}):
                run = out / f"{sweep}-{job}-{'-'.join(caps.values())}"
                if not (run / "summary.json").is_file():
                    subprocess.run([sys.executable, "-m", "mhalab", "train", f"seed={first + job}", *CONFIG,
                                    f"hydra.run.dir={run}"], env={**os.environ, **caps, "PYTHONPATH": str(src)},
                                   check=True, capture_output=True)
                here = read_summary(run)
                metrics, stats, n_stats = summary_differences(saved, here)
                t.add([numerics, first + job, " ".join(f"{k}={v}" for k, v in caps.items()),
                       f"{len(metrics)} of {len({**saved.metrics, **saved.test_metrics})}",
                       f"{len(stats)} of {n_stats}",
                       f"{saved.timings['train_steps']:.0f} / {here.timings['train_steps']:.0f}"])
    print(f"Here: {cpu_name()}; saved runs: {read_summary(REPO / SWEEPS / sweep / '0').environment['processor']}"
          " (a Zen 3: family 25, AVX2 without AVX-512, as that session's lscpu said)\n")
    print(t.markdown())


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "logs/determinism_across_cpus").resolve())
