"""What the tuner saw and what limits each kernel: per candidate config its time, registers, spills, shared memory
and the occupancy those allow, for the forward, dK/dV and dQ kernels of one attention shape.

    PYTHONPATH=. python3 tools/profile_kernels.py [--shape 4,16,4096,128] [--kv-heads H_KV] [--causal] [--dtype bfloat16]

Runs one forward+backward of the fused op on random inputs with an empty tuning cache (a temporary
FUSE_ATTN_CACHE_DIR), so every candidate is compiled and timed; the times are the tuner's own
(``triton.testing.do_bench``), read from its DEBUG log lines. Registers, spills and shared memory come from each
compiled kernel's metadata; "blocks/SM" is how many programs of that kernel fit on one SM at once, the smaller of
the register-file and shared-memory limits (the warp limit never binds at 4-8 warps), and "warps/SM" the
resulting occupancy. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile

import torch
from tabulate import tabulate

from fuse_attn.kernels.tuning import KernelConfig

LOGGER = "fuse_attn.kernels.tuning"
KERNELS = {"fwd": "_attn_fwd", "bwd_dkdv": "_attn_bwd_dkdv", "bwd_dq": "_attn_bwd_dq"}


class TimingLog(logging.Handler):
    """Collects the tuner's "config <cfg> for <key>: <ms> ms" DEBUG lines as {(kind, cfg text): ms}."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.ms = {}

    def emit(self, record):
        if record.msg.startswith("config %s for %s: ") and len(record.args) == 3:
            cfg, key, ms = record.args
            self.ms[key.kind, str(cfg)] = ms


def compiled_variants(kernel, device_index: int):
    """(config text, part, compiled kernel) of every variant of a @triton.jit kernel compiled on the device. The
    part is "dK" or "dV" for the two launches of a dK/dV config with dkdv_launches=2, else ""."""
    kernel_cache = kernel.device_caches[device_index][0]
    for compiled in kernel_cache.values():
        src = getattr(compiled, "src", None)
        names = src.fn.arg_names
        constants = {names[i[0]] if isinstance(i, tuple) else i: v for i, v in src.constants.items()}
        meta = compiled.metadata
        both = constants.get("COMPUTE_DK", True) and constants.get("COMPUTE_DV", True)
        part = "" if both else "dK" if constants["COMPUTE_DK"] else "dV"
        # the config's own text: what the tuner's log lines (TimingLog) name it by
        config = KernelConfig(constants["BLOCK_M"], constants["BLOCK_N"], meta.num_warps, meta.num_stages,
                              dkdv_launches=1 if both else 2)
        yield str(config), part, compiled


def occupancy(compiled, props) -> tuple[int, int]:
    """(programs per SM, warps per SM) that the kernel's registers and shared memory allow."""
    threads = 32 * compiled.metadata.num_warps
    by_regs = props.regs_per_multiprocessor // max(1, compiled.n_regs * threads)
    by_smem = props.shared_memory_per_multiprocessor // max(1, compiled.metadata.shared)
    blocks = min(by_regs, by_smem)
    return blocks, blocks * compiled.metadata.num_warps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4,16,4096,128", help="B,H,N,D")
    ap.add_argument("--kv-heads", type=int, default=None, help="key/value heads (GQA); default H")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    args = ap.parse_args(argv)
    B, H, N, D = map(int, args.shape.split(","))
    H_KV = args.kv_heads or H
    if H % H_KV:
        ap.error(f"--kv-heads {H_KV} does not divide the {H} query heads")
    dtype = getattr(torch, args.dtype)

    with tempfile.TemporaryDirectory(prefix="profile_kernels_") as cache:
        os.environ["FUSE_ATTN_CACHE_DIR"] = cache  # empty: every candidate is compiled and timed
        from fuse_attn.kernels.generated import codegen
        from fuse_attn.kernels import flash_attention
        from fuse_attn.spec import AttentionSpec, CausalMask

        timings = TimingLog()
        logger = logging.getLogger(LOGGER)
        logger.setLevel(logging.DEBUG)
        logger.addHandler(timings)
        progress = logging.StreamHandler()
        progress.setLevel(logging.INFO)  # the tuner's progress lines: candidates, compile and tuning wall times
        logger.addHandler(progress)
        spec = AttentionSpec(dtype=args.dtype, head_dim=D, head_dim_v=D, scale=D ** -0.5,
                             causal=CausalMask() if args.causal else None, gqa_group=H // H_KV)
        q = torch.randn(B, H, N, D, device="cuda", dtype=dtype, requires_grad=True)
        k, v = (torch.randn(B, H_KV, N, D, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
        flash_attention(q, k, v, spec).backward(torch.randn(B, H, N, D, device="cuda", dtype=dtype))
        torch.cuda.synchronize()

        mod = codegen.load_module(spec)
        props = torch.cuda.get_device_properties(q.device)
        print(f"{props.name}, torch {torch.__version__}, shape B,H,N,D={args.shape} kv heads {H_KV} {args.dtype}"
              f"{' causal' if args.causal else ''}; {props.regs_per_multiprocessor} registers and "
              f"{props.shared_memory_per_multiprocessor // 1024} KiB shared memory per SM")
        rows = []
        for kind, name in KERNELS.items():
            for text, part, compiled in compiled_variants(getattr(mod, name), q.device.index):
                if getattr(compiled, "n_regs", None) is None:
                    continue  # compiled but never loaded: it needs more shared memory than the device has (dropped)
                blocks, warps = occupancy(compiled, props)
                ms = timings.ms.get((kind, text))  # (both launches of a split config)
                rows.append([kind, f"{text} ({part})" if part else text, f"{ms:.3f}" if ms is not None else "-",
                             compiled.n_regs, compiled.n_spills,
                             compiled.metadata.shared // 1024, blocks, warps])
        rows.sort(key=lambda r: (r[0], float(r[2]) if r[2] != "-" else float("inf")))
        print(tabulate(rows, headers=["kernel", "config", "ms", "regs/thread", "spills", "smem KiB", "blocks/SM",
                                      "warps/SM"]))


if __name__ == "__main__":
    main()
