import os, sys, copy  # python diag.py MODEL ATTENTION DRAWS: per-parameter mean max error of fuse_attn (interpreter on a CPU), eager and torch.compile against fp64
os.environ.setdefault("TRITON_INTERPRET", "1"); os.environ.setdefault("FUSE_ATTN_CANDIDATES", "triton")
sys.path[:0] = ["/work/main/tests", "/work/main"]
from interpreter_rounding import round_bf16_to_nearest_even; round_bf16_to_nearest_even()
import torch, transformers as T
import fuse_attn
from test_model_zoo import MODELS, first_tensor, max_error
name = sys.argv[1]; attention = sys.argv[2]; nseeds = int(sys.argv[3])
dev = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.bfloat16
model_cls, config, inputs, L = MODELS[name]()
config._attn_implementation = attention
def weights(seed):
    torch.manual_seed(seed); return model_cls(config).to(dev, dtype).state_dict()
seeds = range(nseeds)
states = [weights(s) for s in seeds]
torch.manual_seed(0)
model = model_cls(config).train(True).to(dev, dtype)
inputs = {k: v.to(dev, dtype) if v.is_floating_point() else v.to(dev) for k, v in inputs.items()}
ref_model = copy.deepcopy(model).double()
eager_m = copy.deepcopy(model); comp_m = copy.deepcopy(model)
def run(module, call, cast):
    res = []
    for seed, st in zip(seeds, states):
        module.load_state_dict(st); module.zero_grad(set_to_none=True)
        out = first_tensor(call(**{k: cast(v) for k, v in inputs.items()}))
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1 + seed), dtype=torch.float64)
        (out * g.to(out.device, out.dtype)).sum().backward()
        res.append((out.detach(), {n: p.grad for n, p in module.named_parameters()}))
    return res
same = lambda v: v
rc = torch._inductor.config.patch(emulate_precision_casts=True)
torch._dynamo.reset()
with rc:
    ours = run(model, torch.compile(model, backend="fuse_attn"), same)
ref = run(ref_model, ref_model, lambda v: v.double() if v.is_floating_point() else v)
torch._dynamo.reset()
with rc:
    eag = run(eager_m, eager_m, same)
    comp = run(comp_m, torch.compile(comp_m), same)
def errs(results, what):
    pick = (lambda r: r[0]) if what is None else (lambda r: r[1][what])
    return [max_error(pick(a), pick(r)) for a, r in zip(results, ref)]
rows = []
for what in [None] + [n for n, g in ref[0][1].items() if g is not None]:
    o, e, c = errs(ours, what), errs(eag, what), errs(comp, what)
    mo, me, mc = [sum(x)/len(x) for x in (o, e, c)]
    allowed = 2 * max(me, mc) + 8e-3
    rows.append((mo / allowed, what or "output", mo, me, mc, allowed))
rows.sort(reverse=True)
for r in rows[:int(os.environ.get("TOP", "8"))]:
    print(f"{r[0]:.2f} {r[1]:60s} ours {r[2]:.3g} eager {r[3]:.3g} compile {r[4]:.3g} allowed {r[5]:.3g}")
