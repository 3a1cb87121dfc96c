# A list-scheduling model of the dK/dV / dQ grids (BENCHMARKS.md, 2026-11-26 sixth session): programs start in id
# order on the first free SM slot; makespan in tiles against a perfectly packed schedule, per launch order.
import heapq
def makespan(jobs, sms=132, per_sm=1):
    slots = [0.0] * (sms * per_sm)
    heapq.heapify(slots)
    end = 0
    for j in jobs:  # per_sm programs share an SM: each runs per_sm times longer
        t = heapq.heappop(slots); heapq.heappush(slots, t + j * per_sm); end = max(end, t + j * per_sm)
    return end
def jobs(heads, kbs, G, order):
    work = lambda kb: (64 - 2 * kb) * G
    if order == "block-fastest":
        return [work(kb) for h in range(heads) for kb in range(kbs)]
    if order == "head-fastest":
        return [work(kb) for kb in range(kbs) for h in range(heads)]
    if order.startswith("groups"):
        S = int(order[6:])
        return [work(kb) for g0 in range(0, heads, S) for kb in range(kbs) for h in range(g0, min(heads, g0 + S))]
for name, heads, G in [("GQA 2x8 kv heads, G4", 16, 4), ("MHA 64 heads", 64, 1)]:
    total = sum(jobs(heads, 32, G, "block-fastest"))
    print(name, "ideal", total / 132)
    for order in ["block-fastest", "head-fastest", "groups4", "groups8", "groups16"]:
        print("  ", order, round(makespan(jobs(heads, 32, G, order)), 1), round(makespan(jobs(heads, 32, G, order), per_sm=2), 1), "(one / two programs per SM)")
print("dQ / forward, causal, work = qb + 1 (reversed per head)")
def qjobs(heads, qbs, order):
    work = lambda b: qbs - b  # reversed: block index b -> query block qbs-1-b
    if order == "block-fastest":
        return [work(b) for h in range(heads) for b in range(qbs)]
    S = int(order[6:])
    return [work(b) for g0 in range(0, heads, S) for b in range(qbs) for h in range(g0, min(heads, g0 + S))]
for heads, qbs in [(64, 32), (64, 64), (16*8, 16), (2*32, 32)]:
    total = sum(qjobs(heads, qbs, "block-fastest"))
    for per_sm in (1, 2):
        print(heads, qbs, per_sm, "ideal", round(total / 132, 1), {o: round(makespan(qjobs(heads, qbs, o), per_sm=per_sm), 1) for o in ["block-fastest", "groups4", "groups8", "groups16"]})
