"""scripts/run_design.py and the declared designs of issue 27 (src/mhalab/conf/experiment/*.yaml with design.*)."""

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import proc_env, session, wait_for
from mhalab.config.schema import DesignConfig
from mhalab.errors import ConfigError
from mhalab.runs.preflight import compose, validate

REPO = Path(__file__).resolve().parents[2]
DESIGNS = ["kv_lr_curve", "kv_capacity", "kv_bpb", "head_width_dff", "seq_len_threshold", "head_count_curve",
           "kv_steps"]
RATES = {"kv_lr_curve": 6, "head_width_dff": 6, "seq_len_threshold": 6, "head_count_curve": 6,  # the curve
         "kv_steps": 1}  # a follow-up at the rate kv_lr_curve froze; every other design: at least 3


@pytest.mark.parametrize("name", DESIGNS)
def test_each_design_composes_with_fresh_seeds_per_stage(name):
    p = compose([f"experiment={name}"])
    t = validate(p)
    sweep_seeds = sorted(int(s) for s in str(p.hydra.sweeper.params.seed).split(","))
    assert sweep_seeds == sorted(t.endpoint.selection_seeds)  # stage A runs exactly the selection seeds
    assert t.design.stage_b_seeds and {"avx2", "threads2"} <= set(t.design.numerics_seeds)
    assert t.endpoint.tuned == ["optim.lr"] and t.design.baseline
    lrs = str(p.hydra.sweeper.params["optim.lr"]).split(",")
    assert len(lrs) >= RATES.get(name, 3)
    for stratum in t.design.strata or [""]:  # every stratum composes and passes the checks
        validate(compose([f"experiment={name}", *stratum.split()]))


def test_run_design_knows_every_declared_numerics():
    """scripts/run_design.py carries out each numerics a config may declare, and no other."""
    sys.path.insert(0, str(REPO / "scripts"))
    import run_design
    from mhalab.config.schema import NUMERICS
    assert set(run_design.NUMERICS) == {"default", *NUMERICS}


@pytest.mark.proc
def test_a_kernel_numerics_that_is_this_cpus_default_runs_unvectorised_kernels_instead():
    """ATEN_CPU_CAPABILITY=avx2 on an AVX2-only CPU (this project's AMD EPYC) trains bit for bit as stage B did, so
    its fresh seeds run with ATen's unvectorised kernels; on an AVX-512 CPU avx2 runs as declared."""
    sys.path.insert(0, str(REPO / "scripts"))
    import run_design

    def cpu(default):
        return lambda env: {"avx2": "AVX2", "default": "DEFAULT"}.get(env.get("ATEN_CPU_CAPABILITY"), default)
    kind, why = run_design.numerics_here("avx2", cpu("AVX2"))
    assert kind == "scalar" and "ATEN_CPU_CAPABILITY=avx2 gives this CPU's default kernels (AVX2)" in why
    assert run_design.numerics_here("avx2", cpu("AVX512")) == ("avx2", None)
    for kind in ("threads2", "bf16", "scalar"):
        assert run_design.numerics_here(kind, cpu("AVX2")) == (kind, None)
    # the real probe, a process with the environment set: scalar kernels are never this CPU's default
    assert run_design.capability({"ATEN_CPU_CAPABILITY": "default"}) == "DEFAULT" != run_design.capability({})
    here = run_design.numerics_here("avx2")[0]
    assert here == ("scalar" if run_design.capability({}) == "AVX2" else "avx2")
    # two declared numerics that would run as one (their stages would share a name) are refused, as is a state's
    assert run_design.clashing(["avx2", "threads2"], {"avx2": "scalar", "threads2": "threads2"}) is None
    assert "no two the same" in run_design.clashing(["avx2", "scalar"], {"avx2": "scalar", "scalar": "scalar"})
    assert "each must be one of" in run_design.clashing(["avx2"], {"avx2": ["x"]})


def test_design_keys_are_checked_in_one_sentence():
    with pytest.raises(ConfigError, match="design.numerics_seeds='sse'.*avx2, scalar, threads2"):
        DesignConfig(numerics_seeds={"sse": [1]})
    with pytest.raises(ConfigError, match="design.stage_b_seeds entry 'x'"):
        DesignConfig(stage_b_seeds=["x"])
    with pytest.raises(ConfigError, match="design.strata entry 'foo'"):
        DesignConfig(strata=["foo"])
    with pytest.raises(ConfigError, match="design.numerics_seeds.avx2 shares seeds \\[3\\] with design.stage_b"):
        DesignConfig(stage_b_seeds=[3], numerics_seeds={"avx2": [3]}).check_fresh([0])
    with pytest.raises(ConfigError, match="stage_b_seeds shares seeds \\[0\\] with endpoint.selection_seeds"):
        validate(compose(["experiment=kv_lr_curve", "design.stage_b_seeds=[0,10]"]))


