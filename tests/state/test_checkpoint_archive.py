"""A checkpoint's images packed into one file and unpacked in two parts at once
(engines/runc/archive.py); archives of one part, packed before, still unpack; a damaged
one is refused with a clear reason."""

from __future__ import annotations

import random
import stat
import subprocess
from pathlib import Path

import pytest

from deskbox_server.engines.runc.archive import PARTS, _lengths, pack, unpack
from deskbox_server.errors import SessionFailed


def _images(directory: Path) -> dict[str, bytes]:
    """Files shaped like CRIU's: a few large page images, many small ones."""
    rng = random.Random(5)
    files = {"inventory.img": b"inventory"}
    for pid in range(1, 6):
        files[f"pages-{pid}.img"] = rng.randbytes(200_000 * pid) + bytes(300_000)
        for kind in ("core", "mm", "pagemap", "fs", "ids"):
            files[f"{kind}-{pid}.img"] = rng.randbytes(rng.randrange(10, 3000))
    directory.mkdir()
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return files


def _contents(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in directory.iterdir()}


def test_images_come_back_exactly_from_an_archive_of_parts(tmp_path: Path) -> None:
    files = _images(tmp_path / "images")
    archive = tmp_path / "images.tar.zst"
    assert pack(tmp_path / "images", archive) == archive.stat().st_size
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600
    assert not list(tmp_path.glob("images.tar.part*")) and not list(tmp_path.glob("*.partial"))
    (tmp_path / "out").mkdir()
    unpack(archive, tmp_path / "out")
    assert _contents(tmp_path / "out") == files


def test_the_parts_are_one_zstd_stream_of_tars_for_standard_tools(tmp_path: Path) -> None:
    files = _images(tmp_path / "images")
    archive = tmp_path / "images.tar.zst"
    pack(tmp_path / "images", archive)
    listed = subprocess.run(
        f"zstd -dcq {archive} | tar --ignore-zeros -tf -", shell=True, capture_output=True,
        check=True, text=True).stdout.split()
    assert sorted(name.removeprefix("./") for name in listed) == sorted(files)
    # Each part holds about half of the bytes: the largest files go to different parts.
    lengths = _lengths(archive)
    assert lengths is not None and len(lengths) == PARTS
    assert max(lengths) < 1.5 * min(lengths)


def test_an_archive_of_one_part_from_before_still_unpacks(tmp_path: Path) -> None:
    files = _images(tmp_path / "images")
    archive = tmp_path / "images.tar.zst"
    subprocess.run(["tar", "-C", str(tmp_path / "images"), "-I", "zstd -1 -T0 -q", "-cf",
                    str(archive), "."], check=True)
    (tmp_path / "out").mkdir()
    unpack(archive, tmp_path / "out")
    assert _contents(tmp_path / "out") == files


@pytest.mark.parametrize("damage", ["cut in half", "bytes changed in a part", "missing",
                                    "no inventory"])
def test_a_damaged_archive_is_refused_with_the_reason(tmp_path: Path, damage: str) -> None:
    _images(tmp_path / "images")
    if damage == "no inventory":
        (tmp_path / "images" / "inventory.img").unlink()
    archive = tmp_path / "images.tar.zst"
    pack(tmp_path / "images", archive)
    data = archive.read_bytes()
    if damage == "cut in half":
        archive.write_bytes(data[: len(data) // 2])
    elif damage == "bytes changed in a part":
        middle = len(data) // 2
        archive.write_bytes(data[:middle] + bytes(b ^ 0x5A for b in data[middle:middle + 64])
                            + data[middle + 64:])
    elif damage == "missing":
        archive.unlink()
    (tmp_path / "out").mkdir()
    with pytest.raises(SessionFailed) as raised:
        unpack(archive, tmp_path / "out")
    expected = {"missing": "is missing", "no inventory": "no CRIU inventory"}
    assert expected.get(damage, "corrupted") in raised.value.message
