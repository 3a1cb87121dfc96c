"""Row blocks a CTA (the forward's fifth config entry) against the committed forward (old_fwd_kernel.py, its own
configs): outputs compared at odd lengths, CUDA-graph GPU time at B*N = 16384, H16, bf16; cuDNN beside."""
import importlib.util, sys, time
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph
from fuse_attn.kernels import hopper_forward as hf
from fuse_attn.spec import AttentionSpec, CausalMask

s = importlib.util.spec_from_file_location("old_fwd", ".gpu/v16/old_fwd_kernel.py")
old = importlib.util.module_from_spec(s); s.loader.exec_module(old)
CANDIDATES = {
    (64, False): [(64, 128, 3, 3, 1), (64, 128, 3, 3, 2), (64, 128, 3, 3, 3), (64, 128, 2, 3, 2)],
    (64, True): [(64, 64, 3, 1, 1), (64, 64, 3, 1, 2), (64, 128, 3, 3, 1), (64, 128, 3, 3, 2)],
    (128, False): [(64, 128, 3, 2, 1), (64, 128, 2, 2, 2), (64, 64, 4, 2, 2), (64, 64, 3, 2, 2)],
    (128, True): [(64, 64, 3, 1, 1), (64, 128, 3, 2, 1), (64, 64, 3, 2, 2), (64, 64, 4, 2, 2)],
}
LENGTHS = [1024, 2048, 4096, 16384]
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
t_start = time.time()

def spec_of(D, causal, group=1):
    return AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5,
                         causal=CausalMask() if causal else None, gqa_group=group)

def run_new(cfg, q, k, v, spec):
    hf.forward_config = lambda *a: cfg
    return hf.hopper_forward(q, k, v, spec)

# correctness: every candidate against the committed kernel at odd lengths, GQA 1 and 2, each config in its own
# process (an illegal address poisons the CUDA context); a config that fails is not timed
def check(D, causal, cfg):
    bad = 0
    for M in (300, 2049):
        for group in (1, 2):
            g = torch.Generator(device="cuda").manual_seed(M + group)
            q = torch.randn(2, 4, M, D, device="cuda", dtype=torch.bfloat16, generator=g)
            k, v = (torch.randn(2, 4 // group, M, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
            spec = spec_of(D, causal, group)
            ref_out, ref_lse = old.hopper_forward(q, k, v, spec)
            out, lse = run_new(cfg, q, k, v, spec)
            torch.cuda.synchronize()
            do_ = (out.float() - ref_out.float()).abs().max().item()
            dl = (lse - ref_lse).abs().max().item()
            ok = do_ <= 1e-2 * max(1.0, ref_out.abs().max().item()) and dl <= 1e-3  # (bf16: a few ulps)
            bad += not ok
            print(f"check,{D},{causal},\"{cfg}\",{M},{group},{do_:.2e},{dl:.2e},{'PASS' if ok else 'FAIL'}", flush=True)
    return bad

if sys.argv[1:2] == ["check"]:
    sys.exit(check(int(sys.argv[2]), sys.argv[3] == "1", tuple(int(x) for x in sys.argv[4].split(","))))
import subprocess
print("check,D,causal,cfg,M,group,max_out_diff,max_lse_diff,verdict", flush=True)
for (D, causal), cfgs in CANDIDATES.items():
    for cfg in list(cfgs):
        r = subprocess.run([sys.executable, __file__, "check", str(D), str(int(causal)), ",".join(map(str, cfg))],
                           capture_output=True, text=True, timeout=120)
        print("\n".join(l for l in r.stdout.splitlines() if l.startswith("check")), flush=True)
        if r.returncode:
            print(f"check,{D},{causal},\"{cfg}\",EXCLUDED rc={r.returncode} {r.stderr.strip().splitlines()[-1][:100] if r.stderr.strip() else ''}", flush=True)
            cfgs.remove(cfg)
print(f"checks done ({time.time() - t_start:.0f} s)", flush=True)

print("shape,config,old_ms,new_ms,new_vs_old,cudnn_ms,old_vs_cudnn,new_vs_cudnn", flush=True)
for N in LENGTHS:
    for (D, causal), cfgs in CANDIDATES.items():
        B = 16384 // N
        spec = spec_of(D, causal)
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, 16, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=spec.scale)
        t_old = do_bench_cudagraph(lambda: old.hopper_forward(q, k, v, spec))
        t_cudnn = do_bench_cudagraph(cudnn)
        for cfg in cfgs:
            hf.forward_config = lambda *a, cfg=cfg: cfg
            try:
                t_new = do_bench_cudagraph(lambda: hf.hopper_forward(q, k, v, spec))
            except Exception as e:
                print(f"B{B} H16 N{N} D{D} {'causal' if causal else 'full'},\"{cfg}\",FAILED {type(e).__name__}: {str(e)[:120]}", flush=True)
                continue
            print(f"B{B} H16 N{N} D{D} {'causal' if causal else 'full'},\"{cfg}\",{t_old:.4f},{t_new:.4f},{t_old / t_new:.3f},"
                  f"{t_cudnn:.4f},{t_cudnn / t_old:.3f},{t_cudnn / t_new:.3f}", flush=True)
print(f"done ({time.time() - t_start:.0f} s)", flush=True)
