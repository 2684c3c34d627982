"""Job and experiment specs from a message, a dict or a YAML/JSON file, read
as tallyctl reads spec files (common/spec_yaml.h): unknown fields refused,
naming the field path; enum values in full ("PACKING_MODE_PACKED") or short
and in any case ("packed"); fields by their proto or JSON name; an empty
value leaves the field at its zero value."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, TypeVar, Union

import yaml
from google.protobuf import message as _message
from google.protobuf import struct_pb2
from google.protobuf.descriptor import FieldDescriptor

from tally._errors import InvalidSpec
from tally.v1 import experiments_pb2, spec_pb2

__all__ = ["load_job_spec", "load_experiment_spec", "to_message", "SpecInput", "JobSpecInput",
           "ExperimentSpecInput"]

MAX_SPEC_BYTES = 256 << 10
M = TypeVar("M", bound=_message.Message)

JobSpecInput = Union[spec_pb2.JobSpec, Mapping[str, Any], str, "os.PathLike[str]"]
"""A job spec: the message, a dict of its fields, or a YAML/JSON file's path."""
ExperimentSpecInput = Union[experiments_pb2.ExperimentSpec, Mapping[str, Any], str,
                            "os.PathLike[str]"]
"""An experiment spec: the message, a dict of its fields, or a file's path."""
SpecInput = Union[JobSpecInput, ExperimentSpecInput]


