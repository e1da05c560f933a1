"""summary.json's environment says why numerics differ between machines: the BLAS and oneDNN path, the CPU kernels
and their cap, threads; and a run summary that records it still validates against the schema."""

import torch

from mhalab.runs.summary import RunSummary, read_summary, write_summary
from mhalab.training.fit import _environment


def test_the_environment_names_the_numerics_path(tmp_path, monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    env = _environment("32-true")
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["aten_cpu_capability"] == "avx2"
    assert env["torch_threads"] == torch.get_num_threads() and env["interop_threads"] >= 1
    assert env["mkldnn"] == (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled)
    assert env["blas"] and env["blas"] in env["torch_config"] and "ATen parallel backend" in env["parallel_info"]
    write_summary(tmp_path, RunSummary(status="ok", environment=env))
    assert read_summary(tmp_path).environment == env
