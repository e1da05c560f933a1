"""A fresh adversarial pass over issue 24's trust boundaries (docs/troubleshooting.md and docs/runs.md's "A copied
run directory is self-contained"), each vector a real `mhalab train` process: escaped interpolations that a logger or
callback would resolve again, settings that would send data off the machine (a listener on 127.0.0.1 counts
connections), optuna storages outside, odd values, new runs aimed at a finished run through other spellings of
its path, and a run directory's `.lock` planted as a link to another file. Each refused vector ends with one
sentence and exit status 2 before anything is written; no marker appears, no connection arrives, the finished run
and the file outside stay byte-identical. Vectors that were not refused before are named in the commits that fixed
them (an escaped `\\${oc.create:...}` in a logger or callback setting ran any class; a `.lock` link got a pid).
"""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY, slow_except
from test_secrets import Listener, mhalab  # one 127.0.0.1 listener for the network vectors, one process runner

pytestmark = pytest.mark.proc  # every test here starts real processes

REPO = Path(__file__).resolve().parents[2]
SECRET = "AKIAsecretVALUE0xC0FFEE"


@pytest.fixture(scope="module")
def listener():
    ln = Listener()
    yield ln
    ln.close()


def one_sentence(r: subprocess.CompletedProcess) -> str:
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 2 and len(errors) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-3000:])
    return errors[0]