@pytest.mark.parametrize("override", ["paths.log_dir=/tmp/elsewhere", "+paths.data_dir=/x", "paths=other",
                                      "hydra.sweep.dir=/tmp/s", "hydra.run.dir=/tmp/r"])
def test_a_design_refuses_to_move_its_runs_out_of_the_root(override, tmp_path, monkeypatch):
    """The state and design_runs.py find a design's sweeps under <root>/logs only: moving them is refused before
    anything is written."""
    sys.path.insert(0, str(REPO / "scripts"))
    import run_design
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"keeps its runs under <root>/logs.*MHALAB_ROOT") as e:
        run_design.main(["kv_lr_curve", "--", override])
    assert override in str(e.value) and not any(tmp_path.iterdir())


SMOKE = """# @package _global_
defaults:
  - kv_lr_curve
task_name: smoke_design
data:
  mqar: {n_train: 640, n_val: 64, n_test: 64}
trainer: {max_steps: 6, val_check_interval: 3}
endpoint: {threshold: 0.0, selection_seeds: [0]}
stats: {enabled: false}
design:
  stage_b_seeds: [1]
  numerics_seeds: {avx2: [2], threads2: [3]}
hydra:
  sweeper:
    params:
      optim.lr: 1.0e-3,3.0e-3
      seed: "0"
      attention.n_kv_heads: 4,1
"""


