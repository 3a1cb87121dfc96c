"""Causal Gluon forward under three launches, forced: one query block a CTA, paired (blocks n - 1 - p and p a CTA)
and persistent (causal_persistent.patch: items of two blocks, every grid-th item), in the order one, paired,
persistent, persistent, paired, one; CUDA-graph GPU time (ms), outputs compared with one block a CTA's, cuDNN beside.
H16 (GQA 32/8 where said), bf16. Prints "waves": one block a CTA's CTAs over what the SMs hold at once. Run from the
repository root on an H100/H200 with the patch applied (call 2), or with odd block counts taken too and the argument
``odd`` (call 5) or ``odd+even`` (call 6)."""
import sys
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import hopper_forward as hf
from fuse_attn.spec import AttentionSpec, CausalMask

MODES = {"one": (False, False), "paired": (True, False), "persistent": (False, True)}
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
print("shape,config,waves," + ",".join(f"{m}_ms" for m in MODES) + ",persistent_vs_one,persistent_vs_paired,"
      "cudnn_ms,best_other_vs_cudnn,persistent_vs_cudnn,max_abs_diff", flush=True)
SHAPES = ((64, 16, 16, 16, 1024), (64, 8, 16, 16, 2048), (64, 6, 16, 16, 2048), (64, 4, 16, 16, 2048),
          (128, 16, 16, 16, 1024), (128, 8, 16, 16, 1024), (128, 8, 16, 16, 2048), (128, 6, 16, 16, 2048),
          (128, 4, 16, 16, 2048), (128, 4, 32, 8, 2048), (128, 8, 16, 16, 2000), (128, 4, 16, 16, 4096),
          (128, 2, 16, 16, 8192), (128, 1, 16, 16, 16384))
if sys.argv[1:] == ["odd"]:  # (call 5) odd numbers of blocks a head: the middle blocks of two heads an item
    SHAPES = ((64, 16, 16, 16, 1050), (64, 15, 15, 15, 1050), (128, 16, 16, 16, 1050), (128, 8, 16, 16, 2100),
              (128, 10, 16, 16, 1664), (128, 8, 16, 16, 1920), (128, 8, 16, 16, 2048))
if sys.argv[1:] == ["odd+even"]:  # (call 6) the same, less _block_of's arithmetic (no spills), and even ones
    SHAPES = ((64, 16, 16, 16, 1050), (64, 15, 15, 15, 1050), (128, 16, 16, 16, 1050), (128, 8, 16, 16, 2100),
              (128, 10, 16, 16, 1664), (128, 8, 16, 16, 1920), (128, 8, 16, 16, 2048), (64, 16, 16, 16, 1024),
              (128, 16, 16, 16, 1024), (64, 8, 16, 16, 2048))
for D, B, H, KV, N in SHAPES:
    spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask(),
                         gqa_group=H // KV)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(B, KV, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    block_m, _, _, consumers = config = hf.forward_config(D, True, N)
    blocks = -(-N // (consumers * block_m))
    waves = blocks * B * H / (hf.resident_ctas(D, consumers) * hf.sm_count(q.device))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=spec.scale, enable_gqa=KV != H)

    times, outs = {m: [] for m in MODES}, {}
    for mode in ("one", "paired", "persistent", "persistent", "paired", "one"):
        paired, persistent = MODES[mode]
        hf.pairs_query_blocks = lambda *a, p=paired: p
        hf.runs_persistent = lambda *a, p=persistent: p
        outs[mode] = hf.hopper_forward(q, k, v, spec)
        times[mode].append(do_bench_cudagraph(lambda: hf.hopper_forward(q, k, v, spec)))
    torch.cuda.synchronize()
    diff = max((x.float() - y.float()).abs().max().item() for m in ("paired", "persistent")
               for x, y in zip(outs["one"], outs[m]))
    t = {m: sum(ts) / 2 for m, ts in times.items()}
    tc = do_bench_cudagraph(cudnn)
    print(f"B{B} H{H}/{KV} N{N} D{D} causal,\"{config}\",{waves:.1f}," + ",".join(f"{t[m]:.4f}" for m in MODES)
          + f",{t['one'] / t['persistent']:.3f},{t['paired'] / t['persistent']:.3f},{tc:.4f},"
          f"{tc / min(t['one'], t['paired']):.3f},{tc / t['persistent']:.3f},{diff:.2e}", flush=True)
