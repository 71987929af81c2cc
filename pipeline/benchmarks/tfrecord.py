"""Read (and, for tests, write) TFRecord files of `tf.train.Example`s without TensorFlow.

TensorFlow is a 600 MB dependency for what is a simple container: each record is

    uint64 length | uint32 masked_crc32c(length) | data[length] | uint32 masked_crc32c(data)

(little endian; "masked" = rotate right by 15 bits, then add 0xa282ead8). The CRC comes
from `google-crc32c` and the `Example` message from `protobuf`, with its schema
(tensorflow/core/example/{example,feature}.proto) declared below, so both the framing
and the payload use maintained libraries rather than hand-written decoders.

A damaged file must not be read as if it were whole: `read_records` checks both CRCs
and raises `TFRecordError` (with the record index and byte offset) at the first
truncated or corrupt record, after yielding every good record before it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import BinaryIO

import google_crc32c
from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8


class TFRecordError(ValueError):
    """A truncated or corrupt record; nothing after it in the file can be trusted."""

    def __init__(self, index: int, offset: int, reason: str):
        super().__init__(f"record {index} at byte {offset}: {reason}")
        self.index = index
        self.offset = offset
        self.reason = reason


def masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def read_records(stream: BinaryIO) -> Iterator[bytes]:
    """Yield each record's payload, checking lengths and both CRCs."""
    index = offset = 0
    while True:
        header = stream.read(_HEADER.size)
        if not header:
            return
        if len(header) < _HEADER.size:
            raise TFRecordError(index, offset, f"truncated header ({len(header)} of {_HEADER.size} bytes)")
        length, length_crc = _HEADER.unpack(header)
        if masked_crc(header[:8]) != length_crc:
            raise TFRecordError(index, offset, "length CRC mismatch (corrupt header)")
        data = stream.read(length)
        footer = stream.read(_FOOTER.size)
        if len(data) < length or len(footer) < _FOOTER.size:
            raise TFRecordError(index, offset, f"truncated record (declares {length} bytes of data)")
        if masked_crc(data) != _FOOTER.unpack(footer)[0]:
            raise TFRecordError(index, offset, "data CRC mismatch (corrupt record)")
        yield data
        index += 1
        offset += _HEADER.size + length + _FOOTER.size


def write_records(stream: BinaryIO, records: Iterable[bytes]) -> None:
    for data in records:
        header = struct.pack("<Q", len(data))
        stream.write(header + struct.pack("<I", masked_crc(header)) + data + _FOOTER.pack(masked_crc(data)))


def _example_class() -> type[message.Message]:
    """The `tf.train.Example` message class, built from the schema of TensorFlow's protos."""
    FD = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="depict/tf_example.proto", package="depict.tf", syntax="proto3")

    def add(name: str, fields: Sequence[tuple[str, int, int, int, str]]) -> descriptor_pb2.DescriptorProto:
        msg = proto.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            field = msg.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:  # set only for message fields: an empty one still counts as set
                field.type_name = type_name
        return msg

    repeated, optional = FD.LABEL_REPEATED, FD.LABEL_OPTIONAL
    add("BytesList", [("value", 1, FD.TYPE_BYTES, repeated, "")])
    add("FloatList", [("value", 1, FD.TYPE_FLOAT, repeated, "")])
    add("Int64List", [("value", 1, FD.TYPE_INT64, repeated, "")])
    feature = add(
        "Feature",
        [
            ("bytes_list", 1, FD.TYPE_MESSAGE, optional, ".depict.tf.BytesList"),
            ("float_list", 2, FD.TYPE_MESSAGE, optional, ".depict.tf.FloatList"),
            ("int64_list", 3, FD.TYPE_MESSAGE, optional, ".depict.tf.Int64List"),
        ],
    )
    feature.oneof_decl.add(name="kind")
    for field in feature.field:
        field.oneof_index = 0
    features = add("Features", [("feature", 1, FD.TYPE_MESSAGE, repeated, ".depict.tf.Features.FeatureEntry")])
    entry = features.nested_type.add(name="FeatureEntry")  # how protoc spells map<string, Feature>
    entry.field.add(name="key", number=1, type=FD.TYPE_STRING, label=optional)
    entry.field.add(name="value", number=2, type=FD.TYPE_MESSAGE, label=optional, type_name=".depict.tf.Feature")
    entry.options.map_entry = True
    add("Example", [("features", 1, FD.TYPE_MESSAGE, optional, ".depict.tf.Features")])

    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("depict.tf.Example"))


Example = _example_class()

FeatureValues = list[bytes] | list[float] | list[int]


class ExampleError(ValueError):
    """A record's payload is not a parsable `tf.train.Example`."""


def parse_example(data: bytes) -> dict[str, FeatureValues]:
    """Feature name -> its values (bytes, float or int list; an unset feature gives [])."""
    try:
        example = Example.FromString(data)
    except message.DecodeError as exc:
        raise ExampleError(f"not a tf.train.Example: {exc}") from exc
    out: dict[str, FeatureValues] = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        out[name] = list(getattr(feature, kind).value) if kind else []
    return out


def build_example(features: Mapping[str, bytes | str | float | int | Sequence]) -> bytes:
    """Serialize a `tf.train.Example`; the list kind follows the Python type of the values.

    Single values are wrapped in a list; str is UTF-8 encoded (as TensorFlow does).
    """
    example = Example()
    for name, value in features.items():
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        values = [v.encode("utf-8") if isinstance(v, str) else v for v in values]
        feature = example.features.feature[name]
        if all(isinstance(v, bytes) for v in values):
            feature.bytes_list.value.extend(values)
        elif all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            feature.int64_list.value.extend(values)
        else:
            feature.float_list.value.extend(float(v) for v in values)
    return example.SerializeToString(deterministic=True)
