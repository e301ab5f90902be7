"""Reference benchmarks the field compares against: NVIDIA nccl-tests (or AMD rccl-tests, same
binaries and output) and the OSU micro-benchmarks, run where the site provides them.

A partition offers one by its site.yaml `reference_benchmarks.nccl_tests` / `.osu` (features
`nccl_tests`, `nccl_tests_nodes_<n>`, `osu`, `osu_nodes_<n>`); the checks never build them. Where the
binaries come from is tried in order: the directory named by `dir_variable` (e.g. NCCL_TESTS_DIR; or
`default_dir`, repository-relative; the binary may sit in it or in its build/ or any subdirectory),
the site's `modules` (when the modules system has them), the Spack spec (`spack find` must know it).
When none has them the test case is skipped with the reason, naming what was tried.

| check | parameters | tags |
| --- | --- | --- |
| `nccl_tests_run` | benchmark (all_reduce_perf, all_gather_perf, alltoall_perf, sendrecv_perf) x num_nodes | `reference`, `collective` / `p2p`; all_reduce_perf also `health` |
| `osu_run` | benchmark (osu_latency, osu_bw, osu_allreduce, osu_alltoall) x num_nodes | `reference`, `p2p` / `collective` |

nccl-tests run one process per GPU (`-g 1`) with data checking (`-c 1`) after the site's `args`
(sizes, iterations). Sanity: exit code 0, no wrong elements, "Out of bounds values : 0 OK", one rank
line per task on the expected number of hosts, and the records below, every one valid. Performance:
`small_latency` (out-of-place time at the smallest size that moves data, us) and `large_busbw`
(out-of-place bus bandwidth at the largest size, GB/s).
OSU: the site's `args` (e.g. `-d cuda D D`, `-m 8:1048576`, `-c` for its data check); sanity: exit code 0,
the OSU table, and the records below, every one valid (no Fail in the Validation column of -c);
performance: osu_latency `small_latency`, osu_bw `large_bandwidth` (GB/s), collectives
`small_latency` and `large_latency` (us). Which benchmark reports which metric, and how each metric is
taken from the records below, is the vocabulary's (bench_src/schema/vocabulary.json), as for commbench:
the same number in a perflog, a health verdict and the report. References: the benchmark's `references`
in site.yaml.
Variables: extra_args (more benchmark options), knob_defaults, time_limit, and ReFrame's env_vars
(`-S env_vars='{"NCCL_ALGO":"Ring"}'`), as for the commbench checks.

Results: each check writes its output as commbench-schema records to commbench.jsonl (kept in its output
directory) through campaigns.formats.foreign.parse, the path `commcamp results ingest --format
nccl-tests|osu` reads the same output through (output it refuses fails sanity: nothing could be
stored); the hosts of OSU's ranks (OSU does not print them) are the job's nodes, num_tasks_per_node each,
in Slurm's block order. A campaign naming the check (`check: nccl_tests_run` / `osu_run` in its spec,
campaigns/model/spec.py) stores that file like commbench's own, and so does `commcamp results ingest`.
"""
import json
import os
import shlex
import shutil
import subprocess
import sys
from datetime import datetime, timezone

import reframe as rfm
import reframe.core.runtime as rt
import reframe.utility.sanity as sn
import reframe.utility.typecheck as typ
from reframe.core.exceptions import SanityError

from campaigns.formats import foreign, nccl_tests, osu  # the one parser of each format (checks, store, scripts)
from campaigns.model.spec import CAMPAIGN_ENVIRONS
from campaigns.model.vocabulary import METRICS, REFERENCE_CHECKS

# appended, not inserted first: ReFrame loads check files in its temp_sys_path, which pops by index
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'lib'))
from commbench_tests import RECORDS_FILE, sweep_metric  # noqa: E402
from commcamp_checks import (DATA_ROOT, NODE_COUNTS, apply_site_environment, assert_job_ended,  # noqa: E402
                             checked_words, offered, quoted, set_references, simple_test_if_offered)


def _find_binary(directory, binary):
    '''The executable `binary` in `directory` or below it (build trees, OSU's libexec layout), or None.'''
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        if binary in files and os.access(os.path.join(root, binary), os.X_OK):
            return os.path.join(root, binary)
    return None


