source .gpu/setup.sh
for S in 4,16,4096,128 32,12,512,64; do
for v in new old; do
  if [ $v = new ]; then R="python3"; else R="python3 .gpu/run_old.py"; fi
  $R tools/profile_kernels.py --shape $S > $OUT/prof_${v}_$S.log 2>&1
  echo "=== $v $S"; grep "^bwd_dkdv\|^bwd_dq" $OUT/prof_${v}_$S.log | head -14 | cut -c1-80
done; done
