"""The linearizability checker against histories whose verdict is known."""

from __future__ import annotations

import random
import time
from dataclasses import replace

import pytest
from linearizability import (
    CheckResult,
    Kind,
    Operation,
    Outcome,
    TxnCall,
    TxnCompare,
    TxnReply,
    TxnStep,
    Value,
    around,
    check,
    checked_operations,
    compare_holds,
    group_step,
    step,
    txn_step,
)


def _op(kind: Kind, key: str, start: float, end: float | None, *, value: Value = None,
        expected: Value = None, result: Value | bool = None, client: int = 0,
        failed: bool = False) -> Operation:
    outcome = Outcome.FAILED if failed else Outcome.UNKNOWN if end is None else Outcome.OK
    return Operation(kind, key, start, end, outcome, value, expected, result, client)


def put(value: str, start: float, end: float | None, *, key: str = "k",
        failed: bool = False) -> Operation:
    return _op(Kind.PUT, key, start, end, value=value, failed=failed)


def get(result: Value, start: float, end: float | None, *, key: str = "k") -> Operation:
    return _op(Kind.GET, key, start, end, result=result)


def cas(expected: Value, value: Value, applied: bool | None, start: float, end: float | None,
        *, key: str = "k") -> Operation:
    return _op(Kind.CAS, key, start, end, expected=expected, value=value, result=applied)


def delete(deleted: bool | None, start: float, end: float | None, *, key: str = "k") -> Operation:
    return _op(Kind.DELETE, key, start, end, result=deleted)


def assert_violation(result: CheckResult, key: str = "k") -> str:
    assert not result.linearizable
    [violation] = result.violations
    assert violation.key == key
    explanation = result.explain()
    assert f"key {key!r}" in explanation
    return explanation


def test_sequential_history_is_linearizable() -> None:
    history = [put("1", 0, 1), get("1", 2, 3), cas("1", "2", True, 4, 5),
               cas("1", "3", False, 6, 7), get("2", 8, 9), delete(True, 10, 11),
               get(None, 12, 13), delete(False, 14, 15),
               cas(None, "4", True, 16, 17), get("4", 18, 19)]
    result = check(history)
    assert result.linearizable, result.explain()
    assert result.keys[0].operations == len(history)


def test_stale_read_after_a_completed_write() -> None:
    stale = get("1", 4, 5)
    explanation = assert_violation(check([put("1", 0, 1), put("2", 2, 3), stale]))
    [violation] = check([put("1", 0, 1), put("2", 2, 3), stale]).violations
    assert violation.blocking == stale and violation.state == "2"
    assert violation.linearized == 2
    assert "get('k') -> '1'" in explanation


def test_a_read_concurrent_with_the_write_may_see_either_value() -> None:
    for seen in ("1", "2"):
        assert check([put("1", 0, 1), put("2", 2, 5), get(seen, 3, 4)]).linearizable


def test_lost_acknowledged_write() -> None:
    # The write was acknowledged; the final read finds the key absent.
    assert_violation(check([put("1", 0, 1), put("2", 2, 3), get(None, 10, 11)]))
    # Acknowledged, but overwritten by a concurrent write linearized after it: not lost.
    assert check([put("1", 0, 3), put("2", 1, 2), get("1", 10, 11)]).linearizable


def test_read_of_a_value_never_written() -> None:
    assert_violation(check([put("1", 0, 1), get("ghost", 0.5, 2)]))
    # A definitely failed write never took effect either.
    assert_violation(check([put("1", 0, 1), put("9", 2, 3, failed=True), get("9", 4, 5)]))


def test_around_a_violation_are_the_failed_operations_the_search_left_out() -> None:
    """A write answered as failed but applied shows only as a read of a value never written;
    ``around`` puts the failed write, and what the node answered it, beside the explanation."""
    refused = replace(put("9", 2, 3, failed=True), answer="503 NO_LEADER at node 2")
    history = [put("1", 0, 1), put("x", 0, 1, key="other"), refused, get("9", 4, 5),
               get("1", 10, 11)]
    [violation] = check(history).violations
    shown = around(violation, history, seconds_before=1.5)
    assert shown == [refused, history[3]]  # the keys' operations from 2.5 s on: not "other"
    assert "(failed: 503 NO_LEADER at node 2)" in refused.describe()