@pytest.mark.proc
@pytest.mark.slow  # a real tiny design through every stage: about 2 minutes on 2 idle cores
def test_runner_runs_every_stage_with_its_numerics_and_resumes(tmp_path):
    """A real design, tiny: stage A (2 rates x 2 arms), the frozen choice, stage B and both second numerics, each
    run recording the numerics it ran under; run again, it starts nothing."""
    conf = tmp_path / "conf" / "experiment"
    conf.mkdir(parents=True)
    (conf / "smoke_design.yaml").write_text(SMOKE)
    env = {**os.environ, "MHALAB_ROOT": str(tmp_path), "PYTHONPATH": str(REPO / "src")}
    cmd = [sys.executable, str(REPO / "scripts" / "run_design.py"), "smoke_design", "--no-freeze",
           "--config-dir", str(tmp_path / "conf")]
    out = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    design = tmp_path / "logs" / "smoke_design" / "design"
    state = json.loads((design / "state.json").read_text())["-"]
    sys.path.insert(0, str(REPO / "scripts"))
    import run_design
    second = run_design.numerics_here("avx2")[0]  # scalar on an AVX2-only CPU, whose default avx2 would repeat B
    cap = {"avx2": "avx2", "scalar": "default"}[second]
    assert state.pop("numerics") == {"avx2": second, "threads2": "threads2"}
    assert sorted(state) == sorted(["A"] + [f"{s} attention.n_kv_heads={k}" for s in ("B", second, "threads2")
                                            for k in (4, 1)])
    assert all(stage["folder"] == stage["dir"] for stage in state.values())  # announced before its jobs ran
    a_dir = tmp_path / state["A"]["dir"]  # recorded relative to the root
    chosen = {a["label"]: a["chosen"] for a in json.loads((a_dir / "report" / "report.json").read_text())["arms"]}
    curve = (a_dir / "report" / "lr_curve.csv").read_text().splitlines()
    assert len(curve) == 1 + 2 * 2 and (a_dir / "report" / "lr_curve.png").exists()  # arms x rates
    for name, seed, aten, threads in (("B", 1, None, 1), (second, 2, cap, 1), ("threads2", 3, None, 2)):
        for k in (4, 1):
            (summary,) = (tmp_path / state[f"{name} attention.n_kv_heads={k}"]["dir"]).glob("*/summary.json")
            s = json.loads(summary.read_text())
            assert s["config"]["seed"] == seed and s["config"]["torch_threads"] == threads
            assert s["environment"]["aten_cpu_capability"] == aten
            assert s["config"]["optim"]["lr"] == float(chosen[f"attention.n_kv_heads={k}"].split("=")[1])
            assert state[f"{name} attention.n_kv_heads={k}"]["machine"] == run_design.machine(s["environment"])
        assert (design / "all" / f"report-{name}" / "report.json").exists()
    stability = json.loads((design / "all" / "stability.json").read_text())  # every verdict under every numerics
    assert stability["numerics"] == ["B", second, "threads2"] and stability["rows"]
    assert stability["environment"][second]["aten_cpu_capability"] == cap
    again = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "mhalab train" not in again.stdout and again.stdout.count(": done,") == 7

    # The design moves to another machine (scripts/design_runs.py), one stage's job killed before its end there: the
    # archive holds no checkpoint; restored under another root, the design resumes and trains that job alone, again
    # from step 0, to the same figures.
    stage = "threads2 attention.n_kv_heads=1"
    (job,) = (tmp_path / state[stage]["dir"]).glob("*/summary.json")
    before = json.loads(job.read_text())
    job.unlink()
    full = json.loads((design / "state.json").read_text())
    full["-"][stage] = {"started": True, "folder": full["-"][stage]["folder"]}
    (design / "state.json").write_text(json.dumps(full))
    saved_to, moved = tmp_path / "saved", tmp_path / "moved"
    keep = [sys.executable, str(REPO / "scripts" / "design_runs.py")]
    for summary in tmp_path.glob("logs/smoke_design/multiruns/*/*/summary.json"):  # a minute on: the jobs settled
        os.utime(summary, (summary.stat().st_atime, summary.stat().st_mtime - 60))
    saved = subprocess.run([*keep, "save", "smoke_design", "--to", str(saved_to)], env=env, cwd=tmp_path,
                           capture_output=True, text=True)
    assert saved.returncode == 0 and "saved 9 finished jobs" in saved.stdout, saved.stdout + saved.stderr
    archives = sorted(saved_to.rglob("*.tar.gz"))
    assert len(archives) == 1 + 9  # the design's state, then one a finished job
    names = [n for a in archives for n in tarfile.open(a).getnames()]
    assert "smoke_design/design/state.json" in names
    assert not [n for n in names if "checkpoints" in n or n.endswith(".lock")]
    moved_env = {**env, "MHALAB_ROOT": str(moved)}
    restored = subprocess.run([*keep, "restore", "smoke_design", "--to", str(saved_to)], env=moved_env,
                              cwd=tmp_path, capture_output=True, text=True)
    assert restored.returncode == 0, restored.stderr
    resumed = subprocess.run(cmd, env=moved_env, cwd=moved, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert resumed.stdout.count("$ mhalab train") == 1 and resumed.stdout.count(": done,") == 6
    (rerun,) = (moved / "logs" / "smoke_design" / "multiruns").glob(f"{job.parent.parent.name}/*/summary.json")
    after = json.loads(rerun.read_text())
    assert after["status"] == "ok" and after["metrics"] == before["metrics"]
    assert after["test_metrics"] == before["test_metrics"]
    moved_state = moved / "logs" / "smoke_design" / "design" / "state.json"
    moved_state.write_text("{}")  # restore never replaces a file (the resumed stage's reports differ too)
    refused = subprocess.run([*keep, "restore", "smoke_design", "--to", str(saved_to)], env=moved_env,
                             cwd=tmp_path, capture_output=True, text=True)
    assert refused.returncode != 0 and "is already there and differs from the saved one" in refused.stderr
    assert moved_state.read_text() == "{}"


def test_reports_run_this_checkout_and_keep_carried_packages(monkeypatch):
    """A design's reports run this checkout's src/ first; other PYTHONPATH entries (the packages carried to a GPU
    machine, where the first report call had lost them) stay behind it."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import run_design
    finally:
        sys.path.remove(str(REPO / "scripts"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/tmp/site", "/frozen/code/src"]))
    assert run_design.analysis_env()["PYTHONPATH"].split(os.pathsep) == [str(REPO / "src"), "/tmp/site",
                                                                          "/frozen/code/src"]
    monkeypatch.delenv("PYTHONPATH")
    assert run_design.analysis_env()["PYTHONPATH"] == str(REPO / "src")


def test_a_report_prints_the_command_it_runs(monkeypatch, capsys, tmp_path):
    """The `$ mhalab ...` line in a design's log is the report command as run (it had printed `report` twice, and
    `--numerics` twice for the stability table), so it can be copied from the log."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import run_design
    finally:
        sys.path.remove(str(REPO / "scripts"))
    ran = []
    monkeypatch.setattr(run_design.subprocess, "run", lambda cmd, **kw: ran.append(cmd))
    run_design.report([tmp_path / "A", tmp_path / "B"], tmp_path / "out", "attention.n_kv_heads=4")
    (printed,) = capsys.readouterr().out.splitlines()
    assert printed.startswith(f"$ mhalab report {tmp_path / 'A'} {tmp_path / 'B'} --out")
    assert printed.split()[2:] == ran[0][3:] and ran[0][-2:] == ["--baseline", "attention.n_kv_heads=4"]


