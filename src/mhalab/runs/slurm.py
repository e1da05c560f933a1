"""SLURM: the launcher's resources checked by the cluster before anything is submitted, and the warning signal
turned into a requeue.

`check_launcher` builds the array job's batch script exactly as hydra-submitit-launcher will (through submitit)
and asks `sbatch --test-only` whether the cluster accepts it; a refusal is one sentence before the sweep folder
exists. `requeue` is what a job does with SLURM's warning signal once its checkpoint is saved.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile

from omegaconf import DictConfig, OmegaConf

from mhalab.errors import ConfigError

log = logging.getLogger(__name__)

RESOURCE_KEYS = "hydra.launcher.partition, cpus_per_task, mem_gb, gpus_per_node, timeout_min, account, qos"


def is_slurm_launcher(cfg: DictConfig) -> bool:
    return str(OmegaConf.select(cfg, "hydra.launcher._target_", default="")).endswith("SlurmLauncher")


def check_launcher(cfg: DictConfig, n_jobs: int) -> None:
    """Refuse, in one sentence, a SLURM launcher whose array job of `n_jobs` the cluster would not accept."""
    if not is_slurm_launcher(cfg):
        return
    if shutil.which("sbatch") is None:
        raise ConfigError("hydra/launcher=slurm needs SLURM's sbatch on PATH (run the sweep on the cluster's login "
                          "node, or use hydra/launcher=parallel on this machine)")
    script = batch_script(OmegaConf.to_container(cfg.hydra.launcher, resolve=True), n_jobs)
    r = subprocess.run(["sbatch", "--test-only"], input=script, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        said = " ".join(ln.strip() for ln in (r.stderr or r.stdout).strip().splitlines() if ln.strip())
        raise ConfigError(f"SLURM refuses the launcher's resources ({said}): set {RESOURCE_KEYS} for your "
                          "cluster (README, 'On a SLURM cluster')")


def batch_script(launcher: dict, n_jobs: int) -> str:
    """The sbatch script hydra-submitit-launcher would submit for `n_jobs` jobs (the same parameter mapping)."""
    import submitit
    from submitit.slurm.slurm import _make_sbatch_string

    init_keys = {"_target_", "submitit_folder", "max_num_timeout"}
    base = {"timeout_min", "name", "nodes", "mem_gb", "cpus_per_task", "gpus_per_node", "tasks_per_node",
            "stderr_to_stdout"}
    params = {k if k in base else f"slurm_{k}": v for k, v in launcher.items() if k not in init_keys}
    with tempfile.TemporaryDirectory() as folder:
        executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
        executor.update_parameters(**params)
        slurm = executor._executor
        return _make_sbatch_string(command="true", folder=folder, map_count=n_jobs, **slurm.parameters)


def requeued() -> bool:
    """A SLURM job started again after a requeue (its run directory holds the checkpoint to continue)."""
    return os.environ.get("SLURM_RESTART_COUNT", "0") not in ("", "0")


def requeue(signum: int, previous) -> None:
    """SIGUSR1/2 under SLURM is the warning before a time limit or preemption, acted on once the checkpoint is
    saved: hand it to the handler that was there before (submitit's, under hydra/launcher=slurm: it requeues the
    job with its arguments), else requeue the job as Lightning's SLURMEnvironment(auto_requeue=True) does. The
    requeued job finds its run directory's last.ckpt and continues from it (`requeued`)."""
    if signum not in (signal.SIGUSR1, signal.SIGUSR2) or not os.environ.get("SLURM_JOB_ID"):
        return
    if callable(previous):
        previous(signum, None)
        return
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job = f"{array}_{task}" if array and task else os.environ["SLURM_JOB_ID"]
    result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    log.info("requeued SLURM job %s (scontrol exit %d)", job, result.returncode)