def test_cas_applied_twice_from_the_same_expected_value() -> None:
    assert_violation(check([put("x", 0, 1), cas("x", "y", True, 2, 3),
                            cas("x", "z", True, 4, 5)]))
    # Concurrent, still only one may apply.
    assert_violation(check([put("x", 0, 1), cas("x", "y", True, 2, 5),
                            cas("x", "z", True, 3, 6)]))
    assert check([put("x", 0, 1), cas("x", "y", True, 2, 5),
                  cas("x", "z", False, 3, 6)]).linearizable
    # Unless something wrote x back in between.
    assert check([put("x", 0, 1), cas("x", "y", True, 2, 3), put("x", 3.5, 3.8),
                  cas("x", "z", True, 4, 5)]).linearizable


def test_delete_reports_whether_there_was_a_value() -> None:
    assert_violation(check([delete(True, 0, 1)]))
    assert check([delete(False, 0, 1)]).linearizable
    assert check([put("a", 0, 1), delete(True, 2, 3), delete(False, 4, 5)]).linearizable
    assert_violation(check([put("a", 0, 1), delete(True, 2, 3), delete(True, 4, 5)]))


def test_concurrent_writes_linearizable_in_one_order_only() -> None:
    # Two long writes overlap four reads: only "1" then "2" explains them.
    one_order = [put("1", 0, 10), put("2", 1, 10), get("1", 2, 3), get("2", 4, 5),
                 get("2", 11, 12)]
    assert check(one_order).linearizable
    # Reads see "2" then "1", and the final read "2" again: "2" would have to be written twice.
    neither = [put("1", 0, 10), put("2", 1, 10), get("2", 2, 3), get("1", 4, 5),
               get("2", 11, 12)]
    explanation = assert_violation(check(neither))
    assert "get('k') -> '2'" in explanation


def test_indeterminate_operations_may_or_may_not_have_happened() -> None:
    unknown = put("2", 2, None)
    # It happened (a read saw it), possibly long after its call.
    assert check([put("1", 0, 1), unknown, get("1", 5, 6), get("2", 7, 8)]).linearizable
    # It never happened (nobody saw it).
    assert check([put("1", 0, 1), unknown, get("1", 5, 6), get("1", 70, 80)]).linearizable
    # But once seen, it cannot be undone.
    assert_violation(check([put("1", 0, 1), unknown, get("2", 5, 6), get("1", 7, 8)]))
    # Nor take effect before it was called.
    assert_violation(check([put("1", 0, 1), get("2", 1.5, 1.8), put("2", 2, None)]))
    # An unknown cas takes effect only if its expectation held.
    assert check([put("1", 0, 1), cas("1", "3", None, 2, None), get("3", 4, 5)]).linearizable
    assert_violation(check([put("1", 0, 1), cas("0", "3", None, 2, None), get("3", 4, 5)]))
    # An unknown delete may have removed the key; a read with no answer tells nothing.
    assert check([put("1", 0, 1), delete(None, 2, None), get(None, 4, 5)]).linearizable
    assert check([put("1", 0, 1), _op(Kind.GET, "k", 2, None, result=None),
                  get("1", 4, 5)]).linearizable


def test_a_search_out_of_budget_is_undecided_not_linearizable() -> None:
    # A stale read, and a dozen unknown writes nobody saw: the first pass, without them, finds
    # the violation; the whole search must then rule out placing any of them before the read.
    history = [put("1", 0, 1), *(put(f"u{i}", 2, None) for i in range(12)), put("2", 3, 4),
               get("1", 5, 6)]
    decided = check(history)
    assert not decided.linearizable and not decided.keys[0].undecided
    assert decided.keys[0].explored > 12
    undecided = check(history, budget=5)
    assert not undecided.linearizable and undecided.keys[0].undecided
    assert undecided.keys[0].explored == 5
    explanation = undecided.explain()
    assert "undecided after 5 configurations" in explanation
    assert "get('k') -> '1'" in explanation


