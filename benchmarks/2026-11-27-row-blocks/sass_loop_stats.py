"""Per loop of a SASS dump (cuobjdump -sass): instructions, HGMMAs, barriers, shared stores, TMA ops. python sass_loop_stats.py file.sass"""
import re, sys
from collections import Counter
sass=open(sys.argv[1]).read()
ins=[]
for l in sass.splitlines():
    m=re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?);',l)
    if m: ins.append((int(m.group(1),16),m.group(2).strip()))
addr={a:i for i,(a,t) in enumerate(ins)}
for i,(a,t) in enumerate(ins):
    m=re.search(r'BRA (0x[0-9a-f]+)',t)
    if m:
        tgt=int(m.group(1),16)
        if tgt<a and tgt in addr and 0x800<(a-tgt)<0x2400:
            body=[x for _,x in ins[addr[tgt]:i+1]]
            ops=Counter(x.split()[0] if not x.startswith("@") else x.split()[1] for x in body)
            mem={k:v for k,v in ops.items() if k.startswith(("STS","STSM","HGMMA","BAR","SYNCS","UTMA","WARPGROUP","LDL","STL","MUFU.EX2"))}
            print(f"  key-tile loop {hex(tgt)}-{hex(a)}: {len(body)} instructions", dict(sorted(mem.items())))
