"""What a communicator's calls run: the selector's decision for one path (the CPU
engine, or the GPU path with the variants it implements), checked and cached.

Each decision is a pure function of (collective, bytes, algo) given the path's model
and overrides, so it is taken once per distinct call and looked up afterwards.  The
engine reads `codes` directly: on its hot path a known size costs one dict lookup.
"""
from typing import Dict, Optional, Tuple

from shmcoll.collectives import ALL, BY_NAME
from shmcoll.tuning import selector, trials
from shmcoll.tuning.algorithms import direct

CACHE_MAX = 4096        # sizes per collective (and per named algorithm) before the cache starts over


class Decider:
    """Decisions for `world` ranks priced by `model` under the override `rules`.

    `variants` ({collective: {algorithm: (variant, ...)}}) limits the candidates to
    what a path implements; `alone` is what a one-rank job runs when no algorithm is
    named (a copy: no ring to walk); `log_rank` logs each new decision
    (SHMCOLL_DEBUG=INFO) as that rank.  `agree` (seconds per candidate -> the same,
    maximised over the ranks; None: never) lets the model's close calls be settled by
    trials (tuning.trials)."""

    def __init__(self, world: int, model, rules: Optional[selector.Rules] = None,
                 variants: Optional[dict] = None, alone: Optional[str] = None,
                 log_rank: Optional[int] = None, agree=None):
        self.world, self.model = world, model
        self.rules = rules if rules is not None else selector.Rules()
        self.variants, self.alone, self.log_rank = variants, alone, log_rank
        self.agree = agree if world > 1 else None
        self._decisions: Dict[Tuple[str, int, Optional[str]], selector.Decision] = {}
        # engine code -> {nbytes: schedule code, algo: {nbytes: schedule code}} (a named
        # algorithm's sizes apart: the engine looks a call up without building a key)
        self.codes: Dict[int, dict] = {c.code: {} for c in ALL}
        # (collective, size class) -> its trial, or None where the model has no close call
        self._trials: Dict[Tuple[str, int], Optional[trials.Trial]] = {}

    def decide(self, collective: str, nbytes: int, algo: Optional[str] = None) -> selector.Decision:
        """`algo` if named (its best variant for the size), else the override rule
        covering the size, else the cost model's argmin."""
        key = (collective, nbytes, algo)
        decision = self._decisions.get(key)
        if decision is None:
            decision = self._decide(collective, nbytes, algo)
            if len(self._decisions) >= CACHE_MAX:
                self._decisions.clear()
            self._decisions[key] = decision
        return decision

    def _decide(self, collective, nbytes, algo):
        if algo is not None and not isinstance(algo, str):
            raise ValueError(f"algo must be an algorithm name, 'auto' or None, got {algo!r}")
        if self.world == 1 and self.alone and algo in (None, "auto"):
            algo = self.alone
        variants = self.variants[collective] if self.variants is not None else None
        decision = selector.decide(collective, self.world, nbytes, algo, self.model, self.rules,
                                   variants)
        if self.log_rank is not None:
            selector.log_decision(self.log_rank, collective, self.world, nbytes, decision)
        return decision

    def label(self, collective: str, nbytes: int, algo: Optional[str] = None) -> str:
        """'algorithm' or 'algorithm (variant)' of what the call runs (once a trial
        settled its size class: the winner)."""
        decision = self.decide(collective, nbytes, algo)
        trial = self._trial(collective, nbytes, algo, decision)
        if trial is not None and trial.winner:
            decision = self.decide(collective, nbytes, trial.winner)
        return decision.candidate.label

    def calls_until_settled(self, collective: str, nbytes: int, algo: Optional[str] = None) -> int:
        """Blocking calls of this size before what it runs is final: what its size
        class's trial still needs (0 where none runs or it has settled)."""
        decision = self.decide(collective, nbytes, algo)
        trial = self._trial(collective, nbytes, algo, decision)
        return trial.calls_left if trial is not None else 0

    def code(self, collective: str, nbytes: int, algo: Optional[str],
             blocking: bool = True) -> int:
        """The schedule code of a call (see choose)."""
        return self.choose(collective, nbytes, algo, blocking)[0]

    def choose(self, collective: str, nbytes: int, algo: Optional[str],
               blocking: bool = True) -> Tuple[int, Optional[trials.Trial]]:
        """(schedule code, None) of a call, the code remembered in `codes` for the
        engine — except while a trial runs for its size class: then the candidate whose
        turn it is and the trial the call reports its time to (blocking calls), or the
        model's choice and None (nonblocking calls), not remembered."""
        decision = self.decide(collective, nbytes, algo)
        trial = self._trial(collective, nbytes, algo, decision)
        if trial is not None:
            if not trial.winner and trial.measured:
                self._settle(collective, nbytes, trial)
            if not trial.winner:
                if not blocking:
                    return decision.candidate.code, None
                return self.decide(collective, nbytes, trial.current).candidate.code, trial
            decision = self.decide(collective, nbytes, trial.winner)
        code = decision.candidate.code
        memo = self.codes[BY_NAME[collective].code]
        if algo is not None:
            memo = memo.setdefault(algo, {})
        if len(memo) >= CACHE_MAX:
            memo.clear()
        memo[nbytes] = code
        return code, None

    def _trial(self, collective, nbytes, algo, decision):
        """The trial of the call's size class, started at its first call; None where
        none runs (no agreement, a named algorithm or a rule, no close call, or the
        inline schedule, which does a part of what every other one does: a trial could
        only mistake noise for a difference)."""
        if self.agree is None or algo not in (None, "auto") or decision.reason != "cost model" \
                or decision.candidate.variant == direct.INLINE:
            return None
        key = (collective, trials.size_class(nbytes))
        if key not in self._trials:
            names = trials.candidates(decision.table, decision.candidate.algorithm)
            self._trials[key] = trials.Trial(names, decision.candidate.algorithm) if names else None
        return self._trials[key]

    def _settle(self, collective, nbytes, trial):
        """Every rank at once (the same call of every rank): agree on the winner by
        each candidate's median call on the slowest rank."""
        agreed = [float(s) for s in self.agree(trial.medians())]
        trial.settle(agreed)
        if self.log_rank is not None:
            selector.log_line(self.log_rank,
                              trials.describe(collective, nbytes, self.world, trial, agreed))
