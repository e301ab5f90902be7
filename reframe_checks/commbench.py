"""ReFrame checks for commbench (bench_src/): one build per partition and environment (the fixture
`commbench_build`: CMake, or the site's Spack environment), shared by the run checks. The suite is this
file; `commbench_run`, what campaigns run, is reframe_checks/commbench_run.py (a file of its own: ReFrame
instantiates every variant of a file it loads, and a campaign or tuning trial needs only these); what
they share is reframe_checks/lib/commbench_tests.py.

| check | parameters | tags |
| --- | --- | --- |
| `commbench_sweep` | op x transport x size_range (health, small, large) x num_nodes | `health` (size_range=health: pingpong, allreduce, alltoall) or `characterize`; `p2p` / `collective` |
| `commbench_pairmatrix` | transport x num_nodes: every GPU/rank pair of each node, both directions | `health`, `matrix` |
| `commbench_hostdevice` | op (h2d, d2h): host<->device copies, pinned and pageable | `health`, `hostdevice` |
| `commbench_gpu_aware_mpi` | op (pingpong, pingpong_bi, sendrecv): transport mpi on device buffers in an environment with the feature `gpu_aware_mpi` | `gpu_aware_mpi`, `p2p` |
| `commbench_run` | op x num_nodes, transport a variable: what campaigns run (commcamp) | `campaign`; `p2p` / `collective` / `matrix` |

Everything site-specific comes from the partition (site_configs/<site>/site.yaml through
site_configs/reframe_site.py): its features say which transports and node counts it runs
(`commbench_<transport>`, `commbench_nodes_<n>`), and its `extras` carry the rest: `nodes`,
`gpus_per_node`, `knob_defaults` and `commbench` = {backend, build, cmake_options, transports,
default_transport, expect_unsupported, tasks_per_node, sizes (health, small, large, matrix,
hostdevice), launcher_options, job_options, references}. A transport the site lists under
`expect_unsupported` (e.g. GPU-aware MPI with an MPI that is not) must make commbench exit with code 4
and write only `unsupported` error records; anything else fails the test.

Sanity: the job ended normally with the expected exit code, every record of commbench.jsonl is valid
against bench_src/schema/commbench-record.schema.json and `valid`, for the test's op, with the expected
rank and host counts (pair matrix: every pair of every node in both directions; host<->device: both
host memory kinds at every size). Performance: `small_latency` (us, smallest size that moves data),
`large_goodput` and `large_busbw` (GB/s, largest size); pair matrix: the worst pair's latency, one-way
and two-way goodput; host<->device: latency, pinned and pageable goodput. References: the first
entry of the partition's `commbench.references` matching op, transport, node and rank count,
environment and the size a metric is taken at.

Variables (`-S [CHECK.]NAME=VALUE`): sizes (`-S sizes=8,1024`), or min_bytes/max_bytes/step_factor
(instead of the site's size set), warmup, iters, batch (commbench --batch), bench_timeout (commbench's
watchdog, s), time_limit (the job's, default 10m), check_data, extra_args (more commbench options,
`--peer,1`), knob_defaults (false: leave the site's knob defaults out), num_tasks_per_node
(collectives), transport (commbench_run; default: the site's default_transport), and ReFrame's
env_vars, the knobs. Values with commas or colons need the JSON form (the short form
NAME:VALUE,NAME:VALUE splits on both):

    -S env_vars='{"UCX_TLS":"tcp,sm,cuda_copy,cuda_ipc","NCCL_PROTO":"^LL128"}'

Every value that reaches the job script is checked first and shell-quoted there (`export
NCCL_PROTO='^LL128'`): env_vars naming a knob of the catalog (site_configs/knobs/catalog.yaml with the
site's overrides) must be inside its domain, not forbidden and not against a site pin; other variables
and extra_args may hold only the catalog's safe characters (letters, digits, _ . , : ^ / + = -). A bad
value fails the test case in setup with a message naming it. The site's knob defaults are applied under
env_vars: a variable given there wins.
"""
import os
import sys

import reframe as rfm
import reframe.utility.sanity as sn
from reframe.core.builtins import parameter, run_after, variable

# appended, not inserted first: ReFrame loads check files in its temp_sys_path, which pops by index
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'lib'))
from commbench_tests import (HEALTH_OPS, HOSTDEVICE_METRICS, P2P_OPS, PAIR_OPS, PAIRMATRIX_METRICS,  # noqa: E402
                             PEER_TRANSPORTS, SINGLE_NODE_TRANSPORTS, SWEEP_OPS, TRANSPORT_OPS, CommbenchOpTest,
                             CommbenchTest, check_pairs, op_kind, pairmatrix_metric)
from commcamp_checks import NODE_COUNTS, offered  # noqa: E402


