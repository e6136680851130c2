"""The embedded default corpus: English text that ships with every CPython install, so nothing is downloaded.

Two sources, in this order:
1. ``pydoc_data.topics``: the reference-manual help topics behind ``help("assert")`` etc., one document each.
2. Docstrings of the standard library: for each module of :data:`STDLIB_MODULES` (packages walked recursively,
   test packages and ``__main__`` skipped), the module docstring and those of the classes, methods and
   functions it defines itself (``obj.__module__`` equal to the module), one document per object, headed by
   its qualified name.

Modules that fail to import on this platform are skipped. Documents are deduplicated by body and emitted in a
fixed order (list order, then names sorted). The corpus is collected in a fresh, isolated interpreter, so it is the
same in every process of one Python build whatever that process has imported.
Docstrings differ between Python versions, hence the version tag in :data:`CORPUS_VERSION`. Text is licensed
under the PSF License Agreement, like the rest of Python's documentation and source.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import pkgutil
import subprocess
import sys
import warnings
from types import ModuleType

CORPUS_VERSION = f"1-py{sys.version_info.major}.{sys.version_info.minor}"

# Pure-Python (and a few built-in) standard-library modules that are safe to import: no I/O, GUI, terminal or
# browser side effects on import. Deliberately absent: this, antigravity, idlelib, tkinter, turtle(demo),
# readline, site, distutils (setuptools swaps it), lib2to3 (writes grammar caches), ensurepip, venv, encodings.
STDLIB_MODULES: tuple[str, ...] = (
    "abc", "argparse", "array", "ast", "asyncio", "atexit", "base64", "bdb", "binascii", "bisect", "builtins",
    "bz2", "cProfile", "calendar", "cmath", "cmd", "code", "codecs", "codeop", "collections", "colorsys",
    "compileall", "concurrent", "configparser", "contextlib", "contextvars", "copy", "copyreg", "csv", "ctypes",
    "dataclasses", "datetime", "dbm", "decimal", "difflib", "dis", "doctest", "email", "enum", "errno",
    "faulthandler", "filecmp", "fileinput", "fnmatch", "fractions", "ftplib", "functools", "gc", "genericpath",
    "getopt", "getpass", "gettext", "glob", "graphlib", "gzip", "hashlib", "heapq", "hmac", "html", "http",
    "imaplib", "importlib", "inspect", "io", "ipaddress", "itertools", "json", "keyword", "linecache", "locale",
    "logging", "lzma", "mailbox", "marshal", "math", "mimetypes", "mmap", "modulefinder", "multiprocessing",
    "netrc", "numbers", "opcode", "operator", "optparse", "os", "pathlib", "pdb", "pickle", "pickletools",
    "pkgutil", "platform", "plistlib", "poplib", "posixpath", "pprint", "profile", "pstats", "py_compile",
    "pyclbr", "pydoc", "queue", "quopri", "random", "re", "reprlib", "rlcompleter", "runpy", "sched", "secrets",
    "select", "selectors", "shelve", "shlex", "shutil", "signal", "smtplib", "socket", "socketserver", "sqlite3",
    "ssl", "stat", "statistics", "string", "stringprep", "struct", "subprocess", "symtable", "sys", "sysconfig",
    "tabnanny", "tarfile", "tempfile", "textwrap", "threading", "time", "timeit", "token", "tokenize",
    "tomllib", "trace", "traceback", "tracemalloc", "types", "typing", "unicodedata", "unittest", "urllib",
    "uuid", "warnings", "wave", "weakref", "wsgiref", "xml", "xmlrpc", "zipapp", "zipfile", "zipimport", "zlib",
    "zoneinfo",
    # Private pure-Python twins and helpers with substantial docstrings.
    "_collections_abc", "_compat_pickle", "_markupbase", "_py_abc", "_pydecimal", "_pyio", "_sitebuiltins",
    "_strptime", "_threading_local", "_weakrefset",
    # Deprecated modules (PEP 594), present up to Python 3.12 and skipped where removed.
    "aifc", "asynchat", "asyncore", "audioop", "cgi", "cgitb", "chunk", "crypt", "imghdr", "imp", "mailcap",
    "nntplib", "pipes", "smtpd", "sndhdr", "sunau", "telnetlib", "uu", "xdrlib",
)  # fmt: skip
_SKIPPED_SUBMODULES = frozenset({"__main__", "test", "tests", "idle_test"})
_MIN_DOC_CHARS = 20  # drops stubs such as "Return self."
_BUILD_TIMEOUT_S = 300


def _import_tree(name: str) -> list[ModuleType]:
    """``name`` and, for a package, its submodules depth-first in sorted order; unimportable ones skipped."""
    try:
        module = importlib.import_module(name)
    except Exception:  # noqa: BLE001 -- a module missing on this platform is not an error
        return []
    modules = [module]
    if hasattr(module, "__path__"):
        for info in sorted(pkgutil.iter_modules(module.__path__), key=lambda i: i.name):
            if info.name not in _SKIPPED_SUBMODULES:
                modules += _import_tree(f"{name}.{info.name}")
    return modules


def _own_docstrings(module: ModuleType) -> list[tuple[str, str]]:
    """(qualified name, cleaned docstring) for the module and the objects it defines, in sorted name order."""
    found: list[tuple[str, object]] = [(module.__name__, module)]
    for name, obj in sorted(vars(module).items()):
        if name.startswith("__") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(obj):
            found.append((f"{module.__name__}.{name}", obj))
            for member_name, member in sorted(vars(obj).items()):
                if isinstance(member, (classmethod, staticmethod)):
                    member = member.__func__
                if isinstance(member, property):
                    member = member.fget
                if inspect.isfunction(member) or inspect.isbuiltin(member) or inspect.ismethoddescriptor(member):
                    found.append((f"{module.__name__}.{name}.{member_name}", member))
        elif inspect.isfunction(obj) or inspect.isbuiltin(obj):
            found.append((f"{module.__name__}.{name}", obj))
    docs = []
    for qualname, obj in found:
        doc = getattr(obj, "__doc__", None)
        if isinstance(doc, str) and len(doc.strip()) >= _MIN_DOC_CHARS:
            docs.append((qualname, inspect.cleandoc(doc)))
    return docs


def _collect() -> list[str]:
    """Build the corpus in this interpreter (the isolated child of :func:`_build`)."""
    from pydoc_data.topics import topics

    documents = list(dict.fromkeys(topics[key].strip() for key in sorted(topics)))  # a few topics share a text
    seen = set(documents)
    # Imports happen before any namespace is read, so the result does not depend on import interleaving.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated modules warn on import
        modules = [m for name in STDLIB_MODULES for m in _import_tree(name)]
    for module in modules:
        for qualname, body in _own_docstrings(module):
            if body not in seen:
                seen.add(body)
                documents.append(f"{qualname}\n\n{body}")
    return documents


@functools.lru_cache(maxsize=1)
def _build() -> tuple[str, ...]:
    # A fresh interpreter (-I: no environment or user site; -S: no site-packages) sees the standard library as
    # shipped. In the calling process, importing torch replaces stdlib functions (torch.package swaps
    # inspect.getfile, typing_extensions swaps typing._check_generic), which would change the corpus; and the
    # ~400 imports would stay loaded there.
    if not sys.executable:
        return tuple(_collect())
    result = subprocess.run(
        [sys.executable, "-I", "-S", __file__], capture_output=True, check=False, timeout=_BUILD_TIMEOUT_S
    )
    if result.returncode != 0:
        raise RuntimeError(f"building the embedded corpus failed:\n{result.stderr.decode(errors='replace')}")
    return tuple(json.loads(result.stdout.decode("utf-8")))


def embedded_documents() -> list[str]:
    """The embedded corpus, one string per document (built on first call, about 0.3 s, then cached)."""
    return list(_build())


def embedded_corpus_size() -> dict[str, int]:
    """Size of the embedded corpus: ``documents``, ``chars`` and UTF-8 ``bytes``."""
    docs = _build()
    return {
        "documents": len(docs),
        "chars": sum(len(d) for d in docs),
        "bytes": sum(len(d.encode("utf-8")) for d in docs),
    }


if __name__ == "__main__":
    sys.stdout.write(json.dumps(_collect()))
