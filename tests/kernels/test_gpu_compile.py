"""The generated kernels compile for the GPUs they are tuned on, on a machine without one.

The interpreter runs the kernels' semantics on the CPU, but not Triton's GPU compiler: a template change that the
interpreter accepts can still fail to compile for a GPU (a type the lowering rejects, a layout conversion, too much
shared memory), which on the GPU would only show as a warning and the slow blockwise fallback. So every launch of a
spec's forward and backward is captured (the launcher's arguments, nothing run) and compiled by Triton to a cubin for
sm90 (H100/H200; one spec also for sm80, the A100), with the largest and the smallest candidate launch configs of the
tuner. The
compiles run in one subprocess without TRITON_INTERPRET (a test process's, :class:`_Subprocess`): this session's
Triton bound its own library functions to the interpreter when it was imported. In the same way, torch's analysis of the arguments a user kernel writes (which
Inductor functionalizes each launch by) is run on each launch's TTIR: it must see exactly the kernel's outputs.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import subprocess
import sys
import time

import pytest
import torch

from fuse_attn.kernels import plan
from fuse_attn.kernels import tuning

from fuse_attn.kernels.generated import launch
from fuse_attn.kernels.hopper.mask_tiles import MaskTiles
from fuse_attn.kernels.hopper.key_range_tiles import KeyRangeTiles
from fuse_attn.spec import AttentionSpec, CausalMask
from fuse_attn.score_program import ScoreProgramBuilder, ScoreTensor
from tests.support.fuzz_cases import BIAS_PROGRAM

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (compute capability, shared memory per block): the opt-in limits of the H100/H200 and the A100
TARGETS = {"sm90": (90, 232448), "sm80": (80, 166912)}
_POINTER_TYPES = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.bool: "*i1",
                  torch.int32: "*i32", torch.int64: "*i64", torch.int8: "*i8"}


def _softcap_bias_spec():
    b = ScoreProgramBuilder()
    capped = b.add("mul", b.add("tanh", b.add("div", b.add("add", b.add("score"), b.add("load", value=0)), b.const(30.0))), b.const(30.0))
    return dict(score_program=b.program(capped), score_tensors=(ScoreTensor("bias", "bfloat16", (True, False, False, False)),))


def _key_padding_spec():
    b = ScoreProgramBuilder()
    hidden = b.add("where", b.add("logical_not", b.add("load", value=0)), b.const(float("-inf")), b.add("score"))
    return dict(score_program=b.program(hidden), score_tensors=(ScoreTensor("mask", "bool", (False, True, True, False)),),
                empty_rows="zero")


def _padding_and_causal_in_one_mask_spec():
    """Hugging Face's eager padding + causal mask: the band in the program, the "masking" kind (KEY_BAND 2)."""
    b = ScoreProgramBuilder()
    keep = b.add("logical_and", b.add("le", b.add("kv_idx"), b.add("q_idx")), b.add("load", value=0))
    masked = b.add("add", b.add("score"), b.add("where", keep, b.const(0.0), b.const(torch.finfo(torch.float32).min)))
    return dict(score_program=b.program(masked), score_tensors=(ScoreTensor("mask", "bool", (False, True, True, False)),))


def _mask_summarized_spec():
    """A mask of unknown values added to the scores (``spec.mask_blocks``): block lists in all three kernels."""
    b = ScoreProgramBuilder()
    added = b.add("add", b.add("score"), b.add("load", value=0))
    return dict(score_program=b.program(added), score_tensors=(ScoreTensor("bias", "bfloat16", (False, True, False, False)),))


def _bool_mask_summarized_spec():
    """A bool mask of unknown values choosing the scores, ``where(mask, s, -inf)`` (SDPA's): block lists too."""
    b = ScoreProgramBuilder()
    chosen = b.add("where", b.load(0, "bool"), b.add("score"), b.const(float("-inf")))
    mask = ScoreTensor("mask", "bool", (False, True, False, False))
    return dict(score_program=b.program(chosen), score_tensors=(mask,))


def _packed_documents_spec():
    """Packed documents as an SDPA call of Hugging Face's masks them: ``(pos_k <= pos_q) & (ids_q == ids_k)``, ids and
    positions per query row (int64) and per key column (int32), the tiles classified per call from them."""
    b = ScoreProgramBuilder()
    pos_k, pos_q, ids_q, ids_k = (b.load(i, "int") for i in range(4))
    keep = b.add("logical_and", b.add("le", pos_k, pos_q), b.add("eq", ids_q, ids_k))
    hidden = b.add("where", b.add("logical_not", keep), b.const(float("-inf")), b.add("score"))
    rows, cols = (False, True, False, True), (False, True, True, False)
    tensors = (ScoreTensor("int", "int32", cols), ScoreTensor("int", "int64", rows), ScoreTensor("int", "int64", rows),
               ScoreTensor("int", "int32", cols))
    return dict(score_program=b.program(hidden), score_tensors=tensors, empty_rows="zero")


# Spec fields beyond bf16, head dim 64 and scale 0.125
SPECS = {
    "causal": dict(causal=CausalMask()),
    "head dim 256, fp16, causal": dict(causal=CausalMask(), dtype="float16", head_dim=256, head_dim_v=256),
    "head dim 96 in two parts, GQA 2, causal": dict(causal=CausalMask(), head_dim=96, head_dim_v=96, gqa_group=2),
    # DeepSeek's MLA in training: q and k of 192 = 128 + 64 (two parts), v of 128 (one); the wide heads' candidates
    "head dims 192 / 128, causal": dict(causal=CausalMask(), head_dim=192, head_dim_v=128),
    "fp32 (the exact-delta backward)": dict(causal=CausalMask(), dtype="float32"),
    "softcap + bias, GQA 4, dropout": dict(**_softcap_bias_spec(), gqa_group=4, dropout_p=0.1),
    "key padding + causal": dict(**_key_padding_spec(), causal=CausalMask()),
    "padding and causal in one finfo.min mask": _padding_and_causal_in_one_mask_spec(),
    "sliding window": dict(causal=CausalMask(window=64)),
    "a mask summarized per call": _mask_summarized_spec(),
    "packed documents": _packed_documents_spec(),
    # Gemma-4's global layers: the widest heads' candidates (tuning._WIDEST_FWD and its kin)
    "head dim 512, GQA 2, causal": dict(causal=CausalMask(), head_dim=512, head_dim_v=512, gqa_group=2),
}


