"""Dump the sm90 TTGIR and PTX of every kernel launch of a causal bf16 spec of head dim argv[2] (the smallest and the
largest candidate configs) into directory argv[1], on a machine without a GPU:

    TRITON_INTERPRET=0 PYTHONPATH=<triton 3.6>:<checkout> python ptx_opcode_dump.py OUT 128

Run once for each package (the old one from a copy first on PYTHONPATH), then compare opcode counts per kernel:
    grep -oP '^\s+[a-z][a-z0-9_.]*' OLD/K.ptx | sort | uniq -c   (against the same for NEW/K.ptx)
"""
import os, re, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
import pytest, torch
import test_gpu_compile as g
from fuse_attn.spec import AttentionSpec, CausalMask
out = sys.argv[1]; os.makedirs(out, exist_ok=True)
D = int(sys.argv[2])
spec = AttentionSpec(dtype="bfloat16", head_dim=D, head_dim_v=D, scale=D ** -0.5, causal=CausalMask())
with pytest.MonkeyPatch.context() as mp:
    launches = g._captured_launches(spec, mp)
for kernel, args in launches:
    for cfg in g._configs(kernel.fn.__name__, spec, g.TARGETS["sm90"][1]):
        bound = dict(args) if cfg is None else dict(args, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n)
        for part in g._launch_parts(cfg):
            c = g._compile(kernel, dict(bound, **part), cfg, 90)
            ir = re.sub(r"loc\([^)]*\)", "", c.asm["ttgir"])
            ir = "\n".join(l for l in ir.splitlines() if not l.startswith("#loc"))
            name = f"{kernel.fn.__name__}_{cfg}{part}".replace(" ", "_")
            open(os.path.join(out, name + ".ttgir"), "w").write(ir)
            open(os.path.join(out, name + ".ptx"), "w").write(c.asm["ptx"])
print(len(launches), "launches")