def test_keys_are_checked_independently() -> None:
    history = [put("1", 0, 1, key="a"), put("1", 0, 1, key="b"), get("1", 2, 3, key="a"),
               get(None, 2, 3, key="b")]
    result = check(history)
    assert [r.linearizable for r in result.keys] == [True, False]
    assert_violation(result, key="b")
    assert check(history, initial={"b": "1"}).linearizable is False  # "b" read as absent
    assert check(history[:3]).linearizable


def simulated_history(seed: int, operations: int, keys: int, clients: int,
                      unknown_rate: float) -> list[Operation]:
    """A linearizable history: each client's operations are sequential; each takes effect at a
    random instant inside its interval (unknown ones: at that instant, or never), in that order,
    on a real register per key."""
    rng = random.Random(seed)
    planned: list[tuple[float, float, float, int, Kind, str, str | None, str | None, bool]] = []
    clock = [0.0] * clients
    for n in range(operations):
        client = n % clients
        start = clock[client] + rng.uniform(0, 0.002)
        effect = start + rng.uniform(0, 0.01)
        end = effect + rng.uniform(0, 0.01)
        clock[client] = end
        kind = rng.choice([Kind.PUT, Kind.GET, Kind.GET, Kind.CAS, Kind.DELETE])
        value = f"v{n}" if kind in (Kind.PUT, Kind.CAS) else None
        expected = f"v{rng.randrange(max(1, n - 30), n + 1)}" if kind is Kind.CAS else None
        if kind is Kind.CAS and rng.random() < 0.1:
            expected = None
        planned.append((effect, start, end, client, kind, f"key-{rng.randrange(keys)}", value,
                        expected, kind is not Kind.GET and rng.random() < unknown_rate))
    state: dict[str, Value] = {}
    history: list[Operation] = []
    for effect, start, end, client, kind, key, value, expected, unknown in sorted(planned):
        del effect
        if unknown and rng.random() < 0.5:  # it never took effect
            history.append(Operation(kind, key, start, None, Outcome.UNKNOWN, value, expected,
                                     None, client))
            continue
        applies = kind is Kind.CAS and state.get(key) == expected
        probe = Operation(kind, key, start, end, Outcome.UNKNOWN, value, expected, None, client)
        _, after = step(state.get(key), probe)
        result: Value | bool = {Kind.PUT: None, Kind.GET: state.get(key), Kind.CAS: applies,
                                Kind.DELETE: state.get(key) is not None}[kind]
        state[key] = after
        outcome = Outcome.UNKNOWN if unknown else Outcome.OK
        history.append(Operation(kind, key, start, None if unknown else end, outcome, value,
                                 expected, None if unknown else result, client))
    return history


def test_large_history_is_checked_fast() -> None:
    history = simulated_history(seed=7, operations=4000, keys=4, clients=8, unknown_rate=0.02)
    started = time.perf_counter()
    result = check(history)
    elapsed = time.perf_counter() - started
    print(f"\n{len(history)} operations on {len(result.keys)} keys "
          f"({sum(op.outcome is Outcome.UNKNOWN for op in history)} unknown): linearizable in "
          f"{elapsed:.3f} s, {sum(r.explored for r in result.keys)} configurations")
    assert result.linearizable, result.explain()

    # One read turned stale (it returns what the key held before the preceding write):
    index = next(i for i, op in enumerate(history)
                 if i > 2000 and op.kind is Kind.GET and op.outcome is Outcome.OK
                 and isinstance(op.result, str)
                 and any(o.kind is Kind.PUT and o.key == op.key and o.outcome is Outcome.OK
                         and o.completed is not None and o.completed < op.invoked - 0.05
                         for o in history[i - 40:i]))
    read = history[index]
    older = next(o.value for o in reversed(history[:index - 200]) if o.key == read.key
                 and o.kind is Kind.PUT and o.outcome is Outcome.OK and o.value != read.result)
    broken = [*history[:index], Operation(read.kind, read.key, read.invoked, read.completed,
                                          read.outcome, result=older, client=read.client),
              *history[index + 1:]]
    started = time.perf_counter()
    result = check(broken)
    print(f"the same with one stale read: violation found in "
          f"{time.perf_counter() - started:.3f} s\n{result.explain()}")
    assert_violation(result, key=read.key)


