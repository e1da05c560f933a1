"""summary.json's environment says why numerics differ between machines: the BLAS and oneDNN path, the CPU kernels
and their caps, threads, the CPU's family, model and vector instructions; and a run summary that records it still
validates against the schema."""

import platform

import pytest
import torch

from mhalab.runs.summary import RunSummary, cpu_name, read_summary, write_summary
from mhalab.training.fit import _environment


def test_the_environment_names_the_numerics_path(tmp_path, monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    env = _environment("32-true")
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["aten_cpu_capability"] == "avx2" and env["mkl_cbwr"] == "AVX2" and env["onednn_max_cpu_isa"] is None
    assert env["processor"] == cpu_name()
    assert env["torch_threads"] == torch.get_num_threads() and env["interop_threads"] >= 1
    assert env["mkldnn"] == (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled)
    assert env["blas"] and env["blas"] in env["torch_config"] and "ATen parallel backend" in env["parallel_info"]
    write_summary(tmp_path, RunSummary(status="ok", environment=env))
    assert read_summary(tmp_path).environment == env


ZEN = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: {model}
model name\t: AMD EPYC
flags\t\t: fpu sse4_2 avx {flags} sha_ni

processor\t: 1
model name\t: another core, not read
"""


@pytest.mark.parametrize("model, flags, named", [
    (1, "avx2", "AMD EPYC (family 25 model 1, avx2)"),  # Zen 3
    (17, "avx2 avx512f avx512bw", "AMD EPYC (family 25 model 17, avx512)"),  # Zen 4: the same model name
])
def test_the_processor_names_the_cpu_kind_that_a_bare_model_name_hides(tmp_path, model, flags, named):
    (tmp_path / "cpuinfo").write_text(ZEN.format(model=model, flags=flags))
    assert cpu_name(tmp_path / "cpuinfo") == named


def test_without_cpuinfo_the_processor_is_what_platform_says(tmp_path):
    assert cpu_name(tmp_path / "absent") == platform.processor()
    (tmp_path / "bare").write_text("model name\t: Some CPU\n")
    assert cpu_name(tmp_path / "bare") == "Some CPU"
