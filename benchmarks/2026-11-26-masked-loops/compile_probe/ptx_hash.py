"""Is a kernel's code the same under two templates? Compiles one kernel of a spec as tests/test_gpu_compile does (through
../../2026-11-26-backward-one-launch/compile_probe) under a template edit and prints a hash of its PTX without the
debug and location lines; the PTX goes to $PTX_DIR (default: the temp directory) for a diff.

    HD=64 TRITON_INTERPRET=0 PYTHONPATH=<triton 3.6 wheel>:. python ptx_hash.py EDIT.py causal|window|full _attn_bwd_dq 128x64x4x3
"""
import os, sys, tempfile, importlib.util, pathlib, hashlib, re
os.environ["FUSE_ATTN_CACHE_DIR"] = tempfile.mkdtemp()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "2026-11-26-backward-one-launch", "compile_probe"))
from fuse_attn.kernels import codegen
edit_file, which, kname, cfg = sys.argv[1:5]
m = importlib.util.spec_from_file_location("edit", edit_file); edit = importlib.util.module_from_spec(m); m.loader.exec_module(edit)
d = pathlib.Path(tempfile.mkdtemp())
(d / codegen.TEMPLATE_NAME).write_text(edit.edit((codegen.TEMPLATE_DIR / codegen.TEMPLATE_NAME).read_text()))
(d / codegen.DECODING_TEMPLATE_NAME).write_text((codegen.TEMPLATE_DIR / codegen.DECODING_TEMPLATE_NAME).read_text())
codegen.TEMPLATE_DIR = d
import pytest
from compile_probe import t
from fuse_attn.spec import AttentionSpec, CausalMask
from fuse_attn.kernels.autotune import KernelConfig
hd = int(os.environ.get("HD", "64"))
causal = {"causal": CausalMask(), "window": CausalMask(window=1024), "full": None}[which]
spec = AttentionSpec(dtype="bfloat16", head_dim=hd, head_dim_v=hd, scale=hd ** -0.5, causal=causal)
c_ = KernelConfig(*map(int, cfg.split("x")))
with pytest.MonkeyPatch.context() as mp:
    launches = t._captured_launches(spec, mp)
for kernel, args in launches:
    if kernel.fn.__name__ == kname:
        c = t._compile(kernel, dict(args, BLOCK_M=c_.block_m, BLOCK_N=c_.block_n), c_, 90)
        ptx = c.asm["ptx"]
        body = "\n".join(l for l in ptx.splitlines() if not l.strip().startswith((".loc", ".file", "//")) and "debug" not in l)
        open(os.path.join(os.environ.get("PTX_DIR", tempfile.gettempdir()), f"{os.path.basename(edit_file)}_{which}_{kname}_{cfg}.ptx"), "w").write(body)
        print(os.path.basename(edit_file), which, kname, cfg, hashlib.sha1(body.encode()).hexdigest()[:12], len(body.splitlines()))