def _from_a_terminal() -> None:
    """A runner started from a terminal: SIGHUP at its default, also where pytest itself runs under nohup (which
    every child would inherit as ignored, and the runner then rightly lets a hang-up pass)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _long_design(tmp_path, preexec_fn=_from_a_terminal):
    """The smoke design with a first job that trains on until stopped, started in its own session; (runner, the
    job's first checkpoint once written)."""
    conf = tmp_path / "conf" / "experiment"
    conf.mkdir(parents=True)
    (conf / "smoke_design.yaml").write_text(SMOKE)
    env = {**proc_env(), "MHALAB_ROOT": str(tmp_path), "PYTHONPATH": str(REPO / "src")}
    cmd = [sys.executable, str(REPO / "scripts" / "run_design.py"), "smoke_design", "--no-freeze",
           "--config-dir", str(tmp_path / "conf"), "--", "trainer.max_steps=100000", "endpoint.stop_at_threshold=false",
           "hydra.launcher.n_jobs=1"]
    runner = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True, preexec_fn=preexec_fn)
    try:
        (ckpt,) = wait_for(lambda: list(tmp_path.glob("logs/smoke_design/multiruns/*/0/checkpoints/last.ckpt")),
                           "the first job's checkpoint")
    except AssertionError:
        _end(runner)
        raise
    assert len(session(runner.pid)) >= 2  # the runner and its sweep
    return runner, ckpt


def _stopped(runner, timeout: float = 300) -> tuple[str, str]:
    """The runner's (stdout, stderr) once it has exited and every process of its session ended; a timeout fails
    naming what was still running and the output's last lines (a stop that hangs is diagnosed, not guessed)."""
    try:
        out, err = runner.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as e:
        left = {pid: (name, Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:200].decode())
                for pid, name in session(runner.pid).items() if Path(f"/proc/{pid}").exists()}
        raise AssertionError(f"the design did not stop within {timeout} s; still running: {left}; stdout tail: "
                             f"{(e.stdout or b'')[-3000:]!r}; stderr tail: {(e.stderr or b'')[-2000:]!r}") from None
    assert wait_for(lambda: not session(runner.pid) or None, "every process of the design to end", timeout=60)
    return out, err


def _end(runner) -> None:
    for pid in session(runner.pid):  # a failed check leaves nothing running
        os.kill(pid, signal.SIGKILL)


