"""The launch path: under torch.compile the fused op's kernels are Inductor's kernels.

GPU-only (the traced ``wrap_triton`` launches need compiled Triton): the output code of a compiled attention holds
the generated forward and backward kernels and their launches, no call of the fused op as an extern kernel, and
after the first call no Python of ours runs per call. On the CPU: the op routes CPU tensors to its opaque CPU op
under compile, and the tuner builds real random inputs while a trace holds fake ones.
"""

from __future__ import annotations

import importlib
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton.language as tl

from fuse_attn.kernels import plan
from fuse_attn.kernels.generated import launch
from fuse_attn.report import collect_reports
from tests.support.graph_capture import compiled_code
from tests.support.numerics import needs_cuda
from tools.bench_host_overhead import CausalAttention

ops = importlib.import_module("fuse_attn.kernels.ops")
ROOT = Path(__file__).resolve().parents[2]


def _count_calls(monkeypatch, module, names):
    calls = []
    for name in names:
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name, **kw: calls.append(_name) or _real(*a, **kw))
    return calls


def _kernel_for_copies(X, n, PRECISION: tl.constexpr, BLOCK: tl.constexpr):
    tl.store(X + tl.arange(0, BLOCK), n)


def test_a_config_copy_of_a_kernel_is_the_same_kernel_under_another_function():
    """launch._kernel_of_config: a new Python function (Inductor tells its kernels apart by it) with the same code,
    source, constexpr parameters and specialization; one copy per (kernel, warps, stages)."""
    from triton.runtime.jit import JITFunction

    from fuse_attn.kernels.tuning import KernelConfig

    kernel = JITFunction(_kernel_for_copies, do_not_specialize=["n"])
    four, eight = KernelConfig(64, 64, 4, 3), KernelConfig(64, 64, 8, 3)
    copy = launch._kernel_of_config(kernel, four)
    assert copy.fn is not kernel.fn and copy.fn.__code__ is kernel.fn.__code__
    assert copy.src == kernel.src and copy.arg_names == kernel.arg_names
    assert [p.is_constexpr for p in copy.params] == [p.is_constexpr for p in kernel.params] == [False, False, True, True]
    assert [p.do_not_specialize for p in copy.params] == [p.do_not_specialize for p in kernel.params]
    assert launch._kernel_of_config(kernel, KernelConfig(128, 32, 4, 3)) is copy  # block sizes are arguments
    assert launch._kernel_of_config(kernel, eight) is not copy
    assert launch._kernel_of_config(kernel, None) is kernel


@needs_cuda
def test_compiled_code_launches_the_generated_kernels_directly(monkeypatch):
    torch.manual_seed(0)
    B, H, N, D = 2, 4, 256, 64
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(CausalAttention(N).cuda(), backend="fuse_attn")

    def step():
        out = compiled(q, k, v)
        out.backward(dout)
        return out

    out, code, reports = compiled_code(step)
    assert [len(r.fused) for r in reports] == [1]
    for kernel in ("_attn_fwd", "_attn_bwd_dq", "_attn_bwd_dkdv"):
        assert f"def {kernel}(" in code, f"{kernel}'s source is not in Inductor's output code"
        assert f"{kernel}.run(" in code or f"{kernel}[" in code or f"{kernel}_" in code, f"no launch of {kernel}"
    assert "torch.ops.fuse_attn" not in code, "the fused op is still called as an extern kernel"

    # the numbers are right: the 2x rule against fp64, output and gradients
    sdpa = torch.nn.functional.scaled_dot_product_attention
    leaves64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    ref, eager = sdpa(*leaves64, is_causal=True), sdpa(*leaves, is_causal=True)
    ref.backward(dout.double())
    eager.backward(dout)
    grads = [t.grad.clone() for t in (q, k, v)]
    for name, ours, e, r in zip(["out", "dq", "dk", "dv"], [out, *grads], [eager, *(t.grad for t in leaves)],
                                [ref, *(t.grad for t in leaves64)]):
        err, err_eager = (ours.double() - r).abs().max().item(), (e.double() - r).abs().max().item()
        assert err <= 2 * err_eager + 1e-2 * r.abs().max().item(), (name, err, err_eager)

    # after the first call: no Python of ours per call -- not the op's body, not a launcher, not the tuner -- and the
    # same results again
    calls = _count_calls(monkeypatch, ops, ["_forward", "_backward_impl", "parse_spec", "validate"])
    calls += _count_calls(monkeypatch, launch, ["launch", "choose_kernel_config"])
    for t in (q, k, v):
        t.grad = None
    again = step()
    assert calls == []
    torch.testing.assert_close(again, out, rtol=0, atol=0)
    for t, g in zip((q, k, v), grads):
        torch.testing.assert_close(t.grad, g, rtol=0, atol=0)


