"""The committed forward (three CTAs an SM for head dim 64's one-consumer config) against the same kernel at two CTAs
an SM (the config before: hopper_forward._ONE_CONSUMER_CTAS_AN_SM[64] = 2), causal, head dim 64, plain and with an
added bias (bf16 [1,H,N,N], its tiles by TMA; fp32 [Z,1,N,N], by TMA; bf16 of odd rows, loaded by the consumer),
B*N = 16384, H16, bf16. Outputs compared; CUDA-graph GPU time in the order 3, 2, 2, 3; cuDNN beside (plain); wall
time per eager call (the op's launcher and the kernel, 200 calls then a sync). Run from the repository root."""
import time
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import hopper_forward as hf
from fuse_attn.spec import AttentionSpec, CausalMask, ScoreNode, ScoreTensor

BIAS_PROGRAM = (ScoreNode("score"), ScoreNode("load", value=0), ScoreNode("add", (0, 1)))


def wall_per_call(fn, calls=200):
    fn(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e3


print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
print("shape,bias,config,ms_3ctas,ms_2ctas,ms_2ctas_again,ms_3ctas_again,3_vs_2,cudnn_ms,3ctas_vs_cudnn,"
      "2ctas_vs_cudnn,wall_ms_3ctas,max_abs_diff", flush=True)
D = 64
for bias_kind in (None, "bf16 [1,H,N,N]", "fp32 [Z,1,N,N]", "bf16 [1,H,N,N] odd rows"):
    for N in (1024, 2048):
        B = 16384 // N
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, 16, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        bias, extra = None, {}
        if bias_kind is not None:
            if bias_kind.startswith("fp32"):
                bias = torch.randn(B, 1, N, N, device="cuda", generator=g).expand(B, 16, N, N)
                mask = (False, True, False, False)
            elif bias_kind.endswith("odd rows"):  # rows of N + 1 keys, the last not read: TMA cannot read it
                bias = torch.randn(1, 16, N, N + 1, device="cuda", dtype=torch.bfloat16, generator=g)[..., :N]
                bias = bias.expand(B, 16, N, N)
                mask = (True, False, False, False)
            else:
                bias = torch.randn(1, 16, N, N, device="cuda", dtype=torch.bfloat16, generator=g).expand(B, 16, N, N)
                mask = (True, False, False, False)
            extra = dict(score_mod=BIAS_PROGRAM,
                         score_tensors=(ScoreTensor("bias", str(bias.dtype).split(".")[1], mask),))
        spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask(), **extra)
        assert hf.forward_config(D, True, N)[3] == 1  # the one-consumer config
        run = lambda: hf.hopper_forward(q, k, v, spec, bias)
        times, outs = {}, {}
        for ctas in (3, 2, 2, 3):
            hf._ONE_CONSUMER_CTAS_AN_SM[64] = ctas
            times.setdefault(ctas, []).append(do_bench_cudagraph(run))
            outs[ctas] = run()
        hf._ONE_CONSUMER_CTAS_AN_SM[64] = 3
        wall = wall_per_call(run)
        torch.cuda.synchronize()
        diff = max((x.float() - y.float()).abs().nan_to_num().max().item() for x, y in zip(outs[3], outs[2]))
        t3, t2 = sum(times[3]) / 2, sum(times[2]) / 2
        tc = float("nan")
        if bias is None:
            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=spec.scale)
            tc = do_bench_cudagraph(cudnn)
        print(f"B{B} H16 N{N} D{D} causal,{bias_kind},\"{hf.forward_config(D, True, N)}\","
              f"{times[3][0]:.4f},{times[2][0]:.4f},{times[2][1]:.4f},{times[3][1]:.4f},{t2 / t3:.3f},{tc:.4f},"
              f"{tc / t3:.3f},{tc / t2:.3f},{wall:.4f},{diff:.2e}", flush=True)
