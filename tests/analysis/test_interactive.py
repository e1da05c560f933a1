"""The interactive page of every head: self-contained (no network, no server), and in headless Chromium it loads
without a console message and a hovered token changes what is drawn (the page's #selftest records it)."""

import json
import re
import shutil
import subprocess

import pytest
import torch

from mhalab.attention_page import page_data, write_attention_page

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def causal_maps(n_layers=2, n_heads=4, T=12):
    s = torch.randn(n_layers, n_heads, T, T).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return list(s.softmax(-1))  # n_layers x (H, T, T)


def page(tmp_path, **kwargs):
    tokens = ["the", " </script>", " cat", *"abcdefghi"]  # 12 tokens, one that would end the script
    stats = {"entropy_norm": torch.rand(2, 4), "prev": torch.rand(2, 4)}
    return write_attention_page(tmp_path / "attention.html", causal_maps(), tokens, stats, "a <run>", **kwargs)


def test_page_is_self_contained(tmp_path):
    text = page(tmp_path, n_kv_heads=2).read_text()
    assert not re.search(r"(src|href)=[\"']?(https?:)?//", text) and "fetch(" not in text  # nothing loaded
    assert text.count("</script>") == 1 and "<title>a &lt;run&gt;</title>" in text
    data = json.loads(re.search(r"const D = (.*);\n", text).group(1).replace("<\\/", "</"))
    assert data["tokens"][1] == " </script>" and data["n_kv_heads"] == 2
    assert len(data["weights"]) == 2 and len(data["weights"][0]) == 4 and data["weights"][0][0][0][0] == 1000


def test_page_data_is_bounded():
    data = page_data(causal_maps(1, 2, 100), [str(i) for i in range(100)], max_tokens=64)
    assert len(data["tokens"]) == 64 and len(data["weights"][0][0]) == 64 and len(data["weights"][0][0][0]) == 64


def chromium(url, tmp_path):
    """(the DOM after load, the browser's console lines) of a page in headless Chromium."""
    r = subprocess.run([CHROMIUM, "--headless=new", "--disable-gpu", "--no-sandbox", "--enable-logging=stderr",
                        "--v=0", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", url],
                       capture_output=True, text=True, timeout=120)
    return r.stdout, [line for line in r.stderr.splitlines() if "CONSOLE" in line]


@pytest.mark.proc
@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install chromium) to load the page")
@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_hover_changes_the_drawing_in_chromium_without_console_errors(tmp_path, n_kv_heads):
    path = page(tmp_path, n_kv_heads=n_kv_heads)
    dom, console = chromium(path.as_uri() + "#selftest", tmp_path)
    assert console == [] and 'data-selftest="hover-changed"' in dom
    assert dom.count('<span data-i="') == 12  # every token hoverable
    broken = path.read_text().replace("function map() {", "function map() { undefinedName();")
    (tmp_path / "broken.html").write_text(broken)  # the check sees an error when there is one
    dom, console = chromium((tmp_path / "broken.html").as_uri() + "#selftest", tmp_path)
    assert any("undefinedName" in line for line in console) and "data-selftest" not in dom


@pytest.mark.proc
def test_mhalab_plots_html_writes_the_page_of_a_run(tiny_runs, tmp_path):
    from mhalab.cli import main

    main(["plots", str(tiny_runs[0]), "--out", str(tmp_path / "figs"), "--html", "--no-maps"])
    text = (tmp_path / "figs" / "attention.html").read_text()
    data = json.loads(re.search(r"const D = (.*);\n", text).group(1).replace("<\\/", "</"))
    assert len(data["weights"]) == 2 and data["n_heads"] == 4 and "entropy_norm" in data["stats"]
    assert len(data["stats"]["importance"]) == 2 and 2 <= len(data["tokens"]) <= 64
    if CHROMIUM:
        dom, console = chromium((tmp_path / "figs" / "attention.html").as_uri() + "#selftest", tmp_path)
        assert console == [] and 'data-selftest="hover-changed"' in dom