_STATIC_LAUNCH_SCRIPT = """
import torch, triton
from tools.bench_host_overhead import CausalAttention
q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
compiled = torch.compile(CausalAttention(256).cuda(), backend="fuse_attn")
def step():
    compiled(q, k, v).sum().backward()
step()
python_launches = []
real = triton.runtime.driver.active.launcher_cls.__call__
triton.runtime.driver.active.launcher_cls.__call__ = lambda self, *a, **kw: python_launches.append(1) or real(self, *a, **kw)
step()
torch.cuda.synchronize()
print("python launches", len(python_launches))
"""


@needs_cuda
def test_the_generated_kernels_launch_statically_with_parallel_compile():
    """With Inductor's compile workers on (their default), the generated kernels launch through Inductor's static
    launcher, not Triton's Python launcher: the workers decide that, from the environment they started with. A fresh
    process, so the compile-worker pool starts from this backend's first compile."""
    environment = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS"}
    environment.update(TORCHINDUCTOR_COMPILE_THREADS="4", TORCHINDUCTOR_FORCE_DISABLE_CACHES="1",
                       PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), environment.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-c", _STATIC_LAUNCH_SCRIPT], env=environment, cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "python launches 0", result.stdout


@pytest.mark.parametrize("exact_delta", [False, True])
@pytest.mark.parametrize("dkdv_launches", [1, 2])
def test_only_the_launch_that_accumulates_a_bias_gradient_gets_its_buffer(monkeypatch, exact_delta, dkdv_launches):
    # Inductor takes a buffer that two user kernels receive as written by both: passed to both backward kernels, the
    # fp32 bias-gradient buffer was zeroed twice per call (a copy for the second kernel). Each launch that does not
    # accumulate into it must get something else in its place.
    from fuse_attn.kernels import tuning
    from fuse_attn.spec import AttentionSpec, CausalMask
    from fuse_attn.score_program import ScoreProgramBuilder, ScoreTensor

    b = ScoreProgramBuilder()
    spec = AttentionSpec(dtype="float32", head_dim=16, head_dim_v=16, scale=0.25, causal=CausalMask(),
                         score_program=b.program(b.add("add", b.add("score"), b.add("load", value=0))),
                         score_tensors=(ScoreTensor("bias", "float32", (True, False, False, False)),))
    monkeypatch.setattr(launch, "_uses_exact_delta", lambda q: exact_delta)
    monkeypatch.setitem(tuning.INTERPRETER_CONFIGS, "bwd_dkdv",
                        tuning.KernelConfig(16, 32, 4, 1, dkdv_launches=dkdv_launches))
    launches = []
    monkeypatch.setattr(launch, "launch", lambda kernel, grid, args, cfg=None, warmup=False: launches.append(
        (kernel.fn.__name__, args)))
    q, k, v, dout = (torch.randn(1, 2, 32, 16) for _ in range(4))
    bias = torch.randn(1, 2, 32, 32)
    out, lse = torch.empty_like(q), torch.zeros(1, 2, 32)
    _, _, _, (dbias,) = launch.triton_backward(dout, q, k, v, [bias], out, lse, spec, [True])
    backward = [(name, args) for name, args in launches if name != "_attn_fwd"]
    assert len(backward) == 1 + dkdv_launches
    accumulating = [name for name, args in backward if args["NEED_DT0"]]
    assert accumulating == (["_attn_bwd_dq"] if exact_delta else ["_attn_bwd_dkdv"])
    buffers = {args["DT0"].data_ptr() for name, args in backward if args["NEED_DT0"]}
    assert len(buffers) == 1 and bias.data_ptr() not in buffers
    for name, args in backward:
        if not args["NEED_DT0"]:
            assert args["DT0"].data_ptr() not in buffers, f"{name} gets the gradient buffer it does not write"
    assert dbias.shape == bias.shape


