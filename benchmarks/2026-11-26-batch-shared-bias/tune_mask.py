# The mask-input row's forward candidates timed on the real padding + causal mask and on the tuner's causal tuning
# mask (launch._causal_tuning_mask): does the tuning mask pick what the real mask wants?
import sys
import torch, triton, triton.testing
sys.path.insert(0, ".")
from fuse_attn.report import collect_reports
from fuse_attn.kernels import launch, codegen, autotune
from tools.bench_variants import VARIANTS, DTYPE, resized

device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
name = "padding_causal_mask_input"
size = VARIANTS[name].default if device == "cuda" else resized(VARIANTS[name].default, 2, 2, 64, 16)
dtype = DTYPE if device == "cuda" else torch.float32
torch.manual_seed(0)
with torch.device(device):
    module = VARIANTS[name].module(size).to(dtype)
q, k, v = (torch.randn(size.batch, size.heads, size.seq, size.head_dim, device=device, dtype=dtype) for _ in range(3))
(mask,) = module.extra_inputs(q.device)
mask = mask.to(dtype)
with collect_reports() as reports:
    torch.compile(module, backend="fuse_attn")(q, k, v, mask)
spec = [vd for r in reports for vd in r.verdicts if vd.fused][0].spec
assert spec.mask_blocks() is not None and len(spec.score_tensors) == 1, spec
mod = codegen.load_module(spec)
common = launch._common(q, k, v, spec)
causal = mask.clone()
launch._causal_tuning_mask(spec, [causal])
smem = autotune.max_shared_memory(q.device) if device == "cuda" else 232448
cands = autotune.forward_candidates(common["BLOCK_D"], common["BLOCK_DV"], q.element_size(), common["CAUSAL"], smem)
print(torch.cuda.get_device_name() if device == "cuda" else "cpu", "candidates:", len(cands), flush=True)
for label, t in (("real mask", mask), ("causal tuning mask", causal)):
    out, lse = launch._empty_outputs(q, v)
    key_range = launch._key_range_args(spec, [t], q.shape[0], k.shape[2], lse)
    blocks = launch._MaskBlocks(spec, [t], q.shape[2], k.shape[2], lse)
    for cfg in (cands if device == "cuda" else [autotune.INTERPRETER_CONFIGS["fwd"]]):
        fn = lambda: launch._launch_forward(mod, cfg, common, q, k, v, [t], None, out, lse, key_range, blocks)
        try:
            fn()
            ms = triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median") if device == "cuda" else 0.0
        except Exception as e:
            print(f"  {label} {cfg}: {type(e).__name__}", flush=True)
            continue
        print(f"  {label}: BLOCK_M={cfg.block_m} BLOCK_N={cfg.block_n} warps={cfg.num_warps} stages={cfg.num_stages}: {ms * 1e3:.1f} us", flush=True)
