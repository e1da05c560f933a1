"""A sweep job's config composed once per choice of config groups and copied with its values
(`mhalab.config.compose.Composer.job_config`) equals Hydra's own composition of that job, node for node."""

import pytest
from omegaconf import OmegaConf

from mhalab.config.compose import Composer, parse_args
from mhalab.runs import preflight as pf

SWEEPS = [
    ["setup=mqar_cpu", "seed=0,1,2"],
    ["experiment=kv_sweep64", "optim.lr=3.16e-3", "seed=10,11", "attention.n_kv_heads=4,2,1"],
    ["model.d_model=32,48", "attention.n_heads=2", "optim.betas=[0.9,0.95],[0.8,0.9]", "tags=[a,b]"],
    ["data.max_len=64", "trainer.gradient_clip_val=null,0.5", "optim.warmup_ratio=0.1", "task_name=x-y"],
    ["optim.lr=1e-3,2e-3", "trainer=cpu,gpu", "seed=5"],
    ["seed=1,2", "hydra.job.config.override_dirname.exclude_keys=[seed]", "tags=['with space','b=c']"],
    ["experiment=kv_sweep64", "data.mqar.n_kv_pairs=2,4", "model.param_match={n_heads: 4, d_head: 32}", "seed=1"],
]


def _both(lines: list[str]):
    args = parse_args(["-m", *lines])
    pf.register()
    pf.register_resolvers()
    with Composer(args) as c:
        master = c.sweep_config(list(args.overrides))
        hydra = c.launch_overrides(list(args.overrides), "/tmp/sweep", True)
        jobs = c.sweep_jobs(master, list(args.overrides))
        fast = [c.job_config(hydra, job, i) for i, job in enumerate(jobs)]
        slow = []
        for i, job in enumerate(jobs):
            cfg = c._compose(hydra + list(job))
            cfg.hydra.job.id, cfg.hydra.job.num = str(i), i
            slow.append(cfg)
        return fast, slow, c._bases


@pytest.mark.parametrize("lines", SWEEPS, ids=[" ".join(s)[:40] for s in SWEEPS])
def test_a_job_copied_with_its_values_is_hydras_composition_of_it(lines, monkeypatch, tmp_path):
    monkeypatch.setenv("MHALAB_ROOT", str(tmp_path))
    fast, slow, bases = _both(lines)
    assert len(fast) >= 2
    for f, s in zip(fast, slow):
        assert OmegaConf.to_yaml(f) == OmegaConf.to_yaml(s)
        assert OmegaConf.is_struct(f) == OmegaConf.is_struct(s) and OmegaConf.is_readonly(f) == OmegaConf.is_readonly(s)
        assert OmegaConf.to_container(f, resolve=False) == OmegaConf.to_container(s, resolve=False)
        assert f.hydra.job.override_dirname == s.hydra.job.override_dirname


def test_jobs_that_differ_in_values_share_one_composition(monkeypatch, tmp_path):
    monkeypatch.setenv("MHALAB_ROOT", str(tmp_path))
    _, _, bases = _both(["setup=mqar_cpu", "seed=0,1,2,3", "optim.lr=1e-3,2e-3"])
    assert len(bases) == 1  # 8 jobs, one composition
    _, _, bases = _both(["trainer=cpu,gpu", "seed=0,1,2"])
    assert len(bases) == 2  # a group override is composed by Hydra for each option


@pytest.mark.parametrize("lines, words", [(["nosuchkey=1,2"], "nosuchkey"),
                                          (["seed=1,abc"], "Error merging override seed=abc Value 'abc' of type "
                                                           "'str' could not be converted to Integer")])
def test_a_bad_job_is_hydras_sentence(monkeypatch, tmp_path, lines, words):
    from mhalab.errors import ConfigError

    monkeypatch.setenv("MHALAB_ROOT", str(tmp_path))
    with pytest.raises(ConfigError) as e:
        _both(lines)
    assert words in str(e.value) and "$VALUE" not in str(e.value)
