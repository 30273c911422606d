"""A linearizability checker for histories of a key-value store (put, get, compare-and-set,
delete), and a thread-safe recorder for such histories.

The search is Wing and Gong's, with Lowe's memoization, as Knossos and Porcupine implement it
(Porcupine's ``checkSingle``): the history becomes a doubly linked list of call and return
entries in time order; the search linearizes the first call whose operation the model accepts in
the current state (lifting its call and return out of the list), and backtracks when it reaches a
return entry, i.e. an operation that completed before anything left could have taken effect. A
cache of (set of linearized operations, model state) prunes configurations already explored.
The history is partitioned by key first (P-compositionality: a history is linearizable iff each
key's is), so each key is checked on its own.

Outcomes follow Knossos and Porcupine: an ``ok`` operation took effect once between its call and
its return; a ``failed`` one definitely did not take effect (it is left out); an ``unknown`` one
(a timeout, a lost connection) may have taken effect at any time after its call, or never: it
returns at +infinity, and its result is not known. A read with an unknown outcome constrains
nothing and is left out too.
"""

from __future__ import annotations

import enum
import json
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

Value = str | None  # None: the key is absent


class Kind(enum.Enum):
    PUT = "put"
    GET = "get"
    CAS = "cas"
    DELETE = "delete"


class Outcome(enum.Enum):
    OK = "ok"
    FAILED = "failed"  # definitely not applied
    UNKNOWN = "unknown"  # may or may not have been applied


@dataclass(frozen=True)
class Operation:
    """One client operation on one key.

    ``value``: a put's value, or a cas's new value (None: the cas deletes). ``expected``: a
    cas's expected value (None: absent). ``result``: what an ok operation answered (a get's
    value or None, a cas's ``applied``, a delete's ``deleted``; None for a put). ``completed``
    is None unless the outcome is ok or failed."""

    kind: Kind
    key: str
    invoked: float
    completed: float | None
    outcome: Outcome
    value: Value = None
    expected: Value = None
    result: Value | bool = None
    client: int = 0

    def describe(self) -> str:
        if self.kind is Kind.PUT:
            call = f"put({self.key!r}, {self.value!r})"
        elif self.kind is Kind.GET:
            call = f"get({self.key!r})"
        elif self.kind is Kind.CAS:
            call = f"cas({self.key!r}, {self.expected!r} -> {self.value!r})"
        else:
            call = f"delete({self.key!r})"
        if self.outcome is Outcome.OK:
            answer = "" if self.kind is Kind.PUT else f" -> {self.result!r}"
        else:
            answer = f" ({self.outcome.value})"
        until = "inf" if self.completed is None else f"{self.completed:.4f}"
        return f"client {self.client}: {call}{answer} [{self.invoked:.4f}, {until}]"


def step(state: Value, op: Operation) -> tuple[bool, Value]:
    """The register model: whether ``op`` with its result can take effect in ``state``, and the
    state after it. An unknown operation is always accepted and has its effect."""
    known = op.outcome is Outcome.OK
    if op.kind is Kind.PUT:
        return True, op.value
    if op.kind is Kind.GET:
        return (not known or op.result == state), state
    if op.kind is Kind.CAS:
        matches = state == op.expected
        after = op.value if matches else state
        return (not known or op.result is matches), after
    return (not known or op.result is (state is not None)), None


@dataclass(frozen=True)
class Violation:
    """Where the search got furthest on a key before no linearization extended."""

    key: str
    operations: int  # of the key, checked ones
    linearized: int  # how many were linearized at the deepest point
    recent: tuple[Operation, ...]  # the last few linearized there, in order
    state: Value  # the model's state after them
    blocking: Operation  # it completed before any remaining operation could be linearized
    candidates: tuple[tuple[Operation, str], ...]  # called before it returned, and why not

    def explain(self) -> str:
        lines = [f"key {self.key!r}: no linearization extends past {self.linearized} of "
                 f"{self.operations} operations",
                 f"  the last linearized ({len(self.recent)}), leaving the state at "
                 f"{self.state!r}:"]
        lines += [f"    {op.describe()}" for op in self.recent] or ["    (none)"]
        lines.append(f"  must come next, as it completed before any other could take effect:\n"
                     f"    {self.blocking.describe()}")
        lines.append("  but none of the operations called before it returned can go first:")
        lines += [f"    {op.describe()}: {why}" for op, why in self.candidates]
        return "\n".join(lines)


