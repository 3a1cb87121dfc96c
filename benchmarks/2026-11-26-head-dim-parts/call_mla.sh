source .gpu/setup.sh
export PYTHONWARNINGS=ignore FUSE_ATTN_CANDIDATES=triton
FUSE_ATTN_CACHE_DIR=/tmp/m_old timeout 110 python3 .gpu/run_old.py benchmarks/2026-11-26-head-dim-parts/mla.py padded 2>&1 | grep -v "^package" | grep "ours\|check\|failed" | grep -v "^check" 
FUSE_ATTN_CACHE_DIR=/tmp/m_new timeout 150 python3 benchmarks/2026-11-26-head-dim-parts/mla.py parts 2>&1 | grep "ours\|cuDNN\|check\|failed" | cut -c1-300
