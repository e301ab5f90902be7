"""Running test cases through ReFrame: invocations (-S/-J per set of cases), streaming its output, reading its
report, ingesting each case's records."""
