"""The session image as an OCI image (desktop_image/oci_image.py, ``deskbox image``).

A layer is the same bytes from the same tree whatever its files' times and the order they
were made in; the real image's archive is a valid OCI layout whose digests match its blobs,
``podman load`` (Debian's podman, with a storage root of the test's own) takes it with its
entrypoint, labels and layer, and ``deskbox image inspect|export`` show and copy it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from isal import igzip

from deskbox_server.engines.image import OCI_ARCHIVE, build_image
from deskbox_server.settings import default_recipe_dir

from ..docker.podman import Podman
from ..images import IMAGE_STATE_DIR, progress, recipe_module

BUILD_TIMEOUT_S = 1800
DESKBOX = str(Path(sys.executable).parent / "deskbox")


@pytest.fixture(scope="module")
def oci_image() -> Iterator[ModuleType]:
    """desktop_image/oci_image.py as a module."""
    with recipe_module("oci_image") as module:
        yield module


def _tree(root: Path, reverse: bool) -> None:
    """The same tree, made in one order or the other (inode numbers and times differ)."""
    names = ["a.txt", "bin/tool", "empty/", "private/key"]
    for name in reversed(names) if reverse else names:
        path = root / name
        if name.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(name.encode() * 1000)
    (root / "bin/tool").chmod(0o755)
    (root / "private").chmod(0o700)
    os.chown(root / "private/key", 1000, 1000)
    os.link(root / "a.txt", root / "hardlink")
    os.symlink("bin/tool", root / "symlink")
    os.mkfifo(root / "fifo")
    stamp = 1_700_000_000 if reverse else 1_600_000_000
    for path in root.rglob("*"):
        os.utime(path, (stamp, stamp), follow_symlinks=False)


def test_a_layer_is_the_same_bytes_whatever_the_times_and_order(
    oci_image: ModuleType, tmp_path: Path
) -> None:
    blobs = []
    for reverse in (False, True):
        root = tmp_path / f"tree-{reverse}"
        root.mkdir()
        _tree(root, reverse)
        out = io.BytesIO()
        layer = oci_image.write_layer(root, out)
        blobs.append(out.getvalue())
        assert layer.digest == "sha256:" + hashlib.sha256(out.getvalue()).hexdigest()
        assert layer.size == len(out.getvalue())
        assert layer.skipped == 1  # the fifo
    assert blobs[0] == blobs[1]
    plain = igzip.decompress(blobs[0])
    assert layer.diff_id == "sha256:" + hashlib.sha256(plain).hexdigest()
    with tarfile.open(fileobj=io.BytesIO(plain)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert list(members) == ["a.txt", "bin", "empty", "hardlink", "private", "symlink",
                                 "bin/tool", "private/key"]  # parents first, names sorted
        assert {(m.mtime, m.uname, m.gname) for m in members.values()} == {(0, "", "")}
        assert members["hardlink"].islnk() and members["hardlink"].linkname == "a.txt"
        assert members["symlink"].issym() and members["symlink"].linkname == "bin/tool"
        assert members["bin/tool"].mode == 0o755 and members["private"].mode == 0o700
        assert (members["private/key"].uid, members["private/key"].gid) == (1000, 1000)
        content = tar.extractfile("bin/tool")
        assert content is not None and content.read() == b"bin/tool" * 1000


@pytest.fixture(scope="module")
def built() -> Path:
    """The current recipe's OCI image directory (built if missing: the layer in ~a minute)."""
    return build_image(IMAGE_STATE_DIR, default_recipe_dir(), progress,
                       timeout_s=BUILD_TIMEOUT_S, script_name="oci_image.py")


def _blob(archive: tarfile.TarFile, digest: str) -> bytes:
    member = archive.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
    assert member is not None, digest
    return member.read()