class _SpecLoader(yaml.SafeLoader):
    """YAML 1.2's numbers (1e-3 is a float, as yaml-cpp reads it), no
    anchors or aliases."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise yaml.constructor.ConstructorError(
                None, None, "anchors and aliases are not allowed", event.start_mark)
        return super().compose_node(parent, index)


_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def _short(enum_value_name: str, enum_full_name: str) -> str:
    # JOB_STATE_QUEUED -> queued; the prefix is the enum's name in CAPS_SNAKE.
    prefix = re.sub(r"(?<!^)(?=[A-Z])", "_", enum_full_name).upper() + "_"
    return enum_value_name[len(prefix):].lower() if enum_value_name.startswith(prefix) \
        else enum_value_name.lower()


def _fields(d: Any) -> dict[str, FieldDescriptor]:
    out: dict[str, FieldDescriptor] = {}
    for f in d.fields:
        out[f.name] = f
        out[f.json_name] = f
    return out


def _scalar(f: Any, value: Any, path: str) -> Any:
    t = f.type
    if t == FieldDescriptor.TYPE_ENUM:
        enum = f.enum_type
        if isinstance(value, int) and not isinstance(value, bool):
            if value in enum.values_by_number:
                return value
        elif isinstance(value, str):
            for v in enum.values:
                if value.upper() == v.name or value.lower() == _short(v.name, enum.name):
                    return v.number
        allowed = ", ".join(_short(v.name, enum.name) for v in enum.values if v.number != 0)
        raise InvalidSpec("%s: %r is not a %s; use one of: %s" % (path, value, enum.name, allowed),
                          field=path)
    if t == FieldDescriptor.TYPE_BOOL:
        if isinstance(value, bool):
            return value
        raise InvalidSpec("%s: %r is not true or false" % (path, value), field=path)
    if t == FieldDescriptor.TYPE_STRING:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise InvalidSpec("%s: %r is not a string" % (path, value), field=path)
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise InvalidSpec("%s: %r is not a number" % (path, value), field=path)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"[-+]?[0-9]+", value):
        return int(value)
    raise InvalidSpec("%s: %r is not an integer" % (path, value), field=path)


def _fill(msg: _message.Message, data: Any, path: str) -> None:
    d: Any = msg.DESCRIPTOR
    if isinstance(msg, struct_pb2.Struct):
        if not isinstance(data, Mapping):
            raise InvalidSpec("%s: must be a mapping" % path, field=path)
        msg.update(dict(data))
        return
    if not isinstance(data, Mapping):
        raise InvalidSpec("%s: must be a mapping (%s), not %r" % (path, d.name, data), field=path)
    fields = _fields(d)
    seen: dict[str, str] = {}
    for key, value in data.items():
        f: Any = fields.get(str(key))
        here = "%s.%s" % (path, key) if path else str(key)
        if f is None:
            raise InvalidSpec("%s: unknown field; %s has: %s"
                              % (here, d.name, ", ".join(x.name for x in d.fields)), field=here)
        if f.name in seen:
            raise InvalidSpec("%s: given twice (also as %s)" % (here, seen[f.name]), field=here)
        seen[f.name] = str(key)
        if f.containing_oneof is not None:
            for other in f.containing_oneof.fields:
                if other.name != f.name and other.name in seen:
                    raise InvalidSpec("%s: only one of %s may be set" % (
                        here, ", ".join(x.name for x in f.containing_oneof.fields)), field=here)
        if value is None:
            continue
        here = "%s.%s" % (path, f.name) if path else f.name
        target: Any = getattr(msg, f.name)
        is_map = (f.type == FieldDescriptor.TYPE_MESSAGE
                  and f.message_type.GetOptions().map_entry)
        if is_map:
            if not isinstance(value, Mapping):
                raise InvalidSpec("%s: must be a mapping" % here, field=here)
            value_field = f.message_type.fields_by_name["value"]
            for k, v in value.items():
                item = "%s.%s" % (here, k)
                if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                    _fill(target[str(k)], v, item)
                else:
                    target[str(k)] = _scalar(value_field, v, item)
        elif f.is_repeated:
            if not isinstance(value, list):
                raise InvalidSpec("%s: must be a list" % here, field=here)
            for i, v in enumerate(value):
                item = "%s[%d]" % (here, i)
                if f.type == FieldDescriptor.TYPE_MESSAGE:
                    _fill(target.add(), v, item)
                else:
                    target.append(_scalar(f, v, item))
        elif f.type == FieldDescriptor.TYPE_MESSAGE:
            sub = getattr(msg, f.name)
            sub.SetInParent()
            _fill(sub, value, here)
        else:
            setattr(msg, f.name, _scalar(f, value, here))


def to_message(data: Mapping[str, Any], cls: type[M], root: str = "spec") -> M:
    """A ``cls`` message from a dict of its fields, strictly (see the module's
    docstring). Raises InvalidSpec naming the field path under ``root``."""
    msg = cls()
    _fill(msg, data, root)
    return msg


def _read(path: str | os.PathLike[str]) -> Any:
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            text = f.read(MAX_SPEC_BYTES + 1)
    except FileNotFoundError:
        raise InvalidSpec("%s: cannot read: No such file or directory" % name) from None
    if len(text) > MAX_SPEC_BYTES:
        raise InvalidSpec("%s: larger than %d bytes" % (name, MAX_SPEC_BYTES))
    try:
        docs = list(yaml.load_all(text.decode("utf-8"), Loader=_SpecLoader))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise InvalidSpec("%s: %s" % (name, str(e).replace("\n", " "))) from None
    if len(docs) > 1:
        raise InvalidSpec("%s: more than one YAML document" % name)
    return docs[0] if docs and docs[0] is not None else {}


def _load(spec: object, cls: type[M]) -> M:
    """A ``cls`` from a ``cls`` (copied), a dict, or a YAML/JSON file's path."""
    if isinstance(spec, cls):
        out = cls()
        out.CopyFrom(spec)
        return out
    if isinstance(spec, (str, os.PathLike)):
        spec = _read(spec)
    if not isinstance(spec, Mapping):
        raise InvalidSpec("spec: give a %s, a dict or a file's path, not %s"
                          % (cls.DESCRIPTOR.full_name, type(spec).__name__), field="spec")
    return to_message(spec, cls, "spec")


def load_job_spec(spec: JobSpecInput) -> spec_pb2.JobSpec:
    """A JobSpec from a JobSpec (copied), a dict, or a YAML/JSON file's path."""
    return _load(spec, spec_pb2.JobSpec)


def load_experiment_spec(spec: ExperimentSpecInput) -> experiments_pb2.ExperimentSpec:
    """An ExperimentSpec from a message (copied), a dict, or a YAML/JSON
    file's path (the format of ``tallyctl experiment create -f``)."""
    return _load(spec, experiments_pb2.ExperimentSpec)