def brute_force(history: list[Operation], initial: Value = None) -> bool:
    """Linearizable by exhaustion: some order of the ok operations and a subset of the unknown
    ones that respects real time and the model (single key, a handful of operations)."""
    ops = [op for op in history if op.outcome is Outcome.OK
           or (op.outcome is Outcome.UNKNOWN and op.kind is not Kind.GET)]

    def extend(done: frozenset[int], state: Value) -> bool:
        if all(i in done for i, op in enumerate(ops) if op.outcome is Outcome.OK):
            return True
        # Whatever is next must have been called before every remaining op completed.
        horizon = min(op.completed for i, op in enumerate(ops)
                      if i not in done and op.completed is not None)
        for i, op in enumerate(ops):
            if i not in done and op.invoked <= horizon:
                accepted, after = step(state, op)
                if accepted and extend(done | {i}, after):
                    return True
        return False

    return extend(frozenset(), initial)


def random_history(rng: random.Random, size: int) -> list[Operation]:
    values = ["a", "b", None]
    history = []
    for _ in range(size):
        start = rng.uniform(0, 10)
        end = None if rng.random() < 0.15 else start + rng.uniform(0, 4)
        kind = rng.choice(list(Kind))
        result: Value | bool = None
        if end is not None:
            result = (rng.choice(values) if kind is Kind.GET else
                      rng.random() < 0.5 if kind in (Kind.CAS, Kind.DELETE) else None)
        history.append(Operation(kind, "k", start, end,
                                 Outcome.UNKNOWN if end is None else Outcome.OK,
                                 rng.choice(values[:2]) if kind is Kind.PUT else rng.choice(values),
                                 rng.choice(values), result, 0))
    return history


def test_agrees_with_exhaustive_search_on_small_random_histories() -> None:
    rng = random.Random(11)
    verdicts = {True: 0, False: 0}
    for _ in range(1500):
        history = random_history(rng, rng.randrange(1, 7))
        expected = brute_force(history)
        assert check(history).linearizable is expected, "\n".join(op.describe() for op in history)
        verdicts[expected] += 1
    assert min(verdicts.values()) > 200, verdicts  # both verdicts well represented


# --- transactions: several keys read and written at one instant ------------------------------

def txn(compares: list[TxnCompare], success: list[TxnStep], failure: list[TxnStep],
        reply: TxnReply | None, during: tuple[float, float | None], *,
        failed: bool = False) -> Operation:
    """A txn called and returning ``during`` (no return: unknown)."""
    call = TxnCall(tuple(compares), tuple(success), tuple(failure))
    start, end = during
    outcome = Outcome.FAILED if failed else Outcome.UNKNOWN if end is None else Outcome.OK
    return Operation(Kind.TXN, call.keys[0], start, end, outcome,
                     result=reply if outcome is Outcome.OK else None, txn=call)


def value_is(key: str, value: str) -> TxnCompare:
    return TxnCompare(key, "value", "=", value)


def absent(key: str) -> TxnCompare:
    return TxnCompare(key, "version", "=", 0)


def put_step(key: str, value: str) -> TxnStep:
    return TxnStep("put", key, value)


def get_step(key: str) -> TxnStep:
    return TxnStep("get", key)


def both_written(value: str, start: float, end: float | None,
                 existed: tuple[bool, bool] = (False, False)) -> Operation:
    """A txn putting ``value`` to "a" and "b" together, unconditionally."""
    return txn([], [put_step("a", value), put_step("b", value)], [],
               TxnReply(True, existed), (start, end))


def read_both(seen: tuple[Value, Value], start: float, end: float | None) -> Operation:
    return txn([], [get_step("a"), get_step("b")], [], TxnReply(True, seen), (start, end))


def test_txns_join_their_keys_into_one_group() -> None:
    history = [put("1", 0, 1, key="a"), both_written("2", 2, 3, (True, False)),
               get("2", 4, 5, key="b"), put("1", 0, 1, key="c")]
    result = check(history)
    assert result.linearizable, result.explain()
    assert [r.key for r in result.keys] == ["a+b", "c"]
    assert check([*history, get("1", 6, 7, key="a")]).violations[0].key == "a+b"


