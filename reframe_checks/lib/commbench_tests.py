"""What the commbench checks share (reframe_checks/commbench.py: the suite; reframe_checks/commbench_run.py:
what campaigns run): the build fixture `commbench_build`, the run test `CommbenchTest` (layout and sizes
from the site, records checked against the schema, metrics and references), the transport/op tables and
the metric definitions. A library, as hpctestlib: no test is registered here."""
import functools
import json
import os

import jsonschema
import reframe as rfm
import reframe.utility.sanity as sn
import reframe.utility.typecheck as typ
from reframe.core.builtins import fixture, run_after, run_before, sanity_function, variable
from reframe.core.exceptions import SanityError

from commcamp_checks import (DATA_ROOT, UnsafeVariableError, apply_site_environment, assert_job_ended, checked_words,
                             quoted, set_references)

from campaigns.model.spec import CAMPAIGN_ENVIRONS
from campaigns.model.vocabulary import (COLLECTIVE_OPS, METRICS, P2P_OPS, PAIR_OPS, PEER_TRANSPORTS,  # noqa: F401
                                        SINGLE_NODE_TRANSPORTS, SWEEP_METRICS, TRANSPORT_OPS, metric_value, op_kind)

BENCH_SRC = os.path.join(DATA_ROOT, 'bench_src')
RECORD_SCHEMA = os.path.join(BENCH_SRC, 'schema', 'commbench-record.schema.json')
RECORDS_FILE = 'commbench.jsonl'
BUILD_DIR = 'build'
SPACK_LINK = 'commbench'  # the Spack build links the installed binary into the stage directory

# commbench's exit codes (commbench --help)
EXIT_CODES = {1: 'data validation failed', 2: 'bad arguments', 3: 'timeout',
              4: 'runtime error or unsupported'}
EXIT_UNSUPPORTED = 4

# commbench's ops, transports and metric definitions: campaigns/model/vocabulary.py (its one home; tested
# against `commbench --list` of every backend built).
SWEEP_OPS = (*P2P_OPS, *COLLECTIVE_OPS)
HEALTH_OPS = ('pingpong', 'allreduce', 'alltoall')
# The ops a campaign may ask commbench_run for (campaigns.model.site.COMMBENCH_OPS must agree).
CAMPAIGN_OPS = ('pingpong', 'allreduce', 'alltoall', 'pingpong_bi', 'allgather', 'reduce_scatter', 'bcast',
                'sendrecv', 'pairmatrix')
# Pair matrix: the worst pair's one-way latency at the smallest size, one-way goodput and two-way
# (aggregate) goodput at the largest: name -> (direction, record field, size, worst of the pairs, unit).
PAIRMATRIX_METRICS = {
    'worst_pair_latency': ('uni', 'latency_us', min, max, 'us'),
    'worst_pair_goodput': ('uni', 'goodput_gbs', max, min, 'GB/s'),
    'worst_pair_bi_goodput': ('bi', 'aggregate_gbs', max, min, 'GB/s'),
}
# Host<->device copies (all ranks at once): name -> (host memory, record field, size, unit).
HOSTDEVICE_METRICS = {
    'small_latency': ('pinned', 'latency_us', min, 'us'),
    'pinned_goodput': ('pinned', 'goodput_gbs', max, 'GB/s'),
    'pageable_goodput': ('pageable', 'goodput_gbs', max, 'GB/s'),
}


@functools.lru_cache(maxsize=1)
def _record_validator():
    with open(RECORD_SCHEMA, encoding='utf-8') as stream:
        return jsonschema.Draft202012Validator(json.load(stream))


def sweep_metric(test, name):
    taken = metric_value(name, test.results())
    if taken is None:
        raise SanityError(f'{name}: no valid result to take it from')
    return taken


def pairmatrix_metric(test, name):
    direction, field, size_pick, worst, _ = PAIRMATRIX_METRICS[name]
    results = test.results(direction=direction)
    size = size_pick(r['bytes'] for r in results)
    return worst(r[field] for r in results if r['bytes'] == size), size


def check_pairs(results):
    '''Every pair of ranks that share a host, at every size, in both directions.'''
    hosts = results[0]['hostnames']
    expected = sorted((a, b) for a in range(len(hosts)) for b in range(a + 1, len(hosts)) if hosts[a] == hosts[b])
    for size in sorted({r['bytes'] for r in results}):
        for direction in ('uni', 'bi'):
            pairs = sorted((r['pair']['src'], r['pair']['dst']) for r in results
                           if r['bytes'] == size and r['direction'] == direction)
            sn.evaluate(sn.assert_eq(pairs, expected, msg=f'{size} B {direction}: measured pairs {{0}}, '
                                                          f'expected {{1}}'))