def hashes(folder: Path) -> dict[str, str]:
    """Every file (and link) under folder: its bytes' hash, or where the link points."""
    return {str(p.relative_to(folder)): (f"-> {os.readlink(p)}" if p.is_symlink() else
                                         hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file() or p.is_symlink()}


@pytest.fixture(scope="module")
def ws(tmp_path_factory, data_cache) -> Path:
    """The attacker's folder: config files (conf/), a finished tiny run (base/), outside/victim (must stay 'mine')."""
    ws = tmp_path_factory.mktemp("attacks")
    experiments = {
        "esc_logger": "logger:\n  csv:\n    prefix: '\\${{oc.create:{{_target_: builtins.open, file: {mark}, mode: w}}}}'\n",
        "esc_callback": "callbacks:\n  progress_log:\n    every_n_steps: "
                        "'\\${{oc.create:{{_target_: builtins.open, file: {mark}, mode: w}}}}'\n",
        "esc_decode": "logger:\n  csv:\n    prefix: '\\${{oc.decode:\"{{_target_: builtins.open, file: {mark}, mode: w}}\"}}'\n",
        "esc_secret": "logger:\n  csv:\n    name: '\\${{oc.env:AWS_SECRET_ACCESS_KEY}}'\n",
        "esc_hydra_callback": "hydra:\n  callbacks:\n    x:\n      _target_: mhalab.training.callbacks.ProgressLog\n"
                              "      every_n_steps: '\\${{oc.create:{{_target_: builtins.open, file: {mark}, mode: w}}}}'\n",
        "env_set_online": "hydra:\n  job:\n    env_set:\n      WANDB_MODE: online\n      WANDB_BASE_URL: {url}\n",
        "env_set_hf": "hydra:\n  job:\n    env_copy: [HF_ENDPOINT]\n    env_set:\n      HF_ENDPOINT: {url}\n",
        "settings_mode": "logger:\n  wandb:\n    settings:\n      mode: online\n      base_url: {url}\n",
    }
    (ws / "conf" / "experiment").mkdir(parents=True)
    for name, text in experiments.items():
        (ws / "conf" / "experiment" / f"{name}.yaml").write_text(
            "# @package _global_\n" + text.format(mark=ws / "pwned", url="http://127.0.0.1:{port}"))
    (ws / "outside").mkdir()
    (ws / "outside" / "victim").write_text("mine\n")
    r = mhalab(ws / "train", data_cache)
    assert r.returncode == 0, r.stderr[-2000:]
    (summary,) = (ws / "train").rglob("summary.json")
    shutil.copytree(summary.parent, ws / "base", symlinks=True)
    return ws


def port_in(ws: Path, port: int) -> None:
    """The listener's port in the config files (written once per module with a placeholder)."""
    for p in (ws / "conf" / "experiment").glob("*.yaml"):
        p.write_text(p.read_text().replace("{port}", str(port)))


# name -> (arguments, text the one sentence holds); {ws}, {port} and {conf} are filled in
REFUSED = {
    # escaped interpolations: resolved once to `${...}` text that building a logger or callback resolved again
    "escaped oc.create in a logger setting (file)": (["--config-dir", "{conf}", "experiment=esc_logger"],
                                                     "logger.csv.prefix"),
    "escaped oc.create in a callback setting (file)": (["--config-dir", "{conf}", "experiment=esc_callback"],
                                                       "callbacks.progress_log.every_n_steps"),
    "escaped oc.decode in a logger setting (file)": (["--config-dir", "{conf}", "experiment=esc_decode"],
                                                     "logger.csv.prefix"),
    "escaped oc.env reaching a logger name (file)": (["--config-dir", "{conf}", "experiment=esc_secret"],
                                                     "logger.csv.name"),
    "escaped oc.create in a hydra callback (file)": (["--config-dir", "{conf}", "experiment=esc_hydra_callback"],
                                                     "hydra.callbacks.x"),
    "escaped oc.create in a logger setting (command line)": (
        ["+logger.csv.prefix='\\${oc.create:{_target_:builtins.open,file:{ws}/pwned,mode:w}}'"], "logger.csv.prefix"),
    "escaped oc.create in a sweep job": (
        ["-m", "seed=0,1", "+logger.csv.prefix='\\${oc.create:{_target_:builtins.open,file:{ws}/pwned,mode:w}}'"],
        "logger.csv.prefix"),
    # the network
    "WANDB_MODE and WANDB_BASE_URL through env_set (file)": (
        ["--config-dir", "{conf}", "logger=wandb", "experiment=env_set_online"], "hydra.job.env_set"),
    "WANDB_MODE through env_set (command line)": (
        ["logger=wandb", "+hydra.job.env_set.WANDB_MODE=online", "+hydra.job.env_set.WANDB_BASE_URL=http://127.0.0.1:{port}"],
        "hydra.job.env_set"),
    "HF_ENDPOINT through env_set and env_copy (file)": (["--config-dir", "{conf}", "experiment=env_set_hf"],
                                                        "HF_ENDPOINT"),
    "wandb settings.mode online (file)": (["--config-dir", "{conf}", "logger=wandb", "experiment=settings_mode"],
                                          "logger.wandb.settings.mode"),
    "data.path http:// on the listener": (["data=file", "data.path=http://127.0.0.1:{port}/x.csv"], "data.path"),
    "data.path hf://": (["data=file", "data.path=hf://datasets/x/y.csv"], "data.path"),
    "optuna storage sqlite://// outside": (["-m", "hydra/sweeper=search", "hydra.sweeper.n_trials=1",
                                            "hydra.sweeper.storage=sqlite:///{ws}/outside/x.db"], "hydra.sweeper.storage"),
    "optuna storage sqlite+pysqlite": (["-m", "hydra/sweeper=search", "hydra.sweeper.n_trials=1",
                                        "hydra.sweeper.storage=sqlite+pysqlite:///{ws}/outside/x.db"],
                                       "hydra.sweeper.storage"),
    "optuna storage URL-encoded path": (["-m", "hydra/sweeper=search", "hydra.sweeper.n_trials=1",
                                         "hydra.sweeper.storage=sqlite:///%2Ftmp%2Fx.db"], "hydra.sweeper.storage"),
    # odd values
    "task_name with a line break": (["task_name='a\\nb'"], "task_name"),
    "task_name with a control character": (["task_name=a\x01b"], "task_name"),
    "logger name with an escape character": (["logger.csv.name=a\x1b[31m"], "logger.csv.name"),
    "lr nan": (["optim.lr=nan"], "optim.lr"),
    "lr negative zero": (["optim.lr=-0.0"], "optim.lr"),
    "dropout nan": (["model.dropout=nan"], "model.dropout"),
    "warmup_steps inf": (["optim.warmup_steps=inf"], "optim.warmup_steps"),
    "d_model beyond its range": (["model.d_model=4000000"], "model.d_model"),
    "d_model beyond the machine's memory": (["model.d_model=1048576"], "memory"),
    "data.max_len 0": (["data.max_len=0"], "data.max_len"),
}


# One vector of each kind in the default suite, every vector under `pytest -m slow` (CI runs both).
DEFAULT_REFUSED = {"escaped oc.create in a logger setting (file)", "escaped oc.create in a sweep job",
                   "WANDB_MODE through env_set (command line)", "HF_ENDPOINT through env_set and env_copy (file)",
                   "data.path http:// on the listener", "optuna storage sqlite+pysqlite",
                   "task_name with a line break", "lr negative zero", "d_model beyond the machine's memory"}


@pytest.mark.parametrize("name", slow_except(REFUSED, DEFAULT_REFUSED))
def test_a_refused_vector_is_one_sentence_and_nothing_runs_or_is_written(ws, data_cache, listener, name):
    port_in(ws, listener.port)
    args, says = REFUSED[name]
    fill = lambda a: a.replace("{ws}", str(ws)).replace("{port}", str(listener.port)).replace("{conf}", str(ws / "conf"))
    root = ws / "vectors" / name.replace(" ", "_").replace("/", "_")
    r = mhalab(root, data_cache, *map(fill, args), timeout=180)
    error = one_sentence(r)
    assert says in error, error
    assert not (ws / "pwned").exists(), f"{name}: the payload ran"
    assert not (root / "logs").exists(), f"{name}: something was written"
    assert not listener.requests
    assert SECRET not in r.stdout + r.stderr
    assert (ws / "outside").iterdir() and {p.name for p in (ws / "outside").iterdir()} == {"victim"}


# -- new runs aimed at a finished run, and planted lock links ---------------------------------------------------

def plant(ws: Path, name: str, how: str) -> Path:
    """A copy of the finished run (or an empty folder) whose .lock is a link to outside/victim."""
    run = ws / "targets" / name
    if how.startswith("empty"):
        run.mkdir(parents=True)
    else:
        shutil.copytree(ws / "base", run, symlinks=True)
        (run / ".lock").unlink(missing_ok=True)
    if how.endswith("symlink"):
        (run / ".lock").symlink_to(ws / "outside" / "victim")
    elif how.endswith("hardlink"):
        os.link(ws / "outside" / "victim", run / ".lock")
    return run


OVERWRITES = {  # name -> (how the target is made, arguments with {run}, the one sentence's words; None: exit 0)
    "run dir through a symbolic link": ("copy", ["hydra.run.dir={link}"], "already holds a run"),
    "run dir with ..": ("copy", ["hydra.run.dir={run}/../{name}/."], "already holds a run"),
    "run dir with a trailing slash": ("copy", ["hydra.run.dir={run}/"], "already holds a run"),
    "run dir with a double slash": ("copy", ["hydra.run.dir={dslash}"], "already holds a run"),
    "run dir relative from another folder": ("copy", ["hydra.run.dir={rel}"], "already holds a run"),
    "sweep whose job folder is a finished run": ("copy", ["-m", "hydra.sweep.dir={parent}", "hydra.sweep.subdir={name}",
                                                          "seed=0,1"], "already holds a run"),
    "resume of a finished run": ("copy", ["resume={run}"], None),
    "lock symlink, finished run as run dir": ("copy symlink", ["hydra.run.dir={run}"], "symbolic link"),
    "lock symlink, resume of a finished run": ("copy symlink", ["resume={run}"], "symbolic link"),
    "lock hard link, resume of a finished run": ("copy hardlink", ["resume={run}"], "hard link"),
    "lock symlink, a folder without a run": ("empty symlink", ["hydra.run.dir={run}"], "symbolic link"),
    "lock hard link, a folder without a run": ("empty hardlink", ["hydra.run.dir={run}"], "hard link"),
}


@pytest.mark.parametrize("name", slow_except(OVERWRITES, {  # one of each target and outcome; -m slow: all
    "run dir through a symbolic link", "sweep whose job folder is a finished run", "resume of a finished run",
    "lock symlink, resume of a finished run", "lock hard link, a folder without a run"}))
def test_a_finished_run_and_the_file_behind_a_lock_link_stay_byte_identical(ws, data_cache, name):
    how, args, says = OVERWRITES[name]
    key = name.replace(" ", "_").replace(",", "")
    run = plant(ws, key, how)
    (ws / "links").mkdir(exist_ok=True)
    link = ws / "links" / key
    link.symlink_to(run)
    root = ws / "vectors" / key
    root.mkdir(parents=True)
    fill = {"{run}": str(run), "{link}": str(link), "{name}": key, "{parent}": str(run.parent),
            "{dslash}": str(run).replace("/targets/", "//targets/"), "{rel}": os.path.relpath(run, root)}
    before, victim = hashes(run), (ws / "outside" / "victim").read_bytes()
    argv = []
    for a in args:
        for k, v in fill.items():
            a = a.replace(k, v)
        argv.append(a)
    r = mhalab(root, data_cache, *argv, timeout=180)
    if says is None:
        assert r.returncode == 0, r.stderr[-3000:]
    else:
        assert says in one_sentence(r)
    assert hashes(run) == before, f"{name}: the run changed"
    assert (ws / "outside" / "victim").read_bytes() == victim == b"mine\n"
    assert says is None or not [p for p in root.rglob("*") if p.is_file()], f"{name}: something was written"


# -- held without a refusal ----------------------------------------------------------------------------------------

def test_a_secret_through_sweep_params_and_cfg_job_is_written_and_printed_nowhere(ws, data_cache):
    """`--cfg job` prints the config without the secret's value; a sweep over tags from the environment writes it
    nowhere."""
    root = ws / "vectors" / "secret_cfg"
    r = mhalab(root, data_cache, "--cfg", "job", "+logger.csv.prefix=${oc.env:AWS_SECRET_ACCESS_KEY}")
    assert r.returncode == 0 and SECRET not in r.stdout + r.stderr, r.stderr[-2000:]
    root = ws / "vectors" / "secret_sweep"
    r = mhalab(root, data_cache, "-m", "tags=[${oc.env:AWS_SECRET_ACCESS_KEY}],[x]")
    assert r.returncode == 0 and SECRET not in r.stdout + r.stderr, r.stderr[-2000:]
    for p in root.rglob("*"):
        assert SECRET not in str(p) and not (p.is_file() and SECRET.encode() in p.read_bytes()), p


@pytest.mark.parametrize("name", slow_except(["logger=wandb", "offline false and anonymous from a file"],
                                             keep={"offline false and anonymous from a file"}))
def test_offline_wandb_sends_nothing_not_even_its_usage_metrics(ws, data_cache, listener, name):
    """wandb offline posted its own OpenTelemetry metrics to WANDB_BASE_URL (api.wandb.ai when unset) at the end of
    every run with a wandb logger (the default `logger=many`); now no connection reaches the listener."""
    (ws / "conf2" / "experiment").mkdir(parents=True, exist_ok=True)
    (ws / "conf2" / "experiment" / "net.yaml").write_text(
        "# @package _global_\nlogger:\n  wandb:\n    offline: false\n    anonymous: must\n")
    root = ws / "vectors" / name.replace(" ", "_").replace("=", "_")
    extra = ["--config-dir", str(ws / "conf2"), "experiment=net"] if "file" in name else []
    r = mhalab(root, data_cache, *extra, "logger=wandb", env={"WANDB_BASE_URL": f"http://127.0.0.1:{listener.port}"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert list(root.rglob("offline-run-*")), "wandb did not run offline"
    assert not listener.requests


# -- a copied run directory handed to `mhalab plots` and `report` -------------------------------------------------

def analysis(ws: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MHALAB_ALLOW"}
    env.update({"PYTHONPATH": str(REPO / "src"), "AWS_SECRET_ACCESS_KEY": SECRET, "MHALAB_ROOT": str(cwd)})
    return subprocess.run([sys.executable, "-P", "-m", "mhalab", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=180)


def copy_run(ws: Path, name: str, change=None) -> Path:
    import json

    run = ws / "copies" / name
    shutil.copytree(ws / "base", run, symlinks=True)
    if change is not None:
        d = json.loads((run / "summary.json").read_text())
        change(d)
        (run / "summary.json").write_text(json.dumps(d))
    return run


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
def test_a_summary_that_is_a_fifo_or_a_device_is_refused_without_waiting(ws, kind):
    run = copy_run(ws, kind.strip("/").replace("/", "_"))
    (run / "summary.json").unlink()
    if kind == "fifo":
        os.mkfifo(run / "summary.json")
    else:
        (run / "summary.json").symlink_to(kind)
    r = analysis(ws, "plots", str(run), "--max-tokens", "8", cwd=run.parent)
    assert "summary.json" in one_sentence(r)


def test_interpolations_in_a_summary_are_text_never_resolved(ws):
    """oc.create and oc.env written into a summary's config (model, task_name, tags) create nothing and print no
    secret: `plots` and `report` read them as text."""
    create = f"${{oc.create:{{_target_:builtins.open,file:{ws}/pwned,mode:w}}}}"

    def change(d):
        d["config"]["model"]["norm"] = create
        d["config"]["task_name"] = create
        d["config"]["tags"] = ["${oc.env:AWS_SECRET_ACCESS_KEY}"]

    run = copy_run(ws, "interpolations", change)
    for args in (["plots", str(run), "--max-tokens", "8"], ["report", str(run), "--no-plots"]):
        r = analysis(ws, *args, cwd=run.parent)
        assert r.returncode == 0, r.stderr[-2000:]
        assert SECRET not in r.stdout + r.stderr
    assert not (ws / "pwned").exists()
    assert not [p for p in run.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs chromium (headless) to run the pages")
def test_a_run_directory_named_as_markup_runs_no_script_in_the_pages(ws):
    """A run folder named `x<img src=x onerror=document.title='PWNED'><!--`: `mhalab report` and `mhalab plots
    --html` escape it; headless chromium runs both pages and their title is not PWNED."""
    name = "x<img src=x onerror=document.title='PWNED'><!--"
    run = ws / "markup" / name
    shutil.copytree(ws / "base", run, symlinks=True)
    assert analysis(ws, "report", str(run), "--no-plots", cwd=run.parent).returncode == 0
    assert analysis(ws, "plots", str(run), "--html", "--max-tokens", "8", cwd=run.parent).returncode == 0
    pages = [run / "report" / "report.html", *run.glob("plots-redrawn-*/attention.html")]
    assert len(pages) == 2
    for i, page in enumerate(pages):
        plain = ws / "markup" / f"page{i}.html"  # a file:// address without the markup in it
        shutil.copyfile(page, plain)
        dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                              plain.as_uri()], capture_output=True, text=True, timeout=120).stdout
        assert "<title>" in dom and "<title>PWNED</title>" not in dom, dom[:500]
        assert "<img src=\"x\"" not in dom


# -- orphans --------------------------------------------------------------------------------------------------------

@pytest.mark.slow  # about 25 s: a sweep's start-up, then a wait for its workers
def test_a_parallel_sweep_sigkilled_before_its_jobs_begin_leaves_no_worker(ws, data_cache):
    """SIGKILL of the command as soon as a worker has its job (Hydra made the job's folder; mhalab's code in it has
    not begun, the worker still imports torch): the workers used to
    watch init (their parent by then) and train on; now each job stops as on SIGTERM and no process is left."""
    import signal
    import time

    root = ws / "vectors" / "orphans"
    root.mkdir(parents=True)
    tag = f"ATTACK_ORPHAN_{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if k != "MHALAB_ALLOW"}
    env.update({"MHALAB_ROOT": str(root), "PYTHONPATH": str(REPO / "src"), tag: "1"})
    argv = [sys.executable, "-P", "-m", "mhalab", "train", "-m", "hydra/launcher=parallel", *TINY,
            f"data.cache_dir={data_cache}", "trainer.limit_train_batches=200", "trainer.max_epochs=50", "data.limit=null",
            "data.num_workers=2", "seed=0,1"]

    def left() -> list[int]:
        found = []
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and f"{tag}=1".encode() in (d / "environ").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
        return found

    p = subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list(root.glob("logs/train/multiruns/*/0")) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)  # a worker has its job: Hydra made its folder, mhalab's job code has not begun
    p.wait(10)

    deadline = time.monotonic() + 40
    while left() and time.monotonic() < deadline:
        time.sleep(1)
    orphans = left()
    for pid in orphans:  # this test's own processes, by pid
        os.kill(pid, signal.SIGKILL)
    assert orphans == [], f"workers left running after the command died: {orphans}"


@pytest.mark.slow  # a run long enough to be running while two more commands start
def test_a_second_process_and_a_resume_in_a_running_run_are_refused(ws, data_cache):
    """While one run trains in hydra.run.dir=same, a second new run there and `resume=same` are each one sentence
    naming the holder (exit 2); the first run ends ok."""
    import time

    root = ws / "vectors" / "concurrent"
    root.mkdir(parents=True)
    same = root / "same"
    env = {k: v for k, v in os.environ.items() if k != "MHALAB_ALLOW"}
    env.update({"MHALAB_ROOT": str(root), "PYTHONPATH": str(REPO / "src")})
    long = ["trainer.limit_train_batches=400", "trainer.max_epochs=2", "data.limit=null"]
    first = subprocess.Popen([sys.executable, "-P", "-m", "mhalab", "train", *TINY, f"data.cache_dir={data_cache}",
                              f"hydra.run.dir={same}", *long], cwd=root, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (same / ".lock").exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        for extra in ([], long + [f"resume={same}"]):
            r = mhalab(root, data_cache, f"hydra.run.dir={same}", *extra, timeout=120)
            assert "is in use by another process" in one_sentence(r)
    finally:
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-2000:]
    assert '"status": "ok"' in (same / "summary.json").read_text()
