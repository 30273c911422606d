"""A linearizability checker for histories of a key-value store (put, get, compare-and-set,
delete, and multi-key transactions as etcd's Txn), and a thread-safe recorder for such histories.

The search is Wing and Gong's, with Lowe's memoization, as Knossos and Porcupine implement it
(Porcupine's ``checkSingle``): the history becomes a doubly linked list of call and return
entries in time order; the search linearizes the first call whose operation the model accepts in
the current state (lifting its call and return out of the list), and backtracks when it reaches a
return entry, i.e. an operation that completed before anything left could have taken effect. A
cache of (set of linearized operations, model state) prunes configurations already explored.

The history is partitioned by key first (P-compositionality: a history is linearizable iff each
independent part of it is). A txn reads and writes several keys at one instant, so the keys that
txns join (transitively) form one group, checked as one object whose state is the values of all
its keys: a txn is then one step of that group's model, which evaluates its compares on the
group's state, runs the branch they choose and checks every answer of it (the branch taken, each
get's value, whether a put found the key, whether a delete did). A key no txn touches is a group
of its own, checked as a register.

Outcomes follow Knossos and Porcupine: an ``ok`` operation took effect once between its call and
its return; a ``failed`` one definitely did not take effect (it is left out); an ``unknown`` one
(a timeout, a lost connection) may have taken effect at any time after its call, or never: it
returns at +infinity, and its result is not known. A read with an unknown outcome constrains
nothing and is left out too (a txn that only reads included).
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
State = tuple[Value, ...]  # a group's state: the values of its keys, in the group's key order


class Kind(enum.Enum):
    PUT = "put"
    GET = "get"
    CAS = "cas"
    DELETE = "delete"
    TXN = "txn"


class Outcome(enum.Enum):
    OK = "ok"
    FAILED = "failed"  # definitely not applied
    UNKNOWN = "unknown"  # may or may not have been applied


@dataclass(frozen=True)
class TxnCompare:
    """A txn's compare, of the targets the model follows: a key's ``value`` (a compare of an
    absent key's value never holds, etcd's rule), or its ``version`` against 0 (an absent key's
    version is 0, a present key's at least 1: whether it is present)."""

    key: str
    target: str  # "value" or "version"
    result: str  # "=", "!=", "<" or ">"
    operand: str | int

    def describe(self) -> str:
        operand = repr(self.operand) if self.target == "value" else str(self.operand)
        return f"{self.target}({self.key!r}) {self.result} {operand}"


@dataclass(frozen=True)
class TxnStep:
    """One operation of a txn's branch: ``kind`` is "put" (of ``value``), "delete" or "get"."""

    kind: str
    key: str
    value: Value = None

    def describe(self) -> str:
        return f"put {self.key!r}={self.value!r}" if self.kind == "put" else \
            f"{self.kind} {self.key!r}"


@dataclass(frozen=True)
class TxnCall:
    """What a txn asks: if every compare holds, the ``success`` steps, else the ``failure``
    ones, all at one instant."""

    compares: tuple[TxnCompare, ...]
    success: tuple[TxnStep, ...]
    failure: tuple[TxnStep, ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        named = [c.key for c in self.compares] + [s.key for s in self.success + self.failure]
        return tuple(dict.fromkeys(named))

    @property
    def writes(self) -> bool:
        return any(s.kind != "get" for s in self.success + self.failure)

    def describe(self) -> str:
        condition = " and ".join(c.describe() for c in self.compares) or "true"
        then = ", ".join(s.describe() for s in self.success) or "nothing"
        otherwise = ", ".join(s.describe() for s in self.failure) or "nothing"
        return f"txn(if {condition} then {then} else {otherwise})"


@dataclass(frozen=True)
class TxnReply:
    """What an ok txn answered: whether its compares held, and one answer for each step of the
    branch that ran: a get's value, whether a put found the key there, whether a delete
    deleted one."""

    succeeded: bool
    responses: tuple[Value | bool, ...]


Result = Value | bool | TxnReply


@dataclass(frozen=True)
class Operation:
    """One client operation: on one key, or (a txn, ``txn``) on several.

    ``value``: a put's value, or a cas's new value (None: the cas deletes). ``expected``: a
    cas's expected value (None: absent). ``result``: what an ok operation answered (a get's
    value or None, a cas's ``applied``, a delete's ``deleted``, a txn's ``TxnReply``; None for a
    put). ``completed`` is None unless the outcome is ok or failed. A txn's ``key`` is the
    first it names."""

    kind: Kind
    key: str
    invoked: float
    completed: float | None
    outcome: Outcome
    value: Value = None
    expected: Value = None
    result: Result = None
    client: int = 0
    txn: TxnCall | None = None
    answer: str = ""  # what a node answered one not ok (the code, or the connection's error)

    @property
    def keys(self) -> tuple[str, ...]:
        return self.txn.keys if self.txn is not None else (self.key,)

    def describe(self) -> str:
        if self.txn is not None:
            call = self.txn.describe()
        elif self.kind is Kind.PUT:
            call = f"put({self.key!r}, {self.value!r})"
        elif self.kind is Kind.GET:
            call = f"get({self.key!r})"
        elif self.kind is Kind.CAS:
            call = f"cas({self.key!r}, {self.expected!r} -> {self.value!r})"
        else:
            call = f"delete({self.key!r})"
        if self.outcome is not Outcome.OK:
            answer = f" ({self.outcome.value}{': ' + self.answer if self.answer else ''})"
        elif isinstance(self.result, TxnReply):
            answer = (f" -> {'succeeded' if self.result.succeeded else 'failed'} "
                      f"{list(self.result.responses)!r}")
        else:
            answer = "" if self.kind is Kind.PUT else f" -> {self.result!r}"
        until = "inf" if self.completed is None else f"{self.completed:.4f}"
        return f"client {self.client}: {call}{answer} [{self.invoked:.4f}, {until}]"


def step(state: Value, op: Operation) -> tuple[bool, Value]:
    """The register model, for an operation on one key: whether ``op`` with its result can take
    effect in ``state``, and the state after it. An unknown operation is always accepted and has
    its effect."""
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


def compare_holds(compare: TxnCompare, value: Value) -> bool:
    """Whether a txn's compare holds of a key holding ``value`` (None: absent)."""
    if compare.target == "value":
        # etcd's rule: a compare of an absent key's value never holds.
        return value is not None and _holds(compare.result, value, compare.operand)
    if value is None:
        return _holds(compare.result, 0, compare.operand)
    # A present key's version is some n >= 1, which the model does not follow: only a compare
    # that holds alike for every such n has an answer it knows.
    operand = compare.operand
    assert isinstance(operand, int), compare
    known = {"=": False if operand < 1 else None, "!=": True if operand < 1 else None,
             ">": True if operand < 1 else None, "<": False if operand <= 1 else None}
    answer = known[compare.result]
    if answer is None:
        raise ValueError(f"the model knows whether a key is present, not its version: "
                         f"{compare.describe()}")
    return answer


def _holds(result: str, actual: str | int, operand: str | int) -> bool:
    if result == "=":
        return actual == operand
    if result == "!=":
        return actual != operand
    if result == "<":
        return actual < operand  # type: ignore[operator]
    return actual > operand  # type: ignore[operator]


def txn_step(state: State, op: Operation, where: Mapping[str, int]) -> tuple[bool, State]:
    """The group model's step for a txn: its compares on ``state`` (``where``: each key's
    position in it) choose a branch, whose steps apply in order; an ok txn is accepted only if
    it answered what that branch answers from this state."""
    assert op.txn is not None
    values = list(state)
    succeeded = all(compare_holds(c, values[where[c.key]]) for c in op.txn.compares)
    reply = op.result if op.outcome is Outcome.OK else None
    if isinstance(reply, TxnReply) and reply.succeeded is not succeeded:
        return False, state
    for number, txn_step_ in enumerate(op.txn.success if succeeded else op.txn.failure):
        position = where[txn_step_.key]
        current = values[position]
        answer: Value | bool
        if txn_step_.kind == "get":
            answer = current
        else:
            answer = current is not None
            values[position] = txn_step_.value if txn_step_.kind == "put" else None
        if isinstance(reply, TxnReply) and (number >= len(reply.responses)
                                            or reply.responses[number] != answer
                                            or type(reply.responses[number]) is not type(answer)):
            return False, state
    if isinstance(reply, TxnReply) and len(reply.responses) != \
            len(op.txn.success if succeeded else op.txn.failure):
        return False, state
    return True, tuple(values)


def group_step(state: State, op: Operation, where: Mapping[str, int]) -> tuple[bool, State]:
    """The model of a group of keys: a txn as ``txn_step``, any other operation as the register
    model of its key."""
    if op.txn is not None:
        return txn_step(state, op, where)
    position = where[op.key]
    accepted, after = step(state[position], op)
    if after == state[position]:
        return accepted, state
    return accepted, (*state[:position], after, *state[position + 1:])


@dataclass(frozen=True)
class Violation:
    """Where the search got furthest on a group of keys before no linearization extended."""

    key: str  # the group's keys, joined by "+"
    operations: int  # of the group, checked ones
    linearized: int  # how many were linearized at the deepest point
    recent: tuple[Operation, ...]  # the last few linearized there, in order
    state: Value | dict[str, Value]  # the model's state after them (a group's: by key)
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
    key: str  # the group's keys, joined by "+" (one key: the key)
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
                    f"{len(self.keys)} groups of keys checked in {self.seconds:.3f} s")
        lines = []
        for result in self.keys:
            if result.undecided:
                lines.append(f"key {result.key!r}: undecided after {result.explored} "
                             f"configurations" + ("; without the unknown writes nobody "
                                                  "observed:" if result.violation else ""))
            if result.violation is not None:
                lines.append(result.violation.explain())
        return "\n".join(lines)


DEFAULT_BUDGET = 2_000_000  # configurations per group of keys: a minute or two of search


def check(history: Iterable[Operation], initial: Mapping[str, Value] | None = None,
          recent: int = 4, budget: int = DEFAULT_BUDGET) -> CheckResult:
    """Check a history, group of keys by group (``key_groups``). ``initial``: each key's value
    before the history (absent unless given). ``recent``: how many linearized operations a
    violation shows. ``budget``: the configurations a group's search may explore before it
    gives up, undecided (which does not count as linearizable)."""
    started = time.perf_counter()
    ops = list(history)
    groups = key_groups(ops)
    by_group: dict[tuple[str, ...], list[Operation]] = {}
    for op in ops:
        by_group.setdefault(groups[op.key], []).append(op)
    results = tuple(
        check_key(keys, group_ops, tuple((initial or {}).get(key) for key in keys), recent,
                  budget)
        for keys, group_ops in sorted(by_group.items())
    )
    return CheckResult(results, time.perf_counter() - started)


def key_groups(history: Iterable[Operation]) -> dict[str, tuple[str, ...]]:
    """Each key's group: the keys joined to it by txns, transitively (union-find), sorted."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        parent.setdefault(key, key)
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    for op in history:
        first, *others = op.keys
        for other in others:
            parent[root(other)] = root(first)
        root(first)
    members: dict[str, list[str]] = {}
    for key in parent:
        members.setdefault(root(key), []).append(key)
    return {key: tuple(sorted(group)) for group in members.values() for key in group}


def checked_operations(ops: Iterable[Operation]) -> list[Operation]:
    """The operations that constrain a linearization: not the failed ones (they never took
    effect), nor reads whose outcome is unknown (they changed nothing and told nothing)."""
    return [op for op in ops if op.outcome is Outcome.OK
            or (op.outcome is Outcome.UNKNOWN and op.kind is not Kind.GET
                and (op.txn is None or op.txn.writes))]


def observed_values(ops: Iterable[Operation]) -> set[tuple[str, Value]]:
    """The (key, value) pairs some ok operation saw: a read's answer, an applied cas's
    expectation, a txn's get answers and the values its compares found equal."""
    observed: set[tuple[str, Value]] = set()
    for op in ops:
        if op.outcome is not Outcome.OK:
            continue
        if op.kind is Kind.GET and not isinstance(op.result, TxnReply | bool):
            observed.add((op.key, op.result))
        elif op.kind is Kind.CAS and op.result is True:
            observed.add((op.key, op.expected))
        elif op.txn is not None and isinstance(op.result, TxnReply):
            reply = op.result
            branch = op.txn.success if reply.succeeded else op.txn.failure
            observed |= {(s.key, answer) for s, answer in zip(branch, reply.responses,
                                                             strict=False)
                         if s.kind == "get" and not isinstance(answer, bool)}
            if reply.succeeded:
                observed |= {(c.key, c.operand) for c in op.txn.compares  # type: ignore[misc]
                             if c.target == "value" and c.result == "="}
    return observed


def _traced(op: Operation, observed: set[tuple[str, Value]]) -> bool:
    """Whether an operation may have left a trace: it is ok, it deletes (an answer may depend on
    a key's absence), or some ok operation saw a value it writes."""
    if op.outcome is Outcome.OK or op.kind is Kind.DELETE:
        return True
    if op.txn is None:
        return (op.key, op.value) in observed
    return any(s.kind == "delete" or (s.kind == "put" and (s.key, s.value) in observed)
               for s in op.txn.success + op.txn.failure)


def check_key(key: str | tuple[str, ...], history: Sequence[Operation],
              initial: Value | State = None, recent: int = 4,
              budget: int = DEFAULT_BUDGET) -> KeyResult:
    """Porcupine's ``checkSingle`` for the history of one key or one group of keys (``key``:
    the group's keys, ``initial`` their values).

    Unknown operations make the search costly (each may take effect anywhere after its call,
    or never, and they never return). Most of them leave no trace: nothing ever reads what they
    wrote. So the history is first checked without those: if that is linearizable, so is the
    whole (the ones left out take effect after everything else, i.e. never). Only if it is not
    does the whole history decide (leaving one out can make a failed cas or a delete's answer
    unexplainable that it would have explained); that search can be long, hence the budget."""
    keys = (key,) if isinstance(key, str) else key
    start: State = initial if isinstance(initial, tuple) else (initial,)
    ops = checked_operations(history)
    observed = observed_values(ops)
    traced = [op for op in ops if _traced(op, observed)]
    if len(traced) == len(ops):
        return _KeySearch(keys, ops).run(start, recent, budget)
    first = _KeySearch(keys, traced).run(start, recent, budget)
    if first.linearizable:
        return KeyResult(first.key, len(ops), True, None, first.explored)
    whole = _KeySearch(keys, ops).run(start, recent, budget)
    if whole.undecided:
        return KeyResult(whole.key, len(ops), False, first.violation, whole.explored,
                         undecided=True)
    return whole


class _KeySearch:
    """The entries of one group's history as a doubly linked list (arrays of indices), and the
    search over it."""

    def __init__(self, keys: tuple[str, ...], ops: list[Operation]) -> None:
        for op in ops:
            if op.outcome is Outcome.OK and (op.completed is None or op.completed < op.invoked):
                raise ValueError(f"an ok operation needs invoked <= completed: {op.describe()}")
        self.keys = keys
        self.key = "+".join(keys)
        self.where = {key: position for position, key in enumerate(keys)}
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

    def step(self, state: State, op: Operation) -> tuple[bool, State]:
        return group_step(state, op, self.where)

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

    def run(self, initial: State, recent: int, budget: int) -> KeyResult:
        """The search. Unlike Porcupine, it tries the candidates of each step in two rounds:
        the ok operations called so far (in the list), then the unknown ones called so far
        (those are only needed when nothing else fits, as an unknown write seldom took effect
        where nobody saw a sign of it). The same candidates are tried either way: only the
        order differs."""
        ops, op_of, is_call, following = self.ops, self.op_of, self.is_call, self.following
        unknown, entry_time = self.unknown, self.entry_time
        unknown_used = [False] * len(ops)
        finite = len(ops) - len(unknown)
        cache: set[tuple[int, State]] = set()
        # The linearization: (a call entry, or -1 - a position in ``unknown``; the state before
        # it; whether it is an unknown operation).
        calls: list[tuple[int, State, bool]] = []
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
                accepted, after = self.step(state, ops[index])
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
                accepted, after = self.step(state, ops[index])
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

    def _dominated(self, op: Operation, state: State, after: State,
                   calls: Sequence[tuple[int, State, bool]]) -> bool:
        """Whether linearizing unknown ``op`` here leads to a configuration that another one
        reached anyway dominates (the same linearized ok operations and state, with fewer
        unknown ones spent, which leaves more choices): ``op`` changes nothing, or it overwrites
        blindly, right after another unknown operation, everything that one wrote (the one
        without that other, tried from the same point, dominates it)."""
        if after == state:
            return True
        if not calls or not calls[-1][2] or op.kind not in (Kind.PUT, Kind.DELETE):
            return False
        previous = self.ops[self.unknown[-1 - calls[-1][0]]]
        if previous.txn is None:
            return previous.key == op.key  # in a group of keys, another key's write stays
        return all(s.kind == "get" or s.key == op.key
                   for s in previous.txn.success + previous.txn.failure)

    def described_state(self, state: State) -> Value | dict[str, Value]:
        return state[0] if len(self.keys) == 1 else dict(zip(self.keys, state, strict=True))

    def violation(self, calls: Sequence[tuple[int, State, bool]], state: State,
                  blocking_entry: int,
                  recent: int) -> Violation:
        candidates: list[tuple[Operation, str]] = []
        entry = self.following[0]
        while entry != blocking_entry:
            if self.is_call[entry]:
                op = self.ops[self.op_of[entry]]
                accepted, after = self.step(state, op)
                why = (f"leads nowhere (explored), state would be "
                       f"{self.described_state(after)!r}" if accepted else
                       f"impossible in state {self.described_state(state)!r}")
                candidates.append((op, why))
            entry = self.following[entry]
        return Violation(
            key=self.key, operations=len(self.ops), linearized=len(calls),
            recent=tuple(self.ops[self.unknown[-1 - e] if was_unknown else self.op_of[e]]
                         for e, _, was_unknown in calls[-recent:]) if recent else (),
            state=self.described_state(state), blocking=self.ops[self.op_of[blocking_entry]],
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
             value: Value = None, expected: Value = None, result: Result = None,
             completed: float | None = None, txn: TxnCall | None = None,
             answer: str = "") -> Operation:
    """An operation that ends now (``completed`` defaults to the monotonic clock's now; an
    unknown outcome has no completion)."""
    if outcome is Outcome.UNKNOWN:
        end: float | None = None
    else:
        end = time.monotonic() if completed is None else completed
    return Operation(kind, key, invoked, end, outcome, value, expected, result, client, txn,
                     answer)


def around(violation: Violation, history: Iterable[Operation], *, seconds_before: float = 2.0,
           limit: int = 150) -> list[Operation]:
    """The operations on the violation's keys, failed ones included (the search leaves them
    out, and one wrongly failed is a likely culprit), from ``seconds_before`` before the
    blocking one was called until it returned, in the order they were called: what a reader of
    a violation needs beside its explanation."""
    keys = set(violation.key.split("+"))
    start = violation.blocking.invoked - seconds_before
    end = violation.blocking.completed or violation.blocking.invoked
    found = sorted((op for op in history if keys & set(op.keys) and op.invoked <= end
                    and (op.completed is None or op.completed >= start)),
                   key=lambda op: op.invoked)
    return found[-limit:]


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
        txn = fields.get("txn")
        if txn is not None:
            fields["txn"] = TxnCall(tuple(TxnCompare(**c) for c in txn["compares"]),
                                    tuple(TxnStep(**s) for s in txn["success"]),
                                    tuple(TxnStep(**s) for s in txn["failure"]))
        if isinstance(fields["result"], dict):
            fields["result"] = TxnReply(fields["result"]["succeeded"],
                                        tuple(fields["result"]["responses"]))
        history.append(Operation(**fields))
    return history