class commbench_build(rfm.CompileOnlyRegressionTest):
    '''Build commbench for the partition's backend: with CMake and the environment's MPI compiler, or
    (site `commbench.build: spack`) by installing the site's commbench spec in an environment made from the
    site's Spack environment (spack_env/<site>) in the stage directory.'''

    descr = 'Build commbench'
    build_system = 'CMake'
    sourcesdir = BENCH_SRC

    #: Parallel build jobs; default: the site's commbench.build_jobs.
    build_jobs = variable(int, type(None), value=None)

    @run_before('compile')
    def configure(self):
        site = self.current_partition.extras['commbench']
        jobs = self.build_jobs or site.get('build_jobs', 2)
        if site.get('build') == 'spack':
            # Only the site's commbench spec, in a commbench-only environment made from the site's (its packages,
            # externals, concretizer; spack_env/spack_check.py: commbench_environment) in the stage directory, built
            # from the stage's copy of bench_src: spack.lock, .spack-env/ and Spack's build directory go to the
            # stage, never to the site's environment or the shipped sources (an installed commcamp's install tree),
            # and neither commcamp itself nor the reference benchmarks of the site's environment are installed.
            import importlib.util
            import sys

            import yaml
            spack_check = sys.modules.get('_commcamp_spack_check')  # the name campaigns.model.site loads it as
            if spack_check is None:
                loaded = importlib.util.spec_from_file_location(
                    '_commcamp_spack_check', os.path.join(DATA_ROOT, 'spack_env', 'spack_check.py'))
                spack_check = importlib.util.module_from_spec(loaded)
                sys.modules['_commcamp_spack_check'] = spack_check  # its dataclasses look their module up there
                loaded.loader.exec_module(spack_check)
            env_name = 'commbench-spack-env'  # relative: the build script runs in the stage directory
            env_dir = os.path.join(self.stagedir, env_name)
            os.makedirs(env_dir, exist_ok=True)
            with open(os.path.join(env_dir, 'spack.yaml'), 'w', encoding='utf-8') as stream:
                yaml.safe_dump(spack_check.commbench_environment(
                    os.path.join(DATA_ROOT, site['spack_env'], 'spack.yaml'), '..'), stream, sort_keys=False)
            self.build_system = 'Spack'
            self.build_system.environment = env_name
            self.build_system.specs = [site['spack_spec']]  # `spack -e ENV add SPEC`, then `spack -e ENV install`
            self.build_system.install_opts = ['--fail-fast', '-j', str(jobs)]
            self.postbuild_cmds = [f'ln -sf "$(spack -e {env_name} location -i {site["spack_spec"]})/bin/commbench" '
                                   f'{SPACK_LINK}']
            return
        self.build_system.builddir = BUILD_DIR
        self.build_system.config_opts = [f'-DCOMMBENCH_BACKEND={site["backend"]}', '-DCMAKE_BUILD_TYPE=Release',
                                         *site.get('cmake_options', [])]
        self.build_system.max_concurrency = jobs

    @property
    def commbench_path(self):
        if self.current_partition.extras['commbench'].get('build') == 'spack':
            return os.path.join(self.stagedir, SPACK_LINK)
        return os.path.join(self.stagedir, BUILD_DIR, 'commbench')

    @sanity_function
    def built(self):
        return sn.assert_true(os.access(self.commbench_path, os.X_OK), msg=f'no executable {self.commbench_path}')


