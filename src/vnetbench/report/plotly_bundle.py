"""Which plotly.js the HTML report inlines: Plotly's cartesian partial bundle, pinned and verified.

The report draws only cartesian charts (scatter and box traces, error bars,
shapes, annotations, one update menu), all of which Plotly's own partial
bundle ``plotly.js-cartesian-dist-min`` contains (1.5 MB, against 4.8 MB for
the full bundle of the plotly Python package, maps and 3D included). Its
smaller sibling ``plotly.js-basic-dist-min`` has no box trace.

Nothing fetched is kept in the repository. ``make setup`` runs::

    .venv/bin/python -m vnetbench.report.plotly_bundle install

which downloads the npm tarball once, checks npm's sha512 integrity of it and
the sha256 of the file inside, and writes the file to
``<sys.prefix>/share/vnetbench/`` (the venv). When the file is there and
verified it downloads nothing.

:func:`load` checks the file's sha256 each time a report is written. When the
file is missing or altered (vnetbench installed by pip without ``make
setup``), the report inlines the full bundle of the plotly Python package
instead and says so under the page; writing a report never fails for it.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import os
import re
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "plotly.js-cartesian-dist-min"
#: The plotly.js the pinned plotly Python package (pyproject.toml: plotly==7.1.0) bundles, so a report
#: draws the same with either bundle (tests/unit/test_report_bundle.py checks that they agree).
VERSION = "4.1.1"
TARBALL_URL = f"https://registry.npmjs.org/{PACKAGE}/-/{PACKAGE}-{VERSION}.tgz"
#: npm's integrity of the tarball (`npm view plotly.js-cartesian-dist-min@4.1.1 dist.integrity`).
TARBALL_INTEGRITY = "sha512-o8GrFeusncwBIxbBynRJpY4pkgVB6caM+JLpwrLYbbsO7dZ8FJ+SVN2Fr+L7kiG/Z6w4P5O0Jus/Qr5EefHVeg=="
MEMBER = "package/plotly-cartesian.min.js"
#: sha256 of MEMBER, checked again whenever a report reads the installed file.
FILE_SHA256 = "79542150855a52c567260e3137095dbe2b744e6d702a5cabe67da246942fba7a"
FILE_NAME = f"plotly-cartesian-{VERSION}.min.js"
PIN_SOURCE = "src/vnetbench/report/plotly_bundle.py"
DOWNLOAD_TIMEOUT_S = 60


class BundleError(Exception):
    """The bundle could not be installed; the message says why and what to do."""


@dataclass(frozen=True)
class Bundle:
    """The plotly.js a report inlines."""

    js: str
    #: plotly.js version, e.g. "4.1.1".
    version: str
    #: "cartesian" (the partial bundle) or "full" (the plotly Python package's).
    kind: str
    #: For the page: which bundle, and when it is the full one, why.
    note: str


def bundle_dir() -> Path:
    """Where ``install`` puts the file: the running environment's (the venv's) share/vnetbench."""
    return Path(sys.prefix) / "share" / "vnetbench"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _problem(path: Path) -> str | None:
    """Why the installed file cannot be used, or None when it is there and verified."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return f"{path} is not installed"
    except OSError as err:
        return f"{path} cannot be read ({err.strerror or err})"
    found = _sha256(data)
    if found != FILE_SHA256:
        return f"{path} does not match its pinned sha256 (expected {FILE_SHA256[:16]}…, found {found[:16]}…)"
    return None


def problem(directory: Path | None = None) -> str | None:
    """Why reports cannot inline the cartesian bundle here, or None when they can."""
    return _problem((directory or bundle_dir()) / FILE_NAME)


def bundle_version(js: str) -> str:
    """The plotly.js version a bundle's header comment names ("plotly.js (cartesian - minified) v4.1.1")."""
    m = re.search(r"plotly\.js(?: \([^)]*\))? v(\d+\.\d+\.\d+\S*)", js[:1000])
    return m.group(1) if m else "unknown"


