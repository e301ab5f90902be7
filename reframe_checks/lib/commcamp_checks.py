"""What every commcamp ReFrame check shares: site data from the partition's extras, the site's job and
launcher options, the knob defaults under each test's env_vars, references, job-outcome sanity.

Not a check file: the check files (reframe_checks/*.py) put this directory on sys.path, and ReFrame
does not load it as a test file unless asked to recurse (`-R`), where it registers nothing.

Site data arrives through `site_configs/reframe_site.py` (partition extras and features); check code
holds no site-specific value.

Every value a check writes into a job script is validated first (knobs against the knob catalog of
tuners/catalog.py with the site's overrides, other variables and benchmark options against its
character whitelist) and shell-quoted: `-S env_vars=...` and `-S extra_args=...` cannot run commands.
"""
import functools
import json
import os
import shlex
import sys

import reframe as rfm
import reframe.core.runtime as rt
import reframe.utility.sanity as sn
from reframe.core.exceptions import ReframeError, ReframeFatalError

try:
    import tuners.catalog as knob_catalog
except ImportError:  # a ReFrame install without commcamp: the catalog of this checkout
    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    import tuners.catalog as knob_catalog

from campaigns.model.vocabulary import reference_matches

# commcamp's shipped folders (bench_src/, spack_env/, ...): $COMMCAMP_DATA, which commcamp sets for the ReFrame
# it starts (campaigns/paths.py), else the checkout these checks are in. Relative site paths resolve here.
DATA_ROOT = os.environ.get('COMMCAMP_DATA') or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

# The node counts the checks are parameterized with (campaigns.model.site.NODE_COUNTS must agree).
NODE_COUNTS = (1, 2, 3, 4, 8, 16, 32, 64, 128)

# Job states that mean the job did not end normally. ReFrame treats them all as "completed", and a job
# killed at its time limit can still report exit code 0 (e.g. Slurm's jobcomp/filetxt log).
FAILED_JOB_STATES = {'BOOT_FAIL', 'CANCELLED', 'DEADLINE', 'FAILED', 'FAILURE', 'NODE_FAIL',
                     'OUT_OF_MEMORY', 'PREEMPTED', 'TIMEOUT'}


class UnsafeVariableError(ReframeError):
    """A check variable (-S NAME=VALUE) would put something unsafe or out of domain into a job script
    (a ReframeError: the test case fails with this message, no traceback)."""


@functools.lru_cache(maxsize=8)
def _site_catalog(overrides_json):
    return knob_catalog.KnobCatalog.load().for_site(json.loads(overrides_json), "the site's knobs (site.yaml)")


def site_knob_catalog(partition):
    """The knob catalog with the overrides of the partition's site (extras `knob_overrides`)."""
    return _site_catalog(json.dumps(partition.extras.get('knob_overrides') or {}, sort_keys=True))


def checked_words(words, variable):
    """Command-line words from a check variable, each inside the catalog's character whitelist."""
    try:
        return [knob_catalog.check_safe_value(str(word), variable) for word in words]
    except knob_catalog.UnsafeValueError as exc:
        raise UnsafeVariableError(str(exc)) from None


def quoted(words):
    """Words as the job script's shell must see them (ReFrame joins executable_opts with spaces)."""
    return [shlex.quote(str(word)) for word in words]


def _partitions():
    """The partitions of the system ReFrame runs for (only the named one with --system SYS:PART), or None
    outside a ReFrame run (a check file imported by the tests)."""
    try:
        return list(rt.runtime().system.partitions)
    except ReframeFatalError:
        return None


def offered(values, feature):
    """The parameter values some partition of the current system offers: those whose `feature(value)` is
    one of its features (all values outside a ReFrame run). Check files are loaded after ReFrame read the
    site configuration, so parameters follow the site and no impossible variant is built only to be
    dropped (ReFrame's per-instance cost adds up over thousands of variants)."""
    partitions = _partitions()
    if partitions is None:
        return list(values)
    features = {name for part in partitions for name in part.features}
    return [value for value in values if feature(value) in features]