def test_unknown_writes_to_two_keys_of_a_group_may_both_take_effect() -> None:
    """Two writes whose outcome is unknown, on two keys a txn joins, both seen by the txn: one
    after the other is not one overwriting the other (a pruning that took it so called
    linearizable histories violations)."""
    history = [put("x", 0, None, key="a"), put("y", 0, None, key="b"),
               read_both(("x", "y"), 5, 6)]
    result = check(history)
    assert result.linearizable, result.explain()
    # One write to the same key does overwrite the other: only the later one can be seen.
    assert check([put("x", 0, None, key="a"), put("z", 0, None, key="a"),
                  read_both(("z", None), 5, 6)]).linearizable
    assert_violation(check([put("x", 0, None, key="a"), put("z", 0, None, key="a"),
                            read_both(("x", "y"), 5, 6)]), key="a+b")


def test_sequential_txns_are_linearizable() -> None:
    history = [
        txn([absent("a")], [put_step("a", "1"), put_step("b", "1")], [get_step("a")],
            TxnReply(True, (False, False)), (0, 1)),
        txn([value_is("a", "1")], [put_step("a", "2"), get_step("b")], [],
            TxnReply(True, (True, "1")), (2, 3)),
        # The compare fails: the failure branch runs and reads what a and b hold.
        txn([value_is("a", "1")], [put_step("a", "3")], [get_step("a"), get_step("b")],
            TxnReply(False, ("2", "1")), (4, 5)),
        txn([], [TxnStep("delete", "b"), get_step("b")], [], TxnReply(True, (True, None)),
            (6, 7)),
        read_both(("2", None), 8, 9),
        cas("2", "4", True, 10, 11, key="a"),
        get("4", 12, 13, key="a"),
    ]
    result = check(history)
    assert result.linearizable, result.explain()
    [group] = result.keys
    assert group.key == "a+b" and group.operations == len(history)


def test_a_txn_applied_non_atomically() -> None:
    # The txn writes a and b at one instant: a read that saw its a must see its b.
    torn_reads = [both_written("x", 0, 10), get("x", 2, 3, key="a"), get(None, 4, 5, key="b")]
    explanation = assert_violation(check(torn_reads), key="a+b")
    assert "get('b') -> None" in explanation
    # Two puts in its place, each atomic on its own, explain the same reads.
    assert check([put("x", 0, 10, key="a"), put("x", 0, 10, key="b"),
                  *torn_reads[1:]]).linearizable
    assert check([both_written("x", 0, 10), get("x", 2, 3, key="a"),
                  get("x", 4, 5, key="b")]).linearizable
    # A read-only txn sees both or neither.
    assert_violation(check([both_written("x", 0, 10), read_both(("x", None), 2, 3)]), "a+b")
    assert check([both_written("x", 0, 10), read_both((None, None), 2, 3)]).linearizable
    # Nor may an unknown txn take effect in part.
    assert_violation(check([both_written("x", 0, None), get("x", 2, 3, key="a"),
                            get(None, 4, 5, key="b")]), "a+b")


def test_a_stale_read_in_the_failure_branch() -> None:
    writes = [put("1", 0, 1, key="a"), put("2", 2, 3, key="a")]
    stale = txn([value_is("a", "9")], [put_step("a", "3")], [get_step("a")],
                TxnReply(False, ("1",)), (4, 5))
    explanation = assert_violation(check([*writes, stale]), key="a")
    assert "txn(if value('a') = '9' then put 'a'='3' else get 'a') -> failed ['1']" \
        in explanation
    fresh = txn([value_is("a", "9")], [put_step("a", "3")], [get_step("a")],
                TxnReply(False, ("2",)), (4, 5))
    assert check([*writes, fresh]).linearizable
    # Nor may the txn say its compare held when it could not have, or run the wrong branch.
    wrong_branch = txn([value_is("a", "9")], [put_step("a", "3")], [get_step("a")],
                       TxnReply(True, (True,)), (4, 5))
    assert_violation(check([*writes, wrong_branch]), key="a")
    # A compare of an absent key's value never holds, even "!=".
    never = txn([TxnCompare("a", "value", "!=", "1")], [put_step("a", "3")], [],
                TxnReply(True, (False,)), (0, 1))
    assert_violation(check([never]), key="a")


def test_version_compares_the_model_cannot_decide_are_refused() -> None:
    history = [put("1", 0, 1), txn([TxnCompare("k", "version", "=", 3)], [], [],
                                   TxnReply(False, ()), (2, 3))]
    with pytest.raises(ValueError, match="not its version"):
        check(history)


