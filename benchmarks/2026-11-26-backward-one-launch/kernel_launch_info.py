"""Launch facts of ours and FlexAttention's kernels from the profiler's trace (registers per thread, shared memory,
grid, block, warps per SM, estimated occupancy): window 1024 and causal, B4 H16 N4096 D128 bf16."""
import json, tempfile, os
import torch, triton
from torch.profiler import profile, ProfilerActivity
from torch.nn.attention.flex_attention import flex_attention
from fuse_attn.kernels import flash_attention, autotune
from probe_common import causal_case
print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
flex_c = torch.compile(flex_attention)
B, H, N, D = 4, 16, 4096, 128
KEYS = ("grid", "block", "registers per thread", "shared memory", "blocks per SM", "warps per SM", "est. achieved occupancy %")
for window in (1024, None):
    q, k, v, do, spec, bm = causal_case(B, H, N, D, window)
    for name, step in (("ours", lambda: flash_attention(q, k, v, spec).backward(do)),
                       ("flex", lambda: flex_c(q, k, v, block_mask=bm).backward(do))):
        step(); step(); torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            step(); torch.cuda.synchronize()
        path = os.path.join(tempfile.mkdtemp(), "t.json")
        p.export_chrome_trace(path)
        events = json.load(open(path))["traceEvents"]
        for e in events:
            if e.get("cat") == "kernel" and ("attn" in e["name"] or "flex" in e["name"]):
                a = e.get("args", {})
                print(window, name, e["name"][:60], f"{e['dur']:.1f} us", {k: a.get(k) for k in KEYS}, flush=True)
    autotune._chosen.clear()
