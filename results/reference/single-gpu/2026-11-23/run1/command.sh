# The command sent to the device machine (run tool, kind nvidia-h100-x1, carry .device/gpu-helper),
# verbatim. .device/gpu-helper held: gpu.bundle (git bundle of branch gpu at f330e9f),
# nccl-tests/ (git archive of NVIDIA/nccl-tests v2.19.6, a0b82b2260cf5152b9f8c061bbf7eaf0ba096432) and
# libucx_cu13-1.22.0-py3-none-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl (pip download --no-deps).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
W=$PWD/.device/gpu-helper; [ -f $W/gpu.bundle ] || { echo NO-BUNDLE; exit 9; }
N=/tmp/nt-out; mkdir -p $N; D=$OUT/device.txt
{ date -u; hostname; uname -r; nvidia-smi; nvidia-smi -q | grep -iE 'compute mode|driver version|cuda version|product name|mig mode' ; command -v nvidia-cuda-mps-control git nvcc mpirun; ls /usr/local/nvidia/bin; mpirun --version | head -1; ompi_info | grep -iE 'cuda|ucx' ; dpkg -l | grep -iE 'ucx|nccl|openmpi' | awk '{print $2,$3}'; } > $D 2>&1
(cd $W/nccl-tests && nice -n 19 make -C src -j6 NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90 NCCL_HOME=/usr BUILDDIR=/tmp/nt /tmp/nt/all_reduce_perf /tmp/nt/sendrecv_perf > $N/build.log 2>&1; echo "build rc=$?" >> $N/build.log) &
B=$!
git clone -q -b gpu $W/gpu.bundle /tmp/cc && cd /tmp/cc && echo "fresh clone at $(git log --oneline -1)" >> $D || { echo "no clone" >> $D; cat $D; exit 8; }
UCX_CUDA=$(ls $W/libucx_cu13-*.whl) timeout 470 bench_src/scripts/single-gpu.sh /tmp/sg > /dev/null 2>&1; echo "single-gpu rc=$?" >> $D
cp /tmp/sg/single-gpu.log /tmp/sg/single-gpu.tar.gz $OUT/
wait $B; cd $N
if [ -x /tmp/nt/all_reduce_perf ]; then
 for t in all_reduce sendrecv; do timeout 60 /tmp/nt/${t}_perf -g 1 -b 8 -e 64M -f 4 -w 5 -n 20 -I 1 -J $N/${t}_perf-I.json > $N/${t}_perf-I.txt 2>&1; echo "$t -I rc=$?" >> $N/runs.txt; done
 timeout 60 /tmp/nt/all_reduce_perf -g 1 -b 8 -e 64M -f 4 -w 5 -n 20 -J $N/all_reduce_perf.json > $N/all_reduce_perf.txt 2>&1; echo "all_reduce rc=$?" >> $N/runs.txt
fi
tar -czf $OUT/nccl-tests.tar.gz -C /tmp nt-out
tail -5 $N/build.log; cat $N/runs.txt; cat /tmp/sg/summary.txt; tail -3 $D
