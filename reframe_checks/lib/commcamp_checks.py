"""What every commcamp ReFrame check shares: site data from the partition's extras, the site's job and
launcher options, the knob defaults under each test's env_vars, references, job-outcome sanity.

Not a check file: the check files (reframe_checks/*.py) put this directory on sys.path, and ReFrame
does not load it as a test file unless asked to recurse (`-R`), where it registers nothing.

Site data arrives through `site_configs/reframe_site.py` (partition extras and features); check code
holds no site-specific value.
"""
import os
import re

import reframe.core.runtime as rt
import reframe.utility.sanity as sn
from reframe.core.exceptions import ReframeFatalError

from campaigns.vocabulary import reference_matches

# commcamp's shipped folders (bench_src/, spack_env/, ...): $COMMCAMP_DATA, which commcamp sets for the ReFrame
# it starts (campaigns/paths.py), else the checkout these checks are in. Relative site paths resolve here.
DATA_ROOT = os.environ.get('COMMCAMP_DATA') or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

# The node counts the checks are parameterized with (campaigns.site.NODE_COUNTS must agree).
NODE_COUNTS = (1, 2, 3, 4, 8, 16, 32, 64, 128)

# Job states that mean the job did not end normally. ReFrame treats them all as "completed", and a job
# killed at its time limit can still report exit code 0 (e.g. Slurm's jobcomp/filetxt log).
FAILED_JOB_STATES = {'BOOT_FAIL', 'CANCELLED', 'DEADLINE', 'FAILED', 'FAILURE', 'NODE_FAIL',
                     'OUT_OF_MEMORY', 'PREEMPTED', 'TIMEOUT'}

_ENV_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]*')


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


def node_counts_up_to_partition_size(feature):
    """NODE_COUNTS up to the most nodes a partition with `feature` has (all outside a ReFrame run)."""
    partitions = _partitions()
    if partitions is None:
        return list(NODE_COUNTS)
    largest = max((part.extras.get('nodes', 0) for part in partitions if feature in part.features), default=0)
    return [n for n in NODE_COUNTS if n <= largest]


def apply_site_environment(test, job_options=(), launcher_options=()):
    '''Knob defaults of the site under the test's own env_vars (`-S env_vars=...` wins per variable),
    plus the site's scheduler and launcher options. Call from a run_after('setup') hook.'''
    bad = [name for name in test.env_vars if not _ENV_NAME.fullmatch(name)]
    if bad:
        raise ValueError(f'env_vars: invalid variable names {bad}')
    if test.knob_defaults:
        test.env_vars = {**test.current_partition.extras.get('knob_defaults', {}), **test.env_vars}
    test.job.options += list(job_options)
    test.job.launcher.options += list(launcher_options)


def reference_entry(references, metric, unit, **case):
    '''ReFrame's (value, lower, upper, unit) from the first reference for `metric` whose keys match the
    test case; keys a reference leaves out (or sets to null) match anything. None if none matches.'''
    ref = next((ref for ref in references if reference_matches(ref, metric, case)), None)
    return None if ref is None else (ref['value'], ref.get('lower'), ref.get('upper'), unit)


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
