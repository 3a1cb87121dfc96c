import os, sys, copy  # python variants.py DRAWS: T5 bf16 eager model with its attention computed three ways, errors against fp64
sys.path[:0] = ["/work/main/tests", "/work/main"]
import torch, transformers as T
import transformers.models.t5.modeling_t5 as m
from torch import nn
from test_model_zoo import MODELS, first_tensor, max_error
orig = m.eager_attention_forward
def make(kind):
    def f(module, query, key, value, attention_mask, scaling=None, dropout=0.0, position_bias=None, **kw):
        if kind == "eager" or query.dtype == torch.float64:
            return orig(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, position_bias=position_bias, **kw)
        dt = query.dtype
        up = torch.float64 if kind == "ideal" else torch.float32
        s = torch.matmul(query.to(up), key.to(up).transpose(2, 3)) * scaling
        if position_bias is not None: s = s + position_bias.to(up)
        if attention_mask is not None: s = s + attention_mask.to(up)
        p = s.softmax(-1)
        if kind == "ideal":
            o = torch.matmul(p, value.to(up)).to(dt)
        else:  # fp32 scores/softmax; P rounded for the PV matmul (flash style)
            o = torch.matmul(p.to(dt), value)
        return o.transpose(1, 2).contiguous(), None
    return f
dev = "cpu"; dtype = torch.bfloat16
nseeds = int(sys.argv[1])
model_cls, config, inputs, L = MODELS["t5-relative-bias"]()
config._attn_implementation = "eager"
seeds = range(nseeds)
def weights(seed):
    torch.manual_seed(seed); return model_cls(config).to(dev, dtype).state_dict()
states = [weights(s) for s in seeds]
torch.manual_seed(0)
model = model_cls(config).train(True).to(dev, dtype)
ref_model = copy.deepcopy(model).double()
def run(module, cast):
    res = []
    for seed, st in zip(seeds, states):
        module.load_state_dict(st); module.zero_grad(set_to_none=True)
        out = first_tensor(module(**{k: cast(v) for k, v in inputs.items()}))
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1 + seed), dtype=torch.float64)
        (out * g.to(out.device, out.dtype)).sum().backward()
        res.append((out.detach(), {n: p.grad.clone() for n, p in module.named_parameters()}))
    return res
ref = run(ref_model, lambda v: v)
results = {}
for kind in ["eager", "fp32", "ideal"]:
    m.eager_attention_forward = make(kind)
    results[kind] = run(model, lambda v: v)
m.eager_attention_forward = orig
names = [None] + [n for n in ref[0][1]]
def merr(res, what):
    pick = (lambda r: r[0]) if what is None else (lambda r: r[1][what])
    return sum(max_error(pick(a), pick(r)) for a, r in zip(res, ref)) / len(ref)
for what in names:
    print(f"{(what or 'output')[-50:]:50s}", " ".join(f"{k} {merr(v, what):.3g}" for k, v in results.items()))
