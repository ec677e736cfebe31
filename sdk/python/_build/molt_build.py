"""A PEP 517 build backend for the molt package, standard library only.

setuptools would have pip fetch it into an isolated build environment,
which a host without an index cannot do; this backend needs nothing but
Python. It packs molt/ into a pure wheel (and an sdist of the project),
with the metadata of pyproject.toml's [project] table.
"""

import base64
import hashlib
import io
import os
import tarfile
import zipfile

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "molt"


def _project():
    path = os.path.join(ROOT, "pyproject.toml")
    if tomllib is not None:
        with open(path, "rb") as f:
            return tomllib.load(f)["project"]
    # Without tomllib: the few keys this file sets, read line by line.
    proj, section = {}, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("["):
                section = line
            elif section == "[project]" and "=" in line and not line.startswith("#"):
                k, v = (s.strip() for s in line.split("=", 1))
                if v.startswith('"'):
                    proj[k] = v.strip('"')
    return proj


def _metadata():
    p = _project()
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}",
             f"Summary: {p.get('description', '')}"]
    if p.get("requires-python"):
        lines.append(f"Requires-Python: {p['requires-python']}")
    readme = os.path.join(ROOT, "README.md")
    body = ""
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = f.read()
    return p["name"], p["version"], "\n".join(lines) + "\n\n" + body


def _files():
    base = os.path.join(ROOT, PACKAGE)
    for d, dirs, names in os.walk(base):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for n in sorted(names):
            if n.endswith(".py") or n == "py.typed":
                full = os.path.join(d, n)
                yield full, os.path.relpath(full, ROOT).replace(os.sep, "/")


def _record_line(arc, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arc},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory, entries):
    name, version, meta = _metadata()
    dist = f"{name}-{version}.dist-info"
    wheel_name = f"{name}-{version}-py3-none-any.whl"
    wheel = "Wheel-Version: 1.0\nGenerator: molt_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    entries = list(entries) + [(f"{dist}/METADATA", meta.encode()), (f"{dist}/WHEEL", wheel.encode())]
    record = [_record_line(a, d) for a, d in entries] + [f"{dist}/RECORD,,"]
    entries.append((f"{dist}/RECORD", ("\n".join(record) + "\n").encode()))
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in entries:
            info = zipfile.ZipInfo(arc, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return wheel_name


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    entries = []
    for full, arc in _files():
        with open(full, "rb") as f:
            entries.append((arc, f.read()))
    return _write_wheel(wheel_directory, entries)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # A .pth file puts the source tree on sys.path (PEP 660).
    return _write_wheel(wheel_directory, [("molt_editable.pth", (ROOT + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    name, version, meta = _metadata()
    base = f"{name}-{version}"
    out = f"{base}.tar.gz"
    paths = [os.path.join(ROOT, p) for p in ("pyproject.toml", "README.md")]
    paths += [f for f, _ in _files()]
    paths += [os.path.join(ROOT, "_build", "molt_build.py")]
    with tarfile.open(os.path.join(sdist_directory, out), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for p in paths:
            if os.path.exists(p):
                t.add(p, arcname=f"{base}/{os.path.relpath(p, ROOT)}", recursive=False)
        data = meta.encode()
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return out
