"""The bound on a KV record's JSON nesting, checked before it is parsed: the brackets outside
strings are walked, never the bytes of every key and value; it judges any JSON text as a walk of
every byte does (which the test keeps as its reference), so replicas of either agree."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from quorum_node.kv.ops import MAX_OP_DEPTH, _nesting_exceeds

# Strings full of what a scanner could mistake for structure: brackets, quotes, backslashes.
tricky_text = st.text(alphabet=st.sampled_from(list('[]{}"\\/ab\u00e9\n')), max_size=12)
documents = st.recursive(
    st.none() | st.integers() | tricky_text,
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(tricky_text, children, max_size=3),
    max_leaves=40)


def every_byte_walked(payload: bytes, limit: int) -> bool:
    depth = 0
    in_string = escaped = False
    for byte in payload:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return False


@settings(max_examples=300, deadline=None)
@given(document=documents, limit=st.integers(0, 6), ascii_only=st.booleans())
def test_any_json_text_is_judged_as_a_walk_of_every_byte_judges_it(
        document: object, limit: int, ascii_only: bool) -> None:
    payload = json.dumps(document, ensure_ascii=ascii_only).encode()
    assert _nesting_exceeds(payload, limit) == every_byte_walked(payload, limit)


@settings(max_examples=300, deadline=None)
@given(payload=st.binary(max_size=200) | st.text(alphabet=st.sampled_from(list('[]{}"\\ a1,:')),
                                                 max_size=200).map(str.encode))
def test_bytes_that_parse_as_json_are_judged_alike(payload: bytes) -> None:
    try:
        json.loads(payload)
    except (ValueError, RecursionError):
        return  # refused when parsed, whatever the bound said
    assert _nesting_exceeds(payload, 3) == every_byte_walked(payload, 3)


def test_a_txn_nested_three_deep_passes_and_a_deep_one_does_not() -> None:
    txn = json.dumps({"op": "txn", "compare": [], "success": [
        {"op": "put", "key": f"k{i}", "value": '[{"\\} "' * 3} for i in range(128)],
        "failure": []}).encode()
    assert not _nesting_exceeds(txn, MAX_OP_DEPTH)
    deep = b'{"value":' + b"[" * 33 + b"]" * 33 + b"}"
    assert _nesting_exceeds(deep, MAX_OP_DEPTH)
    assert not _nesting_exceeds(deep, 34)