@rfm.simple_test
class commbench_sweep(CommbenchOpTest):
    '''The suite's op sweeps: every op of every transport a partition offers, at the site's node
    counts; size_range `health` (pingpong, allreduce, alltoall on the site's health sizes) is the nightly
    set, `small` and `large` the characterisation.'''

    descr = 'commbench: one op of one transport over one size range'
    op = parameter(SWEEP_OPS)
    transport = parameter(offered(PEER_TRANSPORTS, lambda t: f'commbench_{t}'))
    size_range = parameter(['health', 'small', 'large'])
    num_nodes = parameter(offered(NODE_COUNTS, lambda n: f'commbench_nodes_{n}'))

    @run_after('init')
    def select(self):
        # Variants that cannot exist are dropped here (at init, skipping removes them from the run).
        self.skip_if(self.op not in TRANSPORT_OPS[self.transport], 'op not implemented by the transport')
        self.skip_if(self.op in PAIR_OPS and self.num_nodes > 2, 'a pair op runs on 1 or 2 nodes')
        self.skip_if(self.transport in SINGLE_NODE_TRANSPORTS and self.num_nodes > 1, 'single-node transport')
        self.skip_if(self.size_range == 'health' and self.op not in HEALTH_OPS, 'not a health op')
        self.valid_systems = [f'+commbench_{self.transport} +commbench_nodes_{self.num_nodes}']
        self.tags = {'health' if self.size_range == 'health' else 'characterize', op_kind(self.op)}

    def size_set(self):
        return self.size_range


@rfm.simple_test
class commbench_pairmatrix(CommbenchTest):
    '''Every pair of ranks (GPUs) within each node, one after the other, one way and both ways: the
    worst pair's latency and goodputs, so that one slow link shows.'''

    descr = 'commbench: pair matrix within each node'
    op = 'pairmatrix'
    transport = parameter(offered(PEER_TRANSPORTS, lambda t: f'commbench_{t}'))
    num_nodes = parameter(offered(NODE_COUNTS, lambda n: f'commbench_nodes_{n}'))

    @run_after('init')
    def select(self):
        self.skip_if(self.transport in SINGLE_NODE_TRANSPORTS and self.num_nodes > 1, 'single-node transport')
        self.valid_systems = [f'+commbench_{self.transport} +commbench_nodes_{self.num_nodes}']
        self.tags = {'health', 'matrix'}

    @run_after('setup')
    def need_pairs(self):
        self.skip_if(self.num_tasks_per_node < 2, 'a pair matrix needs 2 ranks per node')

    def size_set(self):
        return 'matrix'

    def metrics(self):
        return {name: spec[-1] for name, spec in PAIRMATRIX_METRICS.items()}

    def metric_at(self, name):
        return pairmatrix_metric(self, name)

    def check_results(self, results):
        check_pairs(results)


@rfm.simple_test
class commbench_hostdevice(CommbenchTest):
    '''Host<->device copies of every rank at once (one node, all GPUs), from pinned and from pageable
    host memory.'''

    descr = 'commbench: host<->device copies'
    valid_systems = ['+commbench_memcpy']
    op = parameter(['h2d', 'd2h'])
    transport = variable(str, value='memcpy')
    num_nodes = 1
    tags = {'health', 'hostdevice'}

    def size_set(self):
        return 'hostdevice'

    def metrics(self):
        return {name: spec[-1] for name, spec in HOSTDEVICE_METRICS.items()}

    def metric_at(self, name):
        memory, field, pick, _ = HOSTDEVICE_METRICS[name]
        results = self.results(host_memory=memory)
        moving = [r for r in results if r['bytes'] > 0] or results
        size = pick(r['bytes'] for r in moving)
        return next(r[field] for r in moving if r['bytes'] == size), size

    def check_results(self, results):
        for size in sorted({r['bytes'] for r in results}):
            kinds = sorted(r['host_memory'] for r in results if r['bytes'] == size)
            sn.evaluate(sn.assert_eq(kinds, ['pageable', 'pinned'], msg=f'{size} B: host memory kinds {{0}}'))


@rfm.simple_test
class commbench_gpu_aware_mpi(CommbenchOpTest):
    '''GPU-aware MPI where the system MPI is not built for it: the mpi transport's point-to-point ops on
    device buffers, in an environment (feature `gpu_aware_mpi`; h200: openmpi-ucx-cuda) that puts a
    GPU-built UCX under the MPI (bench_src/scripts/ucx-cuda.sh). commbench still refuses that MPI's
    collectives (`unsupported` records: its own collective code is not built for device memory), so
    only point-to-point runs here. Skipped where the environment's UCX_MODULE_DIR is no folder.'''

    descr = 'commbench: GPU-aware MPI point-to-point through a GPU-built UCX'
    valid_systems = ['+commbench_mpi']
    valid_prog_environs = ['+gpu_aware_mpi']
    op = parameter(P2P_OPS)
    transport = variable(str, value='mpi')
    num_nodes = 1
    extra_args = ['--assume-gpu-aware-mpi']
    overrides_expect_unsupported = True
    tags = {'gpu_aware_mpi', 'p2p'}

    @run_after('setup')
    def need_the_ucx(self):
        module_dir = os.path.expandvars(self.current_environ.env_vars.get('UCX_MODULE_DIR', ''))
        self.skip_if(not os.path.isdir(module_dir),
                     f'environment {self.current_environ.name}: UCX_MODULE_DIR {module_dir!r} is no folder '
                     f'(site_configs/h200/env.sh sets it up from COMMCAMP_UCX_CUDA, a libucx-cu13 wheel)')

    def size_set(self):
        return 'health'
