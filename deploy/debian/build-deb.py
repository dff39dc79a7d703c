#!/usr/bin/env python3
"""Builds kvtarget's Debian package from Cargo.toml's [package.metadata.deb]
(cargo-deb's format: assets, conf-files, maintainer-scripts, depends with
$auto) with dpkg-deb, so CI needs no cargo-deb build (measured in
docs/operations.md). Run from the repository root:

    deploy/debian/build-deb.py                    # target/release/kvtarget
    KVTARGET_BIN=path deploy/debian/build-deb.py  # another build

Writes target/debian/kvtarget_VERSION-1_ARCH.deb and prints its path. Needs
cargo (for `cargo metadata`), dpkg-dev (dpkg-shlibdeps), binutils (strip).
"""

import glob
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

PACKAGE = "kvtarget"
# The Debian revision of a package built from upstream's own tree.
REVISION = "1"


def die(msg):
    print(f"build-deb: {msg}", file=sys.stderr)
    sys.exit(1)


def run(args, **kw):
    try:
        return subprocess.run(args, check=True, capture_output=True, text=True, **kw).stdout
    except FileNotFoundError:
        die(f"{args[0]}: not installed")
    except subprocess.CalledProcessError as e:
        die(f"{' '.join(args)}: exit {e.returncode}: {e.stderr.strip()}")


def package_metadata():
    meta = json.loads(run(["cargo", "metadata", "--no-deps", "--format-version", "1"]))
    for p in meta["packages"]:
        if p["name"] == PACKAGE:
            deb = (p.get("metadata") or {}).get("deb")
            if not deb:
                die("Cargo.toml has no [package.metadata.deb]")
            return p, deb
    die(f"no package {PACKAGE} in cargo metadata")


def stage_assets(deb, stage, binary):
    for source, dest, mode in deb["assets"]:
        # cargo-deb's rule: the release binary's path stands for the build.
        if source == f"target/release/{PACKAGE}":
            sources = [binary]
        else:
            sources = sorted(glob.glob(source))
        if not sources:
            die(f"asset {source}: no such file")
        for src in sources:
            target = os.path.join(stage, dest)
            if dest.endswith("/"):
                target = os.path.join(target, os.path.basename(src))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(src, target)
            os.chmod(target, int(mode, 8))
            if src == binary:
                # Line tables (profile.release debug = 1) are for profiling a
                # build tree, not for an installed daemon: 4x smaller.
                run(["strip", "--strip-debug", target])
            if "/share/man/" in target and not target.endswith(".gz"):
                with open(target, "rb") as f, gzip.GzipFile(
                    target + ".gz", "wb", compresslevel=9, mtime=0
                ) as g:
                    g.write(f.read())
                os.chmod(target + ".gz", int(mode, 8))
                os.remove(target)


def copyright_text(pkg, deb):
    return (
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
        f"Upstream-Name: {PACKAGE}\n\n"
        "Files: *\n"
        f"Copyright: {deb.get('copyright', deb['maintainer'])}\n"
        f"License: {pkg['license']}\n"
        f" On Debian systems the full text of the {pkg['license']} license is in\n"
        f" /usr/share/common-licenses/{pkg['license']}.\n"
    )


def auto_depends(stage):
    """dpkg-shlibdeps on every ELF file staged (it wants a debian/control)."""
    elves = []
    for root, _, files in os.walk(stage):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                if fh.read(4) == b"\x7fELF":
                    elves.append(p)
    with tempfile.TemporaryDirectory() as d:
        os.mkdir(os.path.join(d, "debian"))
        with open(os.path.join(d, "debian", "control"), "w") as c:
            c.write(f"Source: {PACKAGE}\n\nPackage: {PACKAGE}\nArchitecture: any\n")
        out = run(["dpkg-shlibdeps", "-O"] + [os.path.abspath(e) for e in elves], cwd=d)
    for line in out.splitlines():
        if line.startswith("shlibs:Depends="):
            return line.split("=", 1)[1]
    return ""


