"""Simulate the forward's ring protocol (positions, releases) for a config; report deadlocks / reuse races."""
import sys, itertools
def cdiv(a, b): return -(-a // b)
def run(cfg, M, N, causal):
    BM, BN, ST, CONS, R = cfg
    n_blocks = cdiv(M, CONS * BM)
    grid = cdiv(n_blocks, R)
    for pid in range(grid):
        if causal:
            nb = 1 + (R == 2 and pid < n_blocks - 1 - pid)
            blocks = [(n_blocks - 1 - pid) + b * (pid - (n_blocks - 1 - pid)) for b in range(nb)]
        else:
            nb = min(n_blocks - pid * R, R); blocks = [pid * R + b for b in range(nb)]
        def tiles(row0, C):
            if causal:
                s = row0 + C * BM
                nt = cdiv(min(row0 + CONS * BM, N), BN); nm = cdiv(min(s + BM, N), BN)
            else:
                nt = nm = cdiv(N, BN)
            return nt, nm
        # event lists: consumer C: sequence of ('wait', pos) / ('hold', pos) / ('release', pos)
        progs = []
        for C in range(CONS):
            ev = []; first = 0
            for i, blk in enumerate(blocks):
                nt, nm = tiles(blk * CONS * BM, C)
                if i == 0: ev.append(('wait', 0))
                for j in range(1, nm):
                    ev.append(('wait', first + j)); ev.append(('release', first + j - 1))
                last = first + nm - 1
                if i + 1 < len(blocks):
                    for p in range(first + nm, first + nt): ev += [('wait', p), ('release', p)]
                    first += nt
                    ev.append(('wait', first)); ev.append(('release', last))
                else:
                    ev.append(('release', last))
                    for p in range(first + nm, first + nt): ev += [('wait', p), ('release', p)]
                    first += nt
            progs.append(ev)
        total = sum(tiles(b * CONS * BM, 0)[0] for b in blocks)
        loaded = 0; released = {}; idx = [0] * CONS; held = [set() for _ in range(CONS)]
        while True:
            moved = False
            # producer: load position `loaded` if position loaded-ST released by all
            if loaded < total and (loaded < ST or released.get(loaded - ST, 0) == CONS):
                loaded += 1; moved = True
            for C in range(CONS):
                if idx[C] < len(progs[C]):
                    op, p = progs[C][idx[C]]
                    if op == 'wait':
                        if p < loaded:
                            idx[C] += 1; moved = True; held[C].add(p)
                    else:
                        assert p in held[C], (cfg, M, pid, C, 'release of unheld', p)
                        held[C].discard(p); released[p] = released.get(p, 0) + 1; idx[C] += 1; moved = True
            if not moved: break
        if loaded < total or any(idx[C] < len(progs[C]) for C in range(CONS)):
            return f"DEADLOCK cfg={cfg} M={M} pid={pid} loaded={loaded}/{total} idx={idx} lens={[len(p) for p in progs]}"
        assert all(v == CONS for v in released.values()) and len(released) == total, (cfg, M, pid, released)
    return None
cfgs = [(64,64,3,3,2),(64,64,4,3,2),(64,128,3,3,2)]
for cfg in cfgs:
    for causal in (True, False):
        for M in list(range(1, 700, 7)) + [1024, 1025, 2049, 4096]:
            r = run(cfg, M, M, causal)
            if r: print(r); break
print("done")
