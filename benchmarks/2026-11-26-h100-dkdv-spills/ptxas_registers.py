# Register use and spills (ptxas -v) of the generated kernels for sm90, per config, without a GPU: each kernel launch
# of a spec captured as tests/test_gpu_compile.py does, compiled as Triton's JIT specializes (ints equal to 1 become
# constants, 16-divisible pointers and ints get the divisibility attribute), then Triton's bundled ptxas -v.
# From the repository root, with TRITON_INTERPRET=0:
#   python3 -c "import sys; sys.path.insert(0, 'benchmarks/2026-11-26-h100-dkdv-spills'); from ptxas_registers import regs; ..."
# On the H100 these counts matched tools/profile_kernels.py's (GQA 4, D64, 64 x 128, 8 warps, 3 stages: 78 spilled
# registers there, 312 bytes here).
import sys, subprocess, os, re
sys.path.insert(0, "tests")
import pytest, triton
import test_gpu_compile as t
from fuse_attn.spec import AttentionSpec, CausalMask
from fuse_attn.kernels import autotune

import torch
from triton.backends.compiler import GPUTarget

def compile_like_jit(kernel, args, cfg, capability):
    """As triton's JIT specializes: ints equal to 1 become constants; pointers and ints divisible by 16 get the
    divisibility attribute (except do_not_specialize args)."""
    signature, constants, attrs = {}, {}, {}
    dns = set(getattr(kernel, "do_not_specialize", []) or [])
    dns |= {kernel.arg_names[i] if isinstance(i, int) else i for i in dns}
    for i, name in enumerate(kernel.arg_names):
        value = args[name]
        if i in kernel.constexprs:
            signature[name], constants[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = t._POINTER_TYPES[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            if value == 1 and name not in dns:
                signature[name], constants[name] = "constexpr", 1
            else:
                signature[name] = "i32"
                if value % 16 == 0 and name not in dns:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32"
    source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options=dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages))

def regs(name, spec_kwargs, which, configs):
    spec = AttentionSpec(**{"dtype": "bfloat16", "head_dim": 64, "head_dim_v": 64, "scale": 0.125, **spec_kwargs})
    cap, smem = t.TARGETS["sm90"]
    with pytest.MonkeyPatch.context() as mp:
        launches = t._captured_launches(spec, mp)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    for kernel, args in launches:
        if kernel.fn.__name__ not in which:
            continue
        for (bm, bn, w, s) in configs[kernel.fn.__name__]:
            cfg = autotune.KernelConfig(bm, bn, w, s)
            c = compile_like_jit(kernel, dict(args, BLOCK_M=bm, BLOCK_N=bn), cfg, cap)
            open("/tmp/ptxas_registers.ptx", "w").write(c.asm["ptx"])
            out = subprocess.run([ptxas, "-arch=sm_90a", "-v", "/tmp/ptxas_registers.ptx", "-o", "/tmp/ptxas_registers.o"], capture_output=True, text=True).stderr
            used = re.search(r"Used (\d+) registers", out).group(1)
            spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
            print(f"{name:28s} {kernel.fn.__name__:15s} {bm},{bn},w{w},s{s}: regs {used}, spill st/ld {spill.group(1)}/{spill.group(2)}, smem {c.metadata.shared}", flush=True)