def installed_size_kib(stage):
    total = 0
    for root, dirs, files in os.walk(stage):
        total += len(dirs) + len(files)
        for f in files:
            total += (os.lstat(os.path.join(root, f)).st_size + 1023) // 1024
    return total


def main():
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    binary = os.environ.get("KVTARGET_BIN", f"target/release/{PACKAGE}")
    if not os.access(binary, os.X_OK):
        die(f"no kvtarget binary at {binary} (cargo build --release)")
    pkg, deb = package_metadata()
    # The man pages come from the binary's own clap definitions.
    run([binary, "man", "--out", "target/man"])

    out_dir = "target/debian"
    stage = os.path.join(out_dir, "stage")
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(os.path.join(stage, "DEBIAN"))
    stage_assets(deb, stage, binary)
    doc = os.path.join(stage, "usr/share/doc", PACKAGE)
    os.makedirs(doc, exist_ok=True)
    with open(os.path.join(doc, "copyright"), "w") as f:
        f.write(copyright_text(pkg, deb))

    arch = run(["dpkg", "--print-architecture"]).strip()
    version = f"{pkg['version']}-{REVISION}"
    depends = [
        d.strip()
        for d in deb.get("depends", "$auto").split(",")
        if d.strip() and d.strip() != "$auto"
    ]
    if "$auto" in deb.get("depends", "$auto"):
        depends = [d for d in auto_depends(stage).split(", ") if d] + depends
    description = deb.get("extended-description", "").replace("\n", " ").split()
    # Extended description lines: folded at 78 columns, each with one space.
    lines, cur = [], ""
    for w in description:
        if cur and len(cur) + 1 + len(w) > 78:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    if cur:
        lines.append(cur)
    control = [
        f"Package: {PACKAGE}",
        f"Version: {version}",
        f"Architecture: {arch}",
        f"Maintainer: {deb['maintainer']}",
        f"Installed-Size: {installed_size_kib(stage)}",
    ]
    if depends:
        control.append(f"Depends: {', '.join(depends)}")
    for key, field in [("recommends", "Recommends"), ("suggests", "Suggests")]:
        if deb.get(key):
            control.append(f"{field}: {deb[key]}")
    control += [
        f"Section: {deb.get('section', 'misc')}",
        f"Priority: {deb.get('priority', 'optional')}",
        f"Description: {pkg['description']}",
    ] + [f" {l}" for l in lines]
    with open(os.path.join(stage, "DEBIAN", "control"), "w") as f:
        f.write("\n".join(control) + "\n")
    with open(os.path.join(stage, "DEBIAN", "conffiles"), "w") as f:
        for c in deb.get("conf-files", []):
            if not os.path.isfile(os.path.join(stage, c.lstrip("/"))):
                die(f"conf-file {c} is not among the assets")
            f.write(c + "\n")
    scripts = deb.get("maintainer-scripts")
    if scripts:
        for name in ["preinst", "postinst", "prerm", "postrm"]:
            src = os.path.join(scripts, name)
            if os.path.exists(src):
                dst = os.path.join(stage, "DEBIAN", name)
                shutil.copyfile(src, dst)
                os.chmod(dst, 0o755)
    with open(os.path.join(stage, "DEBIAN", "md5sums"), "w") as f:
        for root, _, files in sorted(os.walk(stage)):
            if os.path.relpath(root, stage).startswith("DEBIAN"):
                continue
            for name in sorted(files):
                p = os.path.join(root, name)
                with open(p, "rb") as fh:
                    digest = hashlib.md5(fh.read()).hexdigest()
                f.write(f"{digest}  {os.path.relpath(p, stage)}\n")
    # Directories 755 whatever the umask (dpkg-deb refuses group-writable
    # maintainer-script directories, and the package's tree must not be).
    for root, dirs, _ in os.walk(stage):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
    os.chmod(stage, 0o755)
    deb_path = os.path.join(out_dir, f"{PACKAGE}_{version}_{arch}.deb")
    run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", stage, deb_path])
    print(deb_path)


if __name__ == "__main__":
    main()
