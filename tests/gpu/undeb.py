"""Unpack a Debian package's files (data.tar.*) into a folder, for a machine without dpkg-deb.
  undeb.py PACKAGE.deb DEST"""
import io
import sys
import tarfile

deb, dest = sys.argv[1], sys.argv[2]
with open(deb, "rb") as f:
    if f.read(8) != b"!<arch>\n":
        sys.exit(f"undeb.py: {deb} is not a Debian package")
    while True:
        hdr = f.read(60)
        if len(hdr) < 60:
            sys.exit(f"undeb.py: {deb} has no data.tar member")
        name, size = hdr[:16].decode().strip().rstrip("/"), int(hdr[48:58])
        body = f.read(size)
        if size % 2:
            f.read(1)
        if name.startswith("data.tar"):
            if name.endswith(".zst"):
                sys.exit(f"undeb.py: {deb} is zstd-compressed; install dpkg-deb")
            with tarfile.open(fileobj=io.BytesIO(body)) as t:
                t.extractall(dest, filter="tar") if hasattr(tarfile, "data_filter") else t.extractall(dest)
            break
