"""Algorithm selection: a cost table over the registered algorithms, argmin, override.

Every rank evaluates the same pure function of (collective, bytes, world size) with
the same model, so every rank reaches the same decision without a message.

The size n a collective is priced at is the bytes of the whole vector (see
shmcoll.collectives).

Overrides (``SHMCOLL_ALGO`` and ``shmcoll perf --algo``) use one grammar::

    spec    := entry (';' entry)*
    entry   := [collective ':'] choice (',' choice)*
    choice  := algorithm ['@' lo '-' [hi]]       sizes inclusive: 8, 4K, 64M, 1G

e.g. ``allreduce:tree@0-64K,ring;broadcast:tree``.  Within an entry the first choice
whose range holds n wins; entries naming the collective win over plain ones (which
apply to every collective the algorithm implements); sizes no rule covers go to the
cost model.  `describe()` writes the cost model's own decisions in this grammar.
"""
import logging
from dataclasses import dataclass, replace
from typing import Optional

from shmcoll._core.sizes import format_size, parse_size
from shmcoll.collectives import NAMES as ALL_COLLECTIVES
from shmcoll.tuning.algorithms import (ALL, CROSS_MEMORY, REGISTRY, SINGLE_COPY, direct,
                                       variants_of)
from shmcoll.tuning.algorithms.terms import Terms, model_for_collective

log = logging.getLogger("shmcoll")


@dataclass(frozen=True)
class Candidate:
    algorithm: str
    variant: str
    code: int
    seconds: float
    # The least it may cost, where that depends on what the model cannot see (cma: a
    # peer's bytes unchanged since the last read); None: `seconds` is all there is.
    least: Optional[float] = None

    @property
    def label(self):
        return self.algorithm if self.variant == self.algorithm else f"{self.algorithm} ({self.variant})"


def algorithms_for(collective, single_copy=False, cross_memory=False):
    """The algorithms implementing `collective`; single_copy: with those that need a
    symmetric x (algorithms.SINGLE_COPY); cross_memory: with those that need ranks to
    reach each other's memory (algorithms.CROSS_MEMORY)."""
    pool = {**REGISTRY, **(SINGLE_COPY if single_copy else {}),
            **(CROSS_MEMORY if cross_memory else {})}
    return [name for name, alg in pool.items() if collective in alg.COLLECTIVES]


# What a call whose x is symmetric may run of the single-copy AllReduce, by where its
# out lies (one-shot writes out while peers read x; two-shot reads peers' out).
_SINGLE_COPY_ALLREDUCE = {"plain": ("one-shot",), "symmetric": ("one-shot", "two-shot"),
                          "in place": ("two-shot",)}


def symmetric_variants(world, out_case, cross_memory=False):
    """{collective: {algorithm: (variant, ...)}} for calls whose x is in a symmetric
    allocation: every schedule, the single-copy ones included, as `out_case` ("plain",
    "symmetric" or "in place") allows (cross_memory: cma's too)."""
    table = {}
    for coll in ALL_COLLECTIVES:
        names = {}
        for name in algorithms_for(coll, single_copy=True, cross_memory=cross_memory):
            kinds = tuple(variants_of(ALL[name], coll, world))
            if name in SINGLE_COPY and coll == "allreduce":
                kinds = tuple(v for v in kinds if v in _SINGLE_COPY_ALLREDUCE[out_case])
            names[name] = kinds
        table[coll] = names
    return table


def cross_memory_variants(world):
    """{collective: {algorithm: (variant, ...)}} for ordinary arrays on a communicator
    whose ranks reach each other's memory: every channel schedule and cma's."""
    return {coll: {name: tuple(variants_of(ALL[name], coll, world))
                   for name in algorithms_for(coll, cross_memory=True)}
            for coll in ALL_COLLECTIVES}


