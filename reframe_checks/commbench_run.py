"""`commbench_run`: what a campaign runs (commcamp run, the tuner's ReFrame executor): one op on some
nodes, the transport a variable. Variables, sanity, performance and references as in
reframe_checks/commbench.py (the suite), whose build fixture and base test it shares
(reframe_checks/lib/commbench_tests.py)."""
import os
import sys

import reframe as rfm
from reframe.core.builtins import parameter, run_after, variable

# appended, not inserted first: ReFrame loads check files in its temp_sys_path, which pops by index
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'lib'))
from commbench_tests import (CAMPAIGN_OPS, PAIR_OPS, PAIRMATRIX_METRICS, CommbenchOpTest,  # noqa: E402
                             check_pairs, op_kind, pairmatrix_metric, sweep_metric)
from commcamp_checks import node_counts_up_to_partition_size  # noqa: E402


@rfm.simple_test
class commbench_run(CommbenchOpTest):
    '''What a campaign runs (commcamp): one op on some nodes, the transport a variable. The node counts
    go up to the largest commbench partition of the system; smaller partitions skip the larger ones.'''

    descr = 'commbench: one op over a range of message sizes'
    valid_systems = ['+commbench']
    op = parameter(CAMPAIGN_OPS)
    num_nodes = parameter(node_counts_up_to_partition_size('commbench'))
    #: commbench --transport; default: the partition's default_transport.
    transport = variable(str, value='')
    iters = 50

    @run_after('init')
    def select(self):
        self.skip_if(self.op in PAIR_OPS and self.num_nodes > 2, 'a pair op runs on 1 or 2 nodes')
        self.tags = {'campaign', op_kind(self.op)}

    def size_set(self):
        return 'health'

    def metrics(self):
        if self.op == 'pairmatrix':
            return {name: spec[-1] for name, spec in PAIRMATRIX_METRICS.items()}
        return super().metrics()

    def metric_at(self, name):
        return (pairmatrix_metric if self.op == 'pairmatrix' else sweep_metric)(self, name)

    def check_results(self, results):
        if self.op == 'pairmatrix':
            check_pairs(results)
