import os

from Cython.Build import cythonize
from setuptools import Extension, setup

# INCR_DEBUG=1: the debug build, which checks the trace's invariants after every top-level
# operation and aborts on a broken one (incr._core.DEBUG is True); docs/internals.md
DEBUG = [("INCR_DEBUG", "1")] if os.environ.get("INCR_DEBUG") == "1" else []

setup(
    ext_modules=cythonize(
        [Extension("incr._core", ["incr/_core.pyx"], define_macros=DEBUG),
         Extension("incr._codec", ["incr/_codec.pyx"]),
         Extension("incr._collections", ["incr/_collections.pyx"])],
        compiler_directives={"language_level": "3"},
    )
)