def load(directory: Path | None = None) -> Bundle:
    """The cartesian bundle when installed and verified, else the plotly package's full bundle."""
    path = (directory or bundle_dir()) / FILE_NAME
    problem = _problem(path)
    if problem is None:
        return Bundle(path.read_text(encoding="utf-8"), VERSION, "cartesian",
                      f"plotly.js {VERSION}, Plotly's cartesian bundle ({PACKAGE}, sha256 verified)")
    import plotly
    from plotly.offline import get_plotlyjs

    js = get_plotlyjs()
    version = bundle_version(js)
    return Bundle(js, version, "full",
                  f"plotly.js {version}, the full bundle of the plotly {plotly.__version__} Python package, "
                  f"because {problem}: `make setup` installs the cartesian bundle, "
                  "(1.5 MB of plotly.js instead of 4.8 MB)")


# ------------------------------------------------------------------ install (make setup)


def _check_integrity(data: bytes) -> None:
    algo, _, expected = TARBALL_INTEGRITY.partition("-")
    found = base64.b64encode(hashlib.new(algo, data).digest()).decode("ascii")
    if found != expected:
        raise BundleError(
            f"{TARBALL_URL}: the download's {algo} is {found}, expected {expected} (pinned in {PIN_SOURCE}). "
            "The file is corrupt or not the one that was pinned: run `make setup` again; if it still differs, "
            "do not change the pin before checking where the new file comes from.")


def _extract(tarball: bytes) -> bytes:
    try:
        with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
            member = tar.extractfile(MEMBER)  # one member read as bytes: nothing is written from the archive
            data = member.read() if member else None
    except (tarfile.TarError, KeyError, OSError) as err:
        raise BundleError(f"{TARBALL_URL}: cannot read {MEMBER} from the tarball ({err})") from err
    if data is None:
        raise BundleError(f"{TARBALL_URL}: {MEMBER} is not a file in the tarball")
    found = _sha256(data)
    if found != FILE_SHA256:
        raise BundleError(f"{TARBALL_URL}: {MEMBER} has sha256 {found}, expected {FILE_SHA256} (pinned in "
                          f"{PIN_SOURCE}); the tarball passed its integrity check, so the pin itself is wrong")
    return data


def download(url: str = TARBALL_URL) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as resp:
            return resp.read()
    except (urllib.error.URLError, OSError) as err:
        raise BundleError(f"cannot download {url} ({getattr(err, 'reason', err)}): `make setup` needs the npm "
                          "registry once for the report's plotly.js (or an https_proxy); without it reports "
                          "carry the full bundle of the plotly package") from err


def install(directory: Path | None = None, fetch=None) -> tuple[Path, bool]:
    """Install the verified bundle into ``directory``; (its path, whether anything was downloaded).
    ``fetch(url) -> bytes`` is :func:`download` unless given."""
    directory = directory or bundle_dir()
    path = directory / FILE_NAME
    if _problem(path) is None:
        return path, False
    tarball = (fetch or download)(TARBALL_URL)
    _check_integrity(tarball)
    data = _extract(tarball)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{FILE_NAME}.")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)  # never a half-written bundle under the final name
    except OSError as err:
        raise BundleError(f"cannot write {path} ({err.strerror or err}): check the directory's permissions") from err
    return path, True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vnetbench.report.plotly_bundle",
                                 description="Install the plotly.js bundle the HTML report inlines.")
    ap.add_argument("command", choices=["install", "check"],
                    help="install: download and verify when missing or altered; check: say whether it is usable")
    ap.add_argument("--dir", type=Path, default=None, help=f"directory (default: {bundle_dir()})")
    args = ap.parse_args(argv)
    what = f"{PACKAGE} {VERSION}"
    if args.command == "check":
        problem = _problem((args.dir or bundle_dir()) / FILE_NAME)
        print(f"{what}: " + (problem + " (run `make setup`)" if problem else "installed and verified"))
        return 1 if problem else 0
    problem = _problem((args.dir or bundle_dir()) / FILE_NAME)
    if problem and "is not installed" not in problem:
        print(f"{what}: {problem}: fetching it again")
    try:
        path, fetched = install(args.dir)
    except BundleError as err:
        print(f"error: {what}: {err}", file=sys.stderr)
        return 2
    print(f"{what}: {'downloaded and verified' if fetched else 'present and verified'}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
