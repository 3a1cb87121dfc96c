source .gpu/setup.sh
export PYTHONPATH=$PWD/tests:$PYTHONPATH
mkdir -p $OUT
{
for a in "64,64,4,3,2 1 300 1" "64,64,4,3,2 0 300 1" "64,64,4,3,2 1 1025 1" "64,64,3,3,2 1 300 1" "64,64,4,3,1 1 300 1" "64,64,4,2,2 1 300 1 128" "64,64,4,3,2 1 193 1" "64,64,4,3,2 1 384 1"; do
  timeout 60 python3 .gpu/v16/debug_one.py $a 2>&1 | grep -v Warn | tail -n 1
done
CS=$(which compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
echo "sanitizer: $CS"
[ -n "$CS" ] && timeout 120 $CS --print-limit 5 python3 .gpu/v16/debug_one.py 64,64,4,3,2 1 300 1 2>&1 | grep -v "^=========     " | head -n 40
} 2>&1 | tee $OUT/debug.log
timeout 420 python3 .gpu/v16/rb_ab.py 2>&1 | tee $OUT/rb_ab.log
