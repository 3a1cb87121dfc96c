"""Shared by diag.py and variants.py: the zoo test's model in bf16 (weights of each draw), one training step per
draw, and the mean over draws of each parameter's max error against the fp64 model."""
import copy
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "tests"), ROOT]

import torch  # noqa: E402
from test_model_zoo import MODELS, first_tensor, max_error  # noqa: E402


class Draws:
    def __init__(self, name: str, attention: str, draws: int, device: str = "cpu", dtype=torch.bfloat16):
        model_cls, config, inputs, _ = MODELS[name]()
        config._attn_implementation = attention
        self.seeds = range(draws)
        self.states = []
        for seed in self.seeds:
            torch.manual_seed(seed)
            self.states.append(model_cls(config).to(device, dtype).state_dict())
        torch.manual_seed(0)
        self.model = model_cls(config).train(True).to(device, dtype)
        self.inputs = {k: v.to(device, dtype) if v.is_floating_point() else v.to(device) for k, v in inputs.items()}
        self.ref = self.run(copy.deepcopy(self.model).double(), None, lambda v: v.double() if v.is_floating_point() else v)

    def run(self, module, call=None, cast=lambda v: v):
        """[(output, {parameter: gradient})] of one step per draw, ``module`` holding that draw's weights and
        ``call`` (default: ``module``) running it; the output's gradient weights from seed 1 + draw, as the test."""
        results = []
        for seed, state in zip(self.seeds, self.states):
            module.load_state_dict(state)
            module.zero_grad(set_to_none=True)
            out = first_tensor((module if call is None else call)(**{k: cast(v) for k, v in self.inputs.items()}))
            g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1 + seed), dtype=torch.float64)
            (out * g.to(out.device, out.dtype)).sum().backward()
            results.append((out.detach(), {n: p.grad.clone() for n, p in module.named_parameters()}))
        return results

    def mean_error(self, results, what):
        """Mean over the draws of the max error against fp64 of the output (``what`` None) or a gradient."""
        pick = (lambda r: r[0]) if what is None else (lambda r: r[1][what])
        return sum(max_error(pick(a), pick(r)) for a, r in zip(results, self.ref)) / len(self.ref)

    def names(self):
        return [None] + [n for n, g in self.ref[0][1].items() if g is not None]