@dataclass(frozen=True)
class KeyResult:
    key: str
    operations: int
    linearizable: bool
    violation: Violation | None
    explored: int  # configurations cached
    # The search gave up (its budget spent) before it could decide; ``violation`` is then the
    # one found without the unknown writes nobody observed, if that pass ran.
    undecided: bool = False


@dataclass(frozen=True)
class CheckResult:
    keys: tuple[KeyResult, ...]
    seconds: float

    @property
    def linearizable(self) -> bool:
        return all(result.linearizable for result in self.keys)

    @property
    def violations(self) -> list[Violation]:
        return [result.violation for result in self.keys if result.violation is not None]

    def explain(self) -> str:
        if self.linearizable:
            return (f"linearizable: {sum(r.operations for r in self.keys)} operations on "
                    f"{len(self.keys)} keys checked in {self.seconds:.3f} s")
        lines = []
        for result in self.keys:
            if result.undecided:
                lines.append(f"key {result.key!r}: undecided after {result.explored} "
                             f"configurations" + ("; without the unknown writes nobody "
                                                  "observed:" if result.violation else ""))
            if result.violation is not None:
                lines.append(result.violation.explain())
        return "\n".join(lines)


DEFAULT_BUDGET = 2_000_000  # configurations per key: a minute or two of search


def check(history: Iterable[Operation], initial: Mapping[str, Value] | None = None,
          recent: int = 4, budget: int = DEFAULT_BUDGET) -> CheckResult:
    """Check a history, key by key. ``initial``: each key's value before the history (absent
    unless given). ``recent``: how many linearized operations a violation shows. ``budget``:
    the configurations a key's search may explore before it gives up, undecided (which does
    not count as linearizable)."""
    started = time.perf_counter()
    by_key: dict[str, list[Operation]] = {}
    for op in history:
        by_key.setdefault(op.key, []).append(op)
    results = tuple(
        check_key(key, ops, (initial or {}).get(key), recent, budget)
        for key, ops in sorted(by_key.items())
    )
    return CheckResult(results, time.perf_counter() - started)


def checked_operations(ops: Iterable[Operation]) -> list[Operation]:
    """The operations that constrain a linearization: not the failed ones (they never took
    effect), nor reads whose outcome is unknown (they changed nothing and told nothing)."""
    return [op for op in ops if op.outcome is Outcome.OK
            or (op.outcome is Outcome.UNKNOWN and op.kind is not Kind.GET)]


def check_key(key: str, history: Sequence[Operation], initial: Value = None,
              recent: int = 4, budget: int = DEFAULT_BUDGET) -> KeyResult:
    """Porcupine's ``checkSingle`` for one key's history.

    Unknown operations make the search costly (each may take effect anywhere after its call,
    or never, and they never return). Most of them leave no trace: nothing ever reads what they
    wrote. So the history is first checked without those: if that is linearizable, so is the
    whole (the ones left out take effect after everything else, i.e. never). Only if it is not
    does the whole history decide (leaving one out can make a failed cas or a delete's answer
    unexplainable that it would have explained); that search can be long, hence the budget."""
    ops = checked_operations(history)
    observed = {op.result for op in ops if op.kind is Kind.GET and op.outcome is Outcome.OK}
    observed |= {op.expected for op in ops
                 if op.kind is Kind.CAS and op.outcome is Outcome.OK and op.result is True}
    traced = [op for op in ops if op.outcome is Outcome.OK or op.kind is Kind.DELETE
              or op.value in observed]
    if len(traced) == len(ops):
        return _KeySearch(key, ops).run(initial, recent, budget)
    first = _KeySearch(key, traced).run(initial, recent, budget)
    if first.linearizable:
        return KeyResult(key, len(ops), True, None, first.explored)
    whole = _KeySearch(key, ops).run(initial, recent, budget)
    if whole.undecided:
        return KeyResult(key, len(ops), False, first.violation, whole.explored, undecided=True)
    return whole


