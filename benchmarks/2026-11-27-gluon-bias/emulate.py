"""The Gluon bias kernels' arithmetic in torch (fp32, the kernels' formulas), NaN placement against eager autograd: the
kernels with 8581212's dS mask but not its dV flag, which the causal "nan" rows then show missing (dv NaN 256 vs 4800);
the "zero" rows' NaN gradients are the eager reference's own (its masked softmax), which the GPU test replaced by SDPA's."""
import math, torch
from fuse_attn.spec import AttentionSpec, CausalMask, ScoreNode, ScoreTensor
from fuse_attn.kernels.reference import reference_attention
L2E = math.log2(math.e)
PROG = (ScoreNode("score"), ScoreNode("load", value=0), ScoreNode("add", (0, 1)))

def fwd(q, k, v, bias, scale, causal, zero, BN=64):
    Z, H, M, D = q.shape; N = k.shape[2]
    m = torch.full((Z, H, M), -math.inf); l = torch.zeros(Z, H, M); acc = torch.zeros(Z, H, M, D)
    rows = torch.arange(M)[:, None]
    for j0 in range(0, N, BN):
        cols = torch.arange(j0, min(j0 + BN, N))[None, :]
        s = (q @ k[:, :, j0:j0 + BN].transpose(-1, -2)) * scale * L2E + bias[:, :, :, j0:j0 + BN].float() * L2E
        if causal:
            s = s.masked_fill(rows < cols, -math.inf)
        m_new = torch.maximum(m, s.amax(-1))
        m_safe = torch.where(m_new == -math.inf, 0.0, m_new)
        p = torch.exp2(s - m_safe[..., None]); alpha = torch.exp2(m - m_safe)
        l = l * alpha + p.sum(-1); acc = acc * alpha[..., None] + p @ v[:, :, j0:j0 + BN]; m = m_new
    out = acc / l[..., None]
    if zero:
        out = torch.where((l == 0)[..., None], 0.0, out)
    return out, (m + torch.log2(l)) / L2E

def bwd(q, k, v, bias, out, lse, dout, scale, causal, zero):
    M, N = q.shape[2], k.shape[2]
    lse2 = lse * L2E
    bad = (lse2.abs() == math.inf) | (lse2 != lse2)
    lse2b = torch.where(bad, math.nan, lse2)
    if zero:
        lse2b = torch.where(lse2 == -math.inf, math.inf, lse2b)
    s = (q @ k.transpose(-1, -2)) * scale * L2E + bias.float() * L2E
    p = torch.exp2(s - lse2b[..., None])
    vis = torch.ones(M, N, dtype=torch.bool)
    if causal:
        vis = torch.arange(M)[:, None] >= torch.arange(N)[None, :]
    p = torch.where(vis, p, 0.0)  # (tiles above the diagonal: not visited; diagonal tiles: the where)
    dp = dout @ v.transpose(-1, -2)
    delta = (dout * out).sum(-1)
    ds = p * (dp - delta[..., None])
    ds = torch.where(vis, ds, 0.0)
    return ds @ k * scale, ds.transpose(-1, -2) @ q * scale, p.transpose(-1, -2) @ dout

torch.manual_seed(0)
for causal in (False, True):
    for zero in (False, True):
        Z, H, N, D = 1, 2, 150, 16
        q, k, v = (torch.randn(Z, H, N, D) for _ in range(3))
        bias = 2 * torch.randn(Z, H, N, N); bias[:, :, 5] = -math.inf; bias[:, :, 7, :N // 2] = -math.inf
        spec = AttentionSpec(dtype="float32", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask() if causal else None,
                             score_mod=PROG, empty_rows="zero" if zero else "nan",
                             score_tensors=(ScoreTensor("bias", "float32", (False,) * 4),))
        dout = torch.randn(Z, H, N, D)
        o, l = fwd(q, k, v, bias, D ** -0.5, causal, zero)
        qq, kk, vv = (t.double().requires_grad_() for t in (q, k, v))
        ro, rl = reference_attention(qq, kk, vv, [bias.double()], spec)
        g = torch.autograd.grad(ro, (qq, kk, vv), dout.double())
        ours = bwd(q, k, v, bias, o, l, dout, D ** -0.5, causal, zero)
        print(f"causal={causal} zero={zero}: out NaN same {torch.equal(o.isnan(), ro.isnan())} err {(o - ro).abs().nan_to_num().max():.1e}; lse same-inf {torch.equal(l.isinf(), rl.isinf())}",
              *[f"{n}: NaN same {torch.equal(a.isnan(), b.isnan())} (ours {a.isnan().sum()} eager {b.isnan().sum()}) err {(a - b).abs().nan_to_num().max():.1e}" for n, a, b in zip(("dq", "dk", "dv"), ours, g)])