def simple_test_if_offered(cls):
    """`rfm.simple_test` for a check whose parameters come from `offered`: where no partition of the system
    offers it, a parameter has no values and ReFrame would warn that it is undefined; it is left out."""
    return cls if cls.is_abstract() else rfm.simple_test(cls)


def node_counts_up_to_partition_size(feature):
    """NODE_COUNTS up to the most nodes a partition with `feature` has (all outside a ReFrame run)."""
    partitions = _partitions()
    if partitions is None:
        return list(NODE_COUNTS)
    largest = max((part.extras.get('nodes', 0) for part in partitions if feature in part.features), default=0)
    return [n for n in NODE_COUNTS if n <= largest]


def apply_site_environment(test, job_options=(), launcher_options=()):
    '''Knob defaults of the site under the test's own env_vars (`-S env_vars=...` wins per variable),
    plus the site's scheduler and launcher options. Call from a run_after('setup') hook. The test's
    env_vars are validated against the site's knob catalog and shell-quoted: ReFrame writes them into the
    job script as `export NAME=VALUE`.'''
    try:
        env = site_knob_catalog(test.current_partition).check_job_env(test.env_vars)
    except knob_catalog.UnsafeValueError as exc:
        raise UnsafeVariableError(f'env_vars: {exc}') from None
    if test.knob_defaults:
        env = {**test.current_partition.extras.get('knob_defaults', {}), **env}
    test.env_vars = {name: shlex.quote(value) for name, value in env.items()}
    test.job.options += list(job_options)
    test.job.launcher.options += list(launcher_options)


def reference_entry(references, metric, unit, **case):
    '''ReFrame's (value, lower, upper, unit) from the first reference for `metric` whose keys match the
    test case; keys a reference leaves out (or sets to null) match anything. None if none matches.'''
    ref = next((ref for ref in references if reference_matches(ref, metric, case)), None)
    return None if ref is None else (ref['value'], ref.get('lower'), ref.get('upper'), unit)


def set_references(test, references, **case):
    '''The test's reference table (ReFrame's `reference`) from the campaign's references
    (`test.campaign_references`, JSON: a campaign spec's own, first) and the site's `references` matching `case`,
    and the size each metric is taken at: a metric without one gets (None, None, None, unit), so that perflogs
    and reports say None instead of ReFrame's reference 0. Records those sizes in `test.metric_bytes`.'''
    references = [*json.loads(test.campaign_references or '[]'), *references]
    table, sizes = {}, {}
    for name, unit in test.metrics().items():
        sizes[name] = test.metric_at(name)[1]
        table[name] = reference_entry(references, name, unit, bytes=sizes[name], **case) or (None, None, None, unit)
    test.reference = {test.current_partition.fullname: table}
    test.metric_bytes = ','.join(f'{name}={size}' for name, size in sizes.items())


def assert_job_ended(test, program, expected_exitcode=0, exit_codes=None):
    '''The job was not killed (time limit, node failure, ...) and `program` exited with the expected code.'''
    states = set((test.job.state or '').split(','))
    sn.evaluate(sn.assert_not_in('TIMEOUT', states, msg=f'the job hit its time limit ({test.time_limit})'))
    exitcode = test.job.exitcode
    meaning = (exit_codes or {}).get(exitcode, 'unexpected')
    sn.evaluate(sn.assert_eq(exitcode, expected_exitcode,
                             msg=f'{program} exited with code {{0}} ({meaning}), expected {{1}}'))
    # An expected non-zero exit code is itself reported as the state FAILED (Slurm) or FAILURE (local).
    exit_states = {'FAILED', 'FAILURE'} if expected_exitcode != 0 else set()
    sn.evaluate(sn.assert_false((states & FAILED_JOB_STATES) - exit_states,
                                msg=f'the job ended in state {test.job.state}'))
