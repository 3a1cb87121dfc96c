"""Timing-only variants of hopper_backward.py (wrong results by design except 'base'): leave one stage out and time
the difference. Written to .gpu/v15/var/<name>.py, importable as modules."""
import os
SRC = open("fuse_attn/kernels/hopper_backward.py").read()
SRC = SRC.replace("from . import ops\nfrom .hopper_forward import",
                  "from fuse_attn.kernels import ops\nfrom fuse_attn.kernels.hopper_forward import")
SRC = SRC[:SRC.index("# ---- the op (")]
ATOMIC = """            gl.atomic_add(tile + (r + offs_r)[:, None] * HEAD_D + offs_d[None, :], dq,
                          mask=(m0 + r + offs_r < M)[:, None], sem="relaxed")"""
STORE = """            gl.store(tile + (r + offs_r)[:, None] * HEAD_D + offs_d[None, :], dq,
                     mask=(m0 + r + offs_r < M)[:, None])"""
LOOP = """        for r in gl.static_range(0, BLOCK_M, ROWS):
            dq = src.slice(r, ROWS).load(layout)
""" + ATOMIC + "\n"
EXP = "    p = gl.exp2(s * qk_scale - lse[:, None])"
for old in (ATOMIC, LOOP, EXP):
    assert old in SRC, old
variants = {
    "base": SRC,
    "store_not_atomic": SRC.replace(ATOMIC, STORE),          # dQ added by plain stores: what the atomics cost
    "no_dq_traffic": SRC.replace(LOOP, ""),                  # the adder only hands buffers back: dQ's global traffic
    "no_exp": SRC.replace(EXP, "    p = s * qk_scale - lse[:, None]"),  # P without exp2: MUFU's share
}
os.makedirs(".gpu/v15/var", exist_ok=True)
for name, text in variants.items():
    open(f".gpu/v15/var/{name}.py", "w").write(text)
print(list(variants))