def test_cpu_tensors_run_the_opaque_cpu_op_under_compile():
    """A traced wrap_triton launch cannot run under the interpreter: on CPU tensors the compiled graph calls
    ``fuse_attn::flash_attention_cpu`` (and its backward op), whatever TRITON_INTERPRET says."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 17, 16, requires_grad=True) for _ in range(3))
    compiled = torch.compile(CausalAttention(17), backend="fuse_attn")

    def step():
        out = compiled(q, k, v)
        out.sum().backward()
        return out

    out, code, _ = compiled_code(step)
    assert "fuse_attn.flash_attention_cpu" in code and "fuse_attn.flash_attention_backward_cpu" in code
    torch.testing.assert_close(out, CausalAttention(17)(q, k, v), rtol=1e-4, atol=1e-5)


def test_random_like_keeps_sizes_strides_and_is_not_zero():
    base = torch.randn(2, 5, 3, 8).transpose(1, 2)  # a [Z, L, H, D] layout seen as [Z, H, L, D]
    expanded = torch.randn(1, 1, 5, 5).expand(2, 3, 5, 5)  # stride 0 over batch and heads
    for t in (base, expanded, base[..., ::2], torch.ones(2, 3, dtype=torch.bool)):
        r = launch.random_like(t)
        assert (r.shape, r.stride(), r.dtype, r.device) == (t.shape, t.stride(), t.dtype, t.device)
        if r.is_floating_point():
            assert r.abs().sum() > 0
    assert launch.random_like(None) is None


def test_random_like_of_fake_and_symbolic_tensors_is_real():
    """While a trace holds fake tensors with symbolic lengths, the tuner's inputs are real, sized by the hints."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv())
    fake = mode.from_tensor(torch.randn(2, 3, 37, 16), symbolic_context=None)
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    sym = mode.from_tensor(torch.randn(2, 3, 37, 16), symbolic_context=StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.STATIC, DimDynamic.STATIC, DimDynamic.DYNAMIC, DimDynamic.STATIC]))
    assert isinstance(sym.shape[2], torch.SymInt)
    with mode, launch.RealInputs():
        for t in (fake, sym):
            r = launch.random_like(t)
            assert not isinstance(r, FakeTensor) and tuple(r.shape) == (2, 3, 37, 16)
    assert plan.size_hint(sym.shape[2]) == 37


