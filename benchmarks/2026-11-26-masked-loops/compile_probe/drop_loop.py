"""A template edit for ../../2026-11-26-backward-one-launch/compile_probe/variant.py: the dK/dV kernel without its
$DROP-th _dkdv_loop call (0: the diagonal, 1: KEY_FULL, 2: the tail, 3: the unmasked loop, in 62a5f2d's order)."""
import os
def edit(t):
    body = t.index("def _attn_bwd_dkdv(")
    starts = []
    pos = t.index("    for g in range(GQA_GROUP):", body)
    while True:
        a = t.find("dk, dv, dk_tail, dv_tail = _dkdv_loop(", pos)
        if a < 0 or a > t.index("    if COMPUTE_DV:", body):
            break
        starts.append(a); pos = a + 10
    a = t.rindex("\n", 0, starts[int(os.environ["DROP"])]) + 1
    indent = starts[int(os.environ["DROP"])] - a
    b = t.index("\n" + " " * indent + ")\n", a) + indent + 3
    out = t[:a] + " " * indent + "pass\n" + t[b:]
    return out
