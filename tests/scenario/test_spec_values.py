"""A fault spec as a value (`Spec`): built by planners, its text made in one place."""

from __future__ import annotations

import pytest

from torchchaos.errors import UsageError
from torchchaos.scenario.spec import Spec, pairs, parse_fault_spec


def test_a_spec_keeps_its_pairs_in_the_order_given_and_leaves_none_out():
    spec = Spec.make("storage", pairs(mode="torn"), pairs(rank=1, phase="checkpoint_save"),
                     save=2, event=3, dir=None)
    assert str(spec) == "storage:mode=torn,rank=1,phase=checkpoint_save,save=2,event=3"
    assert spec.get("save") == "2" and spec.get("dir") is None
    assert spec.trigger() == (("phase", "checkpoint_save"), ("save", "2"), ("event", "3"))
    assert str(Spec.make("kill", rank=0).plus(step=12)) == "kill:rank=0,step=12"
    assert str(Spec("abort")) == "abort"


@pytest.mark.parametrize("text", [
    "kill:rank=0,step=12",
    "partition:node=1,step=10,for=3",
    "storage:mode=lose_unsynced,rank=0,phase=checkpoint_save,save=2,event=4,dir=out",
    "hang:rank=1,step=11,mode=collective,op=broadcast",
])
def test_the_text_read_back_is_the_same_value_and_parses_as_before(text):
    spec = Spec.read(text)
    assert str(spec) == text and Spec.read(str(spec)) == spec
    assert spec.parse() == parse_fault_spec(text)


def test_a_malformed_text_is_refused_when_read():
    with pytest.raises(UsageError, match="expected key=value"):
        Spec.read("kill:rank=0,oops")
