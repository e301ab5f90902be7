"""ReFrame checks for commbench (bench_src/): one build per partition and environment, shared by the
run tests; one run test per (op, node count).

Everything site-specific comes from the partition's `extras` (site_configs/<site>/site.yaml):
`nodes`, `gpus_per_node`, and `commbench` = {backend, tasks_per_node, references}. Partitions offer the
test by having the feature `commbench`; environments by the feature `mpi`.

Variables (set with `-S [commbench_run.]NAME=VALUE`): min_bytes, max_bytes, step_factor, sizes
(overrides the range: `-S commbench_run.sizes=8,1024`), warmup, iters, bench_timeout (seconds),
check_data, transport, extra_args (more commbench options), time_limit (the job's, default 10m),
num_tasks_per_node (collectives; pingpong always runs 2 ranks), and the built-in env_vars: extra
environment variables of the run (communication knobs). Values with commas or colons need the JSON
form (the short form NAME:VALUE,NAME:VALUE splits on both):

    -S commbench_run.env_vars='{"UCX_TLS":"tcp,self","NCCL_PROTO":"^LL128"}'

As everywhere in ReFrame, each value lands in the job script as `export NAME=VALUE`, so it is a shell
word: quote what the shell must not split or expand, e.g. '{"X":"\'a b\'"}' (commcamp does this).
"""
import functools
import json
import os
import re

import jsonschema
import reframe as rfm
import reframe.utility.sanity as sn
import reframe.utility.typecheck as typ
from reframe.core.exceptions import SanityError

BENCH_SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'bench_src')
RECORD_SCHEMA = os.path.join(BENCH_SRC, 'schema', 'commbench-record.schema.json')
RECORDS_FILE = 'commbench.jsonl'
BUILD_DIR = 'build'

# commbench's exit codes (commbench --help)
EXIT_CODES = {1: 'data validation failed', 2: 'bad arguments', 3: 'timeout',
              4: 'runtime error or unsupported'}

# Job states that mean the job did not end normally. ReFrame treats them all as "completed", and a job
# killed at its time limit can still report exit code 0 (e.g. Slurm's jobcomp/filetxt log).
FAILED_JOB_STATES = {'BOOT_FAIL', 'CANCELLED', 'DEADLINE', 'FAILED', 'FAILURE', 'NODE_FAIL',
                     'OUT_OF_MEMORY', 'PREEMPTED', 'TIMEOUT'}

# Performance variables: name -> (record field, message size it is taken at, unit).
# small_latency: median time of one iteration at the smallest size; large_goodput: bytes / median
# time at the largest size; large_busbw: nccl-tests bus bandwidth at the largest size.
METRICS = {
    'small_latency': ('latency_us', min, 'us'),
    'large_goodput': ('goodput_gbs', max, 'GB/s'),
    'large_busbw': ('busbw_gbs', max, 'GB/s'),
}


@functools.lru_cache(maxsize=1)
def _record_validator():
    with open(RECORD_SCHEMA, encoding='utf-8') as stream:
        return jsonschema.Draft202012Validator(json.load(stream))


class commbench_build(rfm.CompileOnlyRegressionTest):
    '''Build commbench with CMake for the partition's backend, using the environment's MPI compiler.'''

    descr = 'Build commbench'
    build_system = 'CMake'
    sourcesdir = BENCH_SRC

    #: Parallel build jobs (`cmake --build -j`).
    build_jobs = variable(int, value=2)

    @run_before('compile')
    def configure(self):
        backend = self.current_partition.extras['commbench']['backend']
        self.build_system.builddir = BUILD_DIR
        self.build_system.config_opts = [f'-DCOMMBENCH_BACKEND={backend}',
                                         '-DCMAKE_BUILD_TYPE=Release']
        self.build_system.max_concurrency = self.build_jobs

    @property
    def commbench_path(self):
        return os.path.join(self.stagedir, BUILD_DIR, 'commbench')

    @sanity_function
    def built(self):
        return sn.assert_true(os.access(self.commbench_path, os.X_OK),
                              msg=f'no executable {self.commbench_path}')


