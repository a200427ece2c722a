"""What an attribute read costs the router's compiled modules: CPython 3.11's bytecode, Cython on a plain class (how
``setup.py`` compiles the router), and Cython on an extension type declared in an augmenting ``.pxd``.

    .venv/bin/python benchmarks/cython_attribute_access.py [--reads 200000] [--rounds 7] [--out FILE.json]

One class, one method that reads five of the instance's attributes per loop pass (as the router's methods read
``self.pool``, ``self.index``, ``w.state``...), compiled the way ``setup.py`` compiles the router (``language_level``
3, ``annotation_typing`` off) in a temporary folder. The three variants run the same source; the third adds a
``.pxd`` beside it that declares the class a ``cdef class`` whose attributes are ``object`` slots (plus an instance
``__dict__``, so other attributes still work): compiled methods then read ``self``'s attributes as struct fields.
Prints ns per loop pass (best of ``--rounds``, the variants taking turns in each) and the ratios to the
interpreted run; needs Cython and a C compiler.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SOURCE = '''
class Holder:
    def __init__(self):
        self.a = 1
        self.b = 2
        self.c = [1, 2, 3]
        self.d = {"x": 1}
        self.e = None

    def work(self, n):
        t = 0
        for _ in range(n):
            t += self.a + self.b + len(self.c) + (self.e is None) + self.d["x"]
        return t
'''

PXD = '''
cdef class Holder:
    cdef public object a, b, c, d, e
    cdef dict __dict__
'''

BUILD = '''
from Cython.Build import cythonize
from setuptools import setup
setup(ext_modules=cythonize(["compiled_plain.py", "compiled_typed.py"], quiet=True,
                            compiler_directives={"language_level": 3, "annotation_typing": False}),
      script_args=["build_ext", "--inplace"])
'''


def build(folder: Path) -> None:
    for name in ("interpreted", "compiled_plain", "compiled_typed"):
        (folder / f"{name}.py").write_text(SOURCE)
    (folder / "compiled_typed.pxd").write_text(PXD)
    (folder / "build.py").write_text(BUILD)
    done = subprocess.run([sys.executable, "build.py"], cwd=folder, capture_output=True, text=True)
    if done.returncode:
        sys.exit("cython_attribute_access: the build failed (Cython and a C compiler are needed):\n"
                 + done.stderr[-2000:])


def per_pass_ns(modules: dict, reads: int, rounds: int) -> dict[str, float]:
    """Best ns per loop pass of each module's ``Holder.work``; the variants take turns within every round, so a
    machine busy for a while slows all of them alike rather than one."""
    holders = {name: module.Holder() for name, module in modules.items()}
    for holder in holders.values():
        holder.work(1000)
    best = dict.fromkeys(holders, float("inf"))
    for r in range(rounds):
        order = list(holders) if r % 2 == 0 else list(reversed(holders))
        for name in order:
            t0 = time.perf_counter()
            holders[name].work(reads)
            best[name] = min(best[name], time.perf_counter() - t0)
    return {name: t / reads * 1e9 for name, t in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=200_000, help="loop passes per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds; the best is kept")
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        build(folder)
        sys.path.insert(0, str(folder))
        modules = {}
        for name in ("interpreted", "compiled_plain", "compiled_typed"):
            module = modules[name] = importlib.import_module(name)
            if module.__file__.endswith(".py") != (name == "interpreted"):
                sys.exit(f"cython_attribute_access: {name} loaded from {module.__file__}")
        figures = per_pass_ns(modules, args.reads, args.rounds)
    base = figures["interpreted"]
    print(f"Python {platform.python_version()} ({sys.executable}); one loop pass = five attribute reads and a few "
          f"additions; best of {args.rounds} rounds of {args.reads:,} passes\n")
    print("| variant | ns per pass | vs interpreted |\n|---|---:|---:|")
    labels = {"interpreted": "CPython bytecode (specialised attribute reads)",
              "compiled_plain": "Cython, plain class (the router's build)",
              "compiled_typed": "Cython, `cdef class` from an augmenting `.pxd`"}
    for name, ns in figures.items():
        print(f"| {labels[name]} | {ns:.1f} | {ns / base:.2f}x |")
    if args.out:
        args.out.write_text(json.dumps({"python": platform.python_version(), "reads": args.reads,
                                        "rounds": args.rounds, "ns_per_pass": figures,
                                        "command": " ".join(sys.argv)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