def cost_table(collective, world, nbytes, model=None, variants=None):
    """{algorithm: its cheapest variant as a Candidate} for every algorithm implementing
    `collective`, priced by `model` (a CostModel, or a Models with one per collective;
    None: this machine's, as a communicator of `world` ranks would use).  `variants`
    ({algorithm: (variant, ...)}) limits the candidates to what a path implements."""
    if model is None:
        from shmcoll.tuning.calibration import model_for
        model = model_for(world)[0]
    models, model = model, model_for_collective(model, collective)
    table = {}
    least_sync, least_beta, with_records = None, None, None   # (direct's inline or eager: below)
    for name in algorithms_for(collective, single_copy=variants is not None,
                               cross_memory=variants is not None):
        if variants is not None and name not in variants:
            continue
        best = None
        alg = ALL[name]
        for variant, code, terms in alg.variants(collective, world, nbytes):
            if variants is not None and variant not in variants[name]:
                continue
            least = None
            if world == 1:
                seconds = 0.0
            elif hasattr(alg, "price"):     # priced with other fits than its own
                seconds = alg.price(models, collective, terms, variant)
                if hasattr(alg, "least_price"):
                    least = alg.least_price(models, collective, terms, variant)
            else:
                seconds = model.seconds(terms, name)
                if variant in direct.WITH_THE_RECORDS:
                    with_records = (name, variant, code, terms)
                    continue
                sync = model.seconds(Terms(terms.steps, terms.messages), name)
                least_sync = sync if least_sync is None else min(least_sync, sync)
                beta = model.beta_of(name)
                least_beta = beta if least_beta is None else min(least_beta, beta)
            if best is None or seconds < best.seconds:
                best = Candidate(name, variant, code, seconds, least)
        if best is not None:
            table[name] = best
    if with_records is not None:
        # Every schedule publishes its call and checks every peer's, record by record;
        # inline and eager do only that, their parts with the records.  So they cost
        # the least synchronisation any other schedule of the call pays (its fit's α,
        # o and setup), plus their copies and reduction: never more than the schedules
        # they stand for, whatever each fit put its fixed cost into (the reference's
        # 3- and 4-rank AllGather fits, whose α is 0, would price a call of no messages
        # at nothing).  Eager copies as many bytes as one-shot or the star, each part
        # in one memcpy, no slot boundary: at the least β of any schedule (a fit's β
        # per algorithm also holds what its pipelining costs; at P = 2 the chain, which
        # is the star there, had the lower one, and Broadcast took it over eager).
        # Inline's few bytes go with the records.
        name, variant, code, terms = with_records
        copies = (least_beta or 0.0) * terms.moved if variant == direct.EAGER else 0.0
        priced = Candidate(name, variant, code,
                           (least_sync or 0.0) + copies + model.gamma * terms.reduced)
        if "direct" not in table or priced.seconds <= table["direct"].seconds * (1 + 1e-9):
            table["direct"] = priced    # (ties: they do a part of what the others do)
    if "cma" in table and "symmetric" in table:
        # x is symmetric, so cma reads it by pointer too and adds only system calls
        # that write peers' buffers: never priced below the pointer schedules (P=2-4,
        # 256 KiB-4 MiB AllReduce into a plain out: symmetric one-shot took 0.54-0.98x
        # cma two-shot's time, which a write ratio under 0.5 had priced lower).
        least = table["symmetric"].seconds
        table["cma"] = replace(table["cma"], seconds=max(table["cma"].seconds, least))
    return table


def _check_algo(collective, algo):
    if collective not in ALL_COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}")
    known = algorithms_for(collective, single_copy=True, cross_memory=True)
    if algo not in known:
        raise ValueError(f"unknown algorithm {algo!r} for {collective}; available: "
                         f"{', '.join(known + ['auto'])}")


@dataclass(frozen=True)
class Decision:
    candidate: Candidate
    reason: str          # "algo=", "SHMCOLL_ALGO" or "cost model"
    table: dict


def _cheapest(table):
    """The argmin; inline or eager where it ties (it prices at another schedule's
    synchronisation, of which it does a part: cost_table)."""
    best = min(table.values(), key=lambda c: c.seconds)
    with_records = table.get("direct")
    if with_records is not None and with_records.variant in direct.WITH_THE_RECORDS and \
            with_records.seconds <= best.seconds * (1 + 1e-9):
        return with_records
    return best