@rfm.simple_test
class commbench_run(rfm.RunOnlyRegressionTest):
    '''Run commbench for one op on 1 or 2 nodes and check its JSON Lines records.'''

    descr = 'commbench: one op over a range of message sizes'
    valid_systems = ['+commbench']
    valid_prog_environs = ['+mpi']
    sourcesdir = None
    keep_files = [RECORDS_FILE]
    tags = {'health'}

    op = parameter(['pingpong', 'allreduce', 'alltoall'])
    num_nodes = parameter([1, 2])
    commbench = fixture(commbench_build, scope='environment')

    #: Message sizes (bytes) min_bytes, min_bytes*step_factor, ... <= max_bytes.
    min_bytes = variable(int, value=8)
    max_bytes = variable(int, value=1 << 20)
    step_factor = variable(int, value=4)
    #: Explicit message sizes; when set, replaces the range above.
    sizes = variable(typ.List[int], value=[])
    warmup = variable(int, value=5)
    iters = variable(int, value=50)
    #: commbench's watchdog (seconds): the longest one step (setup, one size of one op) may take.
    bench_timeout = variable(int, value=120)
    #: The whole job's limit (ReFrame's variable; -S commbench_run.time_limit=5m).
    time_limit = '10m'
    check_data = variable(typ.Bool, value=True)
    transport = variable(str, value='mpi')
    #: More commbench options, e.g. `-S commbench_run.extra_args=--peer,1`.
    extra_args = variable(typ.List[str], value=[])

    @run_after('init')
    def set_tags_and_metrics(self):
        self.tags = self.tags | {'p2p' if self.op == 'pingpong' else 'collective'}
        self.perf_variables = {name: sn.make_performance_function(self._metric, unit, name)
                               for name, (_, _, unit) in METRICS.items()}

    @run_after('setup')
    def set_layout(self):
        extras = self.current_partition.extras
        self.skip_if(self.num_nodes > extras['nodes'],
                     f'{self.current_partition.fullname} has {extras["nodes"]} node(s), '
                     f'the test needs {self.num_nodes}')
        if self.op == 'pingpong':
            self.num_tasks_per_node = 2 // self.num_nodes
        elif self.num_tasks_per_node is None:
            self.num_tasks_per_node = extras['commbench']['tasks_per_node']
        self.num_tasks = self.num_nodes * self.num_tasks_per_node
        self.num_gpus_per_node = extras['gpus_per_node']

    @run_before('run')
    def set_command(self):
        bad_names = [name for name in self.env_vars if not re.fullmatch(r'[A-Za-z_][A-Za-z0-9_]*', name)]
        if bad_names:
            raise ValueError(f'env_vars: invalid variable names {bad_names}')
        if self.sizes:
            size_opts = ['--sizes', ','.join(str(size) for size in self.sizes)]
        else:
            size_opts = ['--min-bytes', str(self.min_bytes), '--max-bytes', str(self.max_bytes),
                         '--step-factor', str(self.step_factor)]
        self.executable = self.commbench.commbench_path
        self.executable_opts = ['--op', self.op, '--transport', self.transport, *size_opts,
                                '--warmup', str(self.warmup), '--iters', str(self.iters),
                                '--timeout', str(self.bench_timeout),
                                '--check' if self.check_data else '--no-check', '--output', RECORDS_FILE,
                                *self.extra_args]

    def records(self):
        '''The run's records, each checked against the commbench record schema (cached).'''
        if not hasattr(self, '_records'):
            path = os.path.join(self.stagedir, RECORDS_FILE)
            if not os.path.isfile(path):
                raise SanityError(f'commbench wrote no {RECORDS_FILE}')
            records = []
            with open(path, encoding='utf-8') as stream:
                for number, line in enumerate(stream, start=1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except ValueError as exc:
                        raise SanityError(f'{RECORDS_FILE}:{number}: not JSON: {exc}') from None
                    error = jsonschema.exceptions.best_match(_record_validator().iter_errors(record))
                    if error is not None:
                        field = '.'.join(str(p) for p in error.absolute_path) or '(record)'
                        raise SanityError(f'{RECORDS_FILE}:{number}: {field}: {error.message}')
                    records.append(record)
            self._records = records
        return self._records

    def _record_at(self, pick):
        results = [r for r in self.records() if r['kind'] == 'result']
        size = pick(r['bytes'] for r in results)
        return next(r for r in results if r['bytes'] == size)

    @sanity_function
    def validate_records(self):
        states = set((self.job.state or '').split(','))
        sn.evaluate(sn.assert_not_in('TIMEOUT', states,
                                     msg=f'the job hit its time limit ({self.time_limit} s)'))
        exitcode = self.job.exitcode
        sn.evaluate(sn.assert_eq(
            exitcode, 0,
            msg=f'commbench exited with code {{0}} ({EXIT_CODES.get(exitcode, "unexpected")}), '
                f'expected {{1}}'))
        sn.evaluate(sn.assert_false(states & FAILED_JOB_STATES,
                                    msg=f'the job ended in state {self.job.state}'))
        records = self.records()
        sn.evaluate(sn.assert_true(records, msg=f'{RECORDS_FILE} has no records'))
        for number, record in enumerate(records, start=1):
            where = f'{RECORDS_FILE} record {number}'
            sn.evaluate(sn.assert_eq(record['kind'], 'result',
                                     msg=f'{where}: kind is {{0}}: {record.get("error")}'))
            sn.evaluate(sn.assert_true(record['valid'], msg=f'{where}: valid is false '
                                                             f'({record.get("wrong_elements")} wrong elements)'))
            sn.evaluate(sn.assert_eq(record['op'], self.op, msg=f'{where}: op {{0}}, expected {{1}}'))
            sn.evaluate(sn.assert_eq(record['ranks'], self.num_tasks,
                                     msg=f'{where}: {{0}} ranks, expected {{1}}'))
            sn.evaluate(sn.assert_eq(len(set(record['hostnames'])), self.num_nodes,
                                     msg=f'{where}: ranks ran on {{0}} distinct hosts, expected {{1}}'))
        return True

    def _metric(self, name):
        field, pick, _ = METRICS[name]
        return self._record_at(pick)[field]

    @run_before('performance')
    def set_references(self):
        '''For each metric, the first reference in the partition's extras that matches op, node count,
        environment and the message size the metric is taken at.'''
        references = self.current_partition.extras['commbench'].get('references', [])
        environ = self.current_environ.name
        table = {}
        for metric, (_, pick, unit) in METRICS.items():
            size = self._record_at(pick)['bytes']
            for ref in references:
                if (ref['op'] == self.op and ref['metric'] == metric and ref['bytes'] == size
                        and ref.get('nodes') in (None, self.num_nodes)
                        and ref.get('environ') in (None, environ)):
                    table[metric] = (ref['value'], ref.get('lower'), ref.get('upper'), unit)
                    break
        self.reference = {self.current_partition.fullname: table}
