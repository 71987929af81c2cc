"""TFRecord framing and tf.train.Example payloads, read and written without TensorFlow."""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.benchmarks.tfrecord import (
    ExampleError,
    TFRecordError,
    build_example,
    masked_crc,
    parse_example,
    read_records,
    write_records,
)

# Two records written by an independent implementation (the `tfrecord` 1.14.6 package's
# TFRecordWriter, with the `crc32c` package): {"count": 3 (int), "filename":
# b"test/0a1b.png", "misalignment_score": 0.75 (float)} then {"filename": b"x"}.
GOLDEN = (
    b"Q\x00\x00\x00\x00\x00\x00\x00\x9c\xa1\xd9\xbc\nO\n\x0e\n\x05count\x12\x05\x1a\x03\n\x01\x03\n"
    b"\x1d\n\x08filename\x12\x11\n\x0f\n\rtest/0a1b.png\n\x1e\n\x12misalignment_score\x12\x08\x12"
    b"\x06\n\x04\x00\x00@?\xc59(8\x15\x00\x00\x00\x00\x00\x00\x00\xd6\xabk+\n\x13\n\x11\n\x08filename"
    b"\x12\x05\n\x03\n\x01x\xdb\xee\xe7\xf1"
)


def _records(data: bytes) -> list[bytes]:
    return list(read_records(io.BytesIO(data)))


def test_reads_a_file_written_by_another_implementation():
    records = _records(GOLDEN)
    assert [parse_example(r) for r in records] == [
        {"count": [3], "filename": [b"test/0a1b.png"], "misalignment_score": [0.75]},
        {"filename": [b"x"]},
    ]


def test_writes_the_same_bytes_as_another_implementation():
    out = io.BytesIO()
    write_records(
        out,
        [
            build_example({"filename": b"test/0a1b.png", "misalignment_score": 0.75, "count": 3}),
            build_example({"filename": "x"}),
        ],
    )
    assert out.getvalue() == GOLDEN


def test_masked_crc_matches_the_crc32c_check_value_and_tensorflow_mask():
    # CRC-32C("123456789") = 0xE3069283 (RFC 3720 check value); mask = rotr15 + 0xa282ead8.
    crc = 0xE3069283
    assert masked_crc(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) % 2**32


def test_empty_file_has_no_records():
    assert _records(b"") == []


def _two_good_then(tail: bytes) -> bytes:
    return GOLDEN + tail


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda last: last[:5], "truncated header"),
        (lambda last: last[: len(last) - 6], "truncated record"),
        (lambda last: last[:8] + bytes([last[8] ^ 1]) + last[9:], "length CRC mismatch"),
        (lambda last: last[:20] + bytes([last[20] ^ 1]) + last[21:], "data CRC mismatch"),
        (lambda last: last[:-1] + bytes([last[-1] ^ 1]), "data CRC mismatch"),
    ],
)
def test_damage_stops_reading_after_the_good_records(damage, reason):
    last = io.BytesIO()
    write_records(last, [build_example({"filename": b"third record"})])
    stream = io.BytesIO(_two_good_then(damage(last.getvalue())))
    got = []
    with pytest.raises(TFRecordError) as info:
        for record in read_records(stream):
            got.append(record)
    assert len(got) == 2
    assert info.value.index == 2
    assert info.value.offset == len(GOLDEN)
    assert reason in str(info.value)


def test_a_huge_declared_length_is_caught_by_the_length_crc_not_by_reading_it():
    header = struct.pack("<Q", 2**62)
    stream = io.BytesIO(header + struct.pack("<I", masked_crc(header) ^ 1) + b"abc")
    with pytest.raises(TFRecordError, match="length CRC"):
        list(read_records(stream))


def test_a_payload_that_is_not_an_example_is_an_example_error():
    with pytest.raises(ExampleError):
        parse_example(b"\xff\xff\xff")


def test_example_feature_kinds_follow_python_types():
    parsed = parse_example(build_example({"b": [b"a", "é"], "f": [0.5, 2], "i": [-3, 2**40], "empty": []}))
    assert parsed == {"b": [b"a", "é".encode()], "f": [0.5, 2.0], "i": [-3, 2**40], "empty": []}


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.text(min_size=1, max_size=8),
            st.one_of(
                st.lists(st.binary(max_size=20), min_size=1, max_size=3),
                st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=3),
                st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=3),
            ),
            max_size=4,
        ),
        max_size=4,
    )
)
def test_round_trip(examples):
    out = io.BytesIO()
    write_records(out, [build_example(e) for e in examples])
    # float32 values (width=32) survive exactly, so the round trip is an identity
    assert [parse_example(r) for r in _records(out.getvalue())] == examples