class _KeySearch:
    """The entries of one key's history as a doubly linked list (arrays of indices), and the
    search over it."""

    def __init__(self, key: str, ops: list[Operation]) -> None:
        for op in ops:
            if op.outcome is Outcome.OK and (op.completed is None or op.completed < op.invoked):
                raise ValueError(f"an ok operation needs invoked <= completed: {op.describe()}")
        self.key = key
        self.ops = ops
        # The ok operations' entries 1..2n in time order (0 is the list's head): calls sort
        # before returns at the same instant (the permissive reading: they were concurrent).
        # The unknown operations never return: they stay out of the list, by call time.
        timeline = sorted(
            [(op.invoked, 0, index) for index, op in enumerate(ops) if op.outcome is Outcome.OK]
            + [(op.completed, 1, index) for index, op in enumerate(ops)
               if op.outcome is Outcome.OK and op.completed is not None])
        self.unknown = sorted((i for i, op in enumerate(ops) if op.outcome is not Outcome.OK),
                              key=lambda i: ops[i].invoked)
        self.entry_time = [0.0] * (len(timeline) + 1)
        size = len(timeline) + 1
        self.op_of = [-1] * size  # the operation an entry belongs to
        self.is_call = [False] * size
        self.match = [-1] * size  # a call's return entry
        call_entry = [0] * len(ops)
        for position, (instant, kind, index) in enumerate(timeline, start=1):
            self.op_of[position] = index
            self.entry_time[position] = instant
            if kind == 0:
                self.is_call[position] = True
                call_entry[index] = position
            else:
                self.match[call_entry[index]] = position
        self.following = [i + 1 for i in range(size)]
        self.following[-1] = -1
        self.preceding = [i - 1 for i in range(size)]
        self.deepest: Violation | None = None  # where the search got furthest, so far

    def lift(self, entry: int) -> None:
        """Take a call and its return out of the list."""
        following, preceding = self.following, self.preceding
        after = following[entry]
        preceding[after] = preceding[entry]  # a call is always followed by its return
        following[preceding[entry]] = after
        ret = self.match[entry]
        following[preceding[ret]] = following[ret]
        if following[ret] != -1:
            preceding[following[ret]] = preceding[ret]

    def unlift(self, entry: int) -> None:
        """Put back what the last ``lift`` took out (their own links still point at their
        old neighbours)."""
        following, preceding = self.following, self.preceding
        ret = self.match[entry]
        following[preceding[ret]] = ret
        if following[ret] != -1:
            preceding[following[ret]] = ret
        following[preceding[entry]] = entry
        preceding[following[entry]] = entry

    def run(self, initial: Value, recent: int, budget: int) -> KeyResult:
        """The search. Unlike Porcupine, it tries the candidates of each step in two rounds:
        the ok operations called so far (in the list), then the unknown ones called so far
        (those are only needed when nothing else fits, as an unknown write seldom took effect
        where nobody saw a sign of it). The same candidates are tried either way: only the
        order differs."""
        ops, op_of, is_call, following = self.ops, self.op_of, self.is_call, self.following
        unknown, entry_time = self.unknown, self.entry_time
        unknown_used = [False] * len(ops)
        finite = len(ops) - len(unknown)
        cache: set[tuple[int, Value]] = set()
        # The linearization: (a call entry, or -1 - a position in ``unknown``; the state before
        # it; whether it is an unknown operation).
        calls: list[tuple[int, Value, bool]] = []
        linearized = 0  # bitset of linearized operations
        linearized_finite = 0
        state = initial
        deepest = -1
        violation: Violation | None = None
        entry = following[0]
        horizon = -1  # in the unknown round: the first return entry left
        position = 0  # in the unknown round: the next unknown operation to try
        while linearized_finite < finite:
            if horizon == -1 and is_call[entry]:
                index = op_of[entry]
                accepted, after = step(state, ops[index])
                configuration = (linearized | (1 << index), after)
                if accepted and configuration not in cache:
                    if len(cache) >= budget:  # the deepest point so far proves nothing
                        return KeyResult(self.key, len(ops), False, None, len(cache),
                                         undecided=True)
                    cache.add(configuration)
                    calls.append((entry, state, False))
                    state, linearized = after, configuration[0]
                    linearized_finite += 1
                    self.lift(entry)
                    entry = following[0]
                    continue
                entry = following[entry]
                continue
            if horizon == -1:
                # A return entry: its operation must be linearized before anything after it.
                # Try the unknown operations called before it first.
                horizon, position = entry, 0
            while position < len(unknown) and \
                    ops[unknown[position]].invoked <= entry_time[horizon]:
                index = unknown[position]
                position += 1
                if unknown_used[index]:
                    continue
                accepted, after = step(state, ops[index])
                configuration = (linearized | (1 << index), after)
                if configuration in cache or self._dominated(ops[index], state, after, calls):
                    continue
                if len(cache) >= budget:
                    return KeyResult(self.key, len(ops), False, None, len(cache),
                                     undecided=True)
                cache.add(configuration)
                calls.append((-1 - (position - 1), state, True))
                unknown_used[index] = True
                state, linearized = after, configuration[0]
                entry, horizon = following[0], -1
                break
            else:
                # Nothing fits: back up.
                if len(calls) > deepest:
                    deepest = len(calls)
                    violation = self.violation(calls, state, horizon, recent)
                    self.deepest = violation
                if not calls:
                    break
                popped, state, was_unknown = calls.pop()
                if was_unknown:
                    index = unknown[-1 - popped]
                    unknown_used[index] = False
                    linearized &= ~(1 << index)
                    # The same point as when it was tried: go on with the next unknown one.
                    position = -1 - popped + 1
                    horizon = self._horizon()
                else:
                    index = op_of[popped]
                    linearized &= ~(1 << index)
                    linearized_finite -= 1
                    self.unlift(popped)
                    entry, horizon = following[popped], -1
        # Done once every ok operation is linearized: the unknown ones left take effect after
        # all of them, which is the same as never.
        ok = linearized_finite == finite
        return KeyResult(self.key, len(ops), ok, None if ok else violation, len(cache))

    def _horizon(self) -> int:
        """The first return entry left in the list."""
        entry = self.following[0]
        while self.is_call[entry]:
            entry = self.following[entry]
        return entry

    @staticmethod
    def _dominated(op: Operation, state: Value, after: Value,
                   calls: Sequence[tuple[int, Value, bool]]) -> bool:
        """Whether linearizing unknown ``op`` here leads to a configuration that another one
        reached anyway dominates (the same linearized ok operations and state, with fewer
        unknown ones spent, which leaves more choices): ``op`` changes nothing, or it overwrites
        the state blindly right after another unknown operation (the one without that other,
        tried from the same point, dominates it)."""
        if after == state:
            return True
        return bool(calls) and calls[-1][2] and op.kind in (Kind.PUT, Kind.DELETE)

    def violation(self, calls: Sequence[tuple[int, Value, bool]], state: Value,
                  blocking_entry: int,
                  recent: int) -> Violation:
        candidates: list[tuple[Operation, str]] = []
        entry = self.following[0]
        while entry != blocking_entry:
            if self.is_call[entry]:
                op = self.ops[self.op_of[entry]]
                accepted, after = step(state, op)
                why = (f"leads nowhere (explored), state would be {after!r}" if accepted else
                       f"impossible in state {state!r}")
                candidates.append((op, why))
            entry = self.following[entry]
        return Violation(
            key=self.key, operations=len(self.ops), linearized=len(calls),
            recent=tuple(self.ops[self.unknown[-1 - e] if was_unknown else self.op_of[e]]
                         for e, _, was_unknown in calls[-recent:]) if recent else (),
            state=state, blocking=self.ops[self.op_of[blocking_entry]],
            candidates=tuple(candidates))


