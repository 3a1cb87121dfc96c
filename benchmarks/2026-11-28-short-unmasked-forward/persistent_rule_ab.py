"""The Gluon forward as the package launches it (a persistent grid where hopper_forward.runs_persistent says so)
against one query block a CTA (the launch before this session), in the order package, one block, one block,
package: CUDA-graph GPU time, wall time per eager call of the op (do_bench: the launcher's host cost included), and
cuDNN beside; outputs compared. Unmasked, bf16, H16 (GQA: 32 query heads on 8). Run from the repository root."""
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench, do_bench_cudagraph
from fuse_attn.kernels import hopper_forward as hf
from fuse_attn.spec import AttentionSpec

RULE = hf.runs_persistent
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
print("shape,persistent,package_gpu_ms,one_block_gpu_ms,package_gpu_ms_again,one_block_gpu_ms_again,speed_up,"
      "cudnn_gpu_ms,package_vs_cudnn,one_block_vs_cudnn,package_wall_ms,one_block_wall_ms,cudnn_wall_ms,max_abs_diff",
      flush=True)
CASES = [(16384 // N, 16, 16, N, 128) for N in (1024, 2048, 4096, 16384)] + [(2, 32, 8, 4096, 128), (4, 16, 16, 4100, 128)]
for B, H, H_KV, N, D in CASES:
    spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, gqa_group=H // H_KV)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(B, H_KV, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    text = spec.to_json()

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, scale=spec.scale, enable_gqa=H != H_KV)

    def ours():
        return hf.flash_attention_hopper(q, k, v, text)

    persistent = RULE(False, False, hf.forward_config(D, False, N)[3], q.device)
    with torch.no_grad():
        ref = ours()
        gpu, wall = [], []
        for one_block in (False, True, True, False):
            hf.runs_persistent = (lambda *a: False) if one_block else RULE
            gpu.append(do_bench_cudagraph(ours))
            wall.append(do_bench(ours))
        hf.runs_persistent = lambda *a: False
        diff = (ours().float() - ref.float()).abs().max().item()
        hf.runs_persistent = RULE
        tc, tcw = do_bench_cudagraph(cudnn), do_bench(cudnn)
    t0, t1 = (gpu[0] + gpu[3]) / 2, (gpu[1] + gpu[2]) / 2
    w0, w1 = (wall[0] + wall[3]) / 2, (wall[1] + wall[2]) / 2
    print(f"B{B} H{H}/{H_KV} N{N} D{D} full,{persistent}," + ",".join(f"{t:.4f}" for t in gpu)
          + f",{t1 / t0:.3f},{tc:.4f},{tc / t0:.3f},{tc / t1:.3f},{w0:.4f},{w1:.4f},{tcw:.4f},{diff:.2e}", flush=True)
