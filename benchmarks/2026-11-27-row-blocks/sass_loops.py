"""Per backward-branch loop in the last SASS: size in instructions, HGMMAs, DEPBAR/wait, STL/LDL, BAR, SYNCS."""
import re, sys
lines=open(sys.argv[1] if len(sys.argv)>1 else '/tmp/gf/last.sass').read().splitlines()
ins=[]
for l in lines:
    m=re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?);',l)
    if m: ins.append((int(m.group(1),16),m.group(2).strip()))
addr={a:i for i,(a,t) in enumerate(ins)}
for i,(a,t) in enumerate(ins):
    m=re.search(r'BRA (0x[0-9a-f]+)',t)
    if m:
        tgt=int(m.group(1),16)
        if tgt<a and tgt in addr and (a-tgt)<0x6000 and (a-tgt)>0x400:
            body=[x for _,x in ins[addr[tgt]:i+1]]
            c=lambda k: sum(k in x for x in body)
            print(f"loop {hex(tgt)}-{hex(a)}: {len(body)} instrs, HGMMA {c('HGMMA')}, DEPBAR {c('DEPBAR')}, MUFU {c('MUFU')}, STL/LDL {c('STL')+c('LDL')}, BAR {c('BAR.')}, SYNCS {c('SYNCS')}, R2UR {c('R2UR')}")