@dataclass
class Recorder:
    """Records a history from many client threads, with monotonic times."""

    operations: list[Operation] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, op: Operation) -> None:
        with self._lock:
            self.operations.append(op)

    def snapshot(self) -> list[Operation]:
        with self._lock:
            return list(self.operations)


def finished(kind: Kind, key: str, invoked: float, outcome: Outcome, *, client: int = 0,
             value: Value = None, expected: Value = None, result: Value | bool = None,
             completed: float | None = None) -> Operation:
    """An operation that ends now (``completed`` defaults to the monotonic clock's now; an
    unknown outcome has no completion)."""
    if outcome is Outcome.UNKNOWN:
        end: float | None = None
    else:
        end = time.monotonic() if completed is None else completed
    return Operation(kind, key, invoked, end, outcome, value, expected, result, client)


def dump_history(history: Iterable[Operation], path: Path) -> None:
    """Write a history as JSON lines (to check it again with ``load_history``)."""
    with path.open("w") as out:
        for op in history:
            out.write(json.dumps({**asdict(op), "kind": op.kind.value,
                                  "outcome": op.outcome.value}) + "\n")


def load_history(path: Path) -> list[Operation]:
    history = []
    for line in path.read_text().splitlines():
        fields = json.loads(line)
        fields["kind"] = Kind(fields["kind"])
        fields["outcome"] = Outcome(fields["outcome"])
        history.append(Operation(**fields))
    return history
