"""PTX hash (debug / location lines dropped) of the forward, dQ and dK/dV kernels of a few specs of
tests/test_gpu_compile.py, compiled for sm90 as a launch specializes them. Usage: TRITON_INTERPRET=0 PYTHONPATH=<t36>:. python ptx_all.py"""
import os, sys, tempfile, hashlib
os.environ["FUSE_ATTN_CACHE_DIR"] = tempfile.mkdtemp()
sys.path.insert(0, "tests")
import pytest, torch
import test_gpu_compile as t
from fuse_attn.spec import AttentionSpec
from fuse_attn.kernels.autotune import KernelConfig
from fuse_attn.kernels import launch, codegen
import pathlib
if os.environ.get('TEMPLATE_DIR'):
    codegen.TEMPLATE_DIR = pathlib.Path(os.environ['TEMPLATE_DIR'])
CFG = {"_attn_fwd": KernelConfig(128, 64, 8, 3), "_attn_bwd_dq": KernelConfig(128, 64, 8, 3), "_attn_bwd_dkdv": KernelConfig(64, 128, 8, 3)}
for name in sys.argv[1:]:
    spec = AttentionSpec(**{"dtype": "bfloat16", "head_dim": 64, "head_dim_v": 64, "scale": 0.125, **t.SPECS[name]})
    with pytest.MonkeyPatch.context() as mp:
        launches = t._captured_launches(spec, mp)
    seen = set()
    for kernel, args in launches:
        kn = kernel.fn.__name__
        key = (kn, tuple(sorted((k, v) for k, v in args.items() if k.isupper() and isinstance(v, (bool, int)))))
        if kn not in CFG or key in seen:
            continue
        seen.add(key)
        c = t._compile(kernel, dict(args, BLOCK_M=CFG[kn].block_m, BLOCK_N=CFG[kn].block_n), CFG[kn], 90)
        lines = c.asm["ptx"].splitlines()
        code = lines[:next((i for i, l in enumerate(lines) if l.strip().startswith(".section")), len(lines))]  # no DWARF data
        body = "\n".join(l for l in code if not l.strip().startswith((".loc", ".file", "//")))
        flags = ",".join(f"{k}={int(v)}" for k, v in key[1] if k.startswith(("NEED", "COMPUTE", "KEY_", "MASK", "EXACT")))
        open(os.path.join(os.environ.get("PTX_DIR", "/tmp"), f"{name.replace(' ', '_')}_{kn}.ptx"), "w").write(body)
        print(f"{name:45s} {kn:16s} {flags:60s} {hashlib.sha1(body.encode()).hexdigest()[:12]} {len(body.splitlines())}", flush=True)
