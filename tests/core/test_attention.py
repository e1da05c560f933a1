"""MultiHeadAttention: against torch.nn.MultiheadAttention, an independent GQA reference, the worked example."""

import math

import pytest
import torch

from mhalab.attention import KVCache, MultiHeadAttention
from mhalab.errors import ConfigError
from mhalab.hooks import run_with_hooks

torch.manual_seed(0)
ATOL = 1e-5


def copy_from_torch(ref: torch.nn.MultiheadAttention, ours: MultiHeadAttention) -> None:
    d = ref.embed_dim
    with torch.no_grad():
        for i, proj in enumerate((ours.q_proj, ours.k_proj, ours.v_proj)):
            proj.weight.copy_(ref.in_proj_weight[i * d:(i + 1) * d])
            proj.bias.copy_(ref.in_proj_bias[i * d:(i + 1) * d])
        ours.out_proj.weight.copy_(ref.out_proj.weight)
        ours.out_proj.bias.copy_(ref.out_proj.bias)


def padding(B: int, T: int, lengths: list[int]) -> torch.Tensor:
    return torch.arange(T).view(1, T) >= torch.tensor(lengths).view(B, 1)  # True = padding


def reference_gqa(x, attn: MultiHeadAttention, pad=None, causal=False):
    """Straightforward per-head loop: query head i reads KV head i // (n_heads // n_kv_heads)."""
    B, T, _ = x.shape
    H, G, D = attn.n_heads, attn.n_kv_heads, attn.d_head
    q = x @ attn.q_proj.weight.T + attn.q_proj.bias
    k = x @ attn.k_proj.weight.T + attn.k_proj.bias
    v = x @ attn.v_proj.weight.T + attn.v_proj.bias
    heads, weights = [], []
    for i in range(H):
        g = i // (H // G)
        qi, kg, vg = q[..., i * D:(i + 1) * D], k[..., g * D:(g + 1) * D], v[..., g * D:(g + 1) * D]
        s = qi @ kg.transpose(1, 2) / math.sqrt(D)  # (B, T, T)
        if pad is not None:
            s = s.masked_fill(pad[:, None, :], float("-inf"))
        if causal:
            s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        w = s.softmax(-1)
        heads.append(w @ vg)
        weights.append(w)
    out = torch.cat(heads, -1) @ attn.out_proj.weight.T + attn.out_proj.bias
    return out, torch.stack(weights, 1)


@pytest.mark.parametrize("backend", ["sdpa", "math"])
@pytest.mark.parametrize("masking", ["none", "padding", "causal", "both"])
def test_matches_torch_multihead_attention(backend, masking):
    B, T, d, H = 3, 7, 32, 4
    ref = torch.nn.MultiheadAttention(d, H, batch_first=True).eval()
    ours = MultiHeadAttention(d, H, backend=backend).eval()
    copy_from_torch(ref, ours)
    x = torch.randn(B, T, d)
    pad = padding(B, T, [7, 5, 3]) if masking in ("padding", "both") else None
    causal = masking in ("causal", "both")
    causal_mask = torch.ones(T, T, dtype=torch.bool).triu(1) if causal else None  # True = masked
    ref_out, ref_w = ref(x, x, x, key_padding_mask=pad, attn_mask=causal_mask, average_attn_weights=False)
    out, w = ours(x, key_padding_mask=pad, causal=causal, need_weights=True)
    out_fast, _ = ours(x, key_padding_mask=pad, causal=causal)
    valid = slice(None) if pad is None else ~pad  # torch fills padded query rows differently; compare valid rows
    assert torch.allclose(out[valid], ref_out[valid], atol=ATOL)
    assert torch.allclose(out_fast[valid], ref_out[valid], atol=ATOL)
    assert torch.allclose(w.transpose(1, 2)[valid], ref_w.transpose(1, 2)[valid], atol=ATOL)
    _, ref_avg = ref(x, x, x, key_padding_mask=pad, attn_mask=causal_mask, average_attn_weights=True)
    assert torch.allclose(w.mean(1)[valid], ref_avg[valid], atol=ATOL)


@pytest.mark.parametrize("n_heads,n_kv_heads,d_head", [(8, 2, 16), (8, 1, 8), (6, 3, 5), (4, 4, 24)])
@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_gqa_mqa_match_reference(n_heads, n_kv_heads, d_head, backend):
    B, T, d = 2, 9, 32
    attn = MultiHeadAttention(d, n_heads, n_kv_heads, d_head, backend=backend)
    x = torch.randn(B, T, d)
    pad = padding(B, T, [9, 4])
    for causal in (False, True):
        ref_out, ref_w = reference_gqa(x, attn, pad, causal)
        out, w = attn(x, key_padding_mask=pad, causal=causal, need_weights=True)
        out_fast, none = attn(x, key_padding_mask=pad, causal=causal)
        assert none is None and w.shape == (B, n_heads, T, T)
        assert torch.allclose(out, ref_out, atol=ATOL)
        assert torch.allclose(out_fast, ref_out, atol=ATOL)
        assert torch.allclose(w, ref_w, atol=ATOL)