def _planned_operation(rng: random.Random, n: int, client: int, *,
                       interval: tuple[float, float], keys: list[str],
                       latest: dict[str, str]) -> Operation:
    """The n-th operation of a simulated history: a get, a put, or a txn (a conditional put of
    two keys, or a read of all three); ``latest`` follows the values written."""
    start, end = interval
    roll = rng.random()
    first, second = rng.sample(keys, 2)
    if roll < 0.3:
        return Operation(Kind.GET, first, start, end, Outcome.OK, client=client)
    if roll < 0.5:
        latest[first] = f"v{n}"
        return Operation(Kind.PUT, first, start, end, Outcome.OK, value=f"v{n}", client=client)
    # Mostly what a client that read the key last would expect: many compares hold.
    expected = latest.get(first, "v0") if rng.random() < 0.8 else f"v{rng.randrange(n)}"
    call = TxnCall((TxnCompare(first, "value", "=", expected),),
                   (put_step(first, f"v{n}"), put_step(second, f"v{n}")),
                   (get_step(first), get_step(second)))
    if roll < 0.65:
        call = TxnCall((), tuple(get_step(key) for key in keys))
    else:
        latest[first] = latest[second] = f"v{n}"
    return Operation(Kind.TXN, first, start, end, Outcome.OK, client=client, txn=call)


def simulated_txn_history(seed: int, operations: int, clients: int, unknown_rate: float,
                          torn: bool = False) -> list[Operation]:
    """A history of gets, puts and txns on three keys, each operation taking effect at a random
    instant inside its interval (unknown ones: at that instant, or never). With ``torn``, a txn
    that puts several keys applies its first put at that instant and the rest when it returns,
    as a store applying a txn's puts one at a time would."""
    rng = random.Random(seed)
    keys = ["a", "b", "c"]
    clock = [0.0] * clients
    planned: list[tuple[float, float, float, int, int, Operation]] = []
    latest: dict[str, str] = {}  # the value last written to each key, in the order planned
    for n in range(operations):
        client = n % clients
        start = clock[client] + rng.uniform(0, 0.002)
        effect = start + rng.uniform(0, 0.01)
        end = effect + rng.uniform(0, 0.01)
        clock[client] = end
        op = _planned_operation(rng, n, client, interval=(start, end), keys=keys, latest=latest)
        unknown = op.kind is not Kind.GET and rng.random() < unknown_rate
        if unknown and rng.random() < 0.5:  # it never took effect
            planned.append((end, start, end, n, -1, replace(op, completed=None,
                                                             outcome=Outcome.UNKNOWN)))
            continue
        if unknown:
            op = replace(op, completed=None, outcome=Outcome.UNKNOWN)
        planned.append((effect, start, end, n, 0, op))
        if torn and op.txn is not None and op.txn.writes:
            planned.append((end, start, end, n, 1, op))  # its other puts, later
    state = dict.fromkeys(keys)
    where = {key: position for position, key in enumerate(keys)}
    replies: dict[int, TxnReply] = {}
    history: dict[int, Operation] = {}
    for _, _, _, n, part, op in sorted(planned, key=lambda p: (p[0], p[3], p[4])):
        if part == -1:
            history[n] = op
            continue
        before = tuple(state[key] for key in keys)
        if op.txn is None:
            _, after = group_step(before, replace(op, outcome=Outcome.UNKNOWN), where)
            result = state[op.key] if op.kind is Kind.GET else None
        elif part == 1:  # a torn txn's later puts
            after, result = before, None
            for written in op.txn.success[1:]:
                after = tuple(written.value if key == written.key else after[where[key]]
                              for key in keys)
        else:
            result = replies[n] = _txn_reply(op.txn, before, where)
            if torn and op.txn.writes and result.succeeded:
                written = op.txn.success[0]
                after = tuple(written.value if key == written.key else before[where[key]]
                              for key in keys)
            else:
                _, after = txn_step(before, replace(op, outcome=Outcome.UNKNOWN), where)
        state = dict(zip(keys, after, strict=True))
        if part == 0 and op.outcome is Outcome.OK:
            history[n] = replace(op, result=result)
        elif part == 0:
            history[n] = op
    return [history[n] for n in sorted(history)]


