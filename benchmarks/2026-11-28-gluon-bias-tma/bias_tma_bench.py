"""The Gluon forward's bias tiles by TMA in the k / v ring against the consumers' loads (the same kernel with
``_bias_by_tma`` refusing every bias), the generated template and FlexAttention (ALiBi from the slopes), the op
called eagerly, ``do_bench`` medians in two orders: the precomputed ALiBi row of issue 17 (B4 H16 N4096 D128
causal, a ``[1, H, N, N]`` bf16 buffer) and the dense bias row's forward (no mask, the bias a parameter).
Run from the repository root: ``python3 benchmarks/2026-11-28-gluon-bias-tma/bias_tma_bench.py``."""
import contextlib
import sys

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, ".")
from fuse_attn.kernels import hopper_backward as hb, hopper_forward as hf  # noqa: E402
from fuse_attn.kernels.hopper_forward import flash_attention_hopper  # noqa: E402
from fuse_attn.kernels.ops import flash_attention  # noqa: E402
from fuse_attn.spec import AttentionSpec, CausalMask, ScoreNode, ScoreTensor  # noqa: E402
from tools.bench_attention import alibi_slopes  # noqa: E402
from tools.bench_variants import alibi_bias, alibi_score_mod, causal_mask_mod  # noqa: E402

print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
PROGRAM = (ScoreNode("score"), ScoreNode("load", value=0), ScoreNode("add", (0, 1)))
Z, H, N, D = 4, 16, 4096, 128


def spec_for(causal, bias):
    return AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5,
                         causal=CausalMask() if causal else None, score_mod=PROGRAM,
                         score_tensors=(ScoreTensor("bias", "bfloat16", tuple(n == 1 for n in bias.shape)),))


def gluon(q, k, v, spec, bias, config=None):
    """The op on the bias; ``config`` (rows a consumer, key tile, stages, consumers) in place of forward_config's
    (the ring then keeps as many of its stages as fit beside the bias tiles: hopper_forward.bias_ring_stages)."""
    if config is None:
        return lambda: flash_attention_hopper(q, k, v, spec, bias=bias)

    def call():
        saved = hf.forward_config
        hf.forward_config = lambda *args: config
        try:
            return flash_attention_hopper(q, k, v, spec, bias=bias)
        finally:
            hf.forward_config = saved
    return call


class loads_everywhere:
    """Within it, neither kernel takes a bias by TMA."""
    def __enter__(self):
        self.saved = hf._bias_by_tma, hb._bias_by_tma
        hf._bias_by_tma = hb._bias_by_tma = lambda b: None

    def __exit__(self, *exc):
        hf._bias_by_tma, hb._bias_by_tma = self.saved


def time_rows(title, fns, q, k, v, backward=True):
    dout = torch.randn_like(q)
    res = {}
    for order in (list(fns), list(fns)[::-1]):
        for name in order:
            f = fns[name]
            with torch.no_grad(), (loads_everywhere() if "loads" in name else contextlib.nullcontext()):
                tf = do_bench(f, warmup=50, rep=300)
            with loads_everywhere() if "loads" in name else contextlib.nullcontext():
                tb = do_bench(lambda: torch.autograd.grad(f(), (q, k, v), dout), warmup=50, rep=300) if backward else 0

            res.setdefault(name, []).append((tf, tb))
    print(f"\n{title}\n| | forward ms | forward+backward ms |\n|---|---|---|")
    for name, runs in res.items():
        print(f"| {name} | {' / '.join(f'{a:.3f}' for a, _ in runs)} | {' / '.join(f'{b:.3f}' for _, b in runs)} |")
    return res


torch.manual_seed(0)
q, k, v = (torch.randn(Z, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
slopes = alibi_slopes(H).cuda()
alibi = alibi_bias(slopes, N)[None].to(torch.bfloat16).contiguous()
spec = spec_for(True, alibi)
# correctness of the TMA path against the loads path and the template at the timed shape (the tests run odd shapes)
with torch.no_grad():
    outs = {"tma": gluon(q, k, v, spec, alibi)(), "template": flash_attention(q, k, v, spec, [alibi])}
    with loads_everywhere():
        outs["loads"] = gluon(q, k, v, spec, alibi)()
print("max |tma - loads|", (outs["tma"].float() - outs["loads"].float()).abs().max().item(),
      "max |tma - template|", (outs["tma"].float() - outs["template"].float()).abs().max().item(), flush=True)

from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: E402

flex = torch.compile(flex_attention)
block_mask = create_block_mask(causal_mask_mod, None, None, N, N, device="cuda")
score_mod = alibi_score_mod(slopes.to(torch.bfloat16))
time_rows("precomputed ALiBi, B4 H16 N4096 D128 causal", {
    "Gluon, bias by TMA": gluon(q, k, v, spec, alibi),
    "Gluon, bias loads": gluon(q, k, v, spec, alibi),
    "Gluon, bias by TMA, 64-key tiles, 4 stages": gluon(q, k, v, spec, alibi, (64, 64, 4, 2)),
    "template": lambda: flash_attention(q, k, v, spec, [alibi]),
    "Flex (slopes)": lambda: flex(q, k, v, score_mod=score_mod, block_mask=block_mask),
}, q, k, v)

dense = (torch.randn(1, H, N, N, device="cuda") * 0.5).to(torch.bfloat16)
dense_spec = spec_for(False, dense)
flex_dense = lambda: flex(q, k, v, score_mod=lambda s, b, h, i, j: s + dense[0, h, i, j])  # noqa: E731
time_rows("dense bias [1,H,N,N], B4 H16 N4096 D128, forward", {
    "Gluon, bias by TMA": gluon(q, k, v, dense_spec, dense),
    "Gluon, bias loads": gluon(q, k, v, dense_spec, dense),
    "template": lambda: flash_attention(q, k, v, dense_spec, [dense]),
    "Flex": flex_dense,
}, q, k, v, backward=False)