class ReferenceBenchmarkTest(rfm.RunOnlyRegressionTest):
    '''A third-party benchmark binary the site provides, laid out like the commbench checks. Its benchmarks,
    the suite (site.yaml key, feature), which of them run on two ranks and the metrics each reports are the
    vocabulary's (bench_src/schema/vocabulary.json `reference_checks`), which campaigns read too.'''

    valid_prog_environs = [CAMPAIGN_ENVIRONS]  # as CommbenchTest (campaigns.model.spec: the one definition)
    sourcesdir = None
    time_limit = '10m'
    keep_files = [RECORDS_FILE]
    #: More options of the benchmark, after the site's `args`.
    extra_args = variable(typ.List[str], value=[])
    #: Apply the site's knob defaults (site.yaml knobs.defaults) under env_vars.
    knob_defaults = variable(typ.Bool, value=True)
    #: Set by the check (perflog column): the message size each performance variable was taken at.
    metric_bytes = variable(str, value='')
    #: A campaign spec's own references (JSON list, site.yaml's reference format), judged before the site's.
    campaign_references = variable(str, value='')
    #: The format of the benchmark's printed output (campaigns.formats.foreign.FORMATS).
    FORMAT = ''

    @classmethod
    def reference_check(cls):
        '''The vocabulary's entry of this check (by class name: ReFrame may derive classes from it).'''
        return next(REFERENCE_CHECKS[c.__name__] for c in cls.__mro__ if c.__name__ in REFERENCE_CHECKS)

    @run_after('init')
    def select(self):
        suite = self.reference_check().suite  # reference_benchmarks key in site.yaml (and feature name)
        self.valid_systems = [f'+{suite} +{suite}_nodes_{self.num_nodes}']
        self.skip_if(self.benchmark in self.reference_check().pair and self.num_nodes > 2, 'a pair test: 1 or 2 nodes')

    @property
    def site(self):
        return self.current_partition.extras['reference_benchmarks'][self.reference_check().suite]

    def fixed_args(self):
        '''Options the check itself needs (nccl-tests: one GPU per process, data check).'''
        return []

    @run_after('setup')
    def set_layout(self):
        extras = self.current_partition.extras
        commbench = extras.get('commbench', {})
        if self.benchmark in self.reference_check().pair:
            self.num_tasks_per_node = 2 // self.num_nodes
        else:
            self.num_tasks_per_node = (self.num_tasks_per_node or self.site.get('tasks_per_node')
                                       or commbench.get('tasks_per_node') or max(extras['gpus_per_node'], 1))
        self.num_tasks = self.num_nodes * self.num_tasks_per_node
        self.num_gpus_per_node = extras['gpus_per_node']
        self.locate()
        apply_site_environment(self, commbench.get('job_options', []), commbench.get('launcher_options', []))
        self.executable_opts = quoted([*self.site.get('args', []), *self.fixed_args(),
                                       *checked_words(self.extra_args, 'extra_args')])

    def locate(self):
        '''Point the test at the benchmark binary, or skip saying what was tried.'''
        site, binary, tried = self.site, self.benchmark, []
        variable_name = site.get('dir_variable')
        directory = os.environ.get(variable_name, '') if variable_name else ''
        if variable_name and not directory:
            tried.append(f'${variable_name} is not set')
        directory = directory or site.get('default_dir', '')
        if directory:
            directory = directory if os.path.isabs(directory) else os.path.join(DATA_ROOT, directory)
            path = _find_binary(directory, binary) if os.path.isdir(directory) else None
            if path:
                self.executable = quoted([path])[0]
                return
            tried.append(f'no executable {binary} in {directory}')
        modules = site.get('modules', [])
        if modules:
            modules_system = rt.runtime().modules_system
            missing = [m for m in modules if not modules_system.available_modules(m)]
            if not missing:
                self.modules = list(modules)
                self.executable = binary
                return
            tried.append(f'modules not available: {", ".join(missing)}')
        spec = site.get('spack_spec')
        if spec:
            if shutil.which('spack') is None:
                tried.append(f'spack is not on PATH (for {spec})')
            elif subprocess.run(['spack', 'find', spec], capture_output=True, check=False).returncode != 0:
                tried.append(f'spack find {spec} found nothing')
            else:
                self.prerun_cmds = [f'eval "$(spack load --sh {spec})"']
                self.executable = binary
                return
        self.skip(f'{site["package"]} is not available on {self.current_partition.fullname}: {"; ".join(tried)}')

    def output(self):
        path = os.path.join(self.stagedir, sn.evaluate(self.stdout))
        with open(path, encoding='utf-8', errors='replace') as stream:
            return stream.read()

    def results(self):
        '''The output as commbench-schema result records (module docstring; cached); SanityError if it does
        not parse.'''
        if not hasattr(self, '_records'):
            hosts = [node for node in self.job.nodelist or [] for _ in range(self.num_tasks_per_node)]
            try:
                # env_vars (shell-quoted by apply_site_environment): the knobs the job ran with, the site's
                # defaults under the case's own; the report tells curves of other knob settings apart by them
                env = {name: ''.join(shlex.split(value)) for name, value in self.env_vars.items()}
                self._records = foreign.parse(self.FORMAT, self.output(), source=self.benchmark,
                                              timestamp=datetime.now(timezone.utc), hostnames=hosts, env=env)
            except (nccl_tests.NcclTestsError, osu.OsuError) as exc:
                raise SanityError(str(exc)) from None
        return self._records

    @run_before('sanity')
    def write_records(self):
        '''The records in RECORDS_FILE, invalid ones too (as commbench writes its records of wrong data); an
        output that does not parse writes none, and sanity fails with the parser's reason (validate_records).'''
        if self.is_dry_run():
            return
        try:
            records = self.results()
        except SanityError:
            return
        with open(os.path.join(self.stagedir, RECORDS_FILE), 'w', encoding='utf-8') as stream:
            stream.writelines(json.dumps(record) + '\n' for record in records)

    def validate_records(self):
        '''Sanity of what is stored: the output parses into records (a parse error is a sanity error, so that
        an output nothing can be stored of never passes, with or without the performance check) and every
        record is valid: the benchmark's own data check passed at every size (OSU's Validation column with
        -c, nccl-tests' wrong elements). A metric is taken from valid records only: an invalid size would
        otherwise silently move it to another size.'''
        records = self.results()
        for record in records:
            size = record['source'].get('osu_size', record['bytes'])  # OSU's own size where the record's differs
            sn.evaluate(sn.assert_true(record['valid'], msg=f'{size} B: {self.benchmark}\'s data check failed'))
        return sn.assert_true(records, msg='no result in the output')

    def metrics(self):
        '''Performance variable name -> unit: what the vocabulary says this benchmark reports.'''
        return {name: METRICS[name].unit for name in self.reference_check().benchmarks[self.benchmark]}

    def metric_at(self, name):
        '''(value, message size) of `name`, taken from the records as commbench's (and health's) are.'''
        return sweep_metric(self, name)

    def _metric(self, name):
        return self.metric_at(name)[0]

    @run_after('init')
    def set_perf_variables(self):
        # A bound method, not a closure: ReFrame copies the test per partition and environment.
        self.perf_variables = {name: sn.make_performance_function(self._metric, unit, name)
                               for name, unit in self.metrics().items()}

    @run_before('performance')
    def set_references(self):
        if self.is_dry_run():
            return
        set_references(self, self.site.get('references', []), benchmark=self.benchmark, nodes=self.num_nodes,
                       ranks=self.num_tasks, environ=self.current_environ.name)


