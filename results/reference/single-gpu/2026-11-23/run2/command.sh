# The command sent to the device machine (run tool, kind nvidia-h100-x1, carry .device/gpu-helper),
# verbatim. .device/gpu-helper held gpu.bundle (git bundle of branch gpu at 8755f1d) and
# libucx_cu13-1.22.0-py3-none-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl (pip download --no-deps).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
W=$PWD/.device/gpu-helper; [ -f $W/gpu.bundle ] || { echo NO-BUNDLE; exit 9; }
D=$OUT/device.txt
{ date -u; hostname; uname -r; nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,compute_mode --format=csv; mpirun --version | head -1; } > $D 2>&1
git clone -q -b gpu $W/gpu.bundle /tmp/cc && cd /tmp/cc && echo "fresh clone at $(git log --oneline -1)" >> $D || { echo "no clone" >> $D; cat $D; exit 8; }
UCX_CUDA=$(ls $W/libucx_cu13-*.whl) timeout 470 bench_src/scripts/single-gpu.sh /tmp/sg > /dev/null 2>&1; echo "single-gpu rc=$?" >> $D
cp /tmp/sg/single-gpu.log /tmp/sg/single-gpu.tar.gz $OUT/
head -25 /tmp/sg/summary.txt; grep -E "pingpong  |MPS server" /tmp/sg/single-gpu.log | head; cat $D
