# The call that measured variants_old / variants_new (device tool, one H100): the sixth session's package from a copy
# (.gpu/run_old.py there is benchmarks/2026-11-26-batch-shared-bias/run_old.py), then this one with the peers.
source .gpu/setup.sh
export PYTHONWARNINGS=ignore
o() { FUSE_ATTN_CACHE_DIR=/tmp/c_old TORCHINDUCTOR_CACHE_DIR=/tmp/ind_old timeout 250 python3 .gpu/run_old.py tools/bench_variants.py "$@"; }
n() { FUSE_ATTN_CACHE_DIR=/tmp/c_new TORCHINDUCTOR_CACHE_DIR=/tmp/ind_new timeout 300 python3 tools/bench_variants.py "$@"; }
o --variants softcap_causal_d256 --methods fuse_attn --out $OUT/old > $OUT/old_softcap.log 2>&1; grep "^|" $OUT/old_softcap.log
o --variants gqa_causal --heads 16 --head-dim 256 --methods fuse_attn --out $OUT/old > $OUT/old_gqa.log 2>&1; grep "^|" $OUT/old_gqa.log
n --check --variants softcap_causal_d256 --methods fuse_attn flex torch_compile --out $OUT/new > $OUT/new_softcap.log 2>&1; grep "^check\|^|" $OUT/new_softcap.log
n --variants gqa_causal --heads 16 --head-dim 256 --methods fuse_attn cudnn flex --out $OUT/new > $OUT/new_gqa.log 2>&1; grep "^|" $OUT/new_gqa.log