@pytest.mark.proc
@pytest.mark.slow  # a design's first job trained until it is stopped: about a minute on 2 shared cores
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_runner_stops_its_stage_and_leaves_nothing_running(tmp_path, sig):
    """The runner stopped by a signal (passed on) or killed (the kernel's SIGTERM to the sweep, PR_SET_PDEATHSIG):
    the stage's running job saves its checkpoint and an "interrupted" summary, and no process of the design is
    left training unwatched; the same command resumes it."""
    runner, ckpt = _long_design(tmp_path)
    try:
        os.kill(runner.pid, sig)
        out, err = _stopped(runner)
    finally:
        _end(runner)
    summary = json.loads((ckpt.parents[1] / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["error"]["message"].startswith("stopped by SIGTERM")
    if sig == signal.SIGTERM:
        assert runner.returncode == 1 and "stopped by SIGTERM: the sweep's running jobs saved" in err, err[-2000:]


@pytest.mark.proc
@pytest.mark.slow  # as above
def test_a_closing_terminal_stops_the_stage_cleanly(tmp_path):
    """A hang-up to the whole process group (a terminal closing, no nohup): the sweep ignores it and the runner passes
    it on as SIGTERM, so the job saves its checkpoint and an "interrupted" summary and nothing is left running."""
    runner, ckpt = _long_design(tmp_path)
    try:
        os.killpg(runner.pid, signal.SIGHUP)  # its own session: the group is the runner's and its sweep's
        out, err = _stopped(runner)
    finally:
        _end(runner)
    summary = json.loads((ckpt.parents[1] / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["error"]["message"].startswith("stopped by SIGTERM"), summary
    assert "stopped by SIGHUP: the sweep's running jobs saved" in err


@pytest.mark.proc
@pytest.mark.slow  # as above
def test_a_runner_under_nohup_goes_on_when_its_terminal_hangs_up(tmp_path):
    """A runner started with SIGHUP ignored (nohup, as each design's README starts it) keeps it ignored: a hang-up
    stops nothing; SIGTERM still does."""
    runner, ckpt = _long_design(tmp_path, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    try:
        os.kill(runner.pid, signal.SIGHUP)
        before = ckpt.stat().st_mtime
        wait_for(lambda: ckpt.stat().st_mtime > before, "the job to save a later checkpoint after the hang-up")
        assert runner.poll() is None and not (ckpt.parents[1] / "summary.json").exists()
        os.kill(runner.pid, signal.SIGTERM)
        _stopped(runner)
    finally:
        _end(runner)
    assert json.loads((ckpt.parents[1] / "summary.json").read_text())["status"] == "interrupted"


def test_a_job_is_saved_once_it_has_settled(tmp_path):
    """design_runs.py keeps a job as finished when its summary says "ok" and was written a minute ago or more (its
    process has written its last lines by then), so a job still finishing is not archived short."""
    sys.path.insert(0, str(REPO / "scripts"))
    import design_runs

    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"status": "ok"}))
    assert not design_runs.finished(tmp_path)
    os.utime(summary, (summary.stat().st_atime, summary.stat().st_mtime - design_runs.SETTLED_S))
    assert design_runs.finished(tmp_path)
    summary.write_text(json.dumps({"status": "interrupted"}))
    os.utime(summary, (summary.stat().st_atime, summary.stat().st_mtime - design_runs.SETTLED_S))
    assert not design_runs.finished(tmp_path)


def _restore_crafted(tmp_path, members: list[tuple[str, bytes | None]] | None, state: bytes = b"{}"):
    """The real `design_runs.py restore` on a crafted design.tar.gz: its state, then `members` ((name, content), or
    (name, None) for a link to /etc/passwd); None: bytes that are no archive. Its CompletedProcess; the restore root
    is tmp_path/root."""
    saved = tmp_path / "saved"
    saved.mkdir()
    if members is None:
        (saved / "design.tar.gz").write_bytes(b"\x1f\x8b not a gzip stream")
    else:
        with tarfile.open(saved / "design.tar.gz", "w:gz") as tar:
            for name, data in [("kv_lr_curve/design/state.json", state), *members]:
                info = tarfile.TarInfo(name)
                if data is None:
                    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                    tar.addfile(info)
                else:
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return subprocess.run([sys.executable, str(REPO / "scripts" / "design_runs.py"), "restore", "kv_lr_curve", "--to",
                           str(saved)], env={**proc_env(), "MHALAB_ROOT": str(tmp_path / "root")}, cwd=tmp_path,
                          capture_output=True, text=True)


@pytest.mark.proc
@pytest.mark.parametrize("member, kind", [("kv_lr_curve/design/code-0123456789ab/src/mhalab/__init__.py", "file"),
                                          ("kv_lr_curve/multiruns/s/0/checkpoints/last.ckpt", "file"),
                                          ("kv_lr_curve/Design/code-0123456789ab/src/mhalab/__init__.py", "file"),
                                          ("kv_lr_curve/multiruns/s/0/Checkpoints/last.ckpt", "file"),
                                          ("kv_lr_curve/../../evil.py", "file"), ("other/design/state.json", "file"),
                                          ("kv_lr_curve/elsewhere/evil.py", "file"), ("kv_lr_curve", "file"),
                                          ("kv_lr_curve/multiruns/s/0/summary.json", "symlink")])
def test_restore_refuses_what_save_never_writes(tmp_path, member, kind):
    """An archive handed over from elsewhere places no code, checkpoint, link or file outside its design (names
    compared case-blind, as a case-blind file system would merge them): one sentence, exit 1, nothing written (the
    real script on a crafted archive)."""
    out = _restore_crafted(tmp_path, [(member, None if kind == "symlink" else b"import os; os.system('touch pwned')")])
    assert out.returncode == 1 and f"holds {member!r}" in out.stderr and "refused, nothing written" in out.stderr
    assert not (tmp_path / "root").exists() and not list(tmp_path.rglob("evil.py"))


def test_a_state_naming_other_code_is_refused(tmp_path):
    """run_design.py runs only a frozen copy named code-<commit>: a state.json pointing elsewhere is refused."""
    sys.path.insert(0, str(REPO / "scripts"))
    import run_design

    with pytest.raises(SystemExit, match="names the design's code '../../elsewhere'"):
        run_design.frozen_code(tmp_path, {"code": "../../elsewhere"})


@pytest.mark.proc
@pytest.mark.parametrize("state, why", [({"code": "../../elsewhere"}, "names the design's code '../../elsewhere'"),
                                        ({"-": {"A": {"dir": "/home/user/anything"}}}, "names the folder"),
                                        ({"-": {"A": {"dir": "logs/kv_lr_curve/multiruns/../../../x"}}},
                                         "names the folder")])
def test_restore_refuses_a_state_that_points_elsewhere(tmp_path, state, why):
    """A saved state naming other code or a stage folder outside logs/<design>/multiruns is refused before
    anything is written (run_design.py would run that code, or write reports there)."""
    out = _restore_crafted(tmp_path, [], state=json.dumps(state).encode())
    assert out.returncode == 1 and why in out.stderr and "refused, nothing written" in out.stderr, out.stderr
    assert not (tmp_path / "root").exists()


def test_a_state_recorded_by_an_older_runner_resumes_under_another_root():
    """Stage folders recorded absolute (runners before 2026-11-26) are found under this root's logs/<task>."""
    sys.path.insert(0, str(REPO / "scripts"))
    import run_design

    recorded = "/work/main/logs/kv_lr_curve/multiruns/2026-11-26_16-03-52_1"
    assert run_design.bad_state({"-": {"A": {"started": True, "dir": recorded}}}, "kv_lr_curve") is None
    assert run_design.sweep_part(recorded, "kv_lr_curve") == Path("logs/kv_lr_curve/multiruns/2026-11-26_16-03-52_1")
    assert run_design.sweep_part("logs/kv_lr_curve/multiruns/x", "kv_lr_curve") == Path("logs/kv_lr_curve/multiruns/x")
    assert run_design.sweep_part("other/logs/kv_lr_curve/multiruns/x", "kv_lr_curve") is None


def test_a_stage_starts_again_where_its_sweep_was_announced(tmp_path, monkeypatch):
    """A stage cut off before its sweep named a folder starts afresh (resume=true would find no sweep and stop the
    design: seen 2026-11-27, a session ended between the two), one whose sweep named its folder resumes exactly that
    folder under this root, and an older runner's state (no folder key) resumes by its jobs' configs."""
    sys.path.insert(0, str(REPO / "scripts"))
    import run_design

    monkeypatch.setenv("MHALAB_ROOT", str(tmp_path))
    assert run_design.resume_args({}, "exp") == []
    assert run_design.resume_args({"started": True, "folder": None}, "exp") == []
    assert run_design.resume_args({"started": True}, "exp") == ["resume=true"]
    sweep = "logs/exp/multiruns/2026-11-27_01-14-08_1"
    assert run_design.resume_args({"started": True, "folder": sweep}, "exp") == [f"resume={tmp_path.resolve() / sweep}"]
    assert run_design.bad_state({"-": {"A": {"started": True, "folder": "/etc"}}}, "exp") is not None


def _design_tree(root: Path, state: dict, jobs: dict[str, str | None]) -> Path:
    """logs/exp under root: the state, and sweep s1's jobs {number: summary status or None (no summary yet)}."""
    exp = root / "logs" / "exp"
    (exp / "design").mkdir(parents=True)
    (exp / "design" / "state.json").write_text(json.dumps(state))
    for num, status in jobs.items():
        (exp / "multiruns" / "s1" / num / ".hydra").mkdir(parents=True)
        (exp / "multiruns" / "s1" / num / ".hydra" / "config.yaml").write_text(f"seed: {num}\n")
        (exp / "multiruns" / "s1" / num / "train.log").write_text("training\n")
        if status:
            (exp / "multiruns" / "s1" / num / "summary.json").write_text(json.dumps({"status": status}))
    (exp / "multiruns" / "s1" / "multirun.yaml").write_text("sweep: s1\n")
    return exp


def _members(archive: Path) -> list[str]:
    with tarfile.open(archive) as tar:
        return tar.getnames()


def test_a_stage_recorded_done_keeps_all_its_jobs_whatever_their_age_or_status(tmp_path, monkeypatch):
    """The state says stage A's sweep has ended: its jobs are final at once, a "failed" one too (the resumed design
    skips that stage, so a job kept as its config only would be lost); a later save of the restored set is the same
    bytes, and a single run's folder (logs/exp/runs) is not part of the design."""
    sys.path.insert(0, str(REPO / "scripts"))
    import design_runs

    monkeypatch.setenv("MHALAB_ROOT", str(tmp_path / "a"))
    exp = _design_tree(tmp_path / "a", {"-": {"A": {"started": True, "dir": "logs/exp/multiruns/s1"}}},
                       {"0": "ok", "1": "failed"})
    (exp / "runs" / "r1" / ".hydra").mkdir(parents=True)
    (exp / "runs" / "r1" / ".hydra" / "config.yaml").write_text("single run\n")
    saved = tmp_path / "saved"
    design_runs.save("exp", saved)
    assert sorted(p.name for p in (saved / "multiruns" / "s1").iterdir()) == ["0.tar.gz", "1.tar.gz"]
    assert "exp/multiruns/s1/1/summary.json" in _members(saved / "multiruns" / "s1" / "1.tar.gz")
    assert sorted(_members(saved / "design.tar.gz")) == ["exp/design/state.json", "exp/multiruns/s1/multirun.yaml"]
    before = {p: p.read_bytes() for p in saved.rglob("*.tar.gz")}
    monkeypatch.setenv("MHALAB_ROOT", str(tmp_path / "b"))
    design_runs.restore("exp", saved)
    design_runs.save("exp", saved)  # at once: the restored summaries are seconds old
    assert {p: p.read_bytes() for p in saved.rglob("*.tar.gz")} == before


def test_a_running_stage_keeps_an_unsettled_job_as_its_config_only(tmp_path, monkeypatch):
    """A stage still running: a job whose summary is seconds old, or that has none, is kept as its config only
    (resumed, it trains again), and nothing else of it is archived."""
    sys.path.insert(0, str(REPO / "scripts"))
    import design_runs

    monkeypatch.setenv("MHALAB_ROOT", str(tmp_path))
    _design_tree(tmp_path, {"-": {"A": {"started": True}}}, {"0": "ok", "1": None})
    design_runs.save("exp", tmp_path / "saved")  # job 0's summary was written just now: not settled yet
    assert not (tmp_path / "saved" / "multiruns").exists()
    assert sorted(_members(tmp_path / "saved" / "design.tar.gz")) == [
        "exp/design/state.json", "exp/multiruns/s1/0/.hydra/config.yaml", "exp/multiruns/s1/1/.hydra/config.yaml",
        "exp/multiruns/s1/multirun.yaml"]


@pytest.mark.proc
@pytest.mark.parametrize("members, why", [
    ([("kv_lr_curve/design/./state.json", b"{}")], "not a plainly named file"),
    ([("kv_lr_curve/multiruns/s//0", b"x")], "not a plainly named file"),
    ([("kv_lr_curve/multiruns/s/" + "x" * 230, b"x")], "longer than 200 bytes"),
    ([("kv_lr_curve/design/State.json", b'{"code": "../x"}')], "also in"),
    ([("kv_lr_curve/multiruns/s/0", b"x"), ("kv_lr_curve/multiruns/s/0/summary.json", b"{}")], "inside"),
    (None, "cannot be read"),
])
def test_restore_refuses_names_that_a_file_system_would_merge(tmp_path, members, why):
    """Names written other than plainly, or that a case-blind file system would merge with another, or a file that
    is also a folder, or an archive that cannot be read: one sentence, nothing written."""
    out = _restore_crafted(tmp_path, members)
    assert out.returncode == 1 and why in out.stderr and "nothing written" in out.stderr, out.stderr
    assert not (tmp_path / "root").exists()


def test_a_design_runs_only_code_of_this_checkouts_history(tmp_path):
    """The frozen copy is rebuilt only from a commit of HEAD's history: another object, or a name that is not a
    commit, is refused in one sentence."""
    sys.path.insert(0, str(REPO / "scripts"))
    import run_design

    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    tree = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD^{tree}"], capture_output=True,
                          text=True).stdout.strip()
    for bad in (tree[:12], "0" * 12):
        with pytest.raises(SystemExit, match="not in this checkout's history"):
            run_design.extract_src(bad, tmp_path / f"code-{bad}")
    run_design.extract_src(head[:12], tmp_path / "code-head")
    assert (tmp_path / "code-head" / "src" / "mhalab" / "__init__.py").is_file()
    assert not list(tmp_path.glob("*.partial"))


ZEN3, XEON = "AMD EPYC (family 25 model 1, avx2)", "Intel Xeon (family 6 model 143, avx512)"


def threads2_on_zen3(tmp_path, monkeypatch):
    """run_design, and a stratum's state whose 2-thread numerics has one arm's runs, on a Zen 3 (read from the job's
    summary: no machine recorded), under MHALAB_ROOT=tmp_path."""
    sys.path.insert(0, str(REPO / "scripts"))
    import run_design
    from mhalab.runs.summary import RunSummary, write_summary

    monkeypatch.setenv("MHALAB_ROOT", str(tmp_path))
    job = tmp_path / "logs" / "exp" / "multiruns" / "s1" / "0"
    job.mkdir(parents=True)
    write_summary(job, RunSummary(status="ok", environment={"processor": ZEN3, "device": "cpu"}))
    return run_design, {"A": {"started": True, "dir": "logs/exp/multiruns/s0", "machine": XEON},
                        "threads2 attention.n_kv_heads=4": {"started": True, "folder": "logs/exp/multiruns/s1",
                                                            "dir": "logs/exp/multiruns/s1"},
                        "numerics": {"avx2": "scalar", "threads2": "threads2"}}


def test_the_arms_of_one_numerics_run_on_one_machine(tmp_path, monkeypatch):
    """A numerics whose first arm ran on one CPU (or GPU) refuses its next arm on another (the arms would be compared
    across machines), read from the finished jobs' summaries where an older runner recorded no machine; stage A,
    another numerics or the same machine runs."""
    run_design, done = threads2_on_zen3(tmp_path, monkeypatch)
    zen3, xeon = ZEN3, XEON
    clash = run_design.machine_clash
    assert clash(done, "threads2 attention.n_kv_heads=2", "exp", xeon) == (
        "threads2 attention.n_kv_heads=2: the threads2 runs of this stratum ran on " + zen3 + ", and this machine is "
        + xeon + ": its arms would be compared across machines. Resume it on that machine (python "
        "scripts/design_runs.py restore exp), leave threads2 out with --numerics, or run it again whole here with "
        "--set-aside threads2")
    assert clash(done, "threads2 attention.n_kv_heads=2", "exp", xeon).count("--set-aside threads2") == 1
    assert clash(done, "threads2 attention.n_kv_heads=2", "exp", zen3) is None
    assert clash(done, "scalar attention.n_kv_heads=2", "exp", xeon) is None  # another numerics
    assert clash(done, "A", "exp", zen3) is None  # stage A only chooses
    h100 = run_design.machine({"processor": xeon, "device": "NVIDIA H100 80GB HBM3"})  # a GPU run: its GPU
    assert h100 == "NVIDIA H100 80GB HBM3" and run_design.machine({"processor": zen3, "device": "cpu"}) == zen3
    done["B attention.n_kv_heads=4"] = {"started": True, "folder": None, "machine": h100}  # recorded when it started
    assert "ran on " + h100 in clash(done, "B attention.n_kv_heads=1", "exp", "NVIDIA H200")
    assert "--numerics" not in clash(done, "B attention.n_kv_heads=1", "exp", xeon)  # B is the design itself
    assert clash(done, "B attention.n_kv_heads=1", "exp", xeon).endswith("run it again whole here with --set-aside B")
    assert clash(done, "B attention.n_kv_heads=1", "exp", h100) is None  # the same GPU, whatever its host's CPU


def test_a_stranded_numerics_is_set_aside_and_runs_again_whole_here(tmp_path, monkeypatch):
    """--set-aside keeps a numerics' stages that ran on another machine under "set-aside <stage>" (their machines
    recorded, no report reads them), so its seeds run again whole here and the clash is gone; doing it again once
    its new runs are here changes nothing, and on a third machine is refused (no set-aside is overwritten); stage A,
    a numerics with no runs or one whose runs ran here are refused in one sentence; stage B can be set aside."""
    run_design, done = threads2_on_zen3(tmp_path, monkeypatch)
    zen3, xeon = ZEN3, XEON
    done["B attention.n_kv_heads=4"] = {"started": True, "dir": "logs/exp/multiruns/s2", "machine": zen3}
    done["threads2 attention.n_kv_heads=2"] = {"started": True, "folder": "logs/exp/multiruns/s3"}
    for group, why in (("A", "stage A only chooses and may span machines"),
                       ("scalar", "this stratum has no scalar runs to set aside")):
        with pytest.raises(ValueError, match=why):
            run_design.set_aside(done, group, xeon, "exp")
    with pytest.raises(ValueError, match="its runs ran on this machine .* resume them instead"):
        run_design.set_aside(done, "threads2", zen3, "exp")
    assert run_design.set_aside(done, "threads2", xeon, "exp") == [
        "threads2 attention.n_kv_heads=4", "threads2 attention.n_kv_heads=2"]
    assert done["set-aside threads2 attention.n_kv_heads=4"] == {
        "started": True, "folder": "logs/exp/multiruns/s1", "dir": "logs/exp/multiruns/s1", "ran_on": [zen3],
        "set_aside_on": xeon}
    assert not any(n.startswith("threads2 ") for n in done)
    assert run_design.machine_clash(done, "threads2 attention.n_kv_heads=2", "exp", xeon) is None
    assert run_design.bad_state({"s": done}, "exp") is None  # the state still reads back (design_runs restore)
    done["threads2 attention.n_kv_heads=4"] = {"started": True, "folder": None, "machine": xeon}  # runs again here
    before = json.dumps(done)
    assert run_design.set_aside(done, "threads2", xeon, "exp") == [] and json.dumps(done) == before  # a resume
    with pytest.raises(ValueError, match="set aside once already, and its new runs ran on .*family 6.*resume them"):
        run_design.set_aside(done, "threads2", "AMD EPYC (family 25 model 17, avx512)", "exp")
    done["threads2 attention.n_kv_heads=4"]["dir"] = "logs/exp/multiruns/s4"  # its new runs finished on the Xeon:
    before = json.dumps(done)  # on a third machine nothing of it runs again, so the same option there is no error
    assert run_design.set_aside(done, "threads2", "NVIDIA H200", "exp") == [] and json.dumps(done) == before
    assert run_design.machine_clash(done, "threads2 attention.n_kv_heads=4", "exp", "NVIDIA H200") is not None
    assert run_design.set_aside(done, "B", xeon, "exp") == ["B attention.n_kv_heads=4"]  # the verdict's numerics too
    assert done["set-aside B attention.n_kv_heads=4"]["ran_on"] == [zen3]