def test_kv_head_mapping_is_contiguous_groups():
    attn = MultiHeadAttention(32, 8, 2)
    assert [attn.kv_head_of(i) for i in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert attn.k_proj.weight.shape == (2 * 4, 32) and attn.q_proj.weight.shape == (8 * 4, 32)


def test_gqa_with_n_kv_heads_equal_n_heads_is_mha():
    torch.manual_seed(1)
    mha = MultiHeadAttention(24, 4, d_head=10)
    torch.manual_seed(1)
    gqa = MultiHeadAttention(24, 4, n_kv_heads=4, d_head=10)
    x = torch.randn(2, 5, 24)
    assert torch.equal(mha(x)[0], gqa(x)[0])


def test_backends_agree_with_rotary_and_cross_attention():
    attn = MultiHeadAttention(32, 4, 2, d_head=12)
    x, mem = torch.randn(2, 5, 32), torch.randn(2, 8, 32)
    pad = padding(2, 8, [8, 6])
    outs = {}
    for backend in ("sdpa", "math"):
        attn.backend = backend
        outs[backend] = attn(x, kv=mem, key_padding_mask=pad)[0]
    assert torch.allclose(outs["sdpa"], outs["math"], atol=ATOL)
    from mhalab.model import rotary_tables
    rot = rotary_tables(16, 12)
    attn.backend = "sdpa"
    a = attn(x, rotary=rot, causal=True)[0]
    attn.backend = "math"
    b, w = attn(x, rotary=rot, causal=True, need_weights=True)
    assert torch.allclose(a, b, atol=ATOL)
    assert torch.all(w.triu(1) == 0)


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_padding_is_honoured(backend):
    attn = MultiHeadAttention(16, 4, 2, backend=backend)
    x = torch.randn(2, 6, 16)
    pad = padding(2, 6, [6, 4])
    out, w = attn(x, key_padding_mask=pad, need_weights=True)
    assert torch.all(w[1, :, :, 4:] == 0)  # padded keys get weight 0
    assert torch.allclose(w.sum(-1), torch.ones(2, 4, 6), atol=ATOL)
    x2 = x.clone()
    x2[1, 4:] = torch.randn(2, 16) * 100  # change the padded tokens
    out2, _ = attn(x2, key_padding_mask=pad)
    assert torch.allclose(out[1, :4], out2[1, :4], atol=ATOL)  # no valid output changes
    assert torch.allclose(out[0], out2[0])


def test_fully_padded_sequence_gives_finite_output():
    attn = MultiHeadAttention(16, 4)
    pad = torch.ones(1, 5, dtype=torch.bool)
    for backend in ("sdpa", "math"):
        attn.backend = backend
        out, w = attn(torch.randn(1, 5, 16), key_padding_mask=pad, need_weights=True)
        assert torch.isfinite(out).all() and torch.all(w == 0)


def test_gradients_reach_every_projection():
    attn = MultiHeadAttention(16, 4, 2, d_head=6)
    x = torch.randn(2, 5, 16, requires_grad=True)
    attn(x, key_padding_mask=padding(2, 5, [5, 3]))[0].sum().backward()
    for name, p in attn.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert x.grad.abs().sum() > 0


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_zeroing_a_head_at_hook_z_equals_the_model_without_that_head(backend):
    H, D, d = 4, 6, 16
    attn = MultiHeadAttention(d, H, 2, d_head=D, backend=backend)
    x = torch.randn(2, 5, d)

    def zero_head_2(z, hook):  # (B, T, H, D)
        z = z.clone()
        z[:, :, 2] = 0
        return z

    gated, _ = run_with_hooks(attn, x, fwd_hooks=[("hook_z", zero_head_2)])
    # recompute by hand: the same attention, but head 2's slice of out_proj removed
    _, w = attn(x, need_weights=True)
    v = attn.v_proj(x).view(2, 5, 2, D).transpose(1, 2).repeat_interleave(2, 1)  # (B, H, T, D)
    heads = (w @ v).transpose(1, 2)  # (B, T, H, D)
    keep = [h for h in range(H) if h != 2]
    W = attn.out_proj.weight.view(d, H, D)[:, keep]  # (d, H-1, D)
    expected = torch.einsum("bthd,ehd->bte", heads[:, :, keep], W) + attn.out_proj.bias
    assert torch.allclose(gated, expected, atol=ATOL)
    assert not attn.hook_fns  # detached after the call


# ---- docs/definitions.md#worked-example: "I love machine learning" ----
X = torch.tensor([[1, 0, 1, 0], [0, 1, 1, 0], [1, 1, 0, 1], [0, 1, 0, 1]], dtype=torch.float32)


def set_projections(attn, wq, wk, wv, wo):
    with torch.no_grad():
        for proj, w in ((attn.q_proj, wq), (attn.k_proj, wk), (attn.v_proj, wv), (attn.out_proj, wo)):
            proj.weight.copy_(w.T)  # nn.Linear computes x @ weight.T


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_worked_example_single_head(backend):
    attn = MultiHeadAttention(4, 1, bias=False, backend=backend)
    eye = torch.eye(4)
    set_projections(attn, eye, eye, eye, eye)
    out, w = attn(X.unsqueeze(0), need_weights=True)
    expected_w = torch.softmax(X @ X.T / 2, dim=-1)
    assert torch.allclose(w[0, 0], expected_w, atol=1e-6)
    assert torch.allclose(out[0], expected_w @ X, atol=1e-6)
    assert torch.allclose(w[0, 0, 0], torch.softmax(torch.tensor([2.0, 1, 1, 0]) / 2, -1), atol=1e-6)


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_worked_example_two_heads(backend):
    attn = MultiHeadAttention(4, 2, d_head=2, bias=False, backend=backend)
    w1 = torch.tensor([[1.0, 0], [0, 1], [0, 0], [0, 0]])
    w2 = torch.tensor([[0.0, 0], [0, 0], [1, 0], [0, 1]])
    both = torch.cat([w1, w2], dim=1)  # head 1 reads features 0-1, head 2 features 2-3
    set_projections(attn, both, both, both, torch.eye(4))
    out, w = attn(X.unsqueeze(0), need_weights=True)
    for h, cols in enumerate((slice(0, 2), slice(2, 4))):
        xs = X[:, cols]
        expected = torch.softmax(xs @ xs.T / math.sqrt(2), dim=-1)
        assert torch.allclose(w[0, h], expected, atol=1e-6)
        assert torch.allclose(out[0, :, cols], expected @ xs, atol=1e-6)
    assert torch.allclose(w[0, 0, 0], torch.softmax(torch.tensor([1.0, 0, 1, 0]) / math.sqrt(2), -1), atol=1e-6)


@pytest.mark.parametrize("kwargs,name", [
    (dict(d_model=32, n_heads=8, n_kv_heads=3), "n_kv_heads"),
    (dict(d_model=32, n_heads=0), "n_heads"),
    (dict(d_model=-4, n_heads=2), "d_model"),
    (dict(d_model=32, n_heads=4, d_head=0), "d_head"),
    (dict(d_model=30, n_heads=4), "d_head"),
    (dict(d_model=32, n_heads=4, backend="flash3"), "backend"),
    (dict(d_model=32, n_heads=4, dropout=1.5), "dropout"),
])
def test_invalid_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        MultiHeadAttention(**kwargs)
    assert issubclass(ConfigError, ValueError)


def test_wrong_mask_shape_is_a_value_error():
    attn = MultiHeadAttention(16, 4)
    with pytest.raises(ValueError, match="key_padding_mask"):
        attn(torch.randn(2, 5, 16), key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="key_padding_mask"):
        attn(torch.randn(2, 5, 16), key_padding_mask=torch.zeros(2, 5))


def test_kv_cache_decoding_matches_full_causal_pass():
    attn = MultiHeadAttention(16, 4, 2).eval()
    x = torch.randn(2, 7, 16)
    full, _ = attn(x, causal=True)
    cache = KVCache(2, 2, 16, 4)
    prefix, _ = attn(x[:, :3], causal=True, cache=cache)  # prefill 3 tokens
    steps = [attn(x[:, t:t + 1], causal=True, cache=cache)[0] for t in range(3, 7)]
    assert torch.allclose(torch.cat([prefix] + steps, 1), full, atol=ATOL)
    assert cache.length == 7 and cache.nbytes == 2 * 2 * 2 * 7 * 4 * 4


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_the_decoding_backend_list_serves_every_layout(n_kv_heads):
    """DECODE_BACKENDS (what attention names when it decodes on CUDA) always holds a backend that takes a cached
    step of MHA, GQA and MQA (math here; the GPU test runs the CUDA path), with the same result as torch's choice."""
    from torch.nn.attention import sdpa_kernel

    from mhalab.attention import DECODE_BACKENDS

    attn = MultiHeadAttention(16, 4, n_kv_heads).eval()
    x = torch.randn(2, 7, 16)
    full, _ = attn(x, causal=True)
    cache = KVCache(2, n_kv_heads, 16, 4)
    with sdpa_kernel(DECODE_BACKENDS):
        steps = [attn(x[:, :3], causal=True, cache=cache)[0]]
        steps += [attn(x[:, t:t + 1], causal=True, cache=cache)[0] for t in range(3, 7)]
    assert torch.allclose(torch.cat(steps, 1), full, atol=ATOL)


@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_deterministic_reduced_precision_on_the_cpu_attends_with_sdpa_math(monkeypatch, deterministic, dtype):
    """Under torch.use_deterministic_algorithms a bf16 autocast on the CPU calls SDPA with only its math backend
    allowed (torch's CPU flash kernel ran another sequence of kernels from run to run in bf16); float32, or a run
    that does not ask for determinism, keeps torch's own choice. The result matches within bf16's rounding."""
    import torch.nn.functional as F

    seen = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append((torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    attn = MultiHeadAttention(16, 4, 2).train()
    x = torch.randn(2, 7, 16)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            y, _ = attn(x, causal=True)
        y.float().sum().backward()
    finally:
        torch.use_deterministic_algorithms(was)
    math_only = deterministic and dtype == torch.bfloat16
    assert seen == [(not math_only, True)]
    assert torch.backends.cuda.flash_sdp_enabled()  # restored after the call
    assert y.dtype == dtype
    with torch.no_grad():
        reference, _ = attn(x, causal=True)  # float32, torch's choice (no dropout in this layer)
    assert torch.allclose(y.float(), reference, atol=3e-2 if dtype == torch.bfloat16 else ATOL)


@pytest.mark.parametrize("pos", ["rotary", "learned"])
def test_kv_cache_takes_the_compute_dtype_under_a_bf16_autocast(pos):
    """Float32 parameters under a bf16 autocast (a bf16-mixed run): the cache holds bf16 keys and values, so its
    bytes are what mhalab.cost prices at 2 bytes per element, and decoding still equals a full forward pass."""
    from mhalab.cost import kv_cache_bytes
    from mhalab.model import LanguageModel
    from mhalab.architecture import Architecture, AttentionConfig, ModelConfig

    arch = Architecture(vocab_size=41, objective="clm",
                        model=ModelConfig(d_model=32, n_layers=2, d_ff=64, dropout=0.0, max_len=32, pos=pos),
                        attention=AttentionConfig(n_heads=4, n_kv_heads=2))
    torch.manual_seed(0)
    model = LanguageModel(arch).eval()
    assert model.encoder.tok_emb.weight.dtype == torch.float32
    ids = torch.randint(0, 41, (3, 12))  # (B, T)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        full = model(ids).logits  # (B, T, V)
        caches = model.encoder.new_caches(3, max_len=12)
        steps = [model(ids[:, :5], caches=caches).logits]
        steps += [model(ids[:, t:t + 1], caches=caches).logits for t in range(5, 12)]
    assert all(c.dtype == torch.bfloat16 and c.k.device.type == "cpu" for c in caches)
    assert sum(c.nbytes for c in caches) == kv_cache_bytes(2, 8, 2, n_tokens=12, n_layers=2, batch_size=3)
    got = torch.cat(steps, dim=1).float()
    assert ((got - full.float()).norm() / full.float().norm()).item() < 3e-2


def test_kv_cache_with_an_explicit_dtype_stores_it_and_attends_in_the_queries_dtype():
    attn = MultiHeadAttention(16, 4, 2).eval()
    x = torch.randn(2, 5, 16)
    full, _ = attn(x, causal=True)
    cache = KVCache(2, 2, 8, 4, dtype=torch.bfloat16)
    assert cache.dtype == torch.bfloat16 and cache.nbytes == 0
    steps = [attn(x[:, t:t + 1], causal=True, cache=cache)[0] for t in range(5)]
    y = torch.cat(steps, 1)
    assert y.dtype == torch.float32 and cache.nbytes == 2 * 2 * 2 * 5 * 4 * 2
    assert ((y - full).norm() / full.norm()).item() < 3e-2  # only the stored keys and values are rounded


def test_a_kv_cache_without_a_dtype_is_made_by_its_first_keys():
    cache = KVCache(1, 2, 8, 4)
    assert cache.dtype is None and cache.nbytes == 0 and cache.max_len == 8
    k = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    cache.update(k, k)
    assert cache.dtype == torch.float64 and cache.nbytes == 2 * 2 * 3 * 4 * 8
