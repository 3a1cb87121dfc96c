source .gpu/setup.sh
mkdir -p $OUT
FUSE_ATTN_CANDIDATES=triton,gluon timeout 330 python3 tools/bench_variants.py --variants window_causal padding_causal alibi_from_slopes softcap_causal --methods fuse_attn flex --out $OUT/variants_b 2>&1 | tail -n 11
FUSE_ATTN_CANDIDATES=triton,gluon timeout 200 python3 tools/bench_variants.py --variants softcap_causal_d256 --methods fuse_attn flex torch_compile --out $OUT/variants_c 2>&1 | tail -n 4