def _txn_reply(call: TxnCall, state: tuple[Value, ...], where: dict[str, int]) -> TxnReply:
    succeeded = all(compare_holds(c, state[where[c.key]]) for c in call.compares)
    values = list(state)
    responses: list[Value | bool] = []
    for one in call.success if succeeded else call.failure:
        current = values[where[one.key]]
        responses.append(current if one.kind == "get" else current is not None)
        if one.kind == "put":
            values[where[one.key]] = one.value
    return TxnReply(succeeded, tuple(responses))


def test_simulated_txn_histories_and_their_torn_mutants() -> None:
    """Histories of a correct store pass; the same workload on a store that applies a txn's
    puts one at a time fails (its readers catch a txn half applied)."""
    for seed in range(3):
        history = simulated_txn_history(seed, 1000, clients=4, unknown_rate=0.03)
        result = check(history)
        assert result.linearizable, result.explain()
        assert sum(op.kind is Kind.TXN for op in history) > 400
        assert sum(isinstance(op.result, TxnReply) and op.result.succeeded and op.txn is not None
                   and op.txn.writes for op in history) > 20
        torn = check(simulated_txn_history(seed, 1000, clients=4, unknown_rate=0.03, torn=True))
        assert not torn.linearizable
        [violation] = torn.violations
        assert violation.key == "a+b+c"


def group_brute_force(history: list[Operation], keys: tuple[str, ...]) -> bool:
    """``brute_force`` for a group of keys, with the group's model."""
    ops = checked_operations(history)
    where = {key: position for position, key in enumerate(keys)}

    def extend(done: frozenset[int], state: tuple[Value, ...]) -> bool:
        if all(i in done for i, op in enumerate(ops) if op.outcome is Outcome.OK):
            return True
        horizon = min(op.completed for i, op in enumerate(ops)
                      if i not in done and op.completed is not None)
        for i, op in enumerate(ops):
            if i not in done and op.invoked <= horizon:
                accepted, after = group_step(state, op, where)
                if accepted and extend(done | {i}, after):
                    return True
        return False

    return extend(frozenset(), (None,) * len(keys))


def random_txn_history(rng: random.Random, size: int) -> list[Operation]:
    values: list[Value] = ["x", "y", None]
    history = []
    for _ in range(size):
        start = rng.uniform(0, 10)
        end = None if rng.random() < 0.15 else start + rng.uniform(0, 4)
        outcome = Outcome.UNKNOWN if end is None else Outcome.OK
        key = rng.choice("ab")
        if rng.random() < 0.5:
            kind = rng.choice([Kind.PUT, Kind.GET, Kind.DELETE])
            result: Value | bool = (rng.choice(values) if kind is Kind.GET else
                                    rng.random() < 0.5 if kind is Kind.DELETE else None)
            history.append(Operation(kind, key, start, end, outcome, rng.choice(values[:2]),
                                     None, result if end is not None else None))
            continue
        other = "b" if key == "a" else "a"
        compares = [value_is(key, str(rng.choice(values[:2])))] if rng.random() < 0.5 else \
            [absent(key)]
        success = [put_step(key, str(rng.choice(values[:2]))),
                   rng.choice([get_step(other), TxnStep("delete", other)])]
        failure = [get_step(key), get_step(other)][:rng.randrange(3)]
        succeeded = rng.random() < 0.5
        branch = success if succeeded else failure
        reply = TxnReply(succeeded, tuple(rng.choice(values) if s.kind == "get" else
                                          rng.random() < 0.5 for s in branch))
        history.append(txn(compares, success, failure, reply, (start, end)))
    return history


def test_groups_agree_with_exhaustive_search_on_small_random_histories() -> None:
    rng = random.Random(5)
    verdicts = {True: 0, False: 0}
    for _ in range(1500):
        history = random_txn_history(rng, rng.randrange(1, 6))
        keys = tuple(sorted({key for op in history for key in op.keys}))
        if len(keys) == 1:
            continue
        expected = group_brute_force(history, keys)
        assert check(history).linearizable is expected, "\n".join(op.describe()
                                                                  for op in history)
        verdicts[expected] += 1
    assert min(verdicts.values()) > 100, verdicts