def decide(collective, world, nbytes, algo=None, model=None, rules=None, variants=None):
    """What runs: `algo` if given, else the first override rule covering nbytes, else
    the cheapest modelled candidate.  The table is kept for the debug log.  With
    `variants` (see cost_table), rules naming another algorithm are passed over and
    an explicit `algo` outside it is an error."""
    table = cost_table(collective, world, nbytes, model, variants)
    reason = "algo="
    if algo is None or algo == "auto":
        algo = rules.lookup(collective, nbytes) if rules else None
        reason = "SHMCOLL_ALGO"
        if algo not in table:
            algo = None
    if algo is None:
        return Decision(_cheapest(table), "cost model", table)
    _check_algo(collective, algo)
    if algo not in table and algo in CROSS_MEMORY:
        raise ValueError(f"algorithm {algo!r} needs every rank to read every other's memory "
                         f"with cross-memory attach, which this job cannot "
                         f"(Communicator.cross_memory is None: SHMCOLL_CMA=off on a rank, or "
                         f"process_vm_readv/writev not permitted, e.g. "
                         f"kernel.yama.ptrace_scope > 0)")
    if algo not in table and algo in SINGLE_COPY:
        raise ValueError(f"algorithm {algo!r} needs x in a symmetric allocation "
                         f"(Communicator.empty / zeros) on every rank"
                         f"{'' if collective != 'allreduce' else ' (two-shot: out too; one-shot: out not x)'}")
    if algo not in table:
        raise ValueError(f"algorithm {algo!r} does not run {collective} on this path; "
                         f"available: {', '.join(list(table) + ['auto'])}")
    return Decision(table[algo], reason, table)


def choose(collective, world, nbytes, algo=None, model=None, rules=None, variants=None):
    """The name of the algorithm that runs (see decide)."""
    return decide(collective, world, nbytes, algo, model, rules, variants).candidate.algorithm


def code(collective, world, nbytes, algo=None, model=None, rules=None):
    """The engine code of the schedule that runs (see decide)."""
    return decide(collective, world, nbytes, algo, model, rules).candidate.code


def format_decision(collective, world, nbytes, decision):
    """One line for SHMCOLL_DEBUG=INFO: the choice and every candidate's modelled time."""
    costs = ", ".join(f"{c.label} {c.seconds * 1e6:.2f}" +
                      ("" if c.least is None else f" ({c.least * 1e6:.2f} unchanged)")
                      for c in sorted(decision.table.values(), key=lambda c: c.seconds))
    return (f"{collective} {nbytes} B P={world}: {decision.candidate.label} "
            f"({decision.reason}); modelled us: {costs}")


# -- the override grammar ---------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    collective: str      # None: every collective the algorithm implements
    algorithm: str
    lo: int = 0
    hi: int = None       # inclusive; None: no upper bound

    def covers(self, collective, nbytes):
        return ((self.collective is None and collective in ALL[self.algorithm].COLLECTIVES)
                or self.collective == collective) and \
            self.lo <= nbytes and (self.hi is None or nbytes <= self.hi)


class Rules(tuple):
    """Parsed overrides; rules naming a collective come before plain ones."""

    def lookup(self, collective, nbytes):
        return next((r.algorithm for r in self if r.covers(collective, nbytes)), None)

    def __str__(self):
        return format_rules(self)


def _parse_choice(collective, text, where):
    name, _, span = text.partition("@")
    name = name.strip()
    if name not in ALL:
        raise ValueError(f"SHMCOLL_ALGO: unknown algorithm {name!r} in {where!r}; "
                         f"known: {', '.join(sorted(ALL))}")
    if collective and collective not in ALL[name].COLLECTIVES:
        raise ValueError(f"SHMCOLL_ALGO: {name} does not implement {collective} (in {where!r})")
    lo, hi = 0, None
    if span.strip():
        low, dash, high = span.partition("-")
        try:
            lo = parse_size(low) if low.strip() else 0
            hi = parse_size(high) if high.strip() else None
            if not dash:
                hi = lo
        except ValueError as e:
            raise ValueError(f"SHMCOLL_ALGO: {e} in {where!r}") from None
        if hi is not None and hi < lo:
            raise ValueError(f"SHMCOLL_ALGO: empty size range {span!r} in {where!r}")
    return Rule(collective, name, lo, hi)