@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_the_archive_is_an_oci_layout_whose_digests_match(built: Path) -> None:
    manifest = json.loads((built / "manifest.json").read_text())
    image_hash = manifest["image_hash"]
    with tarfile.open(built / OCI_ARCHIVE) as archive:
        assert json.loads(_blob_named(archive, "oci-layout")) == {"imageLayoutVersion": "1.0.0"}
        (entry,) = json.loads(_blob_named(archive, "index.json"))["manifests"]
        assert entry["annotations"]["org.opencontainers.image.ref.name"] == image_hash
        assert entry["digest"] == manifest["manifest"]
        raw = _blob(archive, entry["digest"])
        assert hashlib.sha256(raw).hexdigest() == entry["digest"][7:]
        image = json.loads(raw)
        config_raw = _blob(archive, image["config"]["digest"])
        assert hashlib.sha256(config_raw).hexdigest() == image["config"]["digest"][7:]
        config = json.loads(config_raw)
        assert config["config"]["Entrypoint"] == ["/usr/local/bin/deskbox-session"]
        labels = config["config"]["Labels"]
        assert labels["io.deskbox.image.hash"] == image_hash
        assert labels["io.deskbox.agent.protocol"] == "1"
        (layer,) = image["layers"]
        assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
        member = archive.extractfile(f"blobs/sha256/{layer['digest'][7:]}")
        assert member is not None
        compressed, plain = hashlib.sha256(), hashlib.sha256()
        names = set()
        with igzip.IGzipFile(fileobj=_Tee(member, compressed), mode="rb") as gz:  # type: ignore[no-untyped-call]
            tar_stream = _Tee(gz, plain)
            with tarfile.open(fileobj=tar_stream, mode="r|") as layer_tar:
                for item in layer_tar:
                    names.add(item.name)
            # tarfile stops at the end-of-archive blocks; the digests cover the padding
            # after them too (whether a read had reached it depended on the tar's size).
            while tar_stream.read(1 << 20):
                pass
        assert compressed.hexdigest() == layer["digest"][7:]
        assert config["rootfs"]["diff_ids"] == ["sha256:" + plain.hexdigest()]
        # Docker's manifest.json names the same blobs.
        (docker,) = json.loads(_blob_named(archive, "manifest.json"))
        assert docker["RepoTags"] == [f"deskbox-session:{image_hash}"]
        assert docker["Layers"] == [f"blobs/sha256/{layer['digest'][7:]}"]
    assert {"usr/local/bin/deskbox-session", "usr/local/bin/deskbox-agent",
            "usr/bin/chromium", "usr/bin/Xvfb", "dev"} <= names
    assert "dev/null" not in names  # device nodes are the engine's


def _blob_named(archive: tarfile.TarFile, name: str) -> bytes:
    member = archive.extractfile(name)
    assert member is not None, name
    return member.read()


class _Tee(io.RawIOBase):
    """Reads ``source`` and hashes what it reads."""

    def __init__(self, source: Any, digest: Any) -> None:
        self.source, self.digest = source, digest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.source.read(len(buffer))
        buffer[: len(data)] = data
        self.digest.update(data)
        return len(data)


@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_podman_loads_it_with_its_entrypoint_labels_and_layer(
    built: Path, podman: Podman
) -> None:
    """Into the suite's Podman (tests/conftest.py), whose storage is empty this early: the
    docker engine's sessions then find it there, as a server finds an image loaded by
    hand (the rootless tests load it through the engine, into a storage of their own)."""
    manifest = json.loads((built / "manifest.json").read_text())
    loaded = podman.cli("load", "--input", str(built / OCI_ARCHIVE), timeout_s=600)
    assert loaded.returncode == 0, loaded.stderr
    name = f"localhost/deskbox-session:{manifest['image_hash']}"
    assert name in loaded.stdout, loaded.stdout
    shown = podman.cli("image", "inspect", name)
    assert shown.returncode == 0, shown.stderr
    (image,) = json.loads(shown.stdout)
    assert image["Config"]["Entrypoint"] == ["/usr/local/bin/deskbox-session"]
    assert image["Config"]["Labels"] == manifest["labels"]
    assert image["RootFS"]["Layers"] == [manifest["layer"]["diff_id"]]
    assert image["Id"] == manifest["config"].removeprefix("sha256:")


@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_deskbox_image_inspect_and_export(built: Path, tmp_path: Path) -> None:
    env = {**os.environ, "DESKBOX_IMAGE_STATE_DIR": str(IMAGE_STATE_DIR)}
    shown = subprocess.run([DESKBOX, "image", "inspect"], capture_output=True, text=True,
                           env=env, timeout=120)
    assert shown.returncode == 0, shown.stderr
    found = json.loads(shown.stdout)
    manifest = json.loads((built / "manifest.json").read_text())
    assert found["image"]["hash"] == manifest["image_hash"]
    assert found["oci"]["manifest"] == manifest["manifest"]
    out = tmp_path / "session.tar"
    exported = subprocess.run([DESKBOX, "image", "export", "-o", str(out)],
                              capture_output=True, text=True, env=env, timeout=600)
    assert exported.returncode == 0, exported.stderr
    assert "oci image" in exported.stderr and "MiB" in exported.stderr
    assert out.stat().st_size == (built / OCI_ARCHIVE).stat().st_size
    assert _sha256(out) == _sha256(built / OCI_ARCHIVE)
    assert not list(tmp_path.glob(".*partial"))
    refused = subprocess.run([DESKBOX, "image", "export", "-o", str(tmp_path / "no/such/x")],
                             capture_output=True, text=True, env=env, timeout=600)
    assert refused.returncode == 2 and "cannot write" in refused.stderr, refused.stderr


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as content:
        while chunk := content.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
