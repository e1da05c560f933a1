"""Why `attention.backend=sdpa` decoded at ~34 ms a token on the H100 whatever the batch, context or KV heads
(experiments/gpu/h100/bench: the math backend took ~1 ms). Two measurements, written as JSON and printed:

1. raw SDPA, one query against S cached keys (B, H, 1, D) x (B, G, S, D), per call: S fixed for every call, or S
   growing by one each call as in decoding, under each backend torch offers (a kernel that plans per shape pays its
   planning on every decoding step, not on a fixed shape);
2. the bench's own decode (mhalab.bench.decode.decode_case: a causal LanguageModel with a KV cache) under torch's
   default choice, with cuDNN's kernel left out, and under each single backend.

    python scripts/diagnose_decode.py OUT.json           # on a CUDA machine (under a minute)
    python scripts/diagnose_decode.py OUT.json --dry     # the same on the CPU, tiny: checks the script only
    python scripts/diagnose_decode.py OUT.json --render  # OUT.md again from OUT.json

Writes OUT.json and its tables, OUT.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from mhalab.bench.decode import decode_case
from mhalab.bench.timing import median, sync
from mhalab.tables import Table, fmt

BACKENDS = {  # name -> the backends SDPA may choose from
    "default": None,
    "no_cudnn": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
    "cudnn": [SDPBackend.CUDNN_ATTENTION],
    "flash": [SDPBackend.FLASH_ATTENTION],
    "efficient": [SDPBackend.EFFICIENT_ATTENTION],
    "math": [SDPBackend.MATH],
}


def allowed(name: str):
    return sdpa_kernel(BACKENDS[name]) if BACKENDS[name] else contextlib.nullcontext()


def raw_sdpa(device, dtype, B: int, H: int, G: int, D: int, S: int, calls: int, growing: bool, name: str) -> dict:
    """Median ms of one SDPA call, a single query against S (fixed) or S, S+1, ... (growing) keys."""
    q = torch.randn(B, H, 1, D, device=device, dtype=dtype)  # (B, H, 1, D)
    k = torch.randn(B, G, S + calls, D, device=device, dtype=dtype)  # (B, G, S + calls, D)
    v = torch.randn_like(k)
    times = []
    with torch.no_grad(), allowed(name):
        for i in range(calls + 3):
            n = S + (i if growing else 0)
            sync(device)
            t = time.perf_counter()
            F.scaled_dot_product_attention(q, k[:, :, :n], v[:, :, :n], enable_gqa=G != H)  # (B, H, 1, D)
            sync(device)
            if i >= 3:
                times.append(time.perf_counter() - t)
    return {"ms": 1e3 * median(times), "ms_min": 1e3 * min(times)}


def markdown(res: dict) -> str:
    """The two measurements as tables, one row per case (ms medians; a backend that cannot run says why)."""
    m = res["machine"]
    raw = Table(["backends allowed", "n_kv_heads", "keys per call", "ms / call", "min ms"])
    for r in res["raw"]:
        raw.add([r["backends"], r["n_kv_heads"], f"{r['keys']} ({r['S']}{'+' if r['keys'] == 'growing' else ''})",
                 fmt(r.get("ms"), 3) if "ms" in r else r["error"], fmt(r.get("ms_min"), 3) if "ms" in r else "-"])
    dec = Table(["backends allowed", "batch", "n_kv_heads", "context", "ms / token", "min ms"])
    for r in res["decode"]:
        ok = "ms_per_token" in r
        dec.add([r["backends"], r["batch"], r["n_kv_heads"], r["context"],
                 fmt(r["ms_per_token"], 3) if ok else r["error"], fmt(r["ms_min"], 3) if ok else "-"])
    return (f"# SDPA decoding under each backend choice\n\nMachine: {m['device']}, torch {m['torch']} (CUDA "
            f"{m['cuda']}), Python {m['python']}, {m['dtype']}; `python scripts/diagnose_decode.py`. Medians over "
            "the timed calls.\n\n## 1. One SDPA call, a single query (B 1, 8 query heads of 64)\n\n"
            f"{raw.markdown()}\n\n## 2. The bench's decode: LanguageModel with a KV cache (d_model 512, 8 heads, "
            f"2 layers), per token\n\n{dec.markdown()}\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--dry", action="store_true", help="CPU, tiny shapes: checks the script")
    ap.add_argument("--render", action="store_true", help="write OUT.md from an existing OUT.json")
    args = ap.parse_args()
    md = args.out.removesuffix(".json") + ".md"
    if args.render:
        with open(args.out) as f, open(md, "w") as g:
            g.write(markdown(json.load(f)))
        return
    device = torch.device("cpu" if args.dry else "cuda")
    dtype = torch.float32 if args.dry else torch.bfloat16
    S, calls = (64, 4) if args.dry else (2048, 16)
    res = {"machine": {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
                       "device": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor(),
                       "dtype": str(dtype)}, "raw": [], "decode": []}
    print(res["machine"], flush=True)
    for name in BACKENDS:
        for G in (8, 1):
            for growing in (False, True):
                row = {"backends": name, "n_kv_heads": G, "keys": "growing" if growing else "fixed", "S": S}
                try:
                    row.update(raw_sdpa(device, dtype, 1, 8, G, 64, S, calls, growing, name))
                except RuntimeError as e:  # a backend that cannot take these inputs says so
                    row["error"] = str(e).splitlines()[0][:200]
                res["raw"].append(row)
                print("raw", row, flush=True)
    for name in BACKENDS:
        for B in (1, 8):
            for G in (8, 1):
                spec = dict(backend="sdpa", batch=B, context=S, n_kv_heads=G, n_heads=8, d_model=512, n_layers=2,
                            d_ff=2048, vocab_size=1024, pos="learned", steps=calls, warmup_steps=3, seed=0,
                            check=False, prefill=True)
                row = {"backends": name, "batch": B, "n_kv_heads": G, "context": S}
                try:
                    with allowed(name):
                        out = decode_case(spec, device, dtype)
                    row.update(ms_per_token=out["latency_ms"], ms_min=out["latency_ms_min"])
                except RuntimeError as e:
                    row["error"] = str(e).splitlines()[0][:200]
                res["decode"].append(row)
                print("decode", row, flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    with open(md, "w") as f:
        f.write(markdown(res))


if __name__ == "__main__":
    main()
