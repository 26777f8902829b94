"""Build the session image as an OCI image: one layer, the session's root filesystem.

    deskbox-session.oci.tar  an OCI image layout (``oci-layout``, ``index.json``,
                             ``blobs/sha256/``) in one tar, with Docker's ``manifest.json``
                             beside it (as ``docker save`` writes since Docker 25), so that
                             ``podman load``, ``docker load`` and skopeo (``oci-archive:``)
                             all read it
    manifest.json            the digests, sizes, name and labels, built_at

cached as ``<state_dir>/images/oci-<hash>/``; the hash covers the session image's recipe
hash and this file. It is built (in a temporary directory beside it, under a lock, never
rebuilt) from the session image that build.py made and mounted, and needs no container
daemon: the layer is that mounted tree written as a tar, in path order, every entry with
mtime 0, its numeric uid and gid and no user or group name, hard links as links. So the
same session image gives the same bytes, and the same digests, on every build. What the
layer leaves out: device nodes (the image's ``/dev`` holds a few; every container engine
mounts its own ``/dev``, and rootless engines cannot make them), and extended attributes
(the erofs image keeps none: ``mkfs.erofs -x-1``).

The layer is gzip (ISA-L level 1, no name, mtime 0): every loader and registry reads gzip.
The image's entrypoint is the sandbox's init, ``/usr/local/bin/deskbox-session``, which
takes the desktop's command lines from the environment (``DESKBOX_XSERVER``,
``DESKBOX_WM``, ``DESKBOX_BROWSER``, ``DESKBOX_AGENT``): the engine that runs the image
gives them, as the runc and vm engines do. Its labels name the session image's hash and
the agent's protocol version, so an engine can refuse an image it cannot speak to.

Usage: ``python desktop_image/oci_image.py [--state-dir DIR] [--print-dir]``; the last
line printed is the image's directory (``--print-dir``: only that, built or not).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import stat
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import build
import image_store
from isal import igzip

__all__ = ["ARCHIVE", "LayerInfo", "ensure_oci_image", "main", "oci_dir", "write_layer"]

HERE = Path(__file__).resolve().parent
ARCHIVE = "deskbox-session.oci.tar"
MANIFEST = "manifest.json"
REPOSITORY = "deskbox-session"
ENTRYPOINT = "/usr/local/bin/deskbox-session"
AGENT = "/usr/local/bin/deskbox-agent"
# What every process of a session starts with; deskbox-session sets its children's PATH.
ENV = ("PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root", "LANG=C.UTF-8")
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
_COPY_CHUNK = 1 << 20

Progress = Callable[[str], None]


@dataclass(frozen=True)
class LayerInfo:
    digest: str  # sha256:... of the gzip blob
    size: int
    diff_id: str  # sha256:... of the tar inside it
    entries: int
    skipped: int  # device nodes, sockets, fifos


class _Hashing(io.RawIOBase):
    """A write-only file that hashes and counts what goes through it to ``target``."""

    def __init__(self, target: BinaryIO) -> None:
        self.target = target
        self.sha256 = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:  # tarfile asks where it starts
        return self.size

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.sha256.update(data)
        self.size += len(data)
        self.target.write(data)
        return len(data)


def _walk(root: Path) -> Iterator[tuple[str, os.stat_result, Path]]:
    """Every entry under ``root`` but ``root``, parents first, each directory in name order:
    (tar name, lstat, path). Names sort as bytes, so the order never depends on a locale."""
    stack = [(root, "")]
    while stack:
        directory, prefix = stack.pop()
        names = sorted(os.listdir(directory), key=os.fsencode)
        below = []
        for name in names:
            path = directory / name
            info = os.lstat(path)
            yield prefix + name, info, path
            if stat.S_ISDIR(info.st_mode):
                below.append((path, f"{prefix}{name}/"))
        stack.extend(reversed(below))


def _entry(name: str, info: os.stat_result) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.mode = stat.S_IMODE(info.st_mode)
    member.uid, member.gid = info.st_uid, info.st_gid
    member.uname = member.gname = ""
    member.mtime = 0
    return member


def write_layer(root: Path, out: BinaryIO) -> LayerInfo:
    """``root``'s tree as a gzip'd tar into ``out`` (deterministic: see the module doc)."""
    compressed = _Hashing(out)
    entries = skipped = 0
    with igzip.IGzipFile(fileobj=compressed, mode="wb", compresslevel=1,  # type: ignore[no-untyped-call]
                         mtime=0) as gz:
        plain = _Hashing(gz)  # type: ignore[arg-type]
        with tarfile.TarFile(fileobj=plain, mode="w", format=tarfile.PAX_FORMAT,
                             encoding="utf-8", errors="surrogateescape",
                             copybufsize=_COPY_CHUNK) as tar:
            links: dict[tuple[int, int], str] = {}
            for name, info, path in _walk(root):
                member = _entry(name, info)
                mode = info.st_mode
                if stat.S_ISDIR(mode):
                    member.type = tarfile.DIRTYPE
                elif stat.S_ISLNK(mode):
                    member.type = tarfile.SYMTYPE
                    member.linkname = os.readlink(path)
                elif stat.S_ISREG(mode):
                    key = (info.st_dev, info.st_ino)
                    if info.st_nlink > 1 and key in links:
                        member.type = tarfile.LNKTYPE
                        member.linkname = links[key]
                    else:
                        links[key] = name
                        member.size = info.st_size
                        with open(path, "rb") as content:
                            tar.addfile(member, content)
                        entries += 1
                        continue
                else:
                    skipped += 1
                    continue
                tar.addfile(member)
                entries += 1
    return LayerInfo(f"sha256:{compressed.sha256.hexdigest()}", compressed.size,
                     f"sha256:{plain.sha256.hexdigest()}", entries, skipped)


def _json(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _descriptor(media_type: str, blob: bytes) -> dict[str, object]:
    return {"mediaType": media_type, "digest": f"sha256:{hashlib.sha256(blob).hexdigest()}",
            "size": len(blob)}


def image_config(layer: LayerInfo, labels: dict[str, str]) -> bytes:
    # No "created": a time would make every build's digests differ.
    return _json({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": [ENTRYPOINT], "Env": list(ENV), "WorkingDir": "/root",
                   "Labels": labels},
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id]},
        "history": [{"created_by": "desktop_image/oci_image.py: the session image "
                                   f"{labels['io.deskbox.image.hash']}"}],
    })


def labels_for(image: Path) -> dict[str, str]:
    """The OCI image's labels, from the session image's build manifest."""
    built = json.loads((image / image_store.MANIFEST).read_text())
    protocol = _agent_protocol()
    return {
        "org.opencontainers.image.title": REPOSITORY,
        "org.opencontainers.image.description":
            "Deskbox session: Xvfb, openbox, Chromium and deskbox-agent",
        "org.opencontainers.image.version": built["hash"],
        "io.deskbox.image.hash": built["hash"],
        "io.deskbox.image.erofs-sha256": built["image"]["sha256"],
        "io.deskbox.agent.command": AGENT,
        "io.deskbox.agent.protocol": str(protocol),
        "io.deskbox.agent.python": built["agent"]["python"],
    }


def _agent_protocol() -> int:
    """The protocol version of the agent the image holds (its package's ``PROTOCOL``),
    read from the source without importing the agent."""
    for line in (HERE / "agent/deskbox_agent/__init__.py").read_text().splitlines():
        if line.startswith("PROTOCOL = "):
            return int(line.split("=", 1)[1].split("#", 1)[0])
    raise RuntimeError("deskbox_agent/__init__.py names no PROTOCOL")


def _add(tar: tarfile.TarFile, name: str, size: int, content: BinaryIO | None,
         directory: bool = False) -> None:
    member = tarfile.TarInfo(name)
    member.mtime, member.uname, member.gname = 0, "", ""
    if directory:
        member.type, member.mode = tarfile.DIRTYPE, 0o755
    else:
        member.mode, member.size = 0o444, size
    tar.addfile(member, content)


def write_archive(out: Path, layer_file: Path, layer: LayerInfo, labels: dict[str, str],
                  tag: str) -> dict[str, object]:
    """The OCI layout tar (with Docker's manifest.json) at ``out``; what it holds."""
    config = image_config(layer, labels)
    config_digest = f"sha256:{hashlib.sha256(config).hexdigest()}"
    manifest = _json({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": _descriptor(CONFIG_MEDIA_TYPE, config),
        "layers": [{"mediaType": LAYER_MEDIA_TYPE, "digest": layer.digest,
                    "size": layer.size}],
    })
    manifest_digest = f"sha256:{hashlib.sha256(manifest).hexdigest()}"
    name = f"localhost/{REPOSITORY}:{tag}"
    index = _json({
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [{**_descriptor(MANIFEST_MEDIA_TYPE, manifest), "annotations": {
            "io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag}}],
    })
    blob = "blobs/sha256/"
    docker = _json([{"Config": blob + config_digest.removeprefix("sha256:"),
                     "RepoTags": [f"{REPOSITORY}:{tag}"],
                     "Layers": [blob + layer.digest.removeprefix("sha256:")]}])
    small = [("oci-layout", _json({"imageLayoutVersion": "1.0.0"})), ("index.json", index),
             ("manifest.json", docker), (blob + config_digest[7:], config),
             (blob + manifest_digest[7:], manifest)]
    with tarfile.TarFile(out, "w", format=tarfile.PAX_FORMAT, copybufsize=_COPY_CHUNK) as tar:
        _add(tar, "blobs", 0, None, directory=True)
        _add(tar, "blobs/sha256", 0, None, directory=True)
        for member, content in small:
            _add(tar, member, len(content), io.BytesIO(content))
        with open(layer_file, "rb") as layer_content:
            _add(tar, blob + layer.digest[7:], layer.size, layer_content)
    return {"name": name, "manifest": manifest_digest, "config": config_digest,
            "layer": {"digest": layer.digest, "size": layer.size, "diff_id": layer.diff_id,
                      "entries": layer.entries, "skipped": layer.skipped},
            "labels": labels}


def oci_hash(recipe: build.Recipe) -> str:
    digest = hashlib.sha256(f"rootfs\0{recipe.hash}\0".encode())
    digest.update(hashlib.sha256(Path(__file__).resolve().read_bytes()).digest())
    return digest.hexdigest()[:16]


def oci_dir(state_dir: Path, recipe: build.Recipe) -> Path:
    return state_dir / "images" / f"oci-{oci_hash(recipe)}"


def ensure_oci_image(state_dir: Path, progress: Progress = print) -> Path:
    """The directory of the current OCI image (its archive and manifest), built if missing;
    the session image (build.ensure_image) first. ImageIntegrityError as build.py's."""
    recipe = build.load_recipe()
    rootfs = build.ensure_image(state_dir, recipe, progress)
    final = oci_dir(state_dir, recipe)
    return build.cached_or_built(
        final, MANIFEST, "oci image",
        lambda: _build(final.parent, final, recipe, rootfs, progress), progress)


def _build(images: Path, final: Path, recipe: build.Recipe, rootfs: Path,
           progress: Progress) -> None:
    started = time.monotonic()
    with build._staging(images, final.name) as staging:
        progress(f"oci image {final.name}: writing the layer from the session image "
                 f"{recipe.hash}")
        layer_file = staging / "layer.tar.gz"
        with open(layer_file, "wb") as out:
            layer = write_layer(rootfs, out)
        progress(f"  {layer.entries} entries, {layer.size / 2**20:.0f} MiB compressed "
                 f"({layer.skipped} device nodes left out) in "
                 f"{time.monotonic() - started:.1f} s")
        progress(f"oci image {final.name}: writing the archive")
        labels = labels_for(build.image_dir(images.parent, recipe))
        held = write_archive(staging / ARCHIVE, layer_file, layer, labels, recipe.hash)
        layer_file.unlink()
        (staging / ARCHIVE).chmod(0o444)
        manifest = {"hash": final.name.removeprefix("oci-"), "image_hash": recipe.hash,
                    "archive": {"file": ARCHIVE, "size": (staging / ARCHIVE).stat().st_size},
                    **held, "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        os.rename(staging, final)
    progress(f"oci image {final.name} ready in {time.monotonic() - started:.1f} s: "
             f"{final / ARCHIVE}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--state-dir", type=Path,
        default=Path(os.environ.get("DESKBOX_STATE_DIR", HERE.parent / ".state")),
    )
    parser.add_argument("--print-dir", action="store_true",
                        help="print the current recipe's directory only (built or not)")
    args = parser.parse_args(argv)
    state_dir = args.state_dir.resolve()
    if args.print_dir:
        print(oci_dir(state_dir, build.load_recipe()))
        return 0
    return build.made_from_image(ensure_oci_image, state_dir)


if __name__ == "__main__":
    sys.exit(main())
