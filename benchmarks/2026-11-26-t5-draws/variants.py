"""python variants.py DRAWS: T5's bf16 eager model (the zoo test's) with its attention computed three ways -- as
written ("eager"), scores and softmax in fp32 with P rounded for the PV matmul ("fp32", as flash kernels do), and
exactly ("ideal": fp64, rounded to bf16 only at the attention's output and input gradients) -- and each parameter's
mean max error against fp64 over the draws."""
import sys

from draws import Draws  # (puts tests/ and the repository on sys.path)
import torch
import transformers.models.t5.modeling_t5 as t5

written = t5.eager_attention_forward


def attention(kind):
    def forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, position_bias=None, **kw):
        if kind == "eager" or query.dtype == torch.float64:
            return written(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                           position_bias=position_bias, **kw)
        dt = query.dtype
        up = torch.float64 if kind == "ideal" else torch.float32
        s = torch.matmul(query.to(up), key.to(up).transpose(2, 3)) * scaling
        if position_bias is not None:
            s = s + position_bias.to(up)
        if attention_mask is not None:
            s = s + attention_mask.to(up)
        p = s.softmax(-1)
        o = torch.matmul(p, value.to(up)).to(dt) if kind == "ideal" else torch.matmul(p.to(dt), value)
        return o.transpose(1, 2).contiguous(), None
    return forward


d = Draws("t5-relative-bias", "eager", int(sys.argv[1]))
results = {}
for kind in ("eager", "fp32", "ideal"):
    t5.eager_attention_forward = attention(kind)
    results[kind] = d.run(d.model)
t5.eager_attention_forward = written
for what in d.names():
    print(f"{(what or 'output')[-50:]:50s}", " ".join(f"{k} {d.mean_error(v, what):.3g}" for k, v in results.items()))
