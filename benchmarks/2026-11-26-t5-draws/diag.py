"""python diag.py MODEL ATTENTION DRAWS: per parameter, the mean over draws of the max error against fp64 of fuse_attn
(the kernels in Triton's interpreter on a CPU, with the GPU's bf16 rounding), eager and torch.compile, in bf16, as the
zoo test computes them; the TOP (default 8) parameters closest to the test's bound first."""
import copy
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("FUSE_ATTN_CANDIDATES", "triton")
import sys  # noqa: E402

from draws import Draws  # noqa: E402  (puts tests/ and the repository on sys.path)
from interpreter_rounding import round_bf16_to_nearest_even  # noqa: E402

round_bf16_to_nearest_even()
import torch  # noqa: E402

import fuse_attn  # noqa: E402,F401

d = Draws(sys.argv[1], sys.argv[2], int(sys.argv[3]))
emulate = torch._inductor.config.patch(emulate_precision_casts=True)
torch._dynamo.reset()
with emulate:
    ours = d.run(d.model, torch.compile(d.model, backend="fuse_attn"))
eager_model, compiled_model = copy.deepcopy(d.model), copy.deepcopy(d.model)
torch._dynamo.reset()
with emulate:
    eager = d.run(eager_model)
    compiled = d.run(compiled_model, torch.compile(compiled_model))
rows = []
for what in d.names():
    o, e, c = (d.mean_error(r, what) for r in (ours, eager, compiled))
    allowed = 2 * max(e, c) + 8e-3
    rows.append((o / allowed, what or "output", o, e, c, allowed))
for r in sorted(rows, reverse=True)[:int(os.environ.get("TOP", "8"))]:
    print(f"{r[0]:.2f} {r[1]:60s} ours {r[2]:.3g} eager {r[3]:.3g} compile {r[4]:.3g} allowed {r[5]:.3g}")
