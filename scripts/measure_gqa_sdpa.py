"""Measure how SDPA handles GQA on this machine: enable_gqa=True vs repeat_interleave of K/V, with and without masks.

Each case runs in a fresh subprocess so its peak RSS is its own. Prints median forward time and peak RSS growth.
Usage: python scripts/measure_gqa_sdpa.py [--T 2048] [--heads 16] [--kv 2] [--d-head 64] [--batch 4]
"""
import argparse
import json
import subprocess
import sys

CASE = r"""
import json, resource, statistics, sys, time, torch, torch.nn.functional as F
B, H, G, T, D, how, masked = json.loads(sys.argv[1])
torch.manual_seed(0)
q = torch.randn(B, H, T, D); k = torch.randn(B, G, T, D); v = torch.randn(B, G, T, D)
pad = torch.zeros(B, T, dtype=torch.bool); pad[:, T - T // 8:] = True
mask = (~pad).view(B, 1, 1, T) if masked else None
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
def step():
    if how == "enable_gqa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    kk, vv = k.repeat_interleave(H // G, 1), v.repeat_interleave(H // G, 1)
    return F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)
with torch.no_grad():
    step(); times = []
    for _ in range(5):
        t = time.perf_counter(); step(); times.append(time.perf_counter() - t)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"ms": 1e3 * statistics.median(times), "peak_mib": (peak - base) / 1024}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv", type=int, default=2)
    ap.add_argument("--d-head", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4)
    a = ap.parse_args()
    print(f"B={a.batch} n_heads={a.heads} n_kv_heads={a.kv} T={a.T} d_head={a.d_head}, torch CPU, fresh process per case")
    print(f"{'how':<12} {'mask':<6} {'median ms':>10} {'peak RSS growth MiB':>20}")
    for masked in (False, True):
        for how in ("enable_gqa", "repeat"):
            args = json.dumps([a.batch, a.heads, a.kv, a.T, a.d_head, how, masked])
            out = subprocess.run([sys.executable, "-c", CASE, args], capture_output=True, text=True, check=True)
            r = json.loads(out.stdout)
            print(f"{how:<12} {str(masked):<6} {r['ms']:>10.1f} {r['peak_mib']:>20.1f}")


if __name__ == "__main__":
    main()
