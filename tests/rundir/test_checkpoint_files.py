"""The checkpoint folder read from its bytes: real torch zips, safetensors files and DCP
folders, whole and cut short, named by a symlink or a tracker file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

from torchchaos.rundir.checkpoint_files import defect, inspect

STATE = {"w": torch.arange(4096, dtype=torch.float32), "b": torch.ones(7)}


def cut(path: Path, keep: float = 0.5) -> None:
    os.truncate(path, int(path.stat().st_size * keep))


def torch_file(path: Path) -> Path:
    torch.save(STATE, path)
    return path


def safetensors_file(path: Path) -> Path:
    save_file(STATE, str(path))
    return path


def dcp_folder(path: Path) -> Path:
    dcp.save({"model": dict(STATE)}, checkpoint_id=str(path), no_dist=True)
    return path


MAKERS = {"model.pt": torch_file, "model.safetensors": safetensors_file, "step_8": dcp_folder}


@pytest.mark.parametrize("name", MAKERS)
def test_a_whole_checkpoint_has_no_defect(tmp_path, name):
    assert defect(MAKERS[name](tmp_path / name)) is None


@pytest.mark.parametrize(("name", "says"), [
    ("model.pt", "a torch zip without its end record"),
    ("model.safetensors", "tensors need"),
])
def test_a_file_cut_in_half_is_named_with_its_sizes(tmp_path, name, says):
    path = MAKERS[name](tmp_path / name)
    whole = path.stat().st_size
    cut(path)
    found = defect(path)
    assert found is not None and says in found and str(whole // 2) in found


def test_a_safetensors_file_cut_inside_its_header(tmp_path):
    path = safetensors_file(tmp_path / "model.safetensors")
    cut(path, 0.005)
    assert "header runs past its end" in defect(path)


def test_a_dcp_folder_without_its_metadata(tmp_path):
    folder = dcp_folder(tmp_path / "step_8")
    (folder / ".metadata").unlink()
    assert defect(folder) == "a DCP folder without .metadata (1 .distcp file(s))"


def test_a_dcp_folder_with_an_empty_shard(tmp_path):
    folder = dcp_folder(tmp_path / "step_8")
    shard = next(folder.glob("*.distcp"))
    os.truncate(shard, 0)
    assert defect(folder) == f"a folder whose {shard.name} is an empty file"


def test_a_latest_symlink_names_the_folder_it_points_at(tmp_path):
    ckpt = tmp_path / "checkpoints"
    dcp_folder(ckpt / "step_4")
    dcp_folder(ckpt / "step_8")
    (ckpt / "step_8" / ".metadata").unlink()
    os.symlink("step_8", ckpt / "latest")
    (found,) = inspect(tmp_path, ["checkpoints"])
    assert found.describe() == ("checkpoints/latest named checkpoints/step_8, which is a DCP"
                                " folder without .metadata (1 .distcp file(s))")


def test_a_tracker_names_the_folders_of_its_step(tmp_path):
    ckpt = tmp_path / "ckpts"
    torch_file((ckpt / "global_step_4").mkdir(parents=True) or ckpt / "global_step_4" / "m.pt")
    torch_file((ckpt / "global_step_8").mkdir() or ckpt / "global_step_8" / "m.pt")
    cut(ckpt / "global_step_8" / "m.pt")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("8")
    (found,) = inspect(tmp_path, ["ckpts"])
    assert found.named_by == "ckpts/latest_checkpointed_iteration.txt"
    assert found.path == "ckpts/global_step_8"
    assert "m.pt is a torch zip without its end record" in found.what
    (ckpt / "latest_checkpointed_iteration.txt").write_text("12")
    (found,) = inspect(tmp_path, ["ckpts"])
    assert "holding '12' that no entry beside it names" in found.what


def test_a_dangling_pointer_is_named_missing(tmp_path):
    (tmp_path / "ckpt").mkdir()
    os.symlink("step_20", tmp_path / "ckpt" / "latest")
    (found,) = inspect(tmp_path, ["ckpt"])
    assert found.describe() == "ckpt/latest named ckpt/step_20, which is missing"


def test_a_torn_temporary_file_beside_a_published_checkpoint_is_no_defect(tmp_path):
    """What an atomic writer leaves when it dies mid-write: the pointer names the
    whole checkpoint, the torn file is nobody's."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    torch_file(ckpt / "step_4.pt")
    cut(torch_file(ckpt / "step_8.pt.tmp"))
    (ckpt / "latest").write_text("step_4.pt")
    assert inspect(tmp_path, ["ckpt"]) == []


def test_a_file_a_resume_read_is_judged_without_a_pointer(tmp_path):
    (tmp_path / "out").mkdir()
    cut(torch_file(tmp_path / "out" / "snapshot.pt"))
    (found,) = inspect(tmp_path, ["out"], read=["out/snapshot.pt"])
    assert found.named_by is None and found.describe().startswith("out/snapshot.pt is a torch")


def test_by_names_and_sizes_alone_holes_are_no_defect(tmp_path):
    """A crash state's recovery folder holds sized holes, its bytes in the recording:
    read without contents, a hole of a torch zip's size is no cut zip, and a DCP folder
    without .metadata is still one."""
    ckpt = tmp_path / "ckpt"
    (ckpt / "step_8").mkdir(parents=True)
    with open(ckpt / "step_8" / "__0_0.distcp", "wb") as f:
        f.truncate(4096)
    with open(ckpt / "model.safetensors", "wb") as f:
        f.truncate(4096)
    (ckpt / "current").write_bytes(b"\0" * 8)  # a tracker's bytes not laid out
    os.symlink("step_8", ckpt / "latest")
    os.symlink("model.safetensors", ckpt / "weights")
    (found,) = inspect(tmp_path, ["ckpt"], contents=False)
    assert found.describe() == ("ckpt/latest named ckpt/step_8, which is a DCP folder"
                                " without .metadata (1 .distcp file(s))")
    assert len(inspect(tmp_path, ["ckpt"])) == 2, "read with its bytes, the hole is no file"
