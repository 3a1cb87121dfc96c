"""The loops of a SASS dump (cuobjdump -sass), one line each: its instructions and counts of the kinds that matter
here. Two views, as the session's logs were made:

    python sass_loops.py file.sass            (sass_loops.log: the forward; HGMMA, DEPBAR, MUFU, spills, BAR, SYNCS)
    python sass_loops.py file.sass --opcodes  (backward_loader_warp_sass.log: opcodes by name)
"""
import re
import sys
from collections import Counter


def instructions(path):
    """(address, text) of every instruction."""
    found = []
    for line in open(path).read().splitlines():
        m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?);', line)
        if m:
            found.append((int(m.group(1), 16), m.group(2).strip()))
    return found


def loops(ins, shortest, longest):
    """(start, end, body) of every backward branch spanning shortest..longest bytes."""
    at = {a: i for i, (a, _) in enumerate(ins)}
    for i, (a, t) in enumerate(ins):
        m = re.search(r'BRA (0x[0-9a-f]+)', t)
        if m:
            target = int(m.group(1), 16)
            if target < a and target in at and shortest < a - target < longest:
                yield target, a, [x for _, x in ins[at[target]:i + 1]]


if __name__ == "__main__":
    ins = instructions(sys.argv[1] if len(sys.argv) > 1 else "/tmp/gf/last.sass")
    if "--opcodes" in sys.argv:
        for start, end, body in loops(ins, 0x800, 0x2400):
            ops = Counter(x.split()[1] if x.startswith("@") else x.split()[0] for x in body)
            kept = {k: v for k, v in ops.items()
                    if k.startswith(("STS", "STSM", "HGMMA", "BAR", "SYNCS", "UTMA", "WARPGROUP", "LDL", "STL", "MUFU.EX2"))}
            print(f"  loop {hex(start)}-{hex(end)}: {len(body)} instructions", dict(sorted(kept.items())))
    else:
        for start, end, body in loops(ins, 0x400, 0x6000):
            c = lambda k: sum(k in x for x in body)  # noqa: E731
            print(f"loop {hex(start)}-{hex(end)}: {len(body)} instrs, HGMMA {c('HGMMA')}, DEPBAR {c('DEPBAR')}, "
                  f"MUFU {c('MUFU')}, STL/LDL {c('STL') + c('LDL')}, BAR {c('BAR.')}, SYNCS {c('SYNCS')}, R2UR {c('R2UR')}")
