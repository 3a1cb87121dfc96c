"""Forward A/B at fixed configs: an older template (old) against the working tree's (new); each (version, config)
timed 3 times interleaved with do_bench on the op call, median reported, with each compiled kernel's registers and
spills. On a GPU, from the repository root (the forward-FMA log used 5 rounds and three of these configs):

    git show 2a34523:fuse_attn/kernels/templates/flash_attention.py.tmpl > /tmp/old.tmpl
    PYTHONPATH=. python3 benchmarks/2026-11-26-forward-fma/fwd_ab.py /tmp/old.tmpl
"""
import os, shutil, sys, tempfile, pathlib, statistics
import torch, triton
from torch.nn.attention import sdpa_kernel, SDPBackend
from fuse_attn.kernels import codegen, flash_attention, autotune, ops
from fuse_attn.spec import AttentionSpec, CausalMask
from tabulate import tabulate
os.environ["FUSE_ATTN_AUTOTUNE"] = "0"   # no tuning: the configs are forced below
new_dir = codegen.TEMPLATE_DIR
old_dir = pathlib.Path(tempfile.mkdtemp()); shutil.copy(sys.argv[1], old_dir / codegen.TEMPLATE_NAME)
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
CFGS = [autotune.KernelConfig(128, 128, 8, 3), autotune.KernelConfig(128, 128, 8, 2), autotune.KernelConfig(128, 64, 8, 3), autotune.KernelConfig(64, 64, 4, 3)]
shapes = [(4, 16, 4096, 128, True), (4, 16, 4096, 128, False), (4, 16, 4096, 64, True), (4, 16, 4096, 64, False), (2, 16, 16384, 128, True)]
rows = []
for B, H, N, D, causal in shapes:
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask() if causal else None)
    runs = {(name, str(cfg)): (d, cfg) for name, d in (("old", old_dir), ("new", new_dir)) for cfg in CFGS}
    times = {key: [] for key in runs}
    mods = []
    for rnd in range(3):
        for (name, c), (d, cfg) in runs.items():
            codegen.TEMPLATE_DIR = d; codegen._modules.clear(); autotune._chosen.clear(); ops._kernel_failures.clear()
            try:
                flash_attention(q, k, v, spec)  # records the untimed choice for this kernel's key
            except Exception as e:
                print("fail", name, c, e); continue
            for key in list(autotune._chosen):
                if key.kind == "fwd":
                    autotune._chosen[key] = cfg
            flash_attention(q, k, v, spec); torch.cuda.synchronize()
            if ops._kernel_failures:
                print("fail (forced config does not compile)", name, c); continue
            mods += [(name, m) for m in codegen._modules.values()]
            times[name, c].append(triton.testing.do_bench(lambda: flash_attention(q, k, v, spec), rep=100))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        cud = triton.testing.do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal), rep=200)
    shape = f"B{B} H{H} N{N} D{D} {'causal' if causal else 'full'}"
    from tools.profile_kernels import compiled_variants
    seen = {}
    for name, mod in mods:
        for text, compiled in compiled_variants(mod._attn_fwd, q.device.index):
            compiled._init_handles()
            seen[name, text] = (compiled.n_regs, compiled.n_spills)
    for (name, text), (regs, spills) in sorted(seen.items()):
        print(f"   {shape} {name} {text}: regs {regs} spills {spills}")
    for cfg in CFGS:
        if not times["old", str(cfg)] or not times["new", str(cfg)]:
            continue
        o, n = statistics.median(times["old", str(cfg)]), statistics.median(times["new", str(cfg)])
        rows.append([shape, str(cfg), f"{o:.3f}", f"{n:.3f}", f"{o / n:.3f}", f"{cud:.3f}"])
        print(rows[-1], [round(x, 3) for x in times["old", str(cfg)]], [round(x, 3) for x in times["new", str(cfg)]], flush=True)
print(tabulate(rows, headers=["shape", "config", "old ms", "new ms", "old/new", "cuDNN ms"]))