class CommbenchTest(rfm.RunOnlyRegressionTest):
    '''One commbench run on the partition: layout and sizes from the site, records checked, metrics and
    references. Subclasses set the parameters, `metrics()`, `size_set()` and `metric_at()`.'''

    # '+mpi -gpu_aware_mpi': campaigns.model.spec holds it, so campaign specs default to and accept the same
    # environments (environments with the feature gpu_aware_mpi exist for commbench_gpu_aware_mpi alone).
    valid_prog_environs = [CAMPAIGN_ENVIRONS]
    sourcesdir = None
    keep_files = [RECORDS_FILE]
    commbench = fixture(commbench_build, scope='environment')

    #: Explicit message sizes; when set, replaces the site's size set and min/max/step_factor.
    sizes = variable(typ.List[int], value=[])
    #: Sizes min_bytes, min_bytes*step_factor, ... <= max_bytes instead of the site's size set
    #: (one left unset takes commbench's default).
    min_bytes = variable(int, type(None), value=None)
    max_bytes = variable(int, type(None), value=None)
    step_factor = variable(int, type(None), value=None)
    warmup = variable(int, value=5)
    iters = variable(int, value=20)
    #: Operations per sample (commbench --batch; 1 = per-operation latency).
    batch = variable(int, value=1)
    #: commbench's watchdog (seconds): the longest one step (setup, one size of one op) may take.
    bench_timeout = variable(int, value=120)
    #: The whole job's limit (ReFrame's variable; -S time_limit=5m).
    time_limit = '10m'
    check_data = variable(typ.Bool, value=True)
    #: More commbench options, e.g. `-S extra_args=--peer,1`.
    extra_args = variable(typ.List[str], value=[])
    #: Apply the site's knob defaults (site.yaml knobs.defaults) under env_vars.
    knob_defaults = variable(typ.Bool, value=True)
    #: The test's environment makes a transport work that the site lists under expect_unsupported
    #: (commbench_gpu_aware_mpi: a GPU-built UCX under an MPI that is not GPU-aware).
    overrides_expect_unsupported = False
    #: Set by the check (perflog column): the message size each performance variable was taken at.
    metric_bytes = variable(str, value='')
    #: A campaign spec's own references (JSON list, site.yaml's reference format), judged before the site's.
    campaign_references = variable(str, value='')

    def size_set(self):
        '''Name of the site's size set this test uses when no sizes are given.'''
        raise NotImplementedError

    def metrics(self):
        '''Performance variable name -> unit.'''
        raise NotImplementedError

    def metric_at(self, name):
        '''(value, message size) of performance variable `name`.'''
        raise NotImplementedError

    def check_results(self, results):
        '''More sanity on the result records (pairs, host memory kinds).'''

    @property
    def site(self):
        return self.current_partition.extras['commbench']

    @run_after('init')
    def set_perf_variables(self):
        self.perf_variables = {name: sn.make_performance_function(self._metric, unit, name)
                               for name, unit in self.metrics().items()}

    def ranks_per_node(self):
        if self.op in PAIR_OPS:
            return 2 // self.num_nodes
        return self.num_tasks_per_node or self.site['tasks_per_node']

    @run_after('setup')
    def set_layout(self):
        extras, site = self.current_partition.extras, self.site
        where = self.current_partition.fullname
        if not self.transport:
            self.transport = site['default_transport']
        self.skip_if(self.num_nodes > extras['nodes'],
                     f'{where} has {extras["nodes"]} node(s), the test needs {self.num_nodes}')
        self.skip_if(self.transport not in site['transports'],
                     f'{where} offers the transports {site["transports"]}, not {self.transport!r}')
        self.skip_if(self.op not in TRANSPORT_OPS[self.transport],
                     f'transport {self.transport} has no op {self.op}')
        self.skip_if(self.transport in SINGLE_NODE_TRANSPORTS and self.num_nodes > 1,
                     f'transport {self.transport} connects the ranks of one node only')
        self.num_tasks_per_node = self.ranks_per_node()
        self.num_tasks = self.num_nodes * self.num_tasks_per_node
        self.num_gpus_per_node = extras['gpus_per_node']
        self.expect_unsupported = (self.transport in site.get('expect_unsupported', {})
                                   and not self.overrides_expect_unsupported)
        if self.expect_unsupported:
            self.perf_variables = {}
        apply_site_environment(self, site.get('job_options', []), site.get('launcher_options', []))

    def size_options(self):
        if self.sizes:
            return ['--sizes', ','.join(str(size) for size in self.sizes)]
        given = {'--min-bytes': self.min_bytes, '--max-bytes': self.max_bytes, '--step-factor': self.step_factor}
        if any(value is not None for value in given.values()):
            return [word for option, value in given.items() if value is not None for word in (option, str(value))]
        sizes = self.site['sizes'][self.size_set()]
        if sizes.get('sizes'):
            return ['--sizes', ','.join(str(size) for size in sizes['sizes'])]
        return ['--min-bytes', str(sizes['min_bytes']), '--max-bytes', str(sizes['max_bytes']),
                '--step-factor', str(sizes['step_factor'])]

    @run_after('setup')
    def check_variables(self):
        '''Numbers inside what commbench accepts, a known transport, options inside the catalog's whitelist.'''
        least = {'sizes': 0, 'min_bytes': 0, 'max_bytes': 0, 'step_factor': 2, 'warmup': 0, 'iters': 1, 'batch': 1,
                 'bench_timeout': 1}
        for name, low in least.items():
            value = getattr(self, name)
            for number in value if isinstance(value, list) else [] if value is None else [value]:
                if number < low:
                    raise UnsafeVariableError(f'{name}: {number} is below {low}')
        if self.transport not in TRANSPORT_OPS:
            raise UnsafeVariableError(f'transport: {self.transport!r} is not one of {sorted(TRANSPORT_OPS)}')
        checked_words(self.extra_args, 'extra_args')

    @run_before('run')
    def set_command(self):
        self.executable = quoted([self.commbench.commbench_path])[0]
        self.executable_opts = quoted([
            '--op', self.op, '--transport', self.transport, *self.size_options(), '--warmup', str(self.warmup),
            '--iters', str(self.iters), '--batch', str(self.batch), '--timeout', str(self.bench_timeout),
            '--check' if self.check_data else '--no-check', '--output', RECORDS_FILE, *self.extra_args])

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

    def results(self, **match):
        '''Result records whose fields equal `match`.'''
        return [r for r in self.records() if r['kind'] == 'result' and all(r.get(k) == v for k, v in match.items())]

    def exit_meanings(self):
        '''EXIT_CODES, but exit 1 without a record of wrong data is not commbench's validation: MPI start-up or
        the launcher failed (an unknown OMPI_MCA_btl exits 1 before commbench writes anything).'''
        if self.job.exitcode != 1:
            return EXIT_CODES
        try:
            wrong = any(record.get('valid') is False for record in self.records())
        except SanityError:  # no records file, or a malformed one: validate_records says so
            wrong = False
        return EXIT_CODES if wrong else {
            **EXIT_CODES, 1: 'no record reports wrong data: the launcher or MPI start-up failed, see the job\'s '
                             'standard error'}

    @sanity_function
    def validate_records(self):
        assert_job_ended(self, 'commbench', EXIT_UNSUPPORTED if self.expect_unsupported else 0, self.exit_meanings())
        records = self.records()
        sn.evaluate(sn.assert_true(records, msg=f'{RECORDS_FILE} has no records'))
        for number, record in enumerate(records, start=1):
            where = f'{RECORDS_FILE} record {number}'
            if self.expect_unsupported:
                sn.evaluate(sn.assert_eq(record.get('reason'), 'unsupported',
                                         msg=f'{where}: expected an unsupported error record, got reason {{0}} '
                                             f'(kind {record["kind"]})'))
                continue
            sn.evaluate(sn.assert_eq(record['kind'], 'result', msg=f'{where}: kind is {{0}}: {record.get("error")}'))
            sn.evaluate(sn.assert_true(record['valid'], msg=f'{where}: valid is false '
                                                             f'({record.get("wrong_elements")} wrong elements)'))
            sn.evaluate(sn.assert_eq(record['op'], self.op, msg=f'{where}: op {{0}}, expected {{1}}'))
            sn.evaluate(sn.assert_eq(record['ranks'], self.num_tasks, msg=f'{where}: {{0}} ranks, expected {{1}}'))
            sn.evaluate(sn.assert_eq(len(set(record['hostnames'])), self.num_nodes,
                                     msg=f'{where}: ranks ran on {{0}} distinct hosts, expected {{1}}'))
        if not self.expect_unsupported:
            self.check_results(self.results())
        return True

    def _metric(self, name):
        return self.metric_at(name)[0]

    @run_before('performance')
    def set_references(self):
        if self.expect_unsupported or self.is_dry_run():
            return
        set_references(self, self.site.get('references', []), op=self.op, transport=self.transport,
                       nodes=self.num_nodes, ranks=self.num_tasks, environ=self.current_environ.name)


class CommbenchOpTest(CommbenchTest):
    '''One op over a range of sizes; latency at the smallest size that moves data, bandwidths at the largest.'''

    def metrics(self):
        return {name: METRICS[name].unit for name in SWEEP_METRICS}

    def metric_at(self, name):
        return sweep_metric(self, name)
