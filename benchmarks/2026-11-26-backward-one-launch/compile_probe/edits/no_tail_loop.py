def edit(t):
    start = t.index("            off_z, off_h, offs_n, M, N, causal_offset, qk_scale, part_lo, part_hi,")
    a = t.rindex("        dk, dv, dk_tail, dv_tail = _dkdv_loop(", 0, start)
    b = t.index("        )\n", start) + len("        )\n")
    return t[:a] + t[b:]