@simple_test_if_offered
class nccl_tests_run(ReferenceBenchmarkTest):
    '''nccl-tests (or rccl-tests): one binary over the site's size range.'''

    descr = 'nccl-tests / rccl-tests reference benchmark'
    benchmark = parameter(list(REFERENCE_CHECKS['nccl_tests_run'].benchmarks))
    num_nodes = parameter(offered(NODE_COUNTS, lambda n: f'nccl_tests_nodes_{n}'))
    FORMAT = 'nccl-tests'

    @run_after('init')
    def set_tags(self):
        kind = 'p2p' if self.benchmark == 'sendrecv_perf' else 'collective'
        self.tags = {'reference', kind} | ({'health'} if self.benchmark == 'all_reduce_perf' else set())

    def fixed_args(self):
        return ['-g', '1', '-c', '1']

    def parsed(self):
        try:
            return nccl_tests.parse_text(self.output(), self.benchmark)
        except nccl_tests.NcclTestsError as exc:
            raise SanityError(str(exc)) from None

    @sanity_function
    def validate_output(self):
        assert_job_ended(self, self.benchmark)
        run = self.parsed()
        hosts = run.hosts
        for row in run.rows:
            sn.evaluate(sn.assert_eq(row.out_of_place and row.out_of_place.wrong, 0,
                                     msg=f'{row.size} B: {{0}} wrong elements (out of place)'))
            sn.evaluate(sn.assert_in(row.in_place and row.in_place.wrong, (0, None),
                                     msg=f'{row.size} B: {{0}} wrong elements (in place)'))
        sn.evaluate(sn.assert_found(r'Out of bounds values\s*:\s*0\s+OK', self.stdout))
        sn.evaluate(self.validate_records())
        sn.evaluate(sn.assert_eq(len(hosts), self.num_tasks, msg='{0} ranks reported, expected {1}'))
        return sn.assert_eq(len(set(hosts)), self.num_nodes, msg='ranks ran on {0} distinct hosts, expected {1}')


@simple_test_if_offered
class osu_run(ReferenceBenchmarkTest):
    '''OSU micro-benchmarks: latency and bandwidth between two ranks, two collectives.'''

    descr = 'OSU micro-benchmarks reference benchmark'
    benchmark = parameter(list(REFERENCE_CHECKS['osu_run'].benchmarks))
    num_nodes = parameter(offered(NODE_COUNTS, lambda n: f'osu_nodes_{n}'))
    FORMAT = 'osu'

    @run_after('init')
    def set_tags(self):
        self.tags = {'reference', 'p2p' if self.benchmark in self.reference_check().pair else 'collective'}

    def parsed(self):
        try:
            return osu.parse_text(self.output(), self.benchmark)
        except osu.OsuError as exc:
            raise SanityError(str(exc)) from None

    @sanity_function
    def validate_output(self):
        assert_job_ended(self, self.benchmark)
        sn.evaluate(sn.assert_found(r'# OSU MPI', self.stdout, msg='no OSU banner in the output'))
        sn.evaluate(sn.assert_true(self.parsed().rows, msg='no size table in the output'))
        return self.validate_records()
