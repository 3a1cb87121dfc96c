"""Our dQ and dK/dV kernels one after the other (as launched) against both at once on two streams (what one launch
holding both kinds of programs allows, as FlexAttention's backward), at sliding windows; FlexAttention's
backward kernels (profiler) beside."""
import torch, triton
from tabulate import tabulate
from torch.nn.attention.flex_attention import flex_attention
from fuse_attn.kernels import autotune
from probe_common import backward_launches, causal_case, kernel_times
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
bench = lambda f: triton.testing.do_bench(f, warmup=50, rep=300)
flex_c = torch.compile(flex_attention)
rows = []
for (B, H, N, D), window in [((4, 16, 4096, 128), 128), ((4, 16, 4096, 128), 512), ((4, 16, 4096, 128), 1024),
                             ((4, 16, 4096, 128), None), ((4, 16, 4096, 64), 1024), ((16, 16, 1024, 128), None)]:
    q, k, v, do, spec, bm = causal_case(B, H, N, D, window)
    relaunch = backward_launches(q, k, v, do, spec)  # (tunes on its first backward)
    relaunch = backward_launches(q, k, v, do, spec)
    names = [name for name in relaunch if not name.endswith(".launch")]
    run = lambda name: relaunch[name]()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    def concurrent():
        ev = torch.cuda.Event(); ev.record()
        s1.wait_event(ev); s2.wait_event(ev)
        with torch.cuda.stream(s1): run("_attn_bwd_dkdv")
        with torch.cuda.stream(s2): run("_attn_bwd_dq")
        torch.cuda.current_stream().wait_stream(s1); torch.cuda.current_stream().wait_stream(s2)
    seq = lambda: [run(n) for n in ("_attn_bwd_dq", "_attn_bwd_dkdv")]
    t = {n: bench(lambda: run(n)) for n in names}
    t_seq, t_conc = bench(seq), bench(concurrent)
    flex = kernel_times(lambda: flex_c(q, k, v, block_mask=bm).backward(do))
    fb = sum(us for name, us in flex.items() if "flex_attention_backward" in name)
    rows.append([f"{B},{H},{N},{D}", window, f"{t['_attn_bwd_dq']*1000:.1f}", f"{t['_attn_bwd_dkdv']*1000:.1f}",
                 f"{t_seq*1000:.1f}", f"{t_conc*1000:.1f}", f"{fb:.1f}", str(relaunch["_attn_bwd_dq.launch"][3]), str(relaunch["_attn_bwd_dkdv.launch"][3])])
    print(rows[-1], flush=True)
    autotune._chosen.clear()
print(tabulate(rows, headers=["B,H,N,D", "window", "dQ us", "dK/dV us", "in order", "two streams", "flex bwd (+pre)", "dQ cfg", "dK/dV cfg"]))
