"""Whether a model-level precision gap comes from the attention itself: run a model of the model-zoo test
(tests/e2e/test_model_zoo.py) with ``attn_implementation="sdpa"`` in fp64, capturing each SDPA call's q, k, v, mask and
the gradient that reaches its output; then compute every captured attention alone in a half dtype -- fuse_attn's
kernels (compiled), each SDPA backend the device runs, and the eager math Hugging Face's eager attention does
(scores in the dtype, softmax in fp32, P cast back) -- and print each one's max error against the fp64 attention:
the output and the gradients of q, k, v and the mask.

    PYTHONPATH=. python3 tools/attention_precision.py [--model t5-relative-bias] [--seeds 0 1 2 3]
                                                      [--dtype bfloat16] [--device cuda]

The weights of seed s are those of the zoo test's draw s (``torch.manual_seed(s)`` before building the model, the
output's gradient weights from seed 1 + s), so a failing draw of the test can be looked at call by call. On a CPU
fuse_attn's kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` is set before triton loads).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from tabulate import tabulate
from torch.nn.attention import SDPBackend, sdpa_kernel

# before triton loads (importing torch does not load it): CPU tensors then run the kernels in the interpreter
os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
# the generated kernels, not whichever SDPA kernel the tuner would time faster (SDPA's backends get rows of their own)
os.environ.setdefault("FUSE_ATTN_CANDIDATES", "triton")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run as a script from a checkout: tests.support and tests.e2e
from fuse_attn.backend import fuse_attn_backend  # noqa: E402
from tests.support.interpreter_rounding import round_bf16_to_nearest_even  # noqa: E402
from tests.e2e.test_model_zoo import MODELS, first_tensor  # noqa: E402

round_bf16_to_nearest_even()  # on a CPU: the interpreter's bf16 rounding as the GPU's (tests/support/interpreter_rounding.py)

GRADIENTS = ["dq", "dk", "dv", "dmask"]
SDPA_BACKENDS = {"sdpa math": SDPBackend.MATH, "sdpa efficient": SDPBackend.EFFICIENT_ATTENTION,
                 "sdpa flash": SDPBackend.FLASH_ATTENTION, "sdpa cudnn": SDPBackend.CUDNN_ATTENTION}


def captured_calls(name: str, seed: int, device: str) -> list[dict]:
    """Each SDPA call of one fp64 training step of the zoo model ``name`` (weights of draw ``seed``): its inputs,
    keyword arguments and the gradient of its output."""
    model_cls, config, inputs, _ = MODELS[name]()
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = model_cls(config).train(True).to(device, torch.bfloat16).double()  # the bf16 weights, in fp64
    inputs = {k: v.to(device, torch.float64) if v.is_floating_point() else v.to(device) for k, v in inputs.items()}
    calls, original = [], F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):
        out = original(q, k, v, attn_mask=attn_mask, **kwargs)
        call = dict(q=q.detach(), k=k.detach(), v=v.detach(), mask=None if attn_mask is None else attn_mask.detach(),
                    kwargs=kwargs)
        out.register_hook(lambda grad: call.__setitem__("dout", grad.detach()))
        calls.append(call)
        return out

    F.scaled_dot_product_attention = spy
    try:
        out = first_tensor(model(**inputs))
    finally:
        F.scaled_dot_product_attention = original
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1 + seed), dtype=torch.float64)
    (out * weights.to(out.device)).sum().backward()
    return [c for c in calls if "dout" in c]


def eager_math(q, k, v, attn_mask=None, scale=None, is_causal=False, dropout_p=0.0, enable_gqa=False):
    """Hugging Face's eager attention: scores and mask in the dtype, softmax in fp32 cast back, P @ V in the dtype."""
    if enable_gqa and k.shape[1] != q.shape[1]:
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], 1) for t in (k, v))
    s = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
    return torch.softmax(s.float(), -1).to(q.dtype) @ v


def _differentiable(call: dict) -> list[str]:
    """The captured inputs that get a gradient: q, k, v, and a float mask (a bool one has none)."""
    return ["q", "k", "v"] + (["mask"] if call["mask"] is not None and call["mask"].is_floating_point() else [])


def output_and_gradients(call: dict, attention, dtype: torch.dtype) -> list:
    """``attention`` on the call's inputs in ``dtype``: its output and the gradients of q, k, v and the mask (None
    where it has none) from the call's output gradient."""
    inputs = {n: call[n].clone().to(dtype).requires_grad_() for n in _differentiable(call)}
    out = attention(inputs["q"], inputs["k"], inputs["v"], attn_mask=inputs.get("mask", call["mask"]), **call["kwargs"])
    out.backward(call["dout"].to(dtype))
    return [out.detach()] + [inputs[n].grad if n in inputs else None for n in ["q", "k", "v", "mask"]]


def errors(call: dict, attention, dtype: torch.dtype, reference: list) -> list:
    """Max errors of the output and the gradients of ``attention`` on the call's inputs in ``dtype``."""
    return [None if a is None or r is None else float((a.double() - r).abs().max())
            for a, r in zip(output_and_gradients(call, attention, dtype), reference)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="t5-relative-bias", choices=list(MODELS))
    parser.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2, 3])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    fused = torch.compile(F.scaled_dot_product_attention, backend=fuse_attn_backend)
    rows = []
    for seed in args.seeds:
        for index, call in enumerate(captured_calls(args.model, seed, args.device)):
            reference = output_and_gradients(call, F.scaled_dot_product_attention, torch.float64)
            implementations = {"fuse_attn": fused, "eager math": eager_math}
            if args.device == "cpu":
                implementations["sdpa (cpu default)"] = F.scaled_dot_product_attention
            for label, backend in SDPA_BACKENDS.items():
                if args.device == "cuda" or backend == SDPBackend.MATH:
                    implementations[label] = _with_backend(backend)
            for label, attention in implementations.items():
                try:
                    found = errors(call, attention, dtype, reference)
                except RuntimeError as e:  # this backend does not run these inputs
                    if "No available kernel" not in str(e) and "not supported" not in str(e).lower():
                        raise
                    continue
                rows.append([seed, index, label] + ["-" if e is None else f"{e:.3g}" for e in found])
    print(f"{args.model}, {args.dtype} on {args.device}, torch {torch.__version__}: max error against fp64, per "
          "captured attention call")
    print(tabulate(rows, headers=["seed", "call", "implementation", "out"] + GRADIENTS, tablefmt="github"))
    return 0


def _with_backend(backend: SDPBackend):
    def attention(*args, **kwargs):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(*args, **kwargs)
    return attention


if __name__ == "__main__":
    sys.exit(main())