def _tensors(spec: AttentionSpec, Z=2, H=8, L=256):
    dtype = getattr(torch, spec.dtype)
    q = torch.randn(Z, H, L, spec.head_dim, dtype=dtype)
    k = torch.randn(Z, H // spec.gqa_group, L, spec.head_dim, dtype=dtype)
    v = torch.randn(Z, H // spec.gqa_group, L, spec.head_dim_v, dtype=dtype)
    shapes = [[1 if b else n for b, n in zip(t.broadcast, (Z, H, L, L))] for t in spec.score_tensors]
    scores = [torch.randn(*shape, dtype=getattr(torch, t.dtype)) if t.role == "bias" else
              torch.randint(0, 3, shape, dtype=getattr(torch, t.dtype)) if t.role == "int" else
              torch.rand(Z, 1, 1, L) < 0.9 for t, shape in zip(spec.score_tensors, shapes)]
    seed = torch.tensor(7) if spec.dropout_p else None
    return q, k, v, scores, seed


def _recording_launches(monkeypatch) -> list:
    """The launchers' launches from now on, recorded (kernel, arguments, config) and not run."""
    launches = []
    monkeypatch.setattr(launch, "launch",
                        lambda kernel, grid, args, cfg=None, warmup=False: launches.append((kernel, args, cfg)))
    return launches


def _captured_launches(spec: AttentionSpec, monkeypatch) -> list:
    launches = _recording_launches(monkeypatch)
    q, k, v, scores, seed = _tensors(spec)
    launch.triton_forward(q, k, v, scores, spec, seed)
    out, lse = torch.empty_like(q), torch.empty(q.shape[:3])
    # a bias gets a gradient, except a summarized mask (whose backward would then not use the summaries)
    summarized = plan.mask_blocks(spec)
    needs = [t.role == "bias" and (summarized is None or summarized.tensor != i) for i, t in enumerate(spec.score_tensors)]
    launch.triton_backward(torch.randn_like(q), q, k, v, scores, out, lse, spec, needs, seed)
    return launches


def _configs(name: str, spec: AttentionSpec, capability: int, smem: int) -> list:
    """The smallest and the largest tuning candidates of a kernel for this spec, on a GPU of this compute capability
    and shared memory."""
    generate = {"_attn_fwd": tuning.forward_candidates, "_attn_bwd_dq": tuning.dq_candidates,
                "_attn_bwd_dkdv": tuning.dkdv_candidates}[name]
    elem = getattr(torch, spec.dtype).itemsize
    block_d, block_dv = (launch.pow2_at_least_16(d) for d in (spec.head_dim, spec.head_dim_v))  # as the launcher
    candidates = generate(block_d, block_dv, elem, spec.causal is not None, _shared_memory(capability, smem))
    size = lambda c: (c.block_m * c.block_n, c.num_warps, c.num_stages)  # noqa: E731
    return sorted({min(candidates, key=size), max(candidates, key=size)}, key=size)


def _shared_memory(capability: int, smem: int) -> tuning.SharedMemory:
    return tuning.SharedMemory(smem, wgmma=capability >= 90)


def _compile(kernel, args: dict, cfg, capability: int, maxnreg: int | None = None):
    """Compile ``kernel`` for ``capability`` as a launch with these arguments specializes it (Triton's JIT): an int
    argument equal to 1 becomes a constexpr, and pointers and ints divisible by 16 carry that hint, except where the
    kernel does not specialize them. Without those, loads along a unit stride do not vectorize, and the compiled
    kernel differs from the one that runs (at D128 the dQ kernel's shared memory was 96 KiB here against 160 KiB on
    the GPU)."""
    signature, constants, attrs = {}, {}, {}
    for i, (name, param) in enumerate(zip(kernel.arg_names, kernel.params)):
        value = args[name]
        if i in kernel.constexprs:
            signature[name], constants[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = _POINTER_TYPES[value.dtype]
            if not param.do_not_specialize_on_alignment:  # (torch's allocations are 16-byte aligned)
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            if value == 1 and not param.do_not_specialize:
                signature[name], constants[name] = "constexpr", 1
                continue
            signature[name] = "i32"
            if value % 16 == 0 and not param.do_not_specialize and not param.do_not_specialize_on_alignment:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif hasattr(value, "block_shape"):  # a TMA descriptor (the Gluon forward's)
            signature[name] = mangle_type(value)
        else:
            signature[name] = "fp32"
    options = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if maxnreg is not None:  # a launch's register cap (the Gluon forward's configs of CTAs sharing an SM)
        options["maxnreg"] = maxnreg
    source_type = GluonASTSource if kernel.is_gluon() else triton.compiler.ASTSource
    source = source_type(fn=kernel, signature=signature, constexprs=constants, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)


def compile_spec(name: str, target: str) -> None:
    """(In the subprocess.) Compile every kernel launch of spec ``name`` for ``target``; raise on any failure."""
    spec = AttentionSpec(**{"dtype": "bfloat16", "head_dim": 64, "head_dim_v": 64, "scale": 0.125, **SPECS[name]})
    capability, smem = TARGETS[target]
    with pytest.MonkeyPatch.context() as monkeypatch:
        launches = _captured_launches(spec, monkeypatch)
    assert {kernel.fn.__name__ for kernel, _, _ in launches} >= {"_attn_fwd", "_attn_bwd_dq", "_attn_bwd_dkdv"}
    summarized = plan.mask_blocks(spec)
    if summarized is not None:  # the block-list code paths are the ones compiled
        assert all(args["MASK_BLOCKS"] for kernel, args, _ in launches if "MASK_BLOCKS" in args)
    if summarized is not None and summarized.predicate is not None:  # its tiles classified by the generated kernels
        assert {"_tile_summaries", "_tile_classes"} <= {kernel.fn.__name__ for kernel, _, _ in launches}
    for kernel, args, launched in launches:
        # the attention kernels with the tuner's extreme candidates; the tile classes with the config they launch with
        tile_classes = kernel.fn.__name__ in ("_tile_summaries", "_tile_classes")
        configs = [launched] if tile_classes else _configs(kernel.fn.__name__, spec, capability, smem)
        for cfg in configs:
            bound = dict(args, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n)
            for part in _launch_parts(cfg):
                compiled = _compile(kernel, dict(bound, **part), cfg, capability)
                what = f"{kernel.fn.__name__} {cfg}{part or ''}"
                assert compiled.asm["cubin"], what
                assert compiled.metadata.shared <= smem, f"{what}: {compiled.metadata.shared} bytes"
                print(f"{name} {target} {what}: {compiled.metadata.shared} bytes of shared memory")


def _launch_parts(cfg) -> list:
    """The constexprs of each launch a config makes beyond the captured one's: a dK/dV config with
    dkdv_launches=2 launches the kernel for dV and then for dK."""
    if cfg.dkdv_launches == 1:
        return [{}]
    return [dict(COMPUTE_DK=False, COMPUTE_DV=True), dict(COMPUTE_DK=True, COMPUTE_DV=False)]


# Tiles whose compiled shared memory the candidates' estimate (tuning.config_smem_bytes) is checked against: each
# kernel's resident side at 128 rows (wgmma on sm90) and at 32 (mma v2), pipelined 2 and 3 deep; head dim 64 and
# causal (the quickest compiles)
ESTIMATED_TILES = [("_attn_fwd", tuning.KernelConfig(128, 64, 4, 3)), ("_attn_fwd", tuning.KernelConfig(32, 64, 4, 2)),
                   ("_attn_bwd_dq", tuning.KernelConfig(128, 64, 8, 2)), ("_attn_bwd_dq", tuning.KernelConfig(32, 64, 4, 3)),
                   ("_attn_bwd_dkdv", tuning.KernelConfig(32, 128, 4, 3)), ("_attn_bwd_dkdv", tuning.KernelConfig(64, 32, 4, 2))]


def estimated_shared_memory(target: str) -> None:
    """(In the subprocess.) Each of ESTIMATED_TILES compiled for ``target``: print the kernel, the tile, the estimate
    and the compiled kernel's shared memory."""
    spec = AttentionSpec(dtype="bfloat16", head_dim=64, head_dim_v=64, scale=0.125, causal=CausalMask())
    capability, _ = TARGETS[target]
    with pytest.MonkeyPatch.context() as monkeypatch:
        launches = {kernel.fn.__name__: (kernel, args) for kernel, args, _ in _captured_launches(spec, monkeypatch)}
    for name, cfg in ESTIMATED_TILES:
        kernel, args = launches[name]
        compiled = _compile(kernel, dict(args, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n), cfg, capability)
        kind = {"_attn_fwd": "fwd", "_attn_bwd_dq": "bwd_dq", "_attn_bwd_dkdv": "bwd_dkdv"}[name]
        estimate = tuning.config_smem_bytes(kind, cfg, 64, 64, 2, capability >= 90)
        print("estimated", name, cfg, estimate, compiled.metadata.shared)


class _TargetOnly:
    """A Triton driver that only names the target (sm90), for generating TTIR on a machine without a GPU."""

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")


def _written(kernel: str, args: dict) -> set:
    """The arguments of a launch that the kernel stores to, from its flags: what it must be seen to write."""
    dt = {name[len("NEED_"):] for name, need in args.items() if name.startswith("NEED_DT") and need}
    if kernel == "_attn_fwd":
        return {"Out", "Lse"}
    if kernel == "_tile_classes":
        return {"Lists", "Counts", "Classes", "Arrivals"}
    if kernel == "_tile_summaries":  # the vectors' summaries and SeesKey, and the classification's Arrivals zeroed
        return {"Summaries", "Arrivals"}
    if kernel == "_attn_bwd_dq":
        return {"DQ", "Delta", "LseFlags", "RowMax", "RowScale"} | dt  # (the row statistics: see IMPRECISE_LSE)
    return ({"DK"} if args["COMPUTE_DK"] else set()) | ({"DVout"} if args["COMPUTE_DV"] else set()) | dt


def analyzed_writes(name: str) -> None:
    """(In the subprocess.) For every launch of spec ``name``: the arguments that torch's analysis of user Triton
    kernels (what Inductor functionalizes the launch by) takes as written must be exactly those the kernel stores
    to. More is not wrong, but costs a copy per call: Inductor copies a written argument that another one aliases
    (a BlockList placeholder given the lse, which the same launch reads) before every launch. The analysis is a
    private torch API: a torch release that renames or changes it can fail this test with no change of ours."""
    from torch._higher_order_ops import triton_kernel_wrap

    def written_by_analysis(kernel, args) -> set:
        if hasattr(triton_kernel_wrap, "identify_accessed_tensors"):  # torch 2.13
            accesses = triton_kernel_wrap.identify_accessed_tensors(kernel, args, {})
            return {dep.name for dep in accesses.read_writes.writes}
        return set(triton_kernel_wrap.identify_mutated_tensors(kernel, args, {}))  # the older name

    spec = AttentionSpec(**{"dtype": "bfloat16", "head_dim": 64, "head_dim_v": 64, "scale": 0.125,
                            **ANALYZED_SPECS[name]})
    with pytest.MonkeyPatch.context() as monkeypatch:
        launches = _captured_launches(spec, monkeypatch)
    triton.runtime.driver.set_active(_TargetOnly())
    checked = []
    kinds = {"_attn_fwd": "fwd", "_attn_bwd_dq": "bwd_dq", "_attn_bwd_dkdv": "bwd_dkdv"}
    for kernel, args, _ in launches:
        if kernel.fn.__name__ in kinds:
            cfg = tuning.INTERPRETER_CONFIGS[kinds[kernel.fn.__name__]]  # the tile the launcher gave this launch
            args = dict(args, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n)
        seen = written_by_analysis(kernel, args)
        expected = _written(kernel.fn.__name__, args)
        assert seen == expected, f"{name}: {kernel.fn.__name__} seen writing {sorted(seen)}, writes {sorted(expected)}"
        checked.append(kernel.fn.__name__)
    print("checked", " ".join(checked))


def trace_tile_classes() -> None:
    """(In the subprocess.) The tile-classes kernels' launches traced as the op's body is under torch.compile on a GPU
    (make_fx on meta tensors of symbolic lengths, wrap_triton recording each launch): one graph for every length, its
    grids and outputs sized by the lengths' symbols."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from tests.kernels.test_mask_blocks import ALIGNED, documents_spec, documents_tensors

    spec = documents_spec("sdpa")

    def lists(*tensors):
        M, N = tensors[1].shape[2], tensors[0].shape[3]
        return [launch.predicate_block_args(spec, tensors, M, N, 64, 32, key_major)["BlockList"]
                for key_major in (False, True)]

    triton.runtime.driver.set_active(_TargetOnly())
    graph = make_fx(lists, tracing_mode="symbolic")(*(t.to("meta") for t in documents_tensors(ALIGNED)))
    for node in graph.graph.nodes:
        if node.target is torch.ops.higher_order.triton_kernel_wrapper_mutation:
            print("launch grid", node.kwargs["grid"], "KEY_MAJOR", node.kwargs["kwargs"].get("KEY_MAJOR"))


def compile_tile_classes() -> None:
    """(In the subprocess.) The tile-classes kernels (summaries, classes) of a predicate reaching every op
    (test_mask_blocks.every_op_spec), both orientations, compiled for sm90 with the launch's own arguments and
    config."""
    from tests.kernels.test_mask_blocks import ANY, documents_tensors, every_op_spec

    spec = every_op_spec()
    with pytest.MonkeyPatch.context() as monkeypatch:
        launches = _recording_launches(monkeypatch)
        for key_major in (False, True):
            launch.predicate_block_args(spec, documents_tensors(ANY), 80, 80, 64, 32, key_major)
    _compile_each_for_sm90(launches, lambda kernel, args: f"{kernel.fn.__name__} KEY_MAJOR {args.get('KEY_MAJOR')}")


def _compile_each_for_sm90(launches, label) -> None:
    """Compile each recorded launch's kernel for sm90 with the launch's own arguments and config, and print its shared
    memory after ``label(kernel, args)``."""
    for kernel, args, cfg in launches:
        compiled = _compile(kernel, args, cfg, TARGETS["sm90"][0])
        assert compiled.asm["cubin"]
        print(f"{label(kernel, args)}: {compiled.metadata.shared} bytes of shared memory")


def test_the_tile_classes_kernel_of_every_predicate_op_compiles_for_the_gpu():
    stdout = _in_subprocess("t.compile_tile_classes()")
    assert stdout.count("bytes of shared memory") == 4, stdout


def test_the_tile_classes_kernel_traces_with_symbolic_lengths():
    stdout = _in_subprocess("t.trace_tile_classes()")
    launches = [line for line in stdout.splitlines() if line.startswith("launch grid")]
    assert len(launches) == 4 and all("floordiv" in line for line in launches), stdout  # summaries, classes: twice


# Specs whose kernels store to more than the outputs: a bias gradient (by the dK/dV kernel, or the dQ kernel with the
# exact delta of fp32), next to a key range and block lists (whose placeholders a write through a helper call that
# took them was once attributed to)
ANALYZED_SPECS = {
    "bias gradient, GQA 4, dropout": _softcap_bias_spec() | dict(gqa_group=4, dropout_p=0.1),
    "bias gradient, fp32 (exact delta)": dict(_mask_summarized_spec(), dtype="float32", causal=CausalMask(),
                                              score_tensors=(ScoreTensor("bias", "float32", (True, False, False, False)),)),
    "key padding + causal": SPECS["key padding + causal"],
    "a mask summarized per call": SPECS["a mask summarized per call"],
    "packed documents (tile classes)": SPECS["packed documents"],
}


# The subprocess's loop: each line from the test process is a call (JSON); its reply, after what the call printed,
# is one line after _REPLY (JSON: whether it raised, and the traceback)
_REPLY = "\x00reply "
_SERVE = f"""
import contextlib, io, json, sys, traceback
import tests.kernels.test_gpu_compile as t

for line in sys.stdin:
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            eval(json.loads(line), {{"t": t}})
        reply = {{"stdout": printed.getvalue(), "error": None}}
    except Exception:
        reply = {{"stdout": printed.getvalue(), "error": traceback.format_exc()}}
    sys.stdout.write({_REPLY!r} + json.dumps(reply) + "\\n")
    sys.stdout.flush()
"""
_CALL_TIMEOUT_S = 600  # the longest compile seen takes under a minute with a cold cache


class _Subprocess:
    """One Python without TRITON_INTERPRET a test process, which runs the calls one after another: a fresh one a call
    spent ~6 s of CI's worker time importing torch, Triton and the package, for each of ~40 calls. Every call
    restores what it patches (``pytest.MonkeyPatch.context``), so one call leaves nothing to the next."""

    proc = None

    @classmethod
    def run(cls, call: str) -> str:
        if cls.proc is None or cls.proc.poll() is not None:
            env = dict(os.environ, TRITON_INTERPRET="0")
            cls.proc = subprocess.Popen([sys.executable, "-c", _SERVE], cwd=ROOT,
                                        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            atexit.register(cls.stop, cls.proc)
        cls.proc.stdin.write(json.dumps(call) + "\n")
        cls.proc.stdin.flush()
        deadline, printed = time.monotonic() + _CALL_TIMEOUT_S, []
        while True:
            ready, _, _ = select.select([cls.proc.stdout], [], [], max(deadline - time.monotonic(), 0))
            line = cls.proc.stdout.readline() if ready else ""
            if not line:  # timed out, or the subprocess died: the next call starts another
                cls.proc.kill()
                cls.proc = None
                raise AssertionError(f"{call}: no reply (timed out or died); printed:\n{''.join(printed)[-3000:]}")
            if line.startswith(_REPLY):
                reply = json.loads(line[len(_REPLY):])
                assert reply["error"] is None, reply["error"][-3000:]
                return "".join(printed) + reply["stdout"]
            printed.append(line)  # (something printed outside sys.stdout's redirect)


    @staticmethod
    def stop(proc) -> None:
        """At the test process's exit: the subprocess's input ends, so does its loop."""
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _in_subprocess(call: str) -> str:
    """Run ``call`` (an expression on this module, ``t``) in a Python without TRITON_INTERPRET (:class:`_Subprocess`);
    what it printed."""
    return _Subprocess.run(call)


@pytest.mark.parametrize("name", list(ANALYZED_SPECS))
def test_inductor_sees_each_kernel_write_exactly_its_outputs(name):
    stdout = _in_subprocess(f"t.analyzed_writes({name!r})")
    assert stdout.count("_attn_") >= 3, stdout


def compile_table_gradient(dtype_name: str) -> None:
    """(In the subprocess.) The few-row table gradient's kernel (fuse_attn/kernels/embedding_backward.py) as a
    launch for T5's table specializes it (a [32, 8] table, the gradient laid out as T5's: positions contiguous,
    heads N^2 apart), compiled for sm90 and sm80; and torch's analysis sees it write its partial tables only."""
    import types

    from torch._higher_order_ops import triton_kernel_wrap

    from fuse_attn.kernels import embedding_backward

    n = 64
    grad = torch.randn(1, 8, n, n, dtype=getattr(torch, dtype_name)).permute(2, 3, 1, 0).reshape(n * n, 8)
    _, args, _ = embedding_backward.partials_launch(grad, torch.randint(0, 32, (n * n,)), 32, -1)
    kernel = embedding_backward._table_gradient_partials
    defaults = types.SimpleNamespace(num_warps=4, num_stages=3)  # Triton's, which the launch keeps
    for target, (capability, smem) in TARGETS.items():
        compiled = _compile(kernel, args, defaults, capability)
        assert compiled.asm["cubin"] and compiled.metadata.shared <= smem, target
        print(f"{target}: {compiled.metadata.shared} bytes of shared memory")
    triton.runtime.driver.set_active(_TargetOnly())
    if hasattr(triton_kernel_wrap, "identify_accessed_tensors"):  # torch 2.13
        writes = {dep.name for dep in triton_kernel_wrap.identify_accessed_tensors(kernel, args, {}).read_writes.writes}
    else:
        writes = set(triton_kernel_wrap.identify_mutated_tensors(kernel, args, {}))
    print("writes", " ".join(sorted(writes)))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_table_gradient_kernel_compiles_for_the_gpu_and_writes_only_its_partials(dtype):
    stdout = _in_subprocess(f"t.compile_table_gradient({dtype!r})")
    assert stdout.count("bytes of shared memory") == len(TARGETS) and "writes PARTIALS\n" in stdout, stdout


# How far a compiled kernel's shared memory may be from the estimate: a layout conversion's scratch (a [32, 64] bf16
# tile) and the pipeline's barriers, which the estimate leaves out (ESTIMATED_TILES compiled: 2,560-4,096 bytes over
# where the dots run on mma v2, within 512 bytes on wgmma)
ESTIMATE_SLACK = 4096


@pytest.mark.parametrize("target", list(TARGETS))
def test_the_candidates_shared_memory_estimate_is_the_compiled_kernels(target):
    stdout = _in_subprocess(f"t.estimated_shared_memory({target!r})")
    rows = [line.split() for line in stdout.splitlines() if line.startswith("estimated")]
    assert len(rows) == len(ESTIMATED_TILES), stdout
    for *what, estimate, compiled in rows:
        assert abs(int(compiled) - int(estimate)) <= ESTIMATE_SLACK, f"{' '.join(what)}: {compiled} bytes, estimated {estimate}"


# Every spec for the GPU the project is tuned on; the A100's target for one spec (compiles cost CI minutes)
CASES = [(name, "sm90") for name in SPECS] + [("causal", "sm80")]


@pytest.mark.parametrize("name, target", CASES)
def test_forward_and_backward_kernels_compile_for_the_gpu(name, target):
    stdout = _in_subprocess(f"t.compile_spec({name!r}, {target!r})")
    assert stdout.count("bytes of shared memory") >= 3, stdout  # each kernel, a config or two



# ---- the Gluon forward and backward of plain attention (fuse_attn/kernels/hopper/): sm90 only ---------------------
HOPPER_CASES = {  # (head dim, causal, GQA group, dtype, rows): each head dim's config, both masks, GQA, fp16; MLA's
    # q / k 192 in column parts (v 128: hopper_common.HEAD_DIMS)
    "D64 causal GQA 2": (64, True, 2, torch.bfloat16, 300),
    "D128": (128, False, 1, torch.bfloat16, 300),
    "D128 causal fp16": (128, True, 1, torch.float16, 300),
    "D192 / 128 causal GQA 2": (192, True, 2, torch.bfloat16, 300),
}
# Biases of ``s + bias`` specs: (sizes over Z=2, H=4, M, N="M" -- the case's rows --, dtype, empty_rows): one
# broadcast over the batch (its CTAs batch rows innermost), one over the heads in fp32 whose empty rows give 0
BIAS_CASES = {
    "[1,H,M,N] bf16": ((1, 4, "M", "M"), torch.bfloat16, "nan"),
    "[Z,1,M,N] fp32, empty rows 0": ((2, 1, "M", "M"), torch.float32, "zero"),
}
# the forward's other configs (hopper_forward.forward_config): D64 with three consumer warpgroups of 128-key tiles,
# unmasked and causal over 4096 rows; D128 causal over 2048 rows, two consumers (the 300-row causal cases above take
# the short causal config: one consumer of 64-key tiles, two CTAs an SM at D128, three at D64)
FORWARD_ONLY_CASES = {
    "D64 three consumers": (64, False, 1, torch.bfloat16, 300),
    "D64 causal 4096 rows, three consumers": (64, True, 1, torch.bfloat16, 4096),
    "D128 causal 2048 rows, two consumers": (128, True, 1, torch.bfloat16, 2048),
}


def compile_hopper(name: str, direction: str, sms: int | None = None, bias: str | None = None,
                   rows: int | None = None, bias_grad: bool = False, packed: bool = False, padded: bool = False,
                   summarized: bool = False):
    """(In the subprocess.) Capture the Gluon forward's or backward's launch (``direction``) at lengths that are no
    multiple of a tile and compile its Gluon kernel for sm90 with the signature a launch gives it; its shared memory
    must fit the H100's. Returns the compiled kernel. (The backward's small Triton kernels, plain tl code, are
    captured and not compiled.) ``sms``: the SMs the launcher sees (CPU tensors have none), which decides whether a
    CTA takes two key tiles (the causal backward) or two query blocks (the forward). ``bias``: a key of
    :data:`BIAS_CASES`, the spec then ``s + bias``. ``rows``: a length other than the case's. ``bias_grad``: the backward
    with the bias's gradient (its dS tiles stored). ``packed``: the spec masked as :func:`_packed_documents_spec`'s,
    its four integer vectors, no causal mask but the predicate's (the tile lists, which the tile-classes kernel's own
    test compiles, stand-ins of zeros). ``padded``: the spec masked as :func:`_padding_and_causal_in_one_mask_spec`'s,
    its padding vector (the lists of :mod:`fuse_attn.kernels.hopper.key_range_tiles` stand-ins too). ``summarized``:
    the spec masked as :func:`_mask_summarized_spec`'s, a ``[Z, 1, M, N]`` mask tensor (its lists stand-ins too)."""
    from fuse_attn.kernels.hopper import backward as hopper_backward, common as hopper_common, forward as hopper_forward
    from fuse_attn.kernels.positional_launch import PositionalLaunch

    head_dim, causal, group, dtype, case_rows = {**HOPPER_CASES, **FORWARD_ONLY_CASES}[name]
    head_dim_v = dict(hopper_common.HEAD_DIMS)[head_dim]
    rows = rows or case_rows
    score, bias_tensor = {}, None
    if bias is not None:
        sizes, bias_dtype, empty_rows = BIAS_CASES[bias]
        score = dict(score_program=BIAS_PROGRAM, empty_rows=empty_rows, score_tensors=(
            ScoreTensor("bias", str(bias_dtype).split(".")[1], tuple(n == 1 for n in sizes)),))
        bias_tensor = torch.randn(*(rows if n == "M" else n for n in sizes), dtype=bias_dtype)
    listed = packed or padded or summarized
    if listed:
        score = (_packed_documents_spec() if packed else _padding_and_causal_in_one_mask_spec() if padded
                 else _mask_summarized_spec())
    spec = AttentionSpec(dtype=str(dtype).split(".")[1], head_dim=head_dim, head_dim_v=head_dim_v,
                         scale=head_dim ** -0.5, causal=CausalMask() if causal and not listed else None,
                         gqa_group=group, **score)
    vectors = [torch.zeros(2, 1, *(rows if not b else 1 for b in t.broadcast[2:]), dtype=getattr(torch, t.dtype))
               for t in spec.score_tensors] if listed else ()
    q = torch.randn(2, 4, rows, head_dim, dtype=dtype)
    k = torch.randn(2, 4 // group, rows, head_dim, dtype=dtype)
    v = torch.randn(2, 4 // group, rows, head_dim_v, dtype=dtype)
    module, launched = {"forward": (hopper_forward, ["_hopper_attn_fwd"]),
                        "backward": (hopper_backward, ["_hopper_attn_bwd", "_delta_kernel", "_nan_dv_kernel",
                                                       "_dq_cast_kernel"])}[direction]
    kernel = getattr(module, launched[0])
    launches = {}

    class Recorded:
        def __init__(self, kernel_name):
            self.kernel_name = kernel_name

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.setdefault(self.kernel_name, []).append((args, kwargs))

    with pytest.MonkeyPatch.context() as monkeypatch:
        for kernel_name in launched:  # (each launched through its module's PositionalLaunch)
            launcher, = (obj for obj in vars(module).values()
                         if isinstance(obj, PositionalLaunch) and obj.kernel is getattr(module, kernel_name))
            monkeypatch.setattr(launcher, "kernel", Recorded(kernel_name))
        if sms is not None:
            monkeypatch.setattr(hopper_common, "sm_count", lambda device: sms)  # (both rules: fills_at_most)

        def zero_lists(tile_classes, vectors):
            lists, counts = (torch.zeros(shape, dtype=torch.int32) for shape in (tile_classes.lists_shape,
                                                                                 tile_classes.counts_shape))
            return dict(BlockList=lists, stride_blist_z=lists.stride(0), BlockCounts=counts,
                        stride_bcount_z=counts.stride(0))

        monkeypatch.setattr(launch.TileClasses, "__call__", zero_lists)
        monkeypatch.setattr(KeyRangeTiles, "__call__", zero_lists)
        monkeypatch.setattr(MaskTiles, "__call__", zero_lists)
        if direction == "forward":
            hopper_forward.hopper_forward(q, k, v, spec, bias_tensor, vectors)
        else:
            out = torch.randn(2, 4, rows, head_dim_v, dtype=dtype)
            hopper_backward.hopper_backward(out, q, k, v, out.clone(), torch.randn(2, 4, rows), spec,
                                            bias=bias_tensor, bias_grad=bias_grad, vectors=vectors)
    (args, kwargs), *_ = launches[launched[0]]  # the Gluon kernel's launch (each chunk of heads the same kernel)
    bound = dict(zip(kernel.arg_names, args))  # the tile config is the launch's own constexpr arguments
    cfg = tuning.KernelConfig(bound["BLOCK_M"], bound["BLOCK_N"], kwargs["num_warps"], bound["STAGES"])
    capability, smem = TARGETS["sm90"]
    compiled = _compile(kernel, bound, cfg, capability, kwargs.get("maxnreg"))
    assert compiled.asm["cubin"], name
    if "maxnreg" in kwargs:  # launched for CTAs sharing an SM: the register cap is the kernel's
        assert f".maxnreg {kwargs['maxnreg']}" in compiled.asm["ptx"], name
    assert compiled.metadata.shared <= smem, f"{name}: {compiled.metadata.shared} bytes"
    if "maxnreg" in kwargs:  # the forward's CTAs sharing an SM: each within its share of the SM's shared memory, less
        # what CUDA reserves a CTA
        ctas = hopper_forward.resident_ctas(head_dim, bound["CONSUMERS"])
        share = hopper_common._SHARED_MEMORY_AN_SM // ctas - hopper_common._RESERVED_A_CTA
        assert compiled.metadata.shared <= share, f"{name}: {compiled.metadata.shared} bytes, {ctas} CTAs an SM"
    paired = f", {'key tiles' if direction == 'backward' else 'query blocks'} paired: {bound['PAIRED']}"
    if direction == "forward":
        paired += f", persistent: {bound['PERSISTENT']}"
    print(f"{name}: {compiled.metadata.shared} bytes of shared memory{paired}, bias: {bound['HAS_BIAS']}, batch "
          f"rows innermost: {bound['BATCH_INNER']}, bias tiles by TMA: {bound.get('BIAS_TMA', False)}, dS stored: "
          f"{bound.get('DS_OUT', False)}, listed tiles: {bound['MASK_BLOCKS']}")
    return compiled


def compile_backward_with_its_own_tma_add(name: str) -> None:
    """(In the subprocess.) The backward compiled with the kernel's own builtin for the TMA reduce-add (what the GPU
    machine's Triton 3.6 runs, which has no tma.async_atomic_add) and with the tma module's where Triton has one:
    the same reduce-add instructions in the PTX."""
    from fuse_attn.kernels.hopper import backward as hopper_backward

    reduces = []
    for tma_add in (hopper_backward._tma_add, hopper_backward._tma_add_v36):
        with pytest.MonkeyPatch.context() as monkeypatch:
            monkeypatch.setattr(hopper_backward, "_tma_add", tma_add)
            # each compiled anew: Triton's cache key holds the kernels' sources, not the builtin's
            monkeypatch.setenv("TRITON_ALWAYS_COMPILE", "1")
            ptx = compile_hopper(name, "backward").asm["ptx"]
        reduces.append(re.findall(r"cp\.reduce\.async\.bulk\.tensor[\w.:]*", ptx))
    print(f"TMA reductions in the PTX: {reduces[0]} | {reduces[1]}")


@pytest.mark.parametrize("name", list(HOPPER_CASES) + list(FORWARD_ONLY_CASES))
def test_the_gluon_forward_compiles_for_hopper(name):
    stdout = _in_subprocess(f"t.compile_hopper({name!r}, 'forward')")
    assert "bytes of shared memory, query blocks paired: False" in stdout, stdout


@pytest.mark.parametrize("name", ["D64 causal GQA 2", "D128 causal fp16", "D128 causal 2048 rows, two consumers"])
def test_the_gluon_forward_with_paired_query_blocks_compiles_for_hopper(name):
    """Causal on an H100's 132 SMs, these few CTAs take two query blocks each (hopper_forward._PAIR_UP_TO_WAVES; the
    other causal case, D64's three-consumer config, never pairs)."""
    stdout = _in_subprocess(f"t.compile_hopper({name!r}, 'forward', sms=132)")
    assert "bytes of shared memory, query blocks paired: True" in stdout, stdout


def test_the_gluon_forward_with_a_persistent_grid_compiles_for_hopper():
    """Unmasked, D128's two-consumer config runs a persistent grid where its query blocks (here 24) outnumber what the
    SMs take at once (hopper_forward.runs_persistent; 8 SMs said); without SMs to count (the case above) one block a
    CTA."""
    stdout = _in_subprocess("t.compile_hopper('D128', 'forward', sms=8)")
    assert "query blocks paired: False, persistent: True" in stdout, stdout


@pytest.mark.parametrize("name, rows", [("D64 causal GQA 2", 384), ("D128 causal fp16", None),
                                        ("D128 causal 2048 rows, two consumers", None)])
def test_the_gluon_forward_with_a_causal_persistent_grid_compiles_for_hopper(name, rows):
    """Causal, the configs that pair run a persistent grid of items of two query blocks where their blocks (6 a head
    of 384 rows, 5 of 300: odd, 16 of 2048) outnumber what pairing takes (hopper_forward.runs_persistent; one SM
    said)."""
    stdout = _in_subprocess(f"t.compile_hopper({name!r}, 'forward', sms=1, rows={rows})")
    assert "query blocks paired: False, persistent: True" in stdout, stdout


@pytest.mark.parametrize("direction, name, bias, rows, by_tma", [
    # the forward's bias tiles in the k / v ring (rows of 16-byte multiples), in each config: two consumers, three,
    # and one (CTAs sharing an SM: their share of the shared memory), two and one with an fp32 bias too; loaded by the
    # consumers (600-byte rows)
    ("forward", "D128 causal 2048 rows, two consumers", "[1,H,M,N] bf16", None, True),
    ("forward", "D128 causal 2048 rows, two consumers", "[Z,1,M,N] fp32, empty rows 0", None, True),
    ("forward", "D64 causal 4096 rows, three consumers", "[1,H,M,N] bf16", None, True),
    ("forward", "D128 causal fp16", "[Z,1,M,N] fp32, empty rows 0", 1024, True),
    ("forward", "D128 causal fp16", "[1,H,M,N] bf16", None, False),
    ("forward", "D64 causal GQA 2", "[Z,1,M,N] fp32, empty rows 0", 1024, True),  # (three CTAs an SM: the tightest)
    # the backward's in the q / dO ring at head dim 128 (one dQ buffer), loaded by the compute warpgroups at 64
    ("backward", "D128 causal 2048 rows, two consumers", "[1,H,M,N] bf16", None, True),
    ("backward", "D64 causal GQA 2", "[Z,1,M,N] fp32, empty rows 0", None, False),
])
def test_the_gluon_kernels_with_a_bias_compile_for_hopper(direction, name, bias, rows, by_tma):
    stdout = _in_subprocess(f"t.compile_hopper({name!r}, {direction!r}, bias={bias!r}, rows={rows!r})")
    assert "bias: True" in stdout, stdout
    assert f"batch rows innermost: {bias.startswith('[1,')}" in stdout, stdout
    assert f"bias tiles by TMA: {by_tma}" in stdout, stdout


@pytest.mark.parametrize("name, rows", [("D128", 1001),  # rows of 2002 bytes: the bias loaded
                                        ("D128 causal 2048 rows, two consumers", None)])  # by TMA
def test_the_gluon_backward_storing_the_bias_gradients_ds_compiles_for_hopper(name, rows):
    """The backward where the bias needs a gradient: each tile's dS goes out from its shared tile by TMA (at head
    dim 128: hopper_common._DS_MIN_HEAD_DIM; lengths where a head's dS fits beside the dQ accumulator)."""
    stdout = _in_subprocess(f"t.compile_hopper({name!r}, 'backward', bias='[1,H,M,N] bf16', rows={rows!r}, "
                            "bias_grad=True)")
    assert "dS stored: True" in stdout, stdout


@pytest.mark.parametrize("name", list(HOPPER_CASES))
def test_the_gluon_backward_compiles_for_hopper(name):
    stdout = _in_subprocess(f"t.compile_hopper({name!r}, 'backward')")
    assert "bytes of shared memory, key tiles paired: False" in stdout, stdout


@pytest.mark.parametrize("name", [n for n, case in HOPPER_CASES.items() if case[1]])
def test_the_gluon_backward_with_paired_key_tiles_compiles_for_hopper(name):
    """Causal on an H100's 132 SMs, these few CTAs take two key tiles each (hopper_backward._PAIR_UP_TO_WAVES)."""
    stdout = _in_subprocess(f"t.compile_hopper({name!r}, 'backward', sms=132)")
    assert "bytes of shared memory, key tiles paired: True" in stdout, stdout


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("name", ["D64 causal GQA 2", "D128"])
def test_the_gluon_kernels_of_packed_documents_compile_for_hopper(direction, name):
    """A predicate's mask (packed documents, four vectors of two int dtypes): the kernels visit the listed tiles and
    call the generated program in the partial ones (``MASK_BLOCKS``), GQA, at D64 the forward's two-consumer config."""
    stdout = _in_subprocess(f"t.compile_hopper({name!r}, {direction!r}, packed=True)")
    assert "listed tiles: True" in stdout and "bias: False" in stdout, stdout


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("name", ["D64 causal GQA 2", "D128"])
def test_the_gluon_kernels_of_key_padding_compile_for_hopper(direction, name):
    """A key padding vector with the causal band in the program (Hugging Face's padding + causal mask): the kernels
    visit the tiles key_range_tiles lists and call the generated program in the partial ones (``MASK_BLOCKS``)."""
    stdout = _in_subprocess(f"t.compile_hopper({name!r}, {direction!r}, padded=True)")
    assert "listed tiles: True" in stdout and "bias: False" in stdout, stdout


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("name", ["D64 causal GQA 2", "D128"])
def test_the_gluon_kernels_of_a_summarized_mask_compile_for_hopper(direction, name):
    """A mask tensor ``[Z, 1, M, N]`` added to the scores, its tiles classified per call: the kernels visit the
    listed tiles and load the mask's tile in the generated program of the partial ones (``MASK_BLOCKS``)."""
    stdout = _in_subprocess(f"t.compile_hopper({name!r}, {direction!r}, summarized=True)")
    assert "listed tiles: True" in stdout and "bias: False" in stdout, stdout


def compile_key_range_tiles() -> None:
    """(In the subprocess.) The key-range tiles kernel of a padding vector with the band (the "masking" kind) and
    without (the "-inf" kind), both orientations, compiled for sm90 with the launch's own arguments and config."""
    from fuse_attn.kernels.hopper import key_range_tiles

    launches = []
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(key_range_tiles, "launch",
                            lambda kernel, grid, args, cfg=None, warmup=False: launches.append((kernel, args, cfg)))
        for score in (_padding_and_causal_in_one_mask_spec(), _key_padding_spec()):
            spec = AttentionSpec(dtype="bfloat16", head_dim=64, head_dim_v=64, scale=0.125, **score)
            vector = torch.zeros(2, 1, 1, 300, dtype=torch.bool)
            for rows, key_major in ((128, False), (64, True)):
                KeyRangeTiles(spec, [vector], 300, 300, rows, 128, key_major)([vector])
    _compile_each_for_sm90(launches, lambda kernel, args: f"BAND {args['BAND']} KEY_MAJOR {args['KEY_MAJOR']}")


def test_the_key_range_tiles_kernel_compiles_for_the_gpu():
    stdout = _in_subprocess("t.compile_key_range_tiles()")
    assert stdout.count("bytes of shared memory") == 4, stdout


def compile_mask_tiles() -> None:
    """(In the subprocess.) The mask-tiles kernels of a bf16 mask added to the scores and of a bool one, both
    orientations (the key-major lists' third kernel too), compiled for sm90 with the launches' own arguments and
    config."""
    from fuse_attn.kernels.hopper import mask_tiles

    launches = []
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(mask_tiles, "launch",
                            lambda kernel, grid, args, cfg=None, warmup=False: launches.append((kernel, args, cfg)))
        for mask in (torch.zeros(2, 1, 300, 300, dtype=torch.bfloat16), torch.ones(2, 1, 300, 300, dtype=torch.bool)):
            score = _mask_summarized_spec() if mask.dtype == torch.bfloat16 else _bool_mask_summarized_spec()
            spec = AttentionSpec(dtype="bfloat16", head_dim=64, head_dim_v=64, scale=0.125, **score)
            for rows, key_major in ((128, False), (64, True)):
                MaskTiles(spec, [mask], 300, 300, rows, 128, key_major)([mask])
    _compile_each_for_sm90(launches, lambda kernel, args: f"{kernel.fn.__name__} HIDDEN {args.get('HIDDEN')}")


def test_the_mask_tiles_kernels_compile_for_the_gpu():
    stdout = _in_subprocess("t.compile_mask_tiles()")
    assert stdout.count("bytes of shared memory") == 10, stdout  # (summaries, classes; key-major also lists)


def test_the_gluon_backwards_own_tma_add_compiles_as_tritons():
    """dQ's TMA reduce-add: Triton 3.6's Gluon (the GPU machine's) has the op but no function for it, so the kernel
    brings a builtin; compiled in place of Triton's own function it gives the same instructions (one reduce-add a
    piece of the dQ tile: the fp32 tile's rows are wider than TMA's 128-byte swizzle)."""
    stdout = _in_subprocess(f"t.compile_backward_with_its_own_tma_add({'D128 causal fp16'!r})")
    tritons, own = stdout.split("TMA reductions in the PTX: ")[1].splitlines()[0].split(" | ")
    assert tritons == own and ".add." in own, stdout
