"""One-knob screen: the first proposals of a search are single-knob changes of the best point so far.

On the fully measured landscapes (results/bench/landscapes/: the 2x H200 socket-path grid, the Open MPI grids) the
fastest settings are one or two knob changes away from the defaults (2 socket threads instead of NCCL's auto, a 64 KiB
TCP send buffer), and a model-based sampler's first proposals are random: TPE's first 4 proposals know nothing, and
after them it models a few points. The screen spends those first proposals where the measurements say the gain usually
is: it changes ONE knob of the best starting point (the fastest complete trial among the site defaults, the seeds, the
documented settings and the warm starts) to one value of that knob's ladder (KnobDimension.ladder), knobs taken in
turn, values in an order drawn from the seed; a change the study has already measured or the catalog's constraints
reject is passed over, and so is one that runs a measured configuration again (KnobCatalog.effective_env: a knob set
to the value the library takes when unset, or one that has no effect while another is unset, e.g. NCCL's sockets per
thread without socket threads). The screen works in rounds of ROUND_STEPS steps (a step passed over shortens its
round; rounds of so many screened trials instead were as fast or slower on every landscape of the benchmark): a
round's centre is the fastest complete trial among the starting points and the earlier rounds' trials, so the second
round changes one more knob of the first round's best change (on the 3-node Open MPI grid the fast settings change
both socket buffers: no single change reaches 95 % of the best). Within a round the centre stays: following each noisy
new best instead (tried on the same landscapes) walked the screen away from the defaults on one lucky launch. Then the
wrapped sampler (TPE) goes on with every screened trial as its data. Numbers: results/bench/sampler_benchmark.md.

Optuna's sampler interface, like its GridSampler: the plan of a trial is made in `before_trial` and marked in the
trial's system attributes (SCREEN_ATTR), so a resumed study or another worker counts the screen's trials from storage;
they build the screen with the study's seed (tuners/study.py SCREEN_SEED), so they go on in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from tuners.catalog import UnsafeValueError
from tuners.space import SearchSpace, SpaceError

SCREEN_ATTR = "commcamp:screen"  # system attribute: the screen's step that planned this trial
ROUND_STEPS = 8  # per round, one screened trial each unless passed over; a round changes one knob of the fastest
# point before it


class OneKnobScreen(optuna.samplers.BaseSampler):
    def __init__(self, base: optuna.samplers.BaseSampler, space: SearchSpace, n_screen: int, seed: int | None,
                 env_attr: str, role_attr: str,
                 dropped_knobs: Callable[[optuna.Study], Mapping[str, Any]],
                 dropped_in_context: Callable[[optuna.Study], Mapping[str, Sequence[tuple[Mapping[str, str | None],
                                                                                        str]]]] | None = None) -> None:
        self.base = base
        self.space = space
        self.n_screen = n_screen
        self.env_attr = env_attr  # user attribute holding a trial's environment
        self.role_attr = role_attr  # user attribute of the starting points (defaults, seeds, ...)
        self.dropped_knobs = dropped_knobs  # the study's knobs that left the search
        # the knobs that left the search beside other knobs' values (context): a step that changes one there is
        # passed over (the baseline's values: the study's attribute baseline_env)
        self.dropped_in_context = dropped_in_context
        rng = np.random.default_rng(seed)
        self.knob_order = [int(i) for i in rng.permutation(len(space.dimensions))]
        self.values = [[ladder[int(i)] for i in rng.permutation(len(ladder))]
                       for ladder in (d.ladder() for d in space.dimensions)]
        self._plans: dict[int, dict[str, Any]] = {}

    def reseed_rng(self) -> None:
        self.base.reseed_rng()

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.base.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if trial.number in self._plans:
            return {}
        return self.base.sample_relative(study, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        plan = self._plans.get(trial.number)
        if plan is not None and param_name in plan:
            return plan[param_name]
        return self.base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.base.before_trial(study, trial)
        if "fixed_params" in trial.system_attrs or trial.params:  # enqueued (defaults, seeds) or re-queued (retry)
            return
        trials = study.get_trials(deepcopy=False)
        steps = {t.system_attrs[SCREEN_ATTR] for t in trials if SCREEN_ATTR in t.system_attrs}  # a retry keeps its step
        if len(steps) >= self.n_screen:
            return
        baseline = study.user_attrs.get("baseline_env", {})
        fixed_when = [(name, baseline.get(name), context)
                      for name, contexts in (self.dropped_in_context(study) if self.dropped_in_context else {}).items()
                      for context, _ in contexts]
        planned = self._next(trials, max(steps, default=-1) + 1, self.dropped_knobs(study), fixed_when)
        if planned is not None:
            step, params = planned
            self._plans[trial.number] = params
            study._storage.set_trial_system_attr(trial._trial_id, SCREEN_ATTR, step)

    def _next(self, trials: Sequence[FrozenTrial], first_step: int, dropped: Mapping[str, Any],
              fixed_when: Sequence[tuple[str, str | None, Mapping[str, str | None]]] = ()
              ) -> tuple[int, dict[str, Any]] | None:
        """(step, parameters) of the first step from `first_step` on whose change is new, or None. A step whose
        setting changes a knob from `value` where `fixed_when` fixes it there ((knob, value, context): it left the
        search beside those values) is passed over."""
        measured = [t for t in trials if self.env_attr in t.user_attrs]
        complete = [t for t in measured if t.state is TrialState.COMPLETE and t.values]
        starts = [t for t in complete if self.role_attr in t.user_attrs]
        if not starts:
            return None
        effective = self.space.effective_env
        known = [effective(t.user_attrs[self.env_attr]) for t in measured]
        searched = [i for i in self.knob_order if self.space.dimensions[i].name not in dropped]
        longest = max((len(self.values[i]) for i in searched), default=0)
        current: dict[str, str | None] | None = None
        for step in range(first_step, first_step + len(searched) * longest):
            if current is None or step % ROUND_STEPS == 0:
                # a round's trials are changes of its own centre, also when the round before ended on passed-over steps
                current = self._centre(starts, complete, step - step % ROUND_STEPS)
            index = searched[step % len(searched)]
            values = self.values[index]
            value = values[(step // len(searched)) % len(values)]
            name = self.space.dimensions[index].name
            if value == current[name]:
                continue
            setting = {**current, name: value}
            if any(setting.get(knob) != fixed and self.space.matches(context, setting)
                   for knob, fixed, context in fixed_when):
                continue  # the library did not read that knob beside these values
            try:
                env = self.space.env_from_values(setting)
                params = self.space.params_for_env(env)
            except (UnsafeValueError, SpaceError):
                continue  # e.g. socket threads x sockets per thread above NCCL's cap
            if effective(env) not in known:  # a change the library does not see (an inert knob) is passed over too
                return step, params
        return None

    def _centre(self, starts: Sequence[FrozenTrial], complete: Sequence[FrozenTrial], begun: int
                ) -> dict[str, str | None]:
        """The knob values of the centre of the round beginning at step `begun`: the fastest start or trial of an
        earlier round."""
        candidates = [*starts, *(t for t in complete if t.system_attrs.get(SCREEN_ATTR, begun) < begun)]
        centre = min(candidates, key=lambda t: t.values[0]).user_attrs[self.env_attr]
        return {name: centre.get(name) for name in self.space.knob_names}

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self._plans.pop(trial.number, None)
        self.base.after_trial(study, trial, state, values)
