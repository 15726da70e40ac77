"""The step line, made with one format, reads back as the JSON encoder would write it."""

from __future__ import annotations

import json
import math

import pytest

from torchchaos.rundir.history import HistoryWriter, read_stream

STEPS = [
    dict(step=7, aligned=True, local=7, loss=2.0625, fp={"lr": "ab12", "batch": "cd34",
                                                          "loss": (2.0625).hex()}, light=True),
    dict(step=None, aligned=False, local=1, loss=None, fp={}, light=False),
    dict(step=0, aligned=True, local=3, loss=float("nan"),
         fp={"rng.torch": "0f", "params_start": "e9", "loss": "nan"}, light=False),
    dict(step=10**12, aligned=True, local=2, loss=-math.inf, fp={"grads": "-"}, light=True),
    dict(step=3, aligned=True, local=3, loss=1e-300, fp={"lr": "0x1.8p+1"}, light=False),
]


@pytest.mark.parametrize("fields", STEPS)
def test_the_step_line_is_the_encoders(tmp_path, fields):
    fields = dict(fields)  # the table is shared between the cases
    fast, encoded = tmp_path / "fast.jsonl", tmp_path / "encoded.jsonl"
    writer = HistoryWriter(fast, rank=1, pid=42, launch=0, attempt=2)
    writer.record_step(**fields)
    writer.close()
    light = fields.pop("light")
    writer = HistoryWriter(encoded, rank=1, pid=42, launch=0, attempt=2)
    writer.record("step", **fields, **({"light": True} if light else {}))
    writer.close()
    [mine], [theirs] = read_stream(fast), read_stream(encoded)
    assert mine.pop("t") > 0 and theirs.pop("t") > 0
    # NaN is the one value not equal to itself: compare the texts of the parsed events
    assert json.dumps(mine) == json.dumps(theirs)
    assert list(mine) == list(theirs)  # the same fields in the same order


def test_a_writer_with_no_fixed_fields_writes_json_too(tmp_path):
    path = tmp_path / "bare.jsonl"
    writer = HistoryWriter(path)
    writer.record_step(step=7, aligned=True, local=7, loss=1.5, fp={"lr": "ab"}, light=True)
    writer.close()
    [event] = read_stream(path)
    assert event["step"] == 7 and event["light"] is True