def parse_overrides(text):
    """SHMCOLL_ALGO text -> Rules; raises ValueError naming what is wrong."""
    specific, plain = [], []
    for entry in filter(None, (e.strip() for e in (text or "").split(";"))):
        collective, colon, choices = entry.partition(":")
        if not colon:
            collective, choices = None, entry
        else:
            collective = collective.strip()
            if collective not in ALL_COLLECTIVES:
                raise ValueError(f"SHMCOLL_ALGO: unknown collective {collective!r} in {entry!r}; "
                                 f"known: {', '.join(ALL_COLLECTIVES)}")
        parsed = [_parse_choice(collective, c.strip(), entry) for c in choices.split(",")
                  if c.strip()]
        if not parsed:
            raise ValueError(f"SHMCOLL_ALGO: no algorithm in {entry!r}")
        (specific if collective else plain).extend(parsed)
    return Rules(specific + plain)


def format_rules(rules):
    """Rules -> the grammar (parse_overrides(format_rules(r)) == r)."""
    entries, order = {}, []
    for r in rules:
        if r.collective not in entries:
            entries[r.collective] = []
            order.append(r.collective)
        span = ""
        if r.lo or r.hi is not None:
            span = f"@{format_size(r.lo)}-{'' if r.hi is None else format_size(r.hi)}"
        entries[r.collective].append(r.algorithm + span)
    return ";".join((f"{c}:" if c else "") + ",".join(entries[c]) for c in order)


def describe(world, model=None, collectives=ALL_COLLECTIVES, max_bytes=1 << 40, variants=None):
    """The cost model's decisions for `world` ranks as override rules: one entry per
    collective, each size range with its algorithm (crossovers found exactly).
    `variants`: {collective: {algorithm: (variant, ...)}} of a path (the GPU's)."""
    if model is None:
        from shmcoll.tuning.calibration import model_for
        model = model_for(world)[0]
    rules = []
    for coll in collectives:
        if variants is not None and coll not in variants:
            continue        # (not on that path)
        pick = (lambda n, c=coll: choose(c, world, n, model=model,
                                         variants=variants[c] if variants else None))
        lo = 0
        current = pick(0)
        while True:
            nxt = _next_change(pick, lo, current, max_bytes)
            if nxt is None:
                rules.append(Rule(coll, current, lo, None))
                break
            rules.append(Rule(coll, current, lo, nxt - 1))
            lo, current = nxt, pick(nxt)
    return Rules(rules)


def _next_change(pick, lo, current, max_bytes):
    """The smallest n > lo where pick(n) differs from `current` (None: never)."""
    hi = max(lo, 1)
    while pick(hi) == current:
        if hi >= max_bytes:
            return None
        hi *= 2
    low = lo      # choice(low) == current, choice(hi) != current
    while hi - low > 1:
        mid = (low + hi) // 2
        if pick(mid) == current:
            low = mid
        else:
            hi = mid
    return hi


# -- SHMCOLL_DEBUG=INFO -------------------------------------------------------------

_logged = set()


def log_decision(rank, collective, world, nbytes, decision):
    """Logs a decision once per (collective, size, world size, choice) per process."""
    key = (collective, nbytes, world, decision.candidate.code)
    if key in _logged:
        return
    _logged.add(key)
    log_line(rank, format_decision(collective, world, nbytes, decision))


def log_line(rank, text):
    """One INFO line as `rank` (a handler to stderr if the application set none)."""
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        log.addHandler(handler)
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    log.info("rank %d: %s", rank, text)
