"""Per-kernel GPU time (profiler, 5 fwd+bwd calls) of ours and FlexAttention's at several sliding windows, causal,
B4 H16 N4096 D128 bf16, with the number of tiles each kernel visits: where does the window's time go?"""
import torch, triton
from tabulate import tabulate
from torch.nn.attention.flex_attention import flex_attention
from fuse_attn.kernels import flash_attention, autotune
from probe_common import causal_case, kernel_times
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
flex_c = torch.compile(flex_attention)
B, H, N, D = 4, 16, 4096, 128
rows = []

def tiles(window, bm, bn, key_major):
    # tiles (rows of bm queries x bn keys) a kernel visits: query-major (dQ, fwd) or key-major (dK/dV)
    total = 0
    for b in range(N // (bn if key_major else bm)):
        if key_major:
            k0, k1 = b * bn, b * bn + bn - 1
            r0, r1 = k0, min(N - 1, k1 + window - 1)
            total += (r1 // bm) - (r0 // bm) + 1
        else:
            q0, q1 = b * bm, b * bm + bm - 1
            c0, c1 = max(0, q0 - window + 1), q1
            total += (c1 // bn) - (c0 // bn) + 1
    return total * B * H

for window in (512, 1024, 2048, None):
    q, k, v, do, spec, bm = causal_case(B, H, N, D, window)
    ours = kernel_times(lambda: flash_attention(q, k, v, spec).backward(do))
    cfg = {key.kind: c for key, c in autotune.chosen_configs().items()}
    autotune._chosen.clear()
    w = window or N + 1
    flex = kernel_times(lambda: flex_c(q, k, v, block_mask=bm).backward(do))
    fb = {name: us for name, us in flex.items() if "flex_attention_backward" in name}
    dq, dkdv = cfg["bwd_dq"], cfg["bwd_dkdv"]
    tq = tiles(w, dq.block_m, dq.block_n, False)
    tk = tiles(w, dkdv.block_m, dkdv.block_n, True)
    rows.append([window, f"{ours.get('_attn_bwd_dq', 0):.1f}", tq, f"{ours.get('_attn_bwd_dq', 0) * 1000 / tq:.2f}",
                 f"{ours.get('_attn_bwd_dkdv', 0):.1f}", tk, f"{ours.get('_attn_bwd_dkdv', 0) * 1000 / tk:.2f}",
                 f"{ours.get('_attn_fwd', 0):.1f}", " ".join(f"{us:.1f}" for us in fb.values()),
                 f"{sum(fb.values()):.1f}", str(dq), str(dkdv)])
    print(rows[-1], flush=True)
print(tabulate(rows, headers=["window", "dQ us", "dQ tiles", "ns/tile", "dKdV us", "dKdV tiles", "ns/tile", "fwd us",
                              "flex bwd kernels us", "flex bwd us", "dQ cfg", "dKdV cfg"]))