def test_random_like_sets_a_symbolic_length_to_a_bucket_top():
    """A length bucket's tuning inputs: every dim of the symbolic length gets the bucket top, laid out densely in the
    traced tensor's order of strides; broadcast dims stay broadcast; other dims keep their hints."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv())
    dims = [DimDynamic.STATIC, DimDynamic.DYNAMIC, DimDynamic.STATIC, DimDynamic.STATIC]
    bnhd = mode.from_tensor(torch.randn(2, 37, 3, 16), symbolic_context=StatelessSymbolicContext(dynamic_sizes=dims))
    q = bnhd.transpose(1, 2)  # [Z, H, L, D] seen through a [Z, L, H, D] layout
    length = q.shape[2]
    mask = mode.from_tensor(torch.ones(1, 1, 37, 37, dtype=torch.bool), symbolic_context=StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.STATIC, DimDynamic.STATIC, DimDynamic.DYNAMIC, DimDynamic.DYNAMIC]))
    lengths = {launch._size_expr(length): 128}
    with mode, launch.RealInputs():
        rq = launch.random_like(q, lengths)
        rmask = launch.random_like(mask.expand(2, 3, -1, -1), {launch._size_expr(mask.shape[2]): 64})
    assert tuple(rq.shape) == (2, 3, 128, 16) and rq.stride() == (128 * 48, 16, 48, 1) and rq.abs().sum() > 0
    assert tuple(rmask.shape) == (2, 3, 64, 37) and rmask.stride()[:2] == (0, 0) and rmask.dtype == torch.bool
    assert launch._bytes_at(q, lengths) == 2 * 3 * 128 * 16 * 4


@needs_cuda
def test_dynamic_lengths_choose_a_config_per_bucket_in_the_generated_code(monkeypatch):
    """Under dynamic=True the generated code picks each length bucket's configs itself: with the tuner made to
    choose other warps for lengths up to 256, one compiled graph (forward and backward) holds a condition on the
    length, each kernel is defined in the output code with exactly the configs chosen for it (Inductor would launch
    configs that differ only in warps or stages with the first one's: launch._kernel_of_config), and lengths on
    both sides of the condition run right, without a recompile."""
    import collections
    import dataclasses
    import re

    from torch._inductor.utils import fresh_cache, run_and_get_code

    real_choose = launch.choose_kernel_config
    chosen = collections.defaultdict(dict)  # kind -> {bucket length: (BLOCK_M, BLOCK_N, warps, stages)}

    def choose_by_length(kind, q, kernel_id, common, candidates, bind, m=None, n=None):
        cfg = real_choose(kind, q, kernel_id, common, candidates, bind, m=m, n=n)
        length = plan.size_hint(common["N"] if n is None else n)
        cfg = dataclasses.replace(cfg, num_warps=8 if cfg.num_warps == 4 else 4) if length <= 256 else cfg
        chosen[kind][length] = (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages)
        return cfg

    monkeypatch.setattr(launch, "choose_kernel_config", choose_by_length)
    torch.manual_seed(0)
    model = CausalAttention(1024).cuda()
    compiled = torch.compile(model, backend="fuse_attn", dynamic=True)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with fresh_cache(), collect_reports() as reports:
        for i, n in enumerate((300, 97, 256, 257, 1000, 130)):
            q, k, v = (torch.randn(2, 4, n, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            dout = torch.randn(2, 4, n, 64, device="cuda", dtype=torch.bfloat16)

            def step():
                out = compiled(q, k, v)
                out.backward(dout)
                return out

            out, codes = run_and_get_code(step) if i == 0 else (step(), None)
            if codes is not None:
                code = "\n".join(codes)
                # forward: `if s <= 256:`, backward: `if s < 257:` (see launch._LengthBuckets._shorter_than)
                assert re.search(r"if \w+ <= 256:", code), "no length condition in the forward"
                assert re.search(r"if \w+ < 257:", code), "no length condition in the backward"
                defined = collections.defaultdict(set)
                for name, source in re.findall(r"async_compile\.triton\('(\w+)', '''(.*?)'''", code, re.S):
                    kind = {"_attn_fwd": "fwd", "_attn_bwd_dq": "bwd_dq", "_attn_bwd_dkdv": "bwd_dkdv"}.get(name)
                    if kind is not None:
                        blocks = re.search(r"'BLOCK_M': (\d+), 'BLOCK_N': (\d+)", source).groups()
                        warps_stages = re.search(r"'num_warps': (\d+), 'num_stages': (\d+)", source).groups()
                        defined[kind].add(tuple(int(x) for x in blocks + warps_stages))
                # the configs of the buckets the lengths can reach (up to the mask buffer's 1024) are each defined;
                # Inductor drops the branches of longer buckets' configs, which the shape guards rule out
                for kind, by_length in chosen.items():
                    reachable = {cfg for length, cfg in by_length.items() if length <= 1024}
                    assert reachable <= defined[kind] <= set(by_length.values()), (kind, defined[kind], by_length)
            leaves64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            ref, eager = sdpa(*leaves64, is_causal=True), sdpa(*leaves, is_causal=True)
            ref.backward(dout.double())
            eager.backward(dout)
            for name, ours, e, r in zip(["out", "dq", "dk", "dv"], [out, q.grad, k.grad, v.grad],
                                        [eager, *(t.grad for t in leaves)], [ref, *(t.grad for t in leaves64)]):
                err, err_eager = (ours.double() - r).abs().max().item(), (e.double() - r).abs().max().item()
                assert err <= 2 * err_eager + 1e-2 * r.abs().max().item(), (n, name, err, err_eager)
    assert len(reports) == 1, f"{len(reports)} compiles for six lengths"


class DecodeAttention(torch.nn.Module):
    """One query row against a KV cache, as Hugging Face's LLaMA decodes: GQA by repeat_kv, an additive mask."""

    def forward(self, q, k, v, mask):
        g = q.shape[1] // k.shape[1]
        k = k[:, :, None].expand(-1, -1, g, -1, -1).reshape(q.shape[0], q.shape[1], k.shape[2], k.shape[3])
        v = v[:, :, None].expand(-1, -1, g, -1, -1).reshape(q.shape[0], q.shape[1], v.shape[2], v.shape[3])
        w = q @ k.transpose(2, 3) / math.sqrt(q.shape[-1]) + mask
        return torch.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype) @ v


@needs_cuda
def test_split_k_decode_under_a_growing_cache_matches_eager():
    """Generation: the cache length is symbolic after the first recompile; each length's output (split-K kernels
    through Inductor's code, the split count chosen on the hint) holds the 2x rule against fp64."""
    torch.manual_seed(0)
    model = DecodeAttention()
    compiled = torch.compile(model, backend="fuse_attn")
    for n in (1025, 1026, 1027, 1500, 4096):
        q = torch.randn(1, 16, 1, 128, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, 8, n, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        mask = torch.zeros(1, 1, 1, n, device="cuda", dtype=torch.bfloat16)
        mask[..., : n // 7] = torch.finfo(torch.bfloat16).min  # some keys masked, as padding would
        with collect_reports() as reports:
            out = compiled(q, k, v, mask)
        assert all(len(r.fused) == 1 for r in reports)
        ref = model(*(t.double() for t in (q, k, v, mask)))
        eager = model(q, k, v, mask)
        err, err_eager = (out.double() - ref).abs().max().item(), (eager.double() - ref).abs().max().item()
        assert err <= 2 * err_eager + 1e-2 * ref.abs().max().item(), (n, err, err_eager)
