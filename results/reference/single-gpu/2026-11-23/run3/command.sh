# The command sent to the device machine (run tool, kind nvidia-h100-x1, carry .device/gpu-helper): the
# lines of ../run2/command.sh, verbatim, with gpu.bundle now the git bundle of branch gpu at 8156e36, and
# this last line instead of run2's (it only chooses what is printed back):
head -16 /tmp/sg/summary.txt; tail -3 /tmp/sg/summary.txt; grep -E "pingpong  " /tmp/sg/single-gpu.log | head -12; cat $D
