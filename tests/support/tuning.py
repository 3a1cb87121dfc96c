"""A fake GPU for the kernel tuner's tests (no GPU needed): three candidate configs with fixed timings, the device
identity and software versions the tuner sees, and the configs it timed. The ``machine`` fixture (tests/conftest.py)
installs a :class:`FakeMachine` into ``fuse_attn.kernels.tuning`` with an empty cache directory of its own."""

from __future__ import annotations

import torch

from fuse_attn.kernels import tuning
from fuse_attn.kernels.tuning import KernelConfig

CANDIDATES = [KernelConfig(64, 32, 4, 2), KernelConfig(128, 64, 8, 3), KernelConfig(128, 128, 8, 2)]
TIMES_MS = {CANDIDATES[0]: 0.3, CANDIDATES[1]: 0.1, CANDIDATES[2]: 0.2}
FASTEST = CANDIDATES[1]


class FakeMachine:
    """The GPU and software the tuner sees, and the configs it timed."""

    def __init__(self):
        self.gpu, self.capability, self.triton, self.torch = "Fake GPU 80GB", "9.0", "3.9.0", "2.13.0"
        self.timed = []
        self.failing = {}  # config -> the exception its launch raises
        self.retimed = []  # configs timed again (the second, longer pass over the first pass's fastest)
        self.second_pass_ms = {}  # config -> what its longer timing adds to its first-pass time

    def time_config(self, launch, cfg, rep_ms):
        launch(cfg)
        if rep_ms == tuning._FIRST_PASS_REP_MS:
            self.timed.append(cfg)
        else:
            self.retimed.append(cfg)
        return TIMES_MS[cfg] + self.second_pass_ms.get(cfg, 0.0) * (rep_ms != tuning._FIRST_PASS_REP_MS)

    def launch(self, cfg):
        if cfg in self.failing:
            raise self.failing[cfg]


def key(digest="spec0", m=1000, n=1000):
    return tuning.tuning_key("fwd", torch.device("cuda", 0), digest, torch.bfloat16, 64, 64, m, n)


def new_process(monkeypatch):
    """Forget what this process chose (the disk cache stays)."""
    monkeypatch.setattr(tuning, "_chosen", {})
    monkeypatch.setattr(tuning, "_ahead", {})
